//! Allreduce of many arrays at once, as gradient averaging needs: small arrays are packed into
//! fusion buffers (one collective per buffer, in the arrays' order), optionally compressed to a
//! 16-bit wire format, with Horovod's prescale and postscale factors. Queued, so it runs in
//! the background thread in submission order.
//!
//! For each buffer: pack (convert to the wire dtype, times `prescale`), allreduce on the wire,
//! unpack (convert back, times `postscale`, and divide by N for `avg`). An array that fills a
//! buffer alone and needs no conversion is reduced in place, without a copy. Packing and
//! unpacking use the same arithmetic as in-place scaling, so fused and unfused calls agree
//! whenever the reduction itself is exact.

use super::allreduce::choose;
use super::buffer::{check_disjoint, Buffer};
use super::call::{Call, Element, Kind, Shape};
use super::communicator::Communicator;
use super::process;
use crate::dtype::{DType, ReduceOp};
use crate::error::{CoreError, Result};
use crate::kernels::{self, convert};
use crate::schedules::{self, Reduction};
use crate::scratch::Scratch;
use crate::stats;
use crate::worker::{self, Completion};
use std::any::Any;
use std::sync::Arc;
use std::time::Instant;

/// What to do with a group of arrays of one dtype.
#[derive(Clone, Debug)]
pub struct Group {
    /// Element type of the arrays.
    pub dtype: DType,
    /// Element type on the wire: `dtype`, or float16/bfloat16 for compression.
    pub wire: DType,
    pub op: ReduceOp,
    /// "auto" (the decision table, per buffer) or an algorithm's name.
    pub algorithm: String,
    pub prescale: f64,
    pub postscale: f64,
    /// Largest fusion buffer, in wire bytes; 0 reduces every array on its own.
    pub fusion_bytes: usize,
    /// Each array's shape.
    pub shapes: Vec<Vec<usize>>,
    /// The submitting thread (see [`Call::thread`]).
    pub thread: u64,
}

impl Group {
    fn check(&self, arrays: &[&mut [u8]]) -> Result<()> {
        if self.wire != self.dtype && !(self.dtype.is_float() && self.wire.is_float()) {
            return Err(CoreError::InvalidArgument(format!(
                "{} data cannot be compressed to {} (only floating-point data can)",
                self.dtype.name(),
                self.wire.name()
            )));
        }
        if !self.dtype.is_float() && (self.prescale != 1.0 || self.postscale != 1.0) {
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
        if self.shapes.len() != arrays.len() {
            return Err(CoreError::InvalidArgument(format!(
                "internal: {} shapes for {} arrays",
                self.shapes.len(),
                arrays.len()
            )));
        }
        for (array, shape) in arrays.iter().zip(&self.shapes) {
            let elements: usize = shape.iter().product();
            if array.len() != elements * self.dtype.size() {
                return Err(CoreError::InvalidArgument(format!(
                    "internal: a {} array of shape {shape:?} in {} bytes",
                    self.dtype.name(),
                    array.len()
                )));
            }
            schedules::check_buffer(array, self.dtype)?;
        }
        Ok(())
    }
}

/// Queue an in-place allreduce of every buffer (the arrays `keepalive` owns, released once the
/// job no longer touches them); the completion says when it is done and how it went.
///
/// # Safety
/// Each buffer must point at live memory that `keepalive` keeps alive and that nobody reads or
/// writes until the completion is done.
pub unsafe fn allreduce_group_async(
    buffers: Vec<Buffer>,
    group: Group,
    keepalive: Box<dyn Any + Send>,
) -> Result<Arc<Completion>> {
    worker::submit(Box::new(move || {
        let outcome = check_disjoint(&buffers).and_then(|()| {
            // SAFETY: the caller's contract; the buffers are disjoint (checked just now), so
            // no two slices alias.
            let mut arrays: Vec<&mut [u8]> = buffers.iter().map(|b| unsafe { b.slice() }).collect();
            process::with_communicator(|comm| allreduce_group_on(comm, &mut arrays, &group))
        });
        drop(keepalive);
        outcome
    }))
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

/// Allreduce every array in place, one collective per fusion buffer. Collective: every rank
/// passes a group of the same shapes, and each buffer's call covers the whole group, so a rank
/// with a different group is caught at the first buffer.
pub fn allreduce_group_on(
    comm: &Communicator,
    arrays: &mut [&mut [u8]],
    group: &Group,
) -> Result<()> {
    let shapes: Vec<&[usize]> = group.shapes.iter().map(Vec::as_slice).collect();
    let (dtype, wire) = (group.dtype, group.wire);
    let call = Call {
        element: Element::Typed(wire),
        op: Some(group.op),
        shape: Shape::Arrays(&shapes),
        ..Call::new(Kind::Allreduce, group.thread)
    };
    if let Err(error) = group.check(arrays) {
        return comm.refuse(&call, error);
    }
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
    let runs = fusion_runs(&wire_lengths, group.fusion_bytes);
    let tuning = comm.settings().tuning;
    for (index, run) in runs.iter().cloned().enumerate() {
        let wire_bytes: usize = wire_lengths[run.clone()].iter().sum();
        let alone = run.len() == 1 && !compressed;
        let op = if alone { group.op } else { wire_op };
        let chosen = choose(&group.algorithm, wire, op, wire_bytes);
        let call = Call {
            algorithm: chosen.as_ref().map_or("-", |s| s.name()),
            part: Some((index, runs.len())),
            ..call
        };
        let schedule = match chosen {
            Ok(schedule) => schedule,
            Err(error) => return comm.refuse(&call, error),
        };
        comm.begin(&call, None)?;
        let started = Instant::now();
        if alone {
            let array = &mut *arrays[run.start];
            convert::scale(dtype, array, group.prescale)?;
            let reduction = Reduction { dtype, op };
            schedules::allreduce(comm.transport(), schedule, array, reduction, &tuning)?;
            convert::scale(dtype, array, group.postscale)?;
            stats::record(schedule.name(), wire_bytes, started.elapsed());
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
        let reduction = Reduction {
            dtype: wire,
            op: wire_op,
        };
        schedules::allreduce(comm.transport(), schedule, fusion, reduction, &tuning)?;
        let mut offset = 0;
        for i in run {
            let part = &fusion[offset..offset + wire_lengths[i]];
            convert::convert(wire, part, dtype, arrays[i], group.postscale)?;
            if compressed && group.op == ReduceOp::Avg {
                kernels::divide(dtype, arrays[i], comm.size())?;
            }
            offset += wire_lengths[i];
        }
        stats::record(schedule.name(), wire_bytes, started.elapsed());
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
