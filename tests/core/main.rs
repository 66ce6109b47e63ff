//! The core's integration tests, one binary with a module per subject: the crate's tests are
//! compiled and linked once, not once per file. `cargo test --test core schedules::` runs one
//! module's tests; `kernel_cap.rs` stays a binary of its own, as it caps the kernels for its
//! whole process.

mod common;

mod cluster;
mod collectives;
mod kernels;
mod properties;
mod readme;
mod reduce;
mod runtime;
mod schedules;
mod shm;
mod simulate;
