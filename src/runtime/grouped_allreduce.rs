//! Allreduce of many arrays at once, as gradient averaging needs: consecutive arrays are fused
//! into runs of at most the fusion size (one collective per run, in the arrays' order), with
//! Horovod's prescale and postscale factors, optionally compressed to a 16-bit wire format.
//! Queued, so it runs in the background thread in submission order.
//!
//! A run is reduced where the arrays live: the schedule runs over the arrays as one vector
//! ([`Parts`]), its blocks spanning array boundaries, with the factors and `avg`'s division
//! folded into its combines. No copy, no extra sweep. Two cases pack the run into one buffer
//! instead:
//! - compression: pack converts to the wire dtype (times `prescale`), the wire is reduced, and
//!   unpack converts back (divided by N for `avg`, times `postscale`) in the same pass; the cast
//!   is the one copy compression cannot avoid;
//! - many tiny arrays: a message per array piece costs more than copying them (the caller
//!   passes the mean array size below which a copy pays, from its cost model).

use super::allreduce::{begin, choose_on, refine, settled, Chosen};
use super::buffer::{check_apart, Buffer};
pub use super::call::Dims;
use super::call::{Call, Element, Kind, Shape};
use super::communicator::Communicator;
use super::process::{self, SetId};
use super::replay::{Lengths, Replay};
use crate::dtype::{DType, ReduceOp};
use crate::error::{CoreError, Result};
use crate::kernels::{convert, Finish};
use crate::schedules::{self, Factors, Input, Parts};
use crate::scratch::Scratch;
use crate::stats;
use crate::worker::{self, Completion};
use smallvec::SmallVec;
use std::any::Any;
use std::borrow::Cow;
use std::sync::Arc;
use std::time::Instant;

/// The [`stats`] entry of packing and unpacking fused runs (the copies, casts included).
pub const PACK_STATS: &str = "pack";

/// Bytes per fusion buffer unless the caller or `RINGLET_FUSION_THRESHOLD` says otherwise.
pub const DEFAULT_FUSION_THRESHOLD: usize = 64 << 20;

/// The fusion buffer size in bytes: `value` if given, else `RINGLET_FUSION_THRESHOLD`, else
/// [`DEFAULT_FUSION_THRESHOLD`]. Read on every call (a test or a launcher may set it late).
pub fn fusion_threshold(value: Option<i64>) -> Result<usize> {
    let value = match value {
        Some(value) => value,
        None => match fusion_threshold_variable() {
            None => return Ok(DEFAULT_FUSION_THRESHOLD),
            Some(Ok(value)) => value,
            Some(Err(text)) => {
                return Err(CoreError::InvalidArgument(format!(
                    "RINGLET_FUSION_THRESHOLD='{text}' is not a number of bytes"
                )))
            }
        },
    };
    usize::try_from(value).map_err(|_| {
        CoreError::InvalidArgument(format!("fusion_threshold must be >= 0 bytes, got {value}"))
    })
}

/// `RINGLET_FUSION_THRESHOLD`, if set: its number, or its text when it is not one. Read with
/// `getenv` and a static name, without `std::env::var`'s copies of the name and the value:
/// every grouped call reads it.
fn fusion_threshold_variable() -> Option<std::result::Result<i64, String>> {
    const NAME: &std::ffi::CStr = c"RINGLET_FUSION_THRESHOLD";
    // SAFETY: `NAME` is NUL-terminated. `getenv` returns null or a NUL-terminated string that
    // stays valid until the environment changes; it is read here and not kept. (A write to the
    // environment from another thread at this very moment is the hazard of every `getenv`;
    // std's lock covers only writers that go through std, and Python's do not.)
    let value = unsafe { libc::getenv(NAME.as_ptr()) };
    if value.is_null() {
        return None;
    }
    // SAFETY: as above.
    let text = unsafe { std::ffi::CStr::from_ptr(value) }.to_string_lossy();
    Some(text.trim().parse().map_err(|_| text.into_owned()))
}

/// A group's shapes, inline up to four arrays: the small groups, whose every allocation
/// shows in their time, allocate nothing.
pub type Shapes = SmallVec<[Dims; 4]>;

/// A group's buffers, inline up to four, as [`Shapes`].
pub type Buffers = SmallVec<[Buffer; 4]>;

/// The input of each of a group's results, if it has one, inline up to four.
pub type Inputs = SmallVec<[Option<Buffer>; 4]>;

/// What to do with a group of arrays of one dtype.
#[derive(Clone, Debug)]
pub struct Group {
    /// Element type of the arrays.
    pub dtype: DType,
    /// Element type on the wire: `dtype`, or float16/bfloat16 for compression.
    pub wire: DType,
    pub op: ReduceOp,
    /// "auto" (the decision table, per buffer) or an algorithm's name.
    pub algorithm: Cow<'static, str>,
    pub prescale: f64,
    pub postscale: f64,
    /// Largest fusion run, in wire bytes; 0 reduces every array on its own.
    pub fusion_bytes: usize,
    /// Pack a run of several arrays into one buffer when its arrays average fewer bytes than
    /// this (0: never; compressed runs always pack); `None`: where the cost model says packing
    /// pays ([`crate::auto::Parameters::pack_below`]).
    pub pack_below: Option<usize>,
    /// Each array's shape.
    pub shapes: Shapes,
    /// The submitting thread (see [`Call::thread`]).
    pub thread: u64,
    /// The process set to reduce over.
    pub set: SetId,
}

impl Group {
    fn check(&self, arrays: &[&mut [u8]], inputs: &[Option<&[u8]>]) -> Result<()> {
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
        for (input, array) in inputs.iter().zip(arrays) {
            if let Some(input) = input {
                schedules::check_buffer(input, self.dtype)?;
                if input.len() != array.len() {
                    return Err(CoreError::InvalidArgument(format!(
                        "internal: a {}-byte input for a {}-byte result",
                        input.len(),
                        array.len()
                    )));
                }
            }
        }
        Ok(())
    }
}

/// Allreduce every array in place, now (after any queued work); they must not overlap.
pub fn allreduce_group(arrays: &mut [&mut [u8]], group: &Group) -> Result<()> {
    worker::run_in_order(|| {
        process::with_communicator(group.set, |comm| allreduce_group_on(comm, arrays, group))
    })
}

/// Where a grouped allreduce reads and writes: `results`, each in place or, where `inputs`
/// (empty, or one per result) gives one, reduced from that input, which is only read.
pub struct Targets {
    pub results: Buffers,
    pub inputs: Inputs,
}

impl Targets {
    /// Every buffer reduced in place.
    pub fn in_place(results: Buffers) -> Self {
        Targets {
            results,
            inputs: Inputs::new(),
        }
    }

    /// One input per result, if any, and the buffers apart ([`check_apart`]).
    fn check(&self) -> Result<()> {
        if !self.inputs.is_empty() && self.inputs.len() != self.results.len() {
            return Err(CoreError::InvalidArgument(format!(
                "internal: {} inputs for {} results",
                self.inputs.len(),
                self.results.len()
            )));
        }
        let inputs: SmallVec<[Buffer; 16]> = self.inputs.iter().flatten().copied().collect();
        check_apart(&self.results, &inputs)
    }
}

/// [`allreduce_group`] of the arrays `targets` point at, on the caller's thread when nothing
/// is queued: no hand-off to the comm thread and back.
///
/// # Safety
/// Each result must point at live memory that nobody else reads or writes during the call,
/// and each input at live memory nobody writes.
pub unsafe fn allreduce_buffers(targets: &Targets, group: &Group) -> Result<()> {
    worker::run_in_order(|| {
        process::with_communicator(group.set, |comm| {
            // SAFETY: the caller's contract.
            unsafe { allreduce_buffers_on(comm, targets, group) }
        })
    })
}

/// Queue the allreduce of `targets` (the arrays `keepalive` owns, released once the job no
/// longer touches them); the completion says when it is done and how it went.
///
/// # Safety
/// Each buffer must point at live memory that `keepalive` keeps alive, and that nobody writes
/// (nor reads, for a result) until the completion is done.
pub unsafe fn allreduce_group_async(
    targets: Targets,
    group: Group,
    keepalive: Box<dyn Any + Send>,
) -> Result<Arc<Completion>> {
    worker::submit(Box::new(move || {
        let outcome = process::with_communicator(group.set, |comm| {
            // SAFETY: the caller's contract.
            unsafe { allreduce_buffers_on(comm, &targets, &group) }
        });
        drop(keepalive);
        outcome
    }))
}

/// # Safety
/// As for [`allreduce_buffers`].
unsafe fn allreduce_buffers_on(
    comm: &Communicator,
    targets: &Targets,
    group: &Group,
) -> Result<()> {
    match targets.check() {
        Ok(()) => {
            // Filled in place, not collected: a collected SmallVec is copied out whole.
            let mut arrays: SmallVec<[&mut [u8]; 16]> = SmallVec::new();
            // SAFETY: the caller's contract; no two results share bytes, nor a result and an
            // input (checked just now), so no mutable slice aliases another slice.
            arrays.extend(targets.results.iter().map(|b| unsafe { b.slice() }));
            let mut inputs: SmallVec<[Option<&[u8]>; 16]> = SmallVec::new();
            // SAFETY: as above.
            inputs.extend(
                targets
                    .inputs
                    .iter()
                    .map(|b| b.map(|b| unsafe { b.bytes() })),
            );
            allreduce_checked(comm, &mut arrays, &inputs, group, None)
        }
        // Refused with the other ranks, which stay in step.
        Err(error) => allreduce_checked(comm, &mut [], &[], group, Some(error)),
    }
}

/// Consecutive runs of arrays whose wire bytes fit one fusion buffer (a larger array alone).
fn fusion_runs(lengths: &[usize], limit: usize) -> SmallVec<[std::ops::Range<usize>; 2]> {
    let mut runs = SmallVec::new();
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
    allreduce_checked(comm, arrays, &[], group, None)
}

/// [`allreduce_group_on`] out of place where `inputs` (empty, or one per array) give an input,
/// or the refusal of a call already `refused`.
fn allreduce_checked(
    comm: &Communicator,
    arrays: &mut [&mut [u8]],
    inputs: &[Option<&[u8]>],
    group: &Group,
    refused: Option<CoreError>,
) -> Result<()> {
    let (dtype, wire) = (group.dtype, group.wire);
    let call = Call {
        element: Element::Typed(wire),
        op: Some(group.op),
        shape: Shape::Arrays(&group.shapes),
        ..Call::new(Kind::Allreduce, group.thread)
    };
    if let Some(error) = refused.or_else(|| group.check(arrays, inputs).err()) {
        return comm.refuse(&call, error);
    }
    let wire_lengths: Lengths = arrays
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
    let pack_below = group
        .pack_below
        .unwrap_or_else(|| crate::auto::model::current().pack_below(wire, comm.size()));
    let tuning = comm.settings().tuning;
    let factors = Factors {
        pre: group.prescale,
        post: group.postscale,
    };
    for (index, run) in runs.iter().cloned().enumerate() {
        let wire_bytes: usize = wire_lengths[run.clone()].iter().sum();
        let op = if compressed { wire_op } else { group.op };
        let chosen = choose_on(comm, &group.algorithm, wire, op, wire_bytes);
        let call = Call {
            algorithm: chosen.as_ref().map_or("-", |c| c.schedule.name()),
            part: Some((index, runs.len())),
            ..call
        };
        let Chosen { schedule, pick } = match chosen {
            Ok(chosen) => chosen,
            Err(error) => return comm.refuse(&call, error),
        };
        // A schedule that copies the vector in anyway gathers the arrays as it does: packing
        // first would only add a copy.
        let packs = compressed
            || (run.len() > 1 && wire_bytes / run.len() < pack_below && !schedule.packs_itself());
        // Uncompressed, the reduction folds the factors, exactly as in place; compressed, the
        // wire only sums, and unpacking widens, divides and scales in one pass.
        let wire_factors = if compressed { Factors::NONE } else { factors };
        let pieces: Lengths = if packs {
            smallvec::smallvec![wire_bytes]
        } else {
            wire_lengths[run.clone()].iter().copied().collect()
        };
        let replay = Replay::of(schedule.name(), wire, op, wire_factors, pieces);
        let call = Call {
            replay: replay.as_ref(),
            ..call
        };
        let (seq, mut together) = begin(comm, schedule, &call, wire_bytes)?;
        let started = Instant::now();
        let transport = comm.transport();
        // This run's inputs, if it is reduced out of place: every array from its own input.
        let run_inputs = inputs.get(run.clone());
        let from: Option<Input> = run_inputs
            .filter(|given| given.iter().all(Option::is_some))
            .map(|given| Input::new(given.iter().flatten().copied()));
        if !packs {
            if from.is_none() {
                // In place, after copying any inputs given for some of its arrays.
                for (input, array) in run_inputs
                    .unwrap_or_default()
                    .iter()
                    .zip(&mut arrays[run.clone()])
                {
                    if let Some(input) = input {
                        array.copy_from_slice(input);
                    }
                }
            }
            let mut parts = Parts::new(arrays[run].iter_mut().map(|a| &mut **a));
            together &= settled(comm, &call, seq, || match &from {
                None => schedules::allreduce(
                    transport, schedule, &mut parts, dtype, op, factors, &tuning,
                ),
                Some(from) => schedules::allreduce_from(
                    transport, schedule, from, &mut parts, dtype, op, factors, &tuning,
                ),
            })?;
            let elapsed = started.elapsed();
            stats::record(schedule.name(), wire_bytes, elapsed);
            refine(comm, pick, wire_bytes, elapsed, together)?;
            continue;
        }
        let packing = Instant::now();
        let mut fusion = Scratch::new(wire_bytes);
        let fusion = fusion.bytes(wire_bytes)?;
        let pack_scale = if compressed { group.prescale } else { 1.0 };
        let mut offset = 0;
        for i in run.clone() {
            let part = &mut fusion[offset..offset + wire_lengths[i]];
            let source = inputs.get(i).copied().flatten().unwrap_or(&*arrays[i]);
            convert::convert(dtype, source, wire, part, pack_scale)?;
            offset += wire_lengths[i];
        }
        let mut copying = packing.elapsed();
        let mut packed = Parts::one(fusion);
        together &= settled(comm, &call, seq, || {
            schedules::allreduce(
                transport,
                schedule,
                &mut packed,
                wire,
                op,
                wire_factors,
                &tuning,
            )
        })?;
        drop(packed);
        let finish = if compressed {
            let divide_by = if group.op == ReduceOp::Avg {
                comm.size()
            } else {
                1
            };
            Finish {
                divide_by,
                multiply: group.postscale,
            }
        } else {
            Finish {
                divide_by: 1,
                multiply: 1.0,
            }
        };
        let unpacking = Instant::now();
        let mut offset = 0;
        for i in run {
            let part = &fusion[offset..offset + wire_lengths[i]];
            convert::convert_finishing(wire, part, dtype, arrays[i], finish)?;
            offset += wire_lengths[i];
        }
        copying += unpacking.elapsed();
        let elapsed = started.elapsed() - copying;
        stats::record(schedule.name(), wire_bytes, elapsed);
        refine(comm, pick, wire_bytes, elapsed, together)?;
        // The copies in and out are their own entry, so that a user sees what packing costs.
        stats::record(PACK_STATS, wire_bytes, copying);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_fill_buffers_in_order_and_isolate_large_arrays() {
        assert_eq!(fusion_runs(&[4, 4, 4, 4], 8).as_slice(), [0..2, 2..4]);
        assert_eq!(fusion_runs(&[4, 20, 4], 8).as_slice(), [0..1, 1..2, 2..3]);
        assert_eq!(fusion_runs(&[4, 4, 4], 0).as_slice(), [0..1, 1..2, 2..3]);
        let whole = fusion_runs(&[0, 0, 4], 4);
        assert_eq!((whole.len(), whole.first()), (1, Some(&(0..3))));
        assert!(fusion_runs(&[], 8).is_empty());
    }
}
