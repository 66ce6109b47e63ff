//! `allreduce`: one array, reduced in place on every rank.

use super::call::{Call, Element, Kind, Shape};
use super::communicator::Communicator;
use super::join::Replay;
use super::process::{self, SetId};
use crate::auto;
use crate::dtype::{DType, ReduceOp};
use crate::error::{CoreError, Result};
use crate::schedules::{self, Allreduce, Factors, Parts, ALLREDUCE};
use crate::stats;
use crate::transport::Transport;
use crate::worker;
use std::time::Instant;

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
    let thread = process::caller_thread();
    worker::run_in_order(|| {
        process::with_communicator(set, |comm| {
            allreduce_on(comm, buf, dtype, op, shape, algorithm, thread)
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
    let chosen = choose(algorithm, dtype, op, buf.len(), comm.transport()).and_then(|schedule| {
        check_array(buf, dtype, shape)?;
        Ok(schedule)
    });
    let call = Call {
        element: Element::Typed(dtype),
        op: Some(op),
        shape: Shape::Array(shape),
        algorithm: chosen.as_ref().map_or("-", |s| s.name()),
        ..Call::new(Kind::Allreduce, thread)
    };
    let schedule = match chosen {
        Ok(schedule) => schedule,
        Err(error) => return comm.refuse(&call, error),
    };
    let replay = Replay::of(schedule.name(), dtype, op, Factors::NONE, vec![buf.len()]);
    let call = Call {
        replay: replay.as_ref(),
        ..call
    };
    let transport = comm.transport();
    // Where the schedule's first act is a meeting in shared memory, the check rides on it.
    let at_first_meeting = schedule.checks_at_first_meeting(comm.size(), buf.len());
    let seq = if at_first_meeting {
        comm.begin_at_first_meeting(&call)?
    } else {
        comm.begin(&call, None)?
    };
    let started = Instant::now();
    let tuning = comm.settings().tuning;
    let mut parts = Parts::one(buf);
    let run = |parts: &mut Parts| {
        schedules::allreduce(
            transport,
            schedule,
            parts,
            dtype,
            op,
            Factors::NONE,
            &tuning,
        )
    };
    match run(&mut parts) {
        // Ranks that have joined take part now, replaying it (nothing was written before).
        Err(CoreError::Unsettled) => {
            comm.settle(&call, seq)?;
            run(&mut parts)?;
        }
        outcome => outcome?,
    }
    stats::record(schedule.name(), parts.len(), started.elapsed());
    Ok(())
}

/// The schedule `algorithm` names ("auto": the decision table's choice for `nbytes`), if it
/// can reduce `dtype` with `op` on `transport`.
pub fn choose(
    algorithm: &str,
    dtype: DType,
    op: ReduceOp,
    nbytes: usize,
    transport: &dyn Transport,
) -> Result<&'static dyn Allreduce> {
    let schedule = if algorithm == "auto" {
        let chosen = auto::choose(dtype, op, nbytes).ok_or_else(|| {
            CoreError::InvalidArgument(
                "internal: \"auto\" has no decision table yet (ringlet.selector builds it)".into(),
            )
        })?;
        // The table is the world's; a process set without shared memory takes the ring instead.
        match chosen.unavailable(transport) {
            None => chosen,
            Some(_) => schedules::find(ALLREDUCE, "ring")?,
        }
    } else {
        schedules::find(ALLREDUCE, algorithm)?
    };
    schedules::check_support(ALLREDUCE, schedule, dtype, op)?;
    if let Some(why) = schedule.unavailable(transport) {
        return Err(CoreError::InvalidArgument(format!(
            "algorithm {:?} cannot run here: {why}",
            schedule.name()
        )));
    }
    Ok(schedule)
}

/// Whether `name` is a registered algorithm that can reduce `dtype` with `op` (wherever it
/// can run).
pub fn can_reduce(name: &str, dtype: DType, op: ReduceOp) -> bool {
    schedules::find(ALLREDUCE, name)
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
