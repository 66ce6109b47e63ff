//! What every file that calls MPI directly needs: turning a return code into an error, and
//! `MPI_IN_PLACE`. It imports no other file of the transport, so that the MPI transport, its
//! shared memory and its collectives can all build on it without importing each other.

use crate::error::{CoreError, Result};
use mpi::ffi;
use std::ffi::{c_int, c_void};

extern "C" {
    fn ringlet_mpi_in_place() -> *mut c_void;
}

/// `MPI_IN_PLACE`, whose value differs between MPI libraries (rsmpi does not export it).
pub fn in_place() -> *mut c_void {
    // SAFETY: the shim returns a constant and touches nothing.
    unsafe { ringlet_mpi_in_place() }
}

/// `Ok` if `code` is `MPI_SUCCESS`, else the library's description of the failure of `what`.
pub(crate) fn check(code: c_int, what: &str) -> Result<()> {
    if code == ffi::MPI_SUCCESS as c_int {
        return Ok(());
    }
    Err(CoreError::Communication(format!(
        "{what} failed: {}",
        error_string(code)
    )))
}

/// The MPI library's text for an error code.
pub(crate) fn error_string(code: c_int) -> String {
    let mut text = vec![0u8; ffi::MPI_MAX_ERROR_STRING as usize + 1];
    let mut len: c_int = 0;
    // SAFETY: `text` holds MPI_MAX_ERROR_STRING bytes, as MPI_Error_string requires.
    let described = unsafe { ffi::MPI_Error_string(code, text.as_mut_ptr().cast(), &mut len) };
    if described == ffi::MPI_SUCCESS as c_int {
        String::from_utf8_lossy(&text[..len.max(0) as usize]).into_owned()
    } else {
        format!("MPI error code {code}")
    }
}
