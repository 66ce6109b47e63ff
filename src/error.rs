//! One error type for the whole core. The bindings map each kind to a Python exception.

use std::fmt;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CoreError {
    /// A bad argument: wrong length, unknown name, misaligned buffer. Python sees `ValueError`.
    InvalidArgument(String),
    /// A dtype the core cannot reduce. Python sees `TypeError`.
    UnsupportedDtype(String),
    /// MPI (or the in-process transport) failed, or MPI is not usable. Python sees `RingletError`.
    Communication(String),
    /// A process of the communicator died, or another rank revoked the communicator because one
    /// did (ULFM, Open MPI 5 under `--with-ft ulfm`): the communicator is unusable; its survivors
    /// can shrink it and go on. Python sees `ProcessFailedError`.
    ProcessFailed(String),
    /// Ranks disagree on the collective they are in. Python sees `MismatchError`.
    Mismatch(String),
    /// A schedule's first meeting found that the ranks' calls differ; the runtime then works
    /// out how (a `Mismatch`, or ranks that have joined). Never leaves the runtime.
    Unsettled,
}

impl fmt::Display for CoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CoreError::InvalidArgument(msg)
            | CoreError::UnsupportedDtype(msg)
            | CoreError::Communication(msg)
            | CoreError::ProcessFailed(msg)
            | CoreError::Mismatch(msg) => f.write_str(msg),
            CoreError::Unsettled => f.write_str("internal: the ranks' calls differ"),
        }
    }
}

impl std::error::Error for CoreError {}

pub type Result<T> = std::result::Result<T, CoreError>;
