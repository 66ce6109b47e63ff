//! `broadcast`: the root's array, copied into every other rank's.

use super::buffer::Buffer;
use super::call::{Call, Element, Kind, Shape};
use super::communicator::Communicator;
use super::process::{self, SetId};
use super::registered::cheapest_or_named;
use crate::error::{CoreError, Result};
use crate::schedules::BROADCAST;
use crate::worker::{self, Completion};
use std::any::Any;
use std::sync::Arc;

/// An array as the byte collectives see it: its bytes, NumPy dtype name and shape.
pub struct Array<'a> {
    pub bytes: &'a mut [u8],
    pub dtype: &'a str,
    pub shape: &'a [usize],
}

/// Broadcast `array` from `root` in place, after any queued work.
pub fn broadcast(array: Array, root: usize, algorithm: &str, set: SetId) -> Result<()> {
    let thread = process::caller_for("broadcast")?;
    worker::run_in_order(|| {
        process::with_communicator(set, |comm| {
            broadcast_on(comm, array, root, algorithm, thread)
        })
    })
}

/// Queue a broadcast of `buffer` (an array of `dtype` and `shape`) from `root`.
///
/// # Safety
/// `buffer` must point at live memory that `keepalive` keeps alive and that nobody reads or
/// writes until the completion is done.
pub unsafe fn broadcast_async(
    buffer: Buffer,
    dtype: String,
    shape: Vec<usize>,
    root: usize,
    algorithm: String,
    set: SetId,
    keepalive: Box<dyn Any + Send>,
) -> Result<Arc<Completion>> {
    let thread = process::caller_for("broadcast")?;
    worker::submit(Box::new(move || {
        // SAFETY: the caller's contract.
        let bytes = unsafe { buffer.slice() };
        let array = Array {
            bytes,
            dtype: &dtype,
            shape: &shape,
        };
        let outcome = process::with_communicator(set, |comm| {
            broadcast_on(comm, array, root, &algorithm, thread)
        });
        drop(keepalive);
        outcome
    }))
}

pub fn broadcast_on(
    comm: &Communicator,
    array: Array,
    root: usize,
    algorithm: &str,
    thread: u64,
) -> Result<()> {
    let chosen = cheapest_or_named(BROADCAST, algorithm, comm, array.bytes.len(), None).and_then(
        |schedule| {
            if root >= comm.size() {
                return Err(CoreError::InvalidArgument(format!(
                    "root {root} is outside the {} ranks (0..{})",
                    comm.size(),
                    comm.size() - 1
                )));
            }
            Ok(schedule)
        },
    );
    let call = Call {
        element: Element::Named(array.dtype),
        shape: Shape::Array(array.shape),
        root: Some(root),
        algorithm: chosen.as_ref().map_or("-", |s| s.name()),
        ..Call::new(Kind::Broadcast, thread)
    };
    let schedule = match chosen {
        Ok(schedule) => schedule,
        Err(error) => return comm.refuse(&call, error),
    };
    comm.begin(&call, None)?;
    schedule.run(comm.transport(), array.bytes, root)
}
