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
/// interrupted (`interrupt()`, from another thread of this rank) or after `timeout` seconds;
/// it polls, pausing up to `longest_pause` seconds between polls.
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

    #[pyo3(signature = (timeout, longest_pause = 0.001))]
    fn wait(&self, py: Python<'_>, timeout: f64, longest_pause: f64) -> PyResult<Option<u64>> {
        let limit = seconds("timeout", timeout)?;
        let pause = seconds("longest_pause", longest_pause)?;
        let inner = self.inner.clone();
        detached(py, move || inner.wait(limit, pause))
    }

    fn interrupt(&self) {
        self.inner.interrupt();
    }

    fn close(&self) {
        self.inner.close();
    }
}

fn seconds(name: &str, value: f64) -> PyResult<Duration> {
    Duration::try_from_secs_f64(value).map_err(|_| {
        PyValueError::new_err(format!(
            "{name}={value}: a number of seconds, at least 0, is accepted"
        ))
    })
}

/// Open a doorbell over `process_set` (collective over its members; needs
/// MPI_THREAD_MULTIPLE).
#[pyfunction]
#[pyo3(signature = (process_set = 0))]
pub fn open_doorbell(py: Python<'_>, process_set: SetId) -> PyResult<Doorbell> {
    let inner = detached(py, || doorbell::open(process_set))?;
    Ok(Doorbell { inner })
}
