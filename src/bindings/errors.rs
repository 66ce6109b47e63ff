//! The exceptions of `ringlet._core`, how core errors map onto Python's, and the one way the
//! bindings call into the core: without the GIL, and with no panic crossing into Python.

use crate::error::CoreError;
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

create_exception!(
    ringlet._core,
    MismatchError,
    RingletError,
    "Ranks disagree on the collective they are in (shape, dtype, op, algorithm or order)."
);

impl From<CoreError> for PyErr {
    fn from(error: CoreError) -> PyErr {
        match error {
            CoreError::InvalidArgument(msg) => PyValueError::new_err(msg),
            CoreError::UnsupportedDtype(msg) => PyTypeError::new_err(msg),
            CoreError::Communication(msg) => RingletError::new_err(msg),
            CoreError::Mismatch(msg) => MismatchError::new_err(msg),
            CoreError::Unsettled => MismatchError::new_err(error.to_string()),
        }
    }
}

/// Run `f` without the GIL and turn a panic into `RingletError`.
pub fn detached<T: Send>(
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
