//! `reduce`: the element-wise reduction of an array that every rank passes (the same shape
//! everywhere), delivered to one rank.

use super::allreduce::check_array;
use super::call::{Call, Element, Kind, Shape};
use super::communicator::Communicator;
use super::process::{self, SetId};
use super::registered::cheapest_or_named;
use crate::dtype::{DType, ReduceOp};
use crate::error::{CoreError, Result};
use crate::kernels::{self, Finish};
use crate::schedules::{self, Reduction, REDUCE};
use crate::scratch::Scratch;
use crate::worker;

/// A rank's buffers in a reduce.
pub enum Data<'a> {
    /// Its input, read only (a rank other than the root, or a root whose `out` is elsewhere).
    Read(&'a [u8]),
    /// The root's input, and where its result goes (the same length, not overlapping).
    Into(&'a [u8], &'a mut [u8]),
    /// The root's input, which becomes its result.
    InPlace(&'a mut [u8]),
}

impl Data<'_> {
    fn input(&self) -> &[u8] {
        match self {
            Data::Read(input) | Data::Into(input, _) => input,
            Data::InPlace(buf) => buf,
        }
    }
}

/// Reduce the arrays of `shape` that every rank passes onto `root`, after any queued work:
/// `Ok(true)` on the root, whose `data` must name where the result goes, `Ok(false)` on the
/// others. No rank's input changes (except the root's with [`Data::InPlace`]).
#[allow(clippy::too_many_arguments)]
pub fn reduce(
    data: Data,
    dtype: DType,
    op: ReduceOp,
    shape: &[usize],
    root: usize,
    algorithm: &str,
    set: SetId,
) -> Result<bool> {
    let thread = process::caller_for("reduce")?;
    worker::run_in_order(|| {
        process::with_communicator(set, |comm| {
            reduce_on(comm, data, dtype, op, shape, root, algorithm, thread)
        })
    })
}

#[allow(clippy::too_many_arguments)]
pub fn reduce_on(
    comm: &Communicator,
    data: Data,
    dtype: DType,
    op: ReduceOp,
    shape: &[usize],
    root: usize,
    algorithm: &str,
    thread: u64,
) -> Result<bool> {
    let ranks = comm.size();
    let len = data.input().len();
    let chosen =
        cheapest_or_named(REDUCE, algorithm, comm, len, Some((dtype, op))).and_then(|schedule| {
            schedules::check_support(REDUCE, schedule, dtype, op)?;
            if let Some(reason) = schedule.unavailable(comm.transport()) {
                return Err(CoreError::InvalidArgument(format!(
                    "reduce algorithm {:?} cannot run here: {reason}",
                    schedule.name()
                )));
            }
            check_array(data.input(), dtype, shape)?;
            if root >= ranks {
                return Err(CoreError::InvalidArgument(format!(
                    "root {root} is outside the {ranks} ranks (0..{})",
                    ranks - 1
                )));
            }
            check_target(&data, comm.rank() == root)?;
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
    let reduction = Reduction {
        ranks,
        ..Reduction::plain(dtype, op)
    };
    // The schedule combines into its buffer: the root's output, else a pooled scratch copy
    // (warm pages, not a fresh allocation per call).
    let mut scratch;
    let (work, at_root): (&mut [u8], bool) = match data {
        Data::InPlace(buf) => (buf, true),
        Data::Into(input, out) => {
            out.copy_from_slice(input);
            (out, true)
        }
        Data::Read(input) => {
            scratch = Scratch::new(len);
            let work = scratch.bytes(len)?;
            work.copy_from_slice(input);
            (work, false)
        }
    };
    if ranks > 1 {
        schedule.run(comm.transport(), work, root, &reduction)?;
    }
    if at_root && op == ReduceOp::Avg && ranks > 1 {
        let finish = Finish {
            divide_by: ranks,
            multiply: 1.0,
        };
        kernels::finish(dtype, work, finish)?;
    }
    Ok(at_root)
}

fn check_target(data: &Data, at_root: bool) -> Result<()> {
    match data {
        Data::Read(_) if at_root => Err(CoreError::InvalidArgument(
            "internal: the root of a reduce needs somewhere to put the result".into(),
        )),
        Data::Into(input, out) if out.len() != input.len() => {
            Err(CoreError::InvalidArgument(format!(
                "the output of a reduce must have the input's {} bytes, got {}",
                input.len(),
                out.len()
            )))
        }
        _ => Ok(()),
    }
}
