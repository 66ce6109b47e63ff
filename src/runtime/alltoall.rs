//! `alltoall`: rank r sends `splits[q]` rows of its array to each rank q (in rank order) and
//! gets back, concatenated in rank order, the rows every rank sent it. The row shape and the
//! dtype must agree between ranks; the splits may not (each rank learns what it receives).

use super::allgather::Gathered;
use super::call::{Call, Element, Kind, Shape};
use super::communicator::Communicator;
use super::process::{self, SetId};
use super::registered::first_or_named;
use crate::error::{CoreError, Result};
use crate::schedules::{Alltoall, ALLTOALL};
use crate::worker;
use std::ops::Range;

/// Send `input` (an array of `dtype`, `itemsize` bytes per element, and `shape`) in `splits`
/// rows per rank, after any queued work; the result's `counts` are the rows received from
/// each rank.
pub fn alltoall(
    input: &[u8],
    dtype: &str,
    itemsize: usize,
    shape: &[usize],
    splits: &[usize],
    algorithm: &str,
    set: SetId,
) -> Result<Gathered> {
    let thread = process::caller_for("alltoall")?;
    worker::run_in_order(|| {
        process::with_communicator(set, |comm| {
            alltoall_on(
                comm, input, dtype, itemsize, shape, splits, algorithm, thread,
            )
        })
    })
}

#[allow(clippy::too_many_arguments)]
pub fn alltoall_on(
    comm: &Communicator,
    input: &[u8],
    dtype: &str,
    itemsize: usize,
    shape: &[usize],
    splits: &[usize],
    algorithm: &str,
    thread: u64,
) -> Result<Gathered> {
    let chosen = first_or_named(ALLTOALL, algorithm).and_then(|schedule| {
        check(input, itemsize, shape, splits, comm.size())?;
        Ok(schedule)
    });
    let call = Call {
        element: Element::Named(dtype),
        shape: Shape::Rows(shape),
        algorithm: chosen.as_ref().map_or("-", |s| s.name()),
        ..Call::new(Kind::Alltoall, thread)
    };
    let schedule = match chosen {
        Ok(schedule) => schedule,
        Err(error) => return comm.refuse(&call, error),
    };
    comm.begin(&call, None)?;
    let counts = received_counts(comm, schedule, splits)?;
    let row_bytes = itemsize * shape[1..].iter().product::<usize>();
    let send_blocks = consecutive(splits, row_bytes);
    let recv_blocks = consecutive(&counts, row_bytes);
    let bytes = recv_blocks.last().map_or(0, |b| b.end);
    let mut storage = vec![0u64; bytes.div_ceil(8)];
    let recv: &mut [u8] = &mut bytemuck::cast_slice_mut(&mut storage)[..bytes];
    schedule.run(comm.transport(), input, &send_blocks, recv, &recv_blocks)?;
    Ok(Gathered {
        storage,
        bytes,
        counts,
    })
}

/// What each rank sends this one: the same algorithm on one 8-byte count per pair.
fn received_counts(
    comm: &Communicator,
    schedule: &dyn Alltoall,
    splits: &[usize],
) -> Result<Vec<usize>> {
    let sent: Vec<u64> = splits.iter().map(|&s| s as u64).collect();
    let mut received = vec![0u64; splits.len()];
    let blocks = consecutive(&vec![1; splits.len()], 8);
    schedule.run(
        comm.transport(),
        bytemuck::cast_slice(&sent),
        &blocks,
        bytemuck::cast_slice_mut(&mut received),
        &blocks,
    )?;
    Ok(received.into_iter().map(|c| c as usize).collect())
}

/// Byte ranges of `rows[i]` rows each, one after another.
fn consecutive(rows: &[usize], row_bytes: usize) -> Vec<Range<usize>> {
    let mut start = 0;
    rows.iter()
        .map(|&r| {
            let block = start..start + r * row_bytes;
            start = block.end;
            block
        })
        .collect()
}

fn check(input: &[u8], itemsize: usize, shape: &[usize], splits: &[usize], n: usize) -> Result<()> {
    if shape.is_empty() {
        return Err(CoreError::InvalidArgument(
            "alltoall needs an array of at least one dimension (the one it splits)".into(),
        ));
    }
    if splits.len() != n {
        return Err(CoreError::InvalidArgument(format!(
            "alltoall needs one split per rank ({n}), got {} splits",
            splits.len()
        )));
    }
    let total: usize = splits.iter().sum();
    if total != shape[0] {
        return Err(CoreError::InvalidArgument(format!(
            "alltoall splits {splits:?} add up to {total} rows, but the array has {}",
            shape[0]
        )));
    }
    if itemsize == 0 || input.len() != itemsize * shape.iter().product::<usize>() {
        return Err(CoreError::InvalidArgument(format!(
            "internal: {} bytes for shape {shape:?} of {itemsize}-byte elements",
            input.len()
        )));
    }
    Ok(())
}
