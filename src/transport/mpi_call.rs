//! What every file that calls MPI directly needs: turning a return code into an error (a
//! process failure, under ULFM, revokes the communicator), and `MPI_IN_PLACE`. It imports no other file of the transport, so that the MPI transport, its
//! shared memory and its collectives can all build on it without importing each other.

use crate::error::{CoreError, Result};
use mpi::ffi;
use std::ffi::{c_int, c_void};

extern "C" {
    fn ringlet_mpi_in_place() -> *mut c_void;
    fn ringlet_mpi_revoke(comm: ffi::MPI_Comm) -> c_int;
}

/// `MPI_IN_PLACE`, whose value differs between MPI libraries (rsmpi does not export it).
pub fn in_place() -> *mut c_void {
    // SAFETY: the shim returns a constant and touches nothing.
    unsafe { ringlet_mpi_in_place() }
}

/// `Ok` if `code` is `MPI_SUCCESS`, else the library's description of the failure of `what`:
/// `ProcessFailed` if a process of the communicator has died or the communicator was revoked
/// (ULFM), else `Communication`.
pub(crate) fn check(code: c_int, what: &str) -> Result<()> {
    if code == ffi::MPI_SUCCESS as c_int {
        return Ok(());
    }
    let text = format!("{what} failed: {}", error_string(code));
    if is_process_failure(code) {
        return Err(CoreError::ProcessFailed(format!(
            "{text}: a rank of ringlet's communicator has died, so no collective on it can \
             complete (it is revoked); the survivors go on from a shrunk communicator \
             (ringlet.elastic.run does it; by hand: MPI_Comm_shrink, then ringlet.init(comm=...))"
        )));
    }
    Err(CoreError::Communication(text))
}

/// [`check`] for a call on `comm`; a process failure revokes `comm` first, so that the ranks
/// still waiting on it (for data this rank will now never send) fail too, at once, instead of
/// waiting forever for the rank that died.
pub(crate) fn check_on(comm: ffi::MPI_Comm, code: c_int, what: &str) -> Result<()> {
    let result = check(code, what);
    if let Err(CoreError::ProcessFailed(_)) = &result {
        // SAFETY: `comm` is the live communicator the failed call was made on; revoking one
        // already revoked is allowed, and without ULFM the shim does nothing.
        unsafe { ringlet_mpi_revoke(comm) };
    }
    result
}

/// Whether `code` says that a process died or the communicator was revoked (ULFM's
/// `MPI_ERR_PROC_FAILED`, `_PENDING` and `MPI_ERR_REVOKED`). Their numbers are the library's
/// own, and a core built against headers without ULFM cannot name them: the class's text does,
/// in Open MPI 5 and MPICH alike.
fn is_process_failure(code: c_int) -> bool {
    let mut class: c_int = 0;
    // SAFETY: `class` is a live local that MPI_Error_class fills in.
    if unsafe { ffi::MPI_Error_class(code, &mut class) } != ffi::MPI_SUCCESS as c_int {
        return false;
    }
    let text = error_string(class).to_ascii_uppercase();
    text.contains("PROC_FAILED") || text.contains("REVOKED")
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
