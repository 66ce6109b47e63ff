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

create_exception!(
    ringlet._core,
    ProcessFailedError,
    RingletError,
    "A rank of the communicator died (or the communicator was revoked because one did), under \
     MPI's fault tolerance (ULFM): the survivors can go on without it (ringlet.elastic.run)."
);

/// The Python exception a core error becomes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PyKind {
    Value,
    Type,
    Ringlet,
    ProcessFailed,
    Mismatch,
}

impl PyKind {
    pub fn of(error: &CoreError) -> Self {
        match error {
            CoreError::InvalidArgument(_) => PyKind::Value,
            CoreError::UnsupportedDtype(_) => PyKind::Type,
            CoreError::Communication(_) => PyKind::Ringlet,
            CoreError::ProcessFailed(_) => PyKind::ProcessFailed,
            CoreError::Mismatch(_) | CoreError::Unsettled => PyKind::Mismatch,
        }
    }

    /// The exception's name, as `ringlet` exports it (XLA errors carry it, see `xla`).
    pub fn name(self) -> &'static str {
        match self {
            PyKind::Value => "ValueError",
            PyKind::Type => "TypeError",
            PyKind::Ringlet => "RingletError",
            PyKind::ProcessFailed => "ProcessFailedError",
            PyKind::Mismatch => "MismatchError",
        }
    }
}

impl From<CoreError> for PyErr {
    fn from(error: CoreError) -> PyErr {
        let message = error.to_string();
        match PyKind::of(&error) {
            PyKind::Value => PyValueError::new_err(message),
            PyKind::Type => PyTypeError::new_err(message),
            PyKind::Ringlet => RingletError::new_err(message),
            PyKind::ProcessFailed => ProcessFailedError::new_err(message),
            PyKind::Mismatch => MismatchError::new_err(message),
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
