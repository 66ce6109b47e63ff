//! Arrays in the node's shared memory (`ringlet.empty`). Allocating one is collective, so it is
//! checked like any collective call; before each allocation the ranks free, together, the
//! arrays that every one of them has dropped (`MPI_Win_free` is collective, so an array
//! dropped on one rank only waits for the others).

use super::call::{Call, Element, Kind, Shape};
use super::communicator::Communicator;
use super::consistency::gather_blobs;
use super::process::{self, SetId};
use crate::error::{CoreError, Result};
use crate::worker;

pub use crate::transport::shm::SharedArray;

/// Whether process set `set` has shared memory; if not, why not, and whether to warn.
pub fn status(set: SetId) -> Result<(bool, String, bool)> {
    process::shared_memory(set)
}

/// A zeroed array of `nbytes` in shared memory, on every rank of process set `set` (after any
/// queued work).
pub fn allocate(nbytes: usize, set: SetId) -> Result<SharedArray> {
    let thread = process::caller_for("shared memory")?;
    worker::run_in_order(|| {
        process::with_communicator(set, |comm| allocate_on(comm, nbytes, thread))
    })
}

/// Check, free what every rank dropped, allocate.
pub fn allocate_on(comm: &Communicator, nbytes: usize, thread: u64) -> Result<SharedArray> {
    let dims = [nbytes];
    let call = Call {
        element: Element::Named("uint8"),
        shape: Shape::Array(&dims),
        ..Call::new(Kind::Allocate, thread)
    };
    let transport = comm.transport();
    let Some(shared) = transport.shared() else {
        let why = process::shared_memory(process::WORLD)
            .map(|(_, why, _)| why)
            .unwrap_or_default();
        let error = CoreError::InvalidArgument(format!(
            "this communicator has no shared memory ({why}); ringlet.empty returns ordinary \
             arrays there"
        ));
        return comm.refuse(&call, error);
    };
    comm.begin(&call, None)?;
    let dropped: Vec<u8> = shared
        .dropped()
        .iter()
        .flat_map(|id| id.to_le_bytes())
        .collect();
    let everyone = gather_blobs(transport, &dropped)?;
    let ids = |blob: &Vec<u8>| -> Vec<u64> {
        blob.chunks_exact(8)
            .filter_map(|c| c.try_into().ok().map(u64::from_le_bytes))
            .collect()
    };
    let mut common = ids(&everyone[0]);
    for blob in &everyone[1..] {
        let theirs = ids(blob);
        common.retain(|id| theirs.contains(id));
    }
    shared.free(&common)?;
    shared.allocate(transport, nbytes)
}
