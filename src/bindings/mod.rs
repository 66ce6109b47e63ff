//! `ringlet._core`: thin pyo3 wrappers. Parse arguments, release the GIL, call the core, map
//! errors. No algorithm lives here.

use crate::dtype::{DType, ReduceOp};
use crate::error::CoreError;
use crate::runtime::{self, Parent};
use crate::schedules;
use numpy::PyReadwriteArray1;
use pyo3::create_exception;
use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use std::panic::{catch_unwind, AssertUnwindSafe};

create_exception!(
    ringlet._core,
    RingletError,
    PyRuntimeError,
    "A collective failed: MPI reported an error, or ringlet is not usable in this process."
);

impl From<CoreError> for PyErr {
    fn from(error: CoreError) -> PyErr {
        match error {
            CoreError::InvalidArgument(msg) => PyValueError::new_err(msg),
            CoreError::UnsupportedDtype(msg) => PyTypeError::new_err(msg),
            CoreError::Communication(msg) => RingletError::new_err(msg),
        }
    }
}

/// Run `f` without the GIL and turn a panic into `RingletError`: no Rust panic reaches Python.
fn detached<T: Send>(
    py: Python<'_>,
    f: impl FnOnce() -> Result<T, CoreError> + Send,
) -> PyResult<T> {
    match py.detach(|| catch_unwind(AssertUnwindSafe(f))) {
        Ok(result) => result.map_err(PyErr::from),
        Err(panic) => {
            let reason = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            Err(RingletError::new_err(format!(
                "internal error in ringlet's core: {reason}"
            )))
        }
    }
}

/// Initialize MPI if needed and duplicate `comm_fortran_handle` (from mpi4py's `Comm.py2f()`)
/// or MPI_COMM_WORLD for ringlet. Returns (ringlet initialized MPI, granted thread level).
#[pyfunction]
#[pyo3(signature = (comm_fortran_handle=None))]
fn init(py: Python<'_>, comm_fortran_handle: Option<i64>) -> PyResult<(bool, &'static str)> {
    let parent = comm_fortran_handle.map_or(Parent::World, Parent::Fortran);
    let info = detached(py, || runtime::init(parent))?;
    Ok((info.owns_mpi, info.thread_level))
}

#[pyfunction]
fn is_initialized() -> bool {
    runtime::is_initialized()
}

#[pyfunction]
fn shutdown(py: Python<'_>) -> PyResult<()> {
    detached(py, || {
        runtime::shutdown();
        Ok(())
    })
}

/// Free ringlet's communicator and finalize MPI if ringlet initialized it. Registered with
/// `atexit`; returns whether MPI_Finalize ran.
#[pyfunction]
fn finalize(py: Python<'_>) -> PyResult<bool> {
    detached(py, || Ok(runtime::finalize()))
}

#[pyfunction]
fn rank(py: Python<'_>) -> PyResult<usize> {
    detached(py, || {
        runtime::with_transport(|t| Ok(crate::transport::Transport::rank(t)))
    })
}

#[pyfunction]
fn size(py: Python<'_>) -> PyResult<usize> {
    detached(py, || {
        runtime::with_transport(|t| Ok(crate::transport::Transport::size(t)))
    })
}

#[pyfunction]
fn barrier(py: Python<'_>) -> PyResult<()> {
    detached(py, || runtime::with_transport(|t| t.barrier()))
}

#[pyfunction]
fn mpi_library_version(py: Python<'_>) -> PyResult<String> {
    detached(py, runtime::library_version)
}

/// Split messages above this many bytes (default 2^31 - 1, MPI's count limit).
#[pyfunction]
fn set_max_message_bytes(py: Python<'_>, limit: usize) -> PyResult<()> {
    detached(py, || {
        runtime::with_transport(|t| {
            t.set_max_message_bytes(limit);
            Ok(())
        })
    })
}

#[pyfunction]
fn max_message_bytes(py: Python<'_>) -> PyResult<usize> {
    detached(py, || {
        runtime::with_transport(|t| Ok(t.max_message_bytes()))
    })
}

/// Allreduce `buf` in place. `buf` is the array's bytes (a 1-D uint8 view of a C-contiguous
/// array); `dtype` names what they hold.
#[pyfunction]
fn allreduce(
    py: Python<'_>,
    mut buf: PyReadwriteArray1<'_, u8>,
    dtype: &str,
    op: &str,
    algorithm: &str,
) -> PyResult<()> {
    let dtype = DType::from_name(dtype)?;
    let op = ReduceOp::from_name(op)?;
    let schedule = schedules::by_name(algorithm)?;
    let bytes = buf
        .as_slice_mut()
        .map_err(|e| PyValueError::new_err(format!("allreduce needs a contiguous buffer: {e}")))?;
    detached(py, || {
        runtime::with_transport(|t| schedules::allreduce(t, schedule, bytes, dtype, op))
    })
}

/// Segment size of the pipelined ring; every rank must use the same value.
#[pyfunction]
fn set_segment_bytes(bytes: usize) {
    schedules::pipelined_ring::set_segment_bytes(bytes);
}

#[pyfunction]
fn segment_bytes() -> usize {
    schedules::pipelined_ring::segment_bytes()
}

/// The SIMD level the reduction kernels run at: "generic", "avx2" or "avx512".
#[pyfunction]
fn kernel_level() -> &'static str {
    crate::kernels::Level::active().name()
}

#[pyfunction]
fn algorithms() -> Vec<&'static str> {
    schedules::SCHEDULES.iter().map(|s| s.name()).collect()
}

#[pyfunction]
fn dtypes() -> Vec<&'static str> {
    DType::ALL.iter().map(|d| d.name()).collect()
}

#[pyfunction]
fn ops() -> Vec<&'static str> {
    ReduceOp::ALL.iter().map(|op| op.name()).collect()
}

#[pymodule(gil_used = true)]
mod _core {
    #[pymodule_export]
    use super::{
        algorithms, allreduce, barrier, dtypes, finalize, init, is_initialized, kernel_level,
        max_message_bytes, mpi_library_version, ops, rank, segment_bytes, set_max_message_bytes,
        set_segment_bytes, shutdown, size, RingletError,
    };
}
