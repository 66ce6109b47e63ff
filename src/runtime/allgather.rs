//! `allgather`: every rank's array, concatenated along the first dimension in rank order. The
//! first dimension may differ between ranks; the other dimensions and the dtype may not.

use super::buffer::Buffer;
use super::call::{Call, Element, Kind, Shape};
use super::communicator::Communicator;
use super::process::{self, SetId};
use super::registered::cheapest_or_named;
use crate::error::{CoreError, Result};
use crate::schedules::{self, Allgather, ALLGATHER};
use crate::worker::{self, Queued};
use std::any::Any;

/// The gathered array: `bytes` bytes at the start of `storage` (8-byte aligned, for any
/// dtype), `counts[r]` rows from rank r.
pub struct Gathered {
    pub storage: Vec<u64>,
    pub bytes: usize,
    pub counts: Vec<usize>,
}

/// Gather `input` (an array of `dtype`, `itemsize` bytes per element, and `shape`) from every
/// rank, after any queued work.
pub fn allgather(
    input: &[u8],
    dtype: &str,
    itemsize: usize,
    shape: &[usize],
    algorithm: &str,
    set: SetId,
) -> Result<Gathered> {
    let thread = process::caller_for("allgather")?;
    worker::run_in_order(|| {
        process::with_communicator(set, |comm| {
            allgather_on(comm, input, dtype, itemsize, shape, algorithm, thread)
        })
    })
}

/// Queue an allgather of `input` (see [`allgather`]); its result is in the handle once done.
///
/// # Safety
/// `input` must point at live memory that `keepalive` keeps alive and that nobody writes
/// until the completion is done.
pub unsafe fn allgather_async(
    input: Buffer,
    dtype: String,
    itemsize: usize,
    shape: Vec<usize>,
    algorithm: String,
    set: SetId,
    keepalive: Box<dyn Any + Send>,
) -> Result<Queued<Gathered>> {
    let thread = process::caller_for("allgather")?;
    worker::submit_for_result(move || {
        // SAFETY: the caller's contract.
        let input = unsafe { input.bytes() };
        let outcome = process::with_communicator(set, |comm| {
            allgather_on(comm, input, &dtype, itemsize, &shape, &algorithm, thread)
        });
        drop(keepalive);
        outcome
    })
}

pub fn allgather_on(
    comm: &Communicator,
    input: &[u8],
    dtype: &str,
    itemsize: usize,
    shape: &[usize],
    algorithm: &str,
    thread: u64,
) -> Result<Gathered> {
    // "auto" chooses once the sizes are known (after the row counts are exchanged): the same
    // totals on every rank, so the same choice.
    let named = match algorithm {
        "auto" => Ok(None),
        name => schedules::by_name(ALLGATHER, name).map(Some),
    };
    let chosen = named.and_then(|schedule| {
        check_rows(input, itemsize, shape)?;
        Ok(schedule)
    });
    let call = Call {
        element: Element::Named(dtype),
        shape: Shape::Rows(shape),
        algorithm: match &chosen {
            Ok(Some(schedule)) => schedule.name(),
            Ok(None) => "auto",
            Err(_) => "-",
        },
        ..Call::new(Kind::Allgather, thread)
    };
    let named = match chosen {
        Ok(named) => named,
        Err(error) => return comm.refuse(&call, error),
    };
    comm.begin(&call, None)?;
    let by_size = |bytes: usize| match named {
        Some(schedule) => Ok(schedule),
        None => cheapest_or_named(ALLGATHER, "auto", comm, bytes, None),
    };
    let counts = row_counts(comm, by_size(8 * comm.size())?, shape[0])?;
    let row_bytes = itemsize * shape[1..].iter().product::<usize>();
    let mut blocks = Vec::with_capacity(counts.len());
    let mut start = 0;
    for rows in &counts {
        blocks.push(start..start + rows * row_bytes);
        start += rows * row_bytes;
    }
    let mut storage = vec![0u64; start.div_ceil(8)];
    let bytes: &mut [u8] = &mut bytemuck::cast_slice_mut(&mut storage)[..start];
    bytes[blocks[comm.rank()].clone()].copy_from_slice(input);
    by_size(start)?.run(comm.transport(), bytes, &blocks)?;
    Ok(Gathered {
        storage,
        bytes: start,
        counts,
    })
}

/// Every rank's number of rows, through the same algorithm on 8-byte blocks.
fn row_counts(comm: &Communicator, schedule: &dyn Allgather, rows: usize) -> Result<Vec<usize>> {
    let n = comm.size();
    let mut counts = vec![0u64; n];
    counts[comm.rank()] = rows as u64;
    let blocks: Vec<_> = (0..n).map(|r| 8 * r..8 * (r + 1)).collect();
    schedule.run(
        comm.transport(),
        bytemuck::cast_slice_mut(&mut counts),
        &blocks,
    )?;
    Ok(counts.into_iter().map(|c| c as usize).collect())
}

fn check_rows(input: &[u8], itemsize: usize, shape: &[usize]) -> Result<()> {
    if shape.is_empty() {
        return Err(CoreError::InvalidArgument(
            "allgather needs an array of at least one dimension (the one it concatenates)".into(),
        ));
    }
    if itemsize == 0 || input.len() != itemsize * shape.iter().product::<usize>() {
        return Err(CoreError::InvalidArgument(format!(
            "internal: {} bytes for shape {shape:?} of {itemsize}-byte elements",
            input.len()
        )));
    }
    Ok(())
}
