//! `Doorbell`: a rank wakes the other ranks' waits (see `runtime::doorbell`).

use super::errors::detached;
use crate::runtime::doorbell::{self, Doorbell as Core};
use crate::runtime::process::SetId;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use std::sync::Arc;
use std::time::Duration;

/// A doorbell over a process set's ranks: `ring(value)` wakes every other member's `wait`;
/// `wait(timeout)` returns the largest value rung since the last wait, or None when
/// interrupted (`interrupt()`, from another thread of this rank) or after `timeout` seconds.
#[pyclass(frozen, module = "ringlet._core")]
pub struct Doorbell {
    inner: Arc<Core>,
}

#[pymethods]
impl Doorbell {
    fn ring(&self, py: Python<'_>, value: u64) -> PyResult<()> {
        let inner = self.inner.clone();
        detached(py, move || inner.ring(value))
    }

    fn wait(&self, py: Python<'_>, timeout: f64) -> PyResult<Option<u64>> {
        let limit = Duration::try_from_secs_f64(timeout).map_err(|_| {
            PyValueError::new_err(format!(
                "timeout={timeout}: a number of seconds, at least 0, is accepted"
            ))
        })?;
        let inner = self.inner.clone();
        detached(py, move || inner.wait(limit))
    }

    fn interrupt(&self) {
        self.inner.interrupt();
    }

    fn close(&self) {
        self.inner.close();
    }
}

/// Open a doorbell over `process_set` (collective over its members; needs
/// MPI_THREAD_MULTIPLE).
#[pyfunction]
#[pyo3(signature = (process_set = 0))]
pub fn open_doorbell(py: Python<'_>, process_set: SetId) -> PyResult<Doorbell> {
    let inner = detached(py, || doorbell::open(process_set))?;
    Ok(Doorbell { inner })
}
