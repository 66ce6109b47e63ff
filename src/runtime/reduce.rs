//! `reduce`: the element-wise reduction of an array that every rank passes (the same shape
//! everywhere), delivered to one rank.

use super::allreduce::check_array;
use super::call::{Call, Element, Kind, Shape};
use super::choose;
use super::communicator::Communicator;
use super::process::{self, SetId};
use super::reduce_scatter::Block;
use crate::dtype::{DType, ReduceOp};
use crate::error::{CoreError, Result};
use crate::kernels::{self, Finish};
use crate::schedules::{self, Reduction, REDUCE};
use crate::worker;

/// Reduce `input` (an array of `shape`) over all ranks onto `root`, after any queued work:
/// `Some` of the result there, `None` elsewhere. The input is not changed.
#[allow(clippy::too_many_arguments)]
pub fn reduce(
    input: &[u8],
    dtype: DType,
    op: ReduceOp,
    shape: &[usize],
    root: usize,
    algorithm: &str,
    set: SetId,
) -> Result<Option<Block>> {
    let thread = process::caller_thread();
    worker::run_in_order(|| {
        process::with_communicator(set, |comm| {
            reduce_on(comm, input, dtype, op, shape, root, algorithm, thread)
        })
    })
}

#[allow(clippy::too_many_arguments)]
pub fn reduce_on(
    comm: &Communicator,
    input: &[u8],
    dtype: DType,
    op: ReduceOp,
    shape: &[usize],
    root: usize,
    algorithm: &str,
    thread: u64,
) -> Result<Option<Block>> {
    let ranks = comm.size();
    let chosen =
        choose(REDUCE, algorithm, comm, input.len(), Some((dtype, op))).and_then(|schedule| {
            schedules::check_support(REDUCE, schedule, dtype, op)?;
            if let Some(reason) = schedule.unavailable(comm.transport()) {
                return Err(CoreError::InvalidArgument(format!(
                    "reduce algorithm {:?} cannot run here: {reason}",
                    schedule.name()
                )));
            }
            check_array(input, dtype, shape)?;
            if root >= ranks {
                return Err(CoreError::InvalidArgument(format!(
                    "root {root} is outside the {ranks} ranks (0..{})",
                    ranks - 1
                )));
            }
            Ok(schedule)
        });
    let call = Call {
        element: Element::Typed(dtype),
        op: Some(op),
        shape: Shape::Array(shape),
        root: Some(root),
        algorithm: chosen.as_ref().map_or("-", |s| s.name()),
        ..Call::new(Kind::Reduce, thread)
    };
    let schedule = match chosen {
        Ok(schedule) => schedule,
        Err(error) => return comm.refuse(&call, error),
    };
    comm.begin(&call, None)?;
    // The schedule works on a copy (8-byte aligned for every dtype): the input stays as it was.
    let mut storage = vec![0u64; input.len().div_ceil(8)];
    let bytes: &mut [u8] = &mut bytemuck::cast_slice_mut(&mut storage)[..input.len()];
    bytes.copy_from_slice(input);
    if ranks > 1 {
        let reduction = Reduction {
            ranks,
            ..Reduction::plain(dtype, op)
        };
        schedule.run(comm.transport(), bytes, root, &reduction)?;
    }
    if comm.rank() != root {
        return Ok(None);
    }
    if op == ReduceOp::Avg && ranks > 1 {
        let finish = Finish {
            divide_by: ranks,
            multiply: 1.0,
        };
        kernels::finish(dtype, bytes, finish)?;
    }
    Ok(Some(Block {
        storage,
        bytes: input.len(),
    }))
}
