//! Allreduce of many arrays at once, as gradient averaging needs: small arrays are packed into
//! fusion buffers (one collective per buffer, in the arrays' order), optionally compressed to a
//! 16-bit wire format, with Horovod's prescale and postscale factors.
//!
//! For each buffer: pack (convert to the wire dtype, times `prescale`), allreduce on the wire,
//! unpack (convert back, times `postscale`, and divide by N for `avg`). An array that fills a
//! buffer alone and needs no conversion is reduced in place, without a copy. Packing and
//! unpacking use the same arithmetic as in-place scaling, so fused and unfused calls agree
//! whenever the reduction itself is exact.

use crate::auto;
use crate::consistency::{Call, Kind};
use crate::dtype::{DType, ReduceOp};
use crate::error::{CoreError, Result};
use crate::kernels::{self, convert};
use crate::schedules::scratch::Scratch;
use crate::schedules::{self, Schedule};
use crate::stats;
use crate::transport::Transport;
use std::time::Instant;

#[derive(Clone, Copy)]
pub enum Algorithm {
    /// Whatever the installed decision table picks for each buffer's size.
    Auto,
    Fixed(&'static dyn Schedule),
}

#[derive(Clone, Copy)]
pub struct Group {
    /// Element type of the arrays.
    pub dtype: DType,
    /// Element type on the wire: `dtype`, or float16/bfloat16 for compression.
    pub wire: DType,
    pub op: ReduceOp,
    pub algorithm: Algorithm,
    pub prescale: f64,
    pub postscale: f64,
    /// Largest fusion buffer, in wire bytes; 0 reduces every array on its own.
    pub fusion_bytes: usize,
    /// The submitting thread (see [`crate::consistency::Call::thread`]).
    pub thread: u64,
}

impl Group {
    fn check(&self) -> Result<()> {
        let float = |d: DType| !matches!(d, DType::I32 | DType::I64);
        if self.wire != self.dtype && !(float(self.dtype) && float(self.wire)) {
            return Err(CoreError::InvalidArgument(format!(
                "{} data cannot be compressed to {} (only floating-point data can)",
                self.dtype.name(),
                self.wire.name()
            )));
        }
        if !float(self.dtype) && (self.prescale != 1.0 || self.postscale != 1.0) {
            return Err(CoreError::InvalidArgument(format!(
                "{} data cannot be scaled: prescale and postscale must be 1",
                self.dtype.name()
            )));
        }
        if !(self.prescale.is_finite() && self.postscale.is_finite()) {
            return Err(CoreError::InvalidArgument(
                "prescale and postscale must be finite".into(),
            ));
        }
        Ok(())
    }

    fn schedule(&self, wire_bytes: usize) -> Result<&'static dyn Schedule> {
        match self.algorithm {
            Algorithm::Fixed(schedule) => Ok(schedule),
            Algorithm::Auto => auto::choose(self.wire, self.op, wire_bytes).ok_or_else(|| {
                CoreError::InvalidArgument("internal: no auto table installed".into())
            }),
        }
    }
}

/// Consecutive runs of arrays whose wire bytes fit one fusion buffer (a larger array alone).
fn fusion_runs(lengths: &[usize], limit: usize) -> Vec<std::ops::Range<usize>> {
    let mut runs = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for (i, &len) in lengths.iter().enumerate() {
        if i > start && bytes + len > limit {
            runs.push(start..i);
            (start, bytes) = (i, 0);
        }
        bytes += len;
    }
    if start < lengths.len() {
        runs.push(start..lengths.len());
    }
    runs
}

fn reduce(
    transport: &dyn Transport,
    schedule: &'static dyn Schedule,
    buf: &mut [u8],
    dtype: DType,
    op: ReduceOp,
) -> Result<()> {
    let started = Instant::now();
    schedules::allreduce(transport, schedule, buf, dtype, op)?;
    stats::record(schedule.name(), buf.len(), started.elapsed());
    Ok(())
}

/// Allreduce every array in place. Collective: all ranks pass arrays of the same sizes.
/// `agree` runs before each buffer's collective (the runtime's consistency check).
pub fn allreduce_group(
    transport: &dyn Transport,
    arrays: &mut [&mut [u8]],
    group: &Group,
    agree: &mut dyn FnMut(Call) -> Result<()>,
) -> Result<()> {
    group.check()?;
    let (dtype, wire) = (group.dtype, group.wire);
    let wire_lengths: Vec<usize> = arrays
        .iter()
        .map(|a| a.len() / dtype.size() * wire.size())
        .collect();
    let compressed = wire != dtype;
    // Compressed data is summed on the wire and divided after widening back.
    let wire_op = if compressed {
        group.op.combining()
    } else {
        group.op
    };
    for run in fusion_runs(&wire_lengths, group.fusion_bytes) {
        let wire_bytes: usize = wire_lengths[run.clone()].iter().sum();
        let schedule = group.schedule(wire_bytes)?;
        let op = if run.len() == 1 && !compressed {
            group.op
        } else {
            wire_op
        };
        agree(Call {
            kind: Kind::Allreduce,
            dtype: Some(wire),
            op: Some(op),
            count: (wire_bytes / wire.size()) as u64,
            algorithm: schedule.name(),
            root: 0,
            thread: group.thread,
        })?;
        if run.len() == 1 && !compressed {
            let array = &mut *arrays[run.start];
            convert::scale(dtype, array, group.prescale)?;
            reduce(transport, schedule, array, dtype, group.op)?;
            convert::scale(dtype, array, group.postscale)?;
            continue;
        }
        let mut fusion = Scratch::new(wire_bytes);
        let fusion = fusion.bytes(wire_bytes)?;
        let mut offset = 0;
        for i in run.clone() {
            let part = &mut fusion[offset..offset + wire_lengths[i]];
            convert::convert(dtype, arrays[i], wire, part, group.prescale)?;
            offset += wire_lengths[i];
        }
        reduce(transport, schedule, fusion, wire, wire_op)?;
        let mut offset = 0;
        for i in run {
            let part = &fusion[offset..offset + wire_lengths[i]];
            convert::convert(wire, part, dtype, arrays[i], group.postscale)?;
            if compressed && group.op == ReduceOp::Avg {
                kernels::divide(dtype, arrays[i], transport.size())?;
            }
            offset += wire_lengths[i];
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::fusion_runs;

    #[test]
    fn runs_fill_buffers_in_order_and_isolate_large_arrays() {
        assert_eq!(fusion_runs(&[4, 4, 4, 4], 8), vec![0..2, 2..4]);
        assert_eq!(fusion_runs(&[4, 20, 4], 8), vec![0..1, 1..2, 2..3]);
        assert_eq!(fusion_runs(&[4, 4, 4], 0), vec![0..1, 1..2, 2..3]);
        assert_eq!(fusion_runs(&[0, 0, 4], 4), vec![0..3]);
        assert!(fusion_runs(&[], 8).is_empty());
    }
}
