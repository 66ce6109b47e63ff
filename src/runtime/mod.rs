//! The runtime: one function per collective, each owning the whole path of a call: validate
//! the arguments, describe the call, agree on it with the other ranks, run the algorithm
//! (after any queued work), record it. The bindings call these and nothing below them.
//!
//! Each collective also has an `_on` form that takes the communicator explicitly, which is
//! how the tests run the runtime on in-process ranks.
//!
//! - [`call`]: what a rank is about to do; [`consistency`]: agreeing on it;
//!   [`stall`]: the stall inspector; [`communicator`]: the per-communicator state.
//! - [`doorbell`]: not a collective: a rank wakes the others' waits (`ringlet.hvd`'s idle
//!   negotiation).
//! - [`process`]: MPI initialization, ringlet's communicator, finalization;
//!   [`mpi_library`]: which MPI this is, and the checks that refuse a mixed one.

pub mod allgather;
pub mod allreduce;
pub mod alltoall;
pub mod broadcast;
pub mod buffer;
pub mod call;
pub mod communicator;
pub mod consistency;
pub mod doorbell;
pub mod grouped_allreduce;
pub mod join;
pub mod mpi_library;
pub mod process;
pub mod reduce;
pub mod reduce_scatter;
pub mod registered;
pub mod replay;
pub mod selection;
pub mod shared;
pub mod stall;

// The types that the runtime's functions take and return from below it, named here so that
// the bindings reach nothing else. Only functions and types: never a module of another layer.
pub use crate::dtype::{DType, ReduceOp};
pub use crate::simulate::network::{Link, Network, Outcome};
pub use crate::stats::Usage;
pub use crate::worker::{Completion, Queued};

use crate::dtype::names;
use crate::error::{CoreError, Result};
use crate::kernels::Level;
use crate::schedules::{self, Algorithm, Support, Tuning};
pub use crate::schedules::{Cost, Tiered};
use crate::transport::Nodes;
use crate::{probe, worker};
use call::{Call, Kind};
use communicator::Communicator;
pub use communicator::Settings;
pub use probe::Tier;
use process::{SetId, WORLD};
use registered::registry;

/// Close the doorbells, then free ringlet's communicator (see [`process::shutdown`]).
pub fn shutdown() {
    doorbell::close_all();
    process::shutdown();
}

/// Close the doorbells, free the communicators and finalize MPI if ringlet started it (see
/// [`process::finalize`]).
pub fn finalize() -> bool {
    doorbell::close_all();
    process::finalize()
}

/// Wait until every rank has called it (after any queued work).
pub fn barrier(set: SetId) -> Result<()> {
    let thread = process::caller_for("barrier")?;
    worker::run_in_order(|| process::with_communicator(set, |comm| barrier_on(comm, thread)))
}

/// Add a process set of `ranks` (after any queued work); see [`process::add_process_set`].
pub fn add_process_set(ranks: &[usize]) -> Result<SetId> {
    worker::run_in_order(|| process::add_process_set(ranks))
}

pub fn barrier_on(comm: &Communicator, thread: u64) -> Result<()> {
    comm.begin(&Call::new(Kind::Barrier, thread), None)?;
    schedules::barrier::dissemination::barrier(comm.transport())
}

/// A collective of `kind` that the caller refused before it reached the runtime (bad
/// arguments): take part in its check anyway, so that the ranks stay in step. The other ranks
/// get `MismatchError` naming `reason` unless they refused too; the caller raises its own error.
pub fn refuse(kind: &str, reason: String, set: SetId) -> Result<()> {
    let thread = process::caller_for(kind)?;
    let kind = Kind::from_name(kind)?;
    worker::run_in_order(|| {
        process::with_communicator(set, |comm| {
            // The caller raises its own exception; this one only says the same thing.
            let _ = comm.refuse::<()>(&Call::new(kind, thread), CoreError::InvalidArgument(reason));
            Ok(())
        })
    })
}

/// How waiting threads poll MPI (local to this process; see
/// [`crate::transport::waiting`]).
pub use crate::transport::waiting::{set_wait_policy, wait_policy};

/// The communicator's settings.
pub fn settings() -> Result<Settings> {
    process::with_communicator(WORLD, |comm| Ok(comm.settings()))
}

/// Whether every collective is checked with the other ranks first (`RINGLET_CHECK`).
pub fn is_checked() -> Result<bool> {
    process::with_communicator(WORLD, |comm| Ok(comm.is_checked()))
}

/// Change the settings of ringlet's communicator and its process sets, after every collective
/// already queued: those run with the settings they were called under, on every rank alike.
pub fn update_settings(change: impl FnOnce(&mut Settings) + Send) -> Result<Settings> {
    worker::run_in_order(|| process::update_settings(change))
}

/// Rank, size and each rank's host, in process set `set`.
pub fn group(set: SetId) -> Result<(usize, usize, Vec<String>)> {
    process::with_communicator(set, |comm| {
        Ok((comm.rank(), comm.size(), comm.hosts().to_vec()))
    })
}

/// The names of a collective's algorithms, in registry order.
pub fn algorithms(collective: &str) -> Result<Vec<&'static str>> {
    Ok(registry(collective)?.iter().map(|a| a.name()).collect())
}

fn find_algorithm(collective: &str, name: &str) -> Result<&'static dyn Algorithm> {
    let all = registry(collective)?;
    all.iter()
        .copied()
        .find(|a| a.name() == name)
        .ok_or_else(|| {
            CoreError::InvalidArgument(format!(
                "unknown {collective} algorithm {name:?}; accepted: {}",
                names(all.iter().map(|a| a.name()))
            ))
        })
}

/// Whether `name` can reduce `dtype` with `op`: ("full" | "own_arithmetic" | "no", reason).
pub fn support(
    collective: &str,
    name: &str,
    dtype: DType,
    op: ReduceOp,
) -> Result<(&'static str, &'static str)> {
    Ok(match find_algorithm(collective, name)?.support(dtype, op) {
        Support::Full => ("full", ""),
        Support::OwnArithmetic(reason) => ("own_arithmetic", reason),
        Support::No(reason) => ("no", reason),
    })
}

/// Why algorithm `name` cannot run on process set `set`, if it cannot.
pub fn unavailable(collective: &str, name: &str, set: SetId) -> Result<Option<String>> {
    let algorithm = find_algorithm(collective, name)?;
    process::with_communicator(set, |comm| Ok(algorithm.unavailable(comm.transport())))
}

/// `Err` naming the algorithms that can, unless `name` ("auto" or registered) can reduce
/// `dtype` with `op`.
pub fn check_algorithm(collective: &str, name: &str, dtype: DType, op: ReduceOp) -> Result<()> {
    let all = registry(collective)?;
    if name == "auto" {
        return Ok(());
    }
    let algorithm = find_algorithm(collective, name)?;
    schedules::check_support(&all, algorithm, dtype, op)
}

/// `name`'s cost for `bytes` on ranks that run on the nodes `nodes` (one label per rank; equal
/// labels share a node), with the communicator's settings (the defaults before `init`).
pub fn cost(collective: &str, name: &str, nodes: &[usize], bytes: usize) -> Result<Tiered> {
    let tuning = process::with_communicator(WORLD, |comm| Ok(comm.settings().tuning))
        .unwrap_or_else(|_| Tuning::default());
    let nodes = if nodes.is_empty() {
        Nodes::single(1)
    } else {
        Nodes::from_labels(nodes)
    };
    Ok(find_algorithm(collective, name)?.cost_on(&nodes, bytes, &tuning))
}

/// What `auto` learned online on process set `set` ([`crate::auto::Refiner::report`]).
pub fn refinements(set: SetId) -> Result<Vec<Refinement>> {
    process::with_communicator(set, |comm| Ok(comm.refiner().report()))
}

pub use crate::auto::Refinement;

/// Each rank's node in process set `set` (numbered by their lowest rank), as the MPI library
/// groups them.
pub fn nodes(set: SetId) -> Result<Vec<usize>> {
    process::with_communicator(set, |comm| Ok(comm.transport().nodes().labels().to_vec()))
}

/// This rank's median seconds to exchange `nbytes` with its partner on `tier`. Collective.
pub fn measure_sendrecv(nbytes: usize, repeats: usize, tier: Tier) -> Result<f64> {
    worker::run_in_order(|| {
        process::with_communicator(WORLD, |comm| {
            probe::sendrecv_seconds(comm.transport(), nbytes, repeats, tier)
        })
    })
}

/// Median seconds to combine `nbytes` of `dtype` (sum) in cache. Local.
pub fn measure_combine(dtype: DType, nbytes: usize, repeats: usize) -> Result<f64> {
    probe::combine_seconds(dtype, nbytes, repeats)
}

/// The SIMD level the reduction kernels run at: "generic", "avx2" or "avx512".
pub fn kernel_level() -> &'static str {
    Level::active().name()
}

/// One simulated `collective` of `bytes` with `algorithm` on ranks placed on the nodes
/// `labels`, timed on `network` ([`crate::simulate::simulate_placed`]). Local.
pub fn simulate(
    collective: &str,
    algorithm: &str,
    labels: &[usize],
    bytes: usize,
    node_major: bool,
    network: &Network,
) -> Result<Outcome> {
    crate::simulate::simulate_placed(collective, algorithm, labels, bytes, node_major, network)
}

/// The algorithms the simulator can run for `collective`.
pub fn simulated_algorithms(collective: &str) -> Result<Vec<&'static str>> {
    crate::simulate::algorithms(collective)
}

/// Per algorithm, this process's usage since the last reset.
pub fn stats() -> Vec<(&'static str, Usage)> {
    crate::stats::snapshot()
}

/// Start [`stats`] over from zero (this process only).
pub fn reset_stats() {
    crate::stats::reset();
}

/// Count collectives in [`stats`] or not (calibration's own traffic is not the user's).
pub fn set_stats_enabled(enabled: bool) {
    crate::stats::set_enabled(enabled);
}

/// Hooks for tests of the failure paths that correct code never takes.
#[cfg(feature = "test-hooks")]
pub mod testing {
    use super::{process, worker};
    use crate::error::{CoreError, Result};

    /// A real panic: on the caller's thread, or in a queued job on the background thread.
    pub fn panic(in_background: bool) -> Result<()> {
        if in_background {
            let completion = worker::submit(Box::new(|| panic!("a test asked for a panic")))?;
            return completion.wait();
        }
        panic!("a test asked for a panic")
    }

    /// Rank 0 sends `sent` bytes to rank 1, which expects `expected`: a message of the wrong
    /// length, which the transport must report. Needs at least 2 ranks; the others do nothing.
    pub fn wrong_length_message(sent: usize, expected: usize) -> Result<()> {
        process::with_communicator(process::WORLD, |comm| {
            let transport = comm.transport();
            if transport.size() < 2 {
                return Err(CoreError::InvalidArgument("needs at least 2 ranks".into()));
            }
            match transport.rank() {
                0 => transport.isend(&vec![7u8; sent], 1)?.wait(),
                1 => {
                    let mut buf = vec![0u8; sent.max(expected)];
                    let received = transport.irecv_into(&mut buf, expected, 0)?.wait();
                    received
                }
                _ => Ok(()),
            }
        })
    }
}
