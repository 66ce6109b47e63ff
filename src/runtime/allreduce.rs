//! `allreduce`: one array, reduced in place on every rank.

use super::call::{Call, Element, Kind, Shape};
use super::communicator::Communicator;
use super::process::{self, SetId};
use super::replay::Replay;
use crate::auto::{self, Pick};
use crate::dtype::{DType, ReduceOp};
use crate::error::{CoreError, Result};
use crate::schedules::allreduce::recursive_doubling::RecursiveDoubling;
use crate::schedules::{self, Allreduce, Factors, Input, Parts, Tuning, ALLREDUCE};
use crate::stats;
use crate::transport::Transport;
use crate::worker;
use std::time::{Duration, Instant};

/// Allreduce `buf` (an array of `shape`) in place on ringlet's communicator, after any queued
/// work, with `algorithm` ("auto" or a registered name).
pub fn allreduce(
    buf: &mut [u8],
    dtype: DType,
    op: ReduceOp,
    shape: &[usize],
    algorithm: &str,
    set: SetId,
) -> Result<()> {
    reduce(None, buf, dtype, op, shape, algorithm, set)
}

/// Allreduce `input` (an array of `shape`, only read) into `output` (as long, not
/// overlapping it) on ringlet's communicator, after any queued work: no copy precedes the
/// collective where the schedule reads its input in its first step.
pub fn allreduce_into(
    input: &[u8],
    output: &mut [u8],
    dtype: DType,
    op: ReduceOp,
    shape: &[usize],
    algorithm: &str,
    set: SetId,
) -> Result<()> {
    reduce(Some(input), output, dtype, op, shape, algorithm, set)
}

/// [`allreduce`] or [`allreduce_into`], on the calling thread's turn.
fn reduce(
    input: Option<&[u8]>,
    buf: &mut [u8],
    dtype: DType,
    op: ReduceOp,
    shape: &[usize],
    algorithm: &str,
    set: SetId,
) -> Result<()> {
    let thread = process::caller_for("allreduce")?;
    worker::run_in_order(|| {
        process::with_communicator(set, |comm| {
            reduce_on(comm, input, buf, dtype, op, shape, algorithm, thread)
        })
    })
}

/// Validate, agree, run, record.
pub fn allreduce_on(
    comm: &Communicator,
    buf: &mut [u8],
    dtype: DType,
    op: ReduceOp,
    shape: &[usize],
    algorithm: &str,
    thread: u64,
) -> Result<()> {
    reduce_on(comm, None, buf, dtype, op, shape, algorithm, thread)
}

/// [`allreduce_on`] in place (`input` None) or from `input` into `buf`.
#[allow(clippy::too_many_arguments)]
fn reduce_on(
    comm: &Communicator,
    input: Option<&[u8]>,
    buf: &mut [u8],
    dtype: DType,
    op: ReduceOp,
    shape: &[usize],
    algorithm: &str,
    thread: u64,
) -> Result<()> {
    let chosen = choose_on(comm, algorithm, dtype, op, buf.len()).and_then(|chosen| {
        check_array(buf, dtype, shape)?;
        if let Some(input) = input {
            check_input(input, buf, dtype)?;
        }
        Ok(chosen)
    });
    let call = Call {
        element: Element::Typed(dtype),
        op: Some(op),
        shape: Shape::Array(shape),
        algorithm: chosen.as_ref().map_or("-", |c| c.schedule.name()),
        ..Call::new(Kind::Allreduce, thread)
    };
    let Chosen { schedule, pick } = match chosen {
        Ok(chosen) => chosen,
        Err(error) => return comm.refuse(&call, error),
    };
    let replay = Replay::of(
        schedule.name(),
        dtype,
        op,
        Factors::NONE,
        smallvec::smallvec![buf.len()],
    );
    let call = Call {
        replay: replay.as_ref(),
        ..call
    };
    let transport = comm.transport();
    let (seq, together) = begin(comm, schedule, &call, buf.len())?;
    let started = Instant::now();
    let tuning = comm.settings().tuning;
    let len = buf.len();
    // Ranks that have joined take part in a second run, replaying it (out of place, the input
    // is unchanged for it).
    let together = together
        & settled(comm, &call, seq, || match input {
            None => schedules::allreduce(
                transport,
                schedule,
                &mut Parts::one(&mut *buf),
                dtype,
                op,
                Factors::NONE,
                &tuning,
            ),
            Some(input) => schedules::allreduce_from(
                transport,
                schedule,
                &Input::one(input),
                &mut Parts::one(&mut *buf),
                dtype,
                op,
                Factors::NONE,
                &tuning,
            ),
        })?;
    let elapsed = started.elapsed();
    stats::record(schedule.name(), len, elapsed);
    refine(comm, pick, len, elapsed, together)
}

/// An out-of-place call's input: as long as its result, aligned alike, and apart from it
/// (checked before the agreement, so that a bad call is refused on every rank).
fn check_input(input: &[u8], output: &[u8], dtype: DType) -> Result<()> {
    schedules::check_buffer(input, dtype)?;
    if input.len() != output.len() {
        return Err(CoreError::InvalidArgument(format!(
            "internal: a {}-byte input for a {}-byte result",
            input.len(),
            output.len()
        )));
    }
    let (theirs, ours) = (input.as_ptr_range(), output.as_ptr_range());
    if !input.is_empty() && theirs.start < ours.end && ours.start < theirs.end {
        return Err(CoreError::InvalidArgument(
            "the input and the result overlap in memory; pass separate arrays, or the same \
             array to reduce in place"
                .into(),
        ));
    }
    Ok(())
}

/// Start `call` (of `bytes` for `schedule`): its check rides on the schedule's first meeting
/// where the schedule meets in shared memory before it writes anything, otherwise it is a
/// round of its own. The call's number, and whether every rank made this call.
pub(super) fn begin(
    comm: &Communicator,
    schedule: &dyn Allreduce,
    call: &Call,
    bytes: usize,
) -> Result<(u64, bool)> {
    if schedule.checks_at_first_meeting(comm.size(), bytes) {
        Ok((comm.begin_at_first_meeting(call)?, true))
    } else {
        comm.begin_together(call)
    }
}

/// `run` the schedule; if its first meeting found the ranks' calls differ, settle why (a
/// mismatch fails on every rank) and, where only ranks that have joined differ, run it again
/// (nothing was written). Whether every rank made this very call.
pub(super) fn settled(
    comm: &Communicator,
    call: &Call,
    seq: u64,
    mut run: impl FnMut() -> Result<()>,
) -> Result<bool> {
    match run() {
        Err(CoreError::Unsettled) => {
            comm.settle(call, seq)?;
            run()?;
            Ok(false)
        }
        outcome => outcome.map(|()| true),
    }
}

/// A call's schedule, and for `auto` the refiner's pick that chose it.
pub(super) struct Chosen {
    pub schedule: &'static dyn Allreduce,
    pub pick: Option<Pick>,
}

/// The schedule `algorithm` names on `comm` ("auto": the communicator's decision table's
/// choice for `nbytes`, as its refiner plays it), if it can reduce `dtype` with `op` there.
pub(super) fn choose_on(
    comm: &Communicator,
    algorithm: &str,
    dtype: DType,
    op: ReduceOp,
    nbytes: usize,
) -> Result<Chosen> {
    let transport = comm.transport();
    if algorithm != "auto" {
        let schedule = named(algorithm, dtype, op, transport)?;
        return Ok(Chosen {
            schedule,
            pick: None,
        });
    }
    let tuning = comm.settings().tuning;
    if comm.size() <= 1 {
        // Every schedule returns at once on one rank: nothing to learn (the table still
        // checks the environment's override).
        let schedule = comm
            .refiner()
            .winner(dtype, op, nbytes, transport, &tuning)?;
        return Ok(Chosen {
            schedule,
            pick: None,
        });
    }
    let pick = comm.refiner().pick(dtype, op, nbytes, transport, &tuning)?;
    Ok(Chosen {
        schedule: pick.schedule,
        pick: Some(pick),
    })
}

/// Count an `auto` call that ran, and tell the refiner how long it took; when it was a try of the
/// alternative, agree on the slowest rank's timings and let the refiner decide. Only when
/// every rank made the call itself (ranks that have joined replay calls, and would not take
/// part in the agreement).
pub(super) fn refine(
    comm: &Communicator,
    pick: Option<Pick>,
    nbytes: usize,
    elapsed: Duration,
    together: bool,
) -> Result<()> {
    let Some(pick) = pick else {
        return Ok(());
    };
    // Counted only now that the call has run: one that failed its check (which may ride on the
    // schedule's first meeting) counts on no rank.
    let timings = {
        let mut refiner = comm.refiner();
        refiner.commit(&pick);
        refiner.observe(&pick, nbytes, elapsed.as_secs_f64())
    };
    if let (Some(mut timings), true) = (timings, together) {
        schedules::allreduce_one(
            comm.transport(),
            &RecursiveDoubling,
            bytemuck::cast_slice_mut(&mut timings),
            DType::F64,
            ReduceOp::Max,
            &Tuning::default(),
        )?;
        comm.refiner().decide(&pick, timings);
    }
    Ok(())
}

/// The registered schedule `name`, if it can reduce `dtype` with `op` on `transport`.
fn named(
    name: &str,
    dtype: DType,
    op: ReduceOp,
    transport: &dyn Transport,
) -> Result<&'static dyn Allreduce> {
    let schedule = schedules::by_name(ALLREDUCE, name)?;
    schedules::check_support(ALLREDUCE, schedule, dtype, op)?;
    if let Some(why) = schedule.unavailable(transport) {
        return Err(CoreError::InvalidArgument(format!(
            "algorithm {:?} cannot run here: {why}",
            schedule.name()
        )));
    }
    Ok(schedule)
}

/// Whether a call of `algorithm` on `dtype` with `op` can go straight to the core: a registered
/// algorithm that reduces them, or "auto" once the cost model is installed (before that the
/// Python layer runs or loads the calibration first).
pub fn ready(algorithm: &str, dtype: DType, op: ReduceOp) -> bool {
    match algorithm {
        "auto" => auto::model::is_installed(),
        name => can_reduce(name, dtype, op),
    }
}

/// Whether `name` is a registered algorithm that can reduce `dtype` with `op` (wherever it
/// can run).
pub fn can_reduce(name: &str, dtype: DType, op: ReduceOp) -> bool {
    schedules::by_name(ALLREDUCE, name)
        .and_then(|schedule| schedules::check_support(ALLREDUCE, schedule, dtype, op))
        .is_ok()
}

/// `buf` holds an array of `shape` in whole, aligned `dtype` elements.
pub(super) fn check_array(buf: &[u8], dtype: DType, shape: &[usize]) -> Result<()> {
    schedules::check_buffer(buf, dtype)?;
    let elements: usize = shape.iter().product();
    if elements * dtype.size() != buf.len() {
        return Err(CoreError::InvalidArgument(format!(
            "internal: a {} array of shape {shape:?} in {} bytes",
            dtype.name(),
            buf.len()
        )));
    }
    Ok(())
}
