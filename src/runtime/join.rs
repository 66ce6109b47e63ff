//! `join`: a rank that has no more collectives to make (its data ran out first) waits for the
//! others, as Horovod's `join` does. Until every rank has joined, it takes part in the others'
//! sum and avg allreduces with zeros (avg still divides by every rank), and the others' other
//! collectives raise `MismatchError` on them. Returns the rank that joined last, on every rank.
//!
//! A joined rank learns each call from the consistency check: the others attach a [`Replay`]
//! to every sum or avg allreduce (what the joined rank needs to run the same schedule over the
//! same pieces), and the check hands it over when only joined ranks disagree.

use super::communicator::Communicator;
use super::consistency::Agreement;
use super::process::{self, SetId};
use super::replay::Replay;
use crate::dtype::{DType, ReduceOp};
use crate::error::{CoreError, Result};
use crate::schedules::allreduce::recursive_doubling::RecursiveDoubling;
use crate::schedules::{self, Parts, Tuning, ALLREDUCE};
use crate::worker;

/// Take part in an allreduce as `replay` describes it, with zeros (whatever arrives is
/// discarded).
fn replay_with_zeros(replay: &Replay, comm: &Communicator, tuning: &Tuning) -> Result<()> {
    let schedule = schedules::by_name(ALLREDUCE, replay.algorithm)?;
    let mut zeros = vec![0u8; replay.pieces.iter().sum()];
    let mut pieces = Vec::with_capacity(replay.pieces.len());
    let mut rest = zeros.as_mut_slice();
    for &len in &replay.pieces {
        let (piece, tail) = rest.split_at_mut(len);
        pieces.push(piece);
        rest = tail;
    }
    let mut parts = Parts::new(pieces);
    schedules::allreduce(
        comm.transport(),
        schedule,
        &mut parts,
        replay.dtype,
        replay.op,
        replay.factors,
        tuning,
    )
}

/// Join on process set `set` (after any queued work); the rank that joined last.
pub fn join(set: SetId) -> Result<usize> {
    let thread = process::caller_for("join")?;
    worker::run_in_order(|| process::with_communicator(set, |comm| join_on(comm, thread)))
}

pub fn join_on(comm: &Communicator, thread: u64) -> Result<usize> {
    if !comm.is_checked() && comm.size() > 1 {
        return Err(CoreError::InvalidArgument(
            "join needs the consistency check, which tells a joined rank what the others do; \
             unset RINGLET_CHECK=0"
                .into(),
        ));
    }
    let joined_at = comm.next_sequence();
    let tuning = comm.settings().tuning;
    loop {
        match comm.begin_joined(thread)? {
            Agreement::Same => break,
            Agreement::WithJoined(replay) => {
                replay_with_zeros(&Replay::decode(&replay)?, comm, &tuning)?
            }
            Agreement::Idle => {}
        }
    }
    // The last to join joined at the highest call number (the highest rank among those).
    let size = comm.size() as u64;
    let mut stamp = [(joined_at * size + comm.rank() as u64) as i64];
    schedules::allreduce_one(
        comm.transport(),
        &RecursiveDoubling,
        bytemuck::cast_slice_mut(&mut stamp),
        DType::I64,
        ReduceOp::Max,
        &Tuning::default(),
    )?;
    // The ranks that joined early skipped calls the others counted: `auto`'s refinement
    // starts over everywhere, in step.
    comm.refiner().reset();
    Ok((stamp[0] as u64 % size) as usize)
}
