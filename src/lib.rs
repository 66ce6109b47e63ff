//! ringlet's core: collectives over MPI point-to-point, for data-parallel training.
//!
//! Its top-level modules are layers: each imports only from the layers below it. The order is
//! one table, in `docs/contributing/layers.md`, which `tests/structure/test_layers.py` reads
//! and enforces; each module's own documentation says what it is.

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
