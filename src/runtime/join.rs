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
use crate::dtype::{DType, ReduceOp};
use crate::error::{CoreError, Result};
use crate::schedules::recursive_doubling::RecursiveDoubling;
use crate::schedules::{self, Factors, Parts, Tuning, ALLREDUCE};
use crate::worker;

/// How a joined rank takes part in an allreduce: the schedule, the elements and op on the wire,
/// the factors folded into it, and the pieces (one message each) the others send.
#[derive(Clone, Debug, PartialEq)]
pub struct Replay {
    pub algorithm: &'static str,
    pub dtype: DType,
    pub op: ReduceOp,
    pub factors: Factors,
    pub pieces: Vec<usize>,
}

impl Replay {
    /// The replay of an allreduce, if a joined rank can take part in it: zeros change a sum,
    /// and so an average, by nothing; min, max and prod have no such element for every dtype.
    pub fn of(
        algorithm: &'static str,
        dtype: DType,
        op: ReduceOp,
        factors: Factors,
        pieces: Vec<usize>,
    ) -> Option<Replay> {
        matches!(op, ReduceOp::Sum | ReduceOp::Avg).then_some(Replay {
            algorithm,
            dtype,
            op,
            factors,
            pieces,
        })
    }

    pub fn encode(&self) -> Vec<u8> {
        let index = |found: Option<usize>| found.unwrap_or(usize::MAX) as u64;
        let mut words = vec![
            index(DType::ALL.iter().position(|&d| d == self.dtype)),
            index(ReduceOp::ALL.iter().position(|&o| o == self.op)),
            self.factors.pre.to_bits(),
            self.factors.post.to_bits(),
            self.pieces.len() as u64,
        ];
        words.extend(self.pieces.iter().map(|&p| p as u64));
        let mut bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        bytes.extend_from_slice(self.algorithm.as_bytes());
        bytes
    }

    pub fn decode(bytes: &[u8]) -> Result<Replay> {
        let broken = || CoreError::Communication("internal: a malformed join replay".into());
        let word = |i: usize| -> Result<u64> {
            let chunk = bytes.get(8 * i..8 * i + 8).ok_or_else(broken)?;
            Ok(u64::from_le_bytes(chunk.try_into().map_err(|_| broken())?))
        };
        let dtype = *DType::ALL.get(word(0)? as usize).ok_or_else(broken)?;
        let op = *ReduceOp::ALL.get(word(1)? as usize).ok_or_else(broken)?;
        let factors = Factors {
            pre: f64::from_bits(word(2)?),
            post: f64::from_bits(word(3)?),
        };
        let count = word(4)? as usize;
        let pieces = (0..count)
            .map(|i| word(5 + i).map(|p| p as usize))
            .collect::<Result<Vec<_>>>()?;
        let name = std::str::from_utf8(bytes.get(8 * (5 + count)..).ok_or_else(broken)?)
            .map_err(|_| broken())?;
        let algorithm = schedules::find(ALLREDUCE, name)?.name();
        Ok(Replay {
            algorithm,
            dtype,
            op,
            factors,
            pieces,
        })
    }

    /// Run it with zeros (whatever arrives is discarded).
    fn run(&self, comm: &Communicator, tuning: &Tuning) -> Result<()> {
        let schedule = schedules::find(ALLREDUCE, self.algorithm)?;
        let mut zeros = vec![0u8; self.pieces.iter().sum()];
        let mut pieces = Vec::with_capacity(self.pieces.len());
        let mut rest = zeros.as_mut_slice();
        for &len in &self.pieces {
            let (piece, tail) = rest.split_at_mut(len);
            pieces.push(piece);
            rest = tail;
        }
        let mut parts = Parts::new(pieces);
        schedules::allreduce(
            comm.transport(),
            schedule,
            &mut parts,
            self.dtype,
            self.op,
            self.factors,
            tuning,
        )
    }
}

/// Join on process set `set` (after any queued work); the rank that joined last.
pub fn join(set: SetId) -> Result<usize> {
    let thread = process::caller_thread();
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
            Agreement::WithJoined(replay) => Replay::decode(&replay)?.run(comm, &tuning)?,
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
