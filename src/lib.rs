//! ringlet's core: collectives over MPI point-to-point, for data-parallel training.
//!
//! Layers, bottom up; each imports only from the layers below it:
//! - [`transport`]: byte messages between ranks; over MPI, or threads in one process for tests.
//! - [`kernels`]: element-wise reductions per dtype and op.
//! - [`schedules`]: the algorithms, one file each, registered with their cost model.
//! - [`runtime`]: one function per collective (validate, agree, run, record), the
//!   communicator's state, MPI initialization; [`worker`]: the background thread that runs
//!   queued collectives in order; [`auto`]: the decision table behind `algorithm="auto"`.
//! - [`simulate`]: the schedules' own code on virtual ranks, timed on a network model.
//! - `bindings`: the thin pyo3 module `ringlet._core`.

pub mod auto;
pub mod dtype;
pub mod error;
pub mod kernels;
pub mod probe;
pub mod runtime;
pub mod schedules;
pub mod scratch;
pub mod simulate;
pub mod stats;
pub mod transport;
pub mod worker;

mod bindings;
