//! ringlet's core: allreduce schedules over MPI point-to-point, for data-parallel training.
//!
//! Layers, bottom up (each file says more):
//! - [`transport`]: byte messages between ranks; over MPI, or threads in one process for tests.
//! - [`kernels`]: element-wise reductions per dtype and op.
//! - [`schedules`]: the algorithms (ring, halving-doubling, recursive doubling, native MPI).
//! - [`runtime`]: process-wide MPI state (init, ringlet's communicator, finalize).
//! - [`fusion`]: many arrays in few collectives (gradient averaging); [`worker`]: the
//!   background thread that runs queued collectives in order.
//! - [`auto`]: the decision table behind `algorithm="auto"`; [`probe`]: its measurements.
//! - `bindings`: the thin pyo3 module `ringlet._core`.

pub mod auto;
pub mod consistency;
pub mod dtype;
pub mod error;
pub mod fusion;
pub mod kernels;
pub mod probe;
pub mod runtime;
pub mod schedules;
pub mod stats;
pub mod transport;
pub mod worker;

mod bindings;
