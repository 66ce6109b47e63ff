//! Allreduce schedules: which bytes go to which rank in which step.
//!
//! A schedule knows the element size and calls a [`Reduction`] to combine; it never looks at
//! the dtype itself, never touches Python, and talks only to a [`Transport`]. Adding an
//! algorithm means one new file here plus one line in [`SCHEDULES`].

mod blocks;
pub mod broadcast;
pub mod halving_doubling;
pub mod native;
pub mod pipelined_ring;
pub mod recursive_doubling;
pub mod ring;
pub mod scratch;

use crate::dtype::{names, DType, ReduceOp};
use crate::error::{CoreError, Result};
use crate::kernels::{self, Order};
use crate::transport::Transport;

/// How two partial results combine: a dtype and an op, applied by the kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reduction {
    pub dtype: DType,
    pub op: ReduceOp,
}

impl Reduction {
    pub fn elem_size(&self) -> usize {
        self.dtype.size()
    }

    /// `acc = acc ⊕ other`.
    pub fn combine(&self, acc: &mut [u8], other: &[u8]) -> Result<()> {
        kernels::combine(self.dtype, self.op, acc, other, Order::AccFirst)
    }

    /// `acc = acc ⊕ other` or `acc = other ⊕ acc`, for schedules that must fix the order.
    pub fn combine_ordered(&self, acc: &mut [u8], other: &[u8], order: Order) -> Result<()> {
        kernels::combine(self.dtype, self.op, acc, other, order)
    }
}

pub trait Schedule: Sync {
    /// The name users pass as `algorithm=`.
    fn name(&self) -> &'static str;

    /// Reduce `buf` in place across every rank of `transport`. On return every rank holds the
    /// same bytes: the combination of all ranks' inputs (before any `avg` division).
    fn run(&self, transport: &dyn Transport, buf: &mut [u8], reduction: &Reduction) -> Result<()>;
}

/// Every algorithm, in the order `explain` and the benchmarks list them.
pub static SCHEDULES: &[&dyn Schedule] = &[
    &ring::Ring,
    &pipelined_ring::PipelinedRing::TUNABLE,
    &halving_doubling::HalvingDoubling,
    &recursive_doubling::RecursiveDoubling,
    &native::Native,
];

pub fn by_name(name: &str) -> Result<&'static dyn Schedule> {
    SCHEDULES
        .iter()
        .copied()
        .find(|s| s.name() == name)
        .ok_or_else(|| {
            CoreError::InvalidArgument(format!(
                "unknown algorithm {name:?}; accepted: \"auto\", {}",
                names(SCHEDULES.iter().map(|s| s.name()))
            ))
        })
}

/// The whole allreduce: check the buffer, run the schedule, divide for `avg`.
pub fn allreduce(
    transport: &dyn Transport,
    schedule: &dyn Schedule,
    buf: &mut [u8],
    dtype: DType,
    op: ReduceOp,
) -> Result<()> {
    let elem = dtype.size();
    if !buf.len().is_multiple_of(elem) {
        return Err(CoreError::InvalidArgument(format!(
            "a {} buffer must be a multiple of {elem} bytes, got {}",
            dtype.name(),
            buf.len()
        )));
    }
    // An empty array's data pointer may be anything; there is nothing to align.
    if !buf.is_empty() && !(buf.as_ptr() as usize).is_multiple_of(elem) {
        return Err(CoreError::InvalidArgument(format!(
            "a {} buffer must be aligned to {elem} bytes",
            dtype.name()
        )));
    }
    schedule.run(transport, buf, &Reduction { dtype, op })?;
    if op == ReduceOp::Avg {
        kernels::divide(dtype, buf, transport.size())?;
    }
    Ok(())
}

/// The largest power of two not above `n` (n ≥ 1).
pub(crate) fn largest_power_of_two(n: usize) -> usize {
    1 << (usize::BITS - 1 - n.leading_zeros())
}
