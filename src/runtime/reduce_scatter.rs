//! `reduce_scatter`: the element-wise reduction of an array that every rank passes (the same
//! shape everywhere), of which each rank keeps its block of rows.

use super::allreduce::check_array;
use super::buffer::Buffer;
use super::call::{Call, Element, Kind, Shape};
use super::communicator::Communicator;
use super::process::{self, SetId};
use super::registered::cheapest_or_named;
use crate::dtype::{DType, ReduceOp};
use crate::error::{CoreError, Result};
use crate::kernels::{self, Finish};
use crate::schedules::{self, Reduction, REDUCE_SCATTER};
use crate::scratch::Scratch;
use crate::worker::{self, Queued};
use std::any::Any;

/// This rank's block: `bytes` bytes at the start of `storage` (8-byte aligned).
pub struct Block {
    pub storage: Vec<u64>,
    pub bytes: usize,
}

/// Reduce `input` (an array of `shape`) over all ranks and keep rows
/// `counts[..rank].sum() .. counts[..=rank].sum()`, after any queued work.
pub fn reduce_scatter(
    input: &[u8],
    dtype: DType,
    op: ReduceOp,
    shape: &[usize],
    counts: &[usize],
    algorithm: &str,
    set: SetId,
) -> Result<Block> {
    let thread = process::caller_for("reduce_scatter")?;
    worker::run_in_order(|| {
        process::with_communicator(set, |comm| {
            reduce_scatter_on(comm, input, dtype, op, shape, counts, algorithm, thread)
        })
    })
}

/// Queue a reduce-scatter of `input` (see [`reduce_scatter`]); its block is in the handle once
/// done.
///
/// # Safety
/// `input` must point at live memory that `keepalive` keeps alive and that nobody writes
/// until the completion is done.
#[allow(clippy::too_many_arguments)]
pub unsafe fn reduce_scatter_async(
    input: Buffer,
    dtype: DType,
    op: ReduceOp,
    shape: Vec<usize>,
    counts: Vec<usize>,
    algorithm: String,
    set: SetId,
    keepalive: Box<dyn Any + Send>,
) -> Result<Queued<Block>> {
    let thread = process::caller_for("reduce_scatter")?;
    worker::submit_for_result(move || {
        // SAFETY: the caller's contract.
        let input = unsafe { input.bytes() };
        let outcome = process::with_communicator(set, |comm| {
            reduce_scatter_on(comm, input, dtype, op, &shape, &counts, &algorithm, thread)
        });
        drop(keepalive);
        outcome
    })
}

#[allow(clippy::too_many_arguments)]
pub fn reduce_scatter_on(
    comm: &Communicator,
    input: &[u8],
    dtype: DType,
    op: ReduceOp,
    shape: &[usize],
    counts: &[usize],
    algorithm: &str,
    thread: u64,
) -> Result<Block> {
    let chosen = cheapest_or_named(
        REDUCE_SCATTER,
        algorithm,
        comm,
        input.len(),
        Some((dtype, op)),
    )
    .and_then(|schedule| {
        schedules::check_support(REDUCE_SCATTER, schedule, dtype, op)?;
        check_array(input, dtype, shape)?;
        check_counts(shape, counts, comm.size())?;
        Ok(schedule)
    });
    let call = Call {
        element: Element::Typed(dtype),
        op: Some(op),
        shape: Shape::Array(shape),
        counts,
        algorithm: chosen.as_ref().map_or("-", |s| s.name()),
        ..Call::new(Kind::ReduceScatter, thread)
    };
    let schedule = match chosen {
        Ok(schedule) => schedule,
        Err(error) => return comm.refuse(&call, error),
    };
    comm.begin(&call, None)?;
    let row_bytes = dtype.size() * shape[1..].iter().product::<usize>();
    let mut blocks = Vec::with_capacity(counts.len());
    let mut start = 0;
    for rows in counts {
        blocks.push(start..start + rows * row_bytes);
        start += rows * row_bytes;
    }
    // The input stays as it was: the schedule works on a copy, in pooled scratch (warm pages,
    // not a fresh allocation of the whole array per call).
    let mut work = Scratch::new(input.len());
    let bytes = work.bytes(input.len())?;
    bytes.copy_from_slice(input);
    let ranks = comm.size();
    let folded = ranks > 1 && schedule.folds_scaling();
    let reduction = Reduction {
        ranks,
        scaled: folded,
        ..Reduction::plain(dtype, op)
    };
    schedule.run(comm.transport(), bytes, &blocks, &reduction)?;
    let mine = &mut bytes[blocks[comm.rank()].clone()];
    if op == ReduceOp::Avg && !folded {
        kernels::finish(
            dtype,
            mine,
            Finish {
                divide_by: ranks,
                multiply: 1.0,
            },
        )?;
    }
    let mut storage = vec![0u64; mine.len().div_ceil(8)];
    bytemuck::cast_slice_mut::<u64, u8>(&mut storage)[..mine.len()].copy_from_slice(mine);
    Ok(Block {
        storage,
        bytes: mine.len(),
    })
}

fn check_counts(shape: &[usize], counts: &[usize], ranks: usize) -> Result<()> {
    let Some(&rows) = shape.first() else {
        return Err(CoreError::InvalidArgument(
            "reduce_scatter needs an array of at least one dimension (the one it splits)".into(),
        ));
    };
    if counts.len() != ranks || counts.iter().sum::<usize>() != rows {
        return Err(CoreError::InvalidArgument(format!(
            "counts must give the rows of each of the {ranks} ranks and add up to the {rows} \
             rows of the array, got {counts:?}"
        )));
    }
    Ok(())
}
