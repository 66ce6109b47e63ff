//! MPI as a whole process sees it: starting and finalizing MPI, the thread level it grants, the
//! communicator ringlet duplicates, the world's size, and what the library says about itself
//! and this host. The runtime decides when to do each; only this file talks to MPI about it.

use crate::error::{CoreError, Result};
use crate::transport::mpi::{check, MpiTransport};
use mpi::environment::Universe;
use mpi::ffi;
use mpi::Threading;
use std::ffi::{c_char, c_int, CStr};

extern "C" {
    fn ringlet_mpi_built_with() -> *const c_char;
}

/// How much concurrency MPI allows its callers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ThreadLevel {
    Single,
    Funneled,
    Serialized,
    Multiple,
}

impl ThreadLevel {
    /// "single", "funneled", "serialized" or "multiple".
    pub fn name(self) -> &'static str {
        match self {
            ThreadLevel::Single => "single",
            ThreadLevel::Funneled => "funneled",
            ThreadLevel::Serialized => "serialized",
            ThreadLevel::Multiple => "multiple",
        }
    }

    fn of(threading: Threading) -> Self {
        match threading {
            Threading::Single => ThreadLevel::Single,
            Threading::Funneled => ThreadLevel::Funneled,
            Threading::Serialized => ThreadLevel::Serialized,
            Threading::Multiple => ThreadLevel::Multiple,
        }
    }
}

/// The two ABI families an MPI library belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    OpenMpi,
    /// MPICH and its derivatives (Intel MPI, MVAPICH, Cray MPICH).
    Mpich,
}

impl Family {
    pub fn of(description: &str) -> Option<Family> {
        if description.contains("Open MPI") {
            Some(Family::OpenMpi)
        } else if ["MPICH", "MVAPICH", "Intel(R) MPI"]
            .iter()
            .any(|name| description.contains(name))
        {
            Some(Family::Mpich)
        } else {
            None
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Family::OpenMpi => "Open MPI",
            Family::Mpich => "MPICH",
        }
    }
}

/// MPI as ringlet started it; dropping it calls MPI_Finalize.
pub struct StartedMpi {
    universe: Universe,
}

impl StartedMpi {
    /// Finalize MPI, unless someone else already has. Whether MPI_Finalize was called here.
    pub fn finalize(self) -> bool {
        if mpi::is_finalized() {
            // Dropping would finalize twice.
            std::mem::forget(self.universe);
            return false;
        }
        drop(self.universe);
        true
    }
}

/// Whether MPI has been finalized (it cannot be started again then).
pub fn is_finalized() -> bool {
    mpi::is_finalized()
}

/// Whether MPI may be called now: initialized, and not yet finalized.
fn is_running() -> bool {
    mpi::is_initialized() && !mpi::is_finalized()
}

fn not_running(what: &str) -> CoreError {
    CoreError::Communication(format!(
        "{what} needs MPI initialized and not yet finalized"
    ))
}

/// Initialize MPI asking for MPI_THREAD_MULTIPLE, unless it is initialized already. Returns MPI
/// if this call started it, and the thread level it has (granted here, or to whoever started it).
pub fn initialize() -> (Option<StartedMpi>, ThreadLevel) {
    match mpi::initialize_with_threading(Threading::Multiple) {
        Some((universe, granted)) => (Some(StartedMpi { universe }), ThreadLevel::of(granted)),
        None => (None, ThreadLevel::of(mpi::environment::threading_support())),
    }
}

/// Where ringlet's communicator comes from.
pub enum Parent {
    World,
    /// A Fortran handle (`MPI_Comm_c2f`), which is how mpi4py hands out communicators portably
    /// across MPI libraries (`Comm.py2f()`).
    Fortran(i64),
}

/// A parent communicator's handle, checked not to be MPI_COMM_NULL.
pub struct ParentHandle(ffi::MPI_Comm);

impl Parent {
    /// Its C handle. MPI must be running; a Fortran handle must be one of a live communicator
    /// (the Python layer passes only `py2f()` of a live mpi4py communicator).
    pub fn handle(&self) -> Result<ParentHandle> {
        if !is_running() {
            return Err(not_running("reading a communicator's handle"));
        }
        // SAFETY: MPI is running (checked above); this reads the predefined COMM_WORLD handle,
        // or converts a Fortran handle, which any value may be passed to.
        let handle = unsafe {
            match self {
                Parent::World => ffi::RSMPI_COMM_WORLD,
                Parent::Fortran(fortran) => {
                    let fint = ffi::RSMPI_Fint::try_from(*fortran).map_err(|_| {
                        CoreError::InvalidArgument(format!("{fortran} is not a Fortran handle"))
                    })?;
                    ffi::RSMPI_Comm_f2c(fint)
                }
            }
        };
        // SAFETY: reading a predefined handle constant.
        if handle == unsafe { ffi::RSMPI_COMM_NULL } {
            return Err(CoreError::InvalidArgument(
                "the communicator is MPI_COMM_NULL".into(),
            ));
        }
        Ok(ParentHandle(handle))
    }
}

impl ParentHandle {
    /// A duplicate of the communicator for ringlet's own use. Collective over it.
    pub fn duplicate(&self) -> Result<MpiTransport> {
        if !is_running() {
            return Err(not_running("MPI_Comm_dup"));
        }
        // SAFETY: MPI is running (checked above) and the handle is a live communicator, not
        // MPI_COMM_NULL (see `Parent::handle`).
        unsafe { MpiTransport::duplicate(self.0) }
    }
}

/// The number of processes MPI_COMM_WORLD holds.
pub fn world_size() -> Result<usize> {
    if !is_running() {
        return Err(not_running("MPI_Comm_size"));
    }
    let mut size = 0;
    // SAFETY: MPI is running (checked above); `size` is a live local.
    let code = unsafe { ffi::MPI_Comm_size(ffi::RSMPI_COMM_WORLD, &mut size) };
    check(code, "MPI_Comm_size")?;
    Ok(size.max(0) as usize)
}

/// The MPI ringlet's C shim was compiled against, e.g. "Open MPI 4.1.4" or "MPICH 4.0.2".
pub fn built_with() -> String {
    // SAFETY: the shim returns a pointer to a NUL-terminated string literal.
    let text = unsafe { CStr::from_ptr(ringlet_mpi_built_with()) };
    text.to_string_lossy().into_owned()
}

/// The MPI library's own description of itself, e.g. "Open MPI v4.1.4, ...".
pub fn library_version() -> Result<String> {
    let mut text = vec![0u8; ffi::MPI_MAX_LIBRARY_VERSION_STRING as usize + 1];
    let mut len = 0;
    // SAFETY: `text` has room for MPI_MAX_LIBRARY_VERSION_STRING bytes; callable before init.
    let code = unsafe { ffi::MPI_Get_library_version(text.as_mut_ptr().cast(), &mut len) };
    check(code, "MPI_Get_library_version")?;
    text.truncate(len.max(0) as usize);
    Ok(String::from_utf8_lossy(&text)
        .trim_end_matches('\0')
        .trim_end()
        .to_string())
}

/// This process's host, as MPI names it (falls back to "unknown").
pub fn processor_name() -> String {
    if !is_running() {
        return "unknown".into();
    }
    let mut name = vec![0u8; ffi::MPI_MAX_PROCESSOR_NAME as usize + 1];
    let mut len: c_int = 0;
    // SAFETY: `name` has room for MPI_MAX_PROCESSOR_NAME bytes; MPI is running (checked above).
    let code = unsafe { ffi::MPI_Get_processor_name(name.as_mut_ptr().cast(), &mut len) };
    if check(code, "MPI_Get_processor_name").is_err() {
        return "unknown".into();
    }
    name.truncate(len.max(0) as usize);
    String::from_utf8_lossy(&name).into_owned()
}
