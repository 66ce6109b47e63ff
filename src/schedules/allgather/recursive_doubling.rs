//! Allgather by recursive doubling: log2 p' steps over the largest power of two p' ≤ N ranks;
//! in step k each rank swaps everything it holds (the blocks of 2^k ranks) with the rank 2^k
//! away, so a rank sends (p'-1)/p' of the data in log2 p' messages, where the ring needs N-1.
//! Non-power-of-two N folds as MPICH does for allreduce: each even rank below 2r (r = N - p')
//! hands its block to the odd rank above it, which stands for both in the core, and gets
//! every other block back at the end. Blocks may differ in size per rank; the blocks of
//! consecutive ranks that are adjacent in memory travel as one message.

use crate::schedules::common::exchange::{merged, shift};
use crate::schedules::common::fold::{largest_power_of_two, log2_floor, real_rank, Role};
use crate::schedules::{Algorithm, Allgather, Cost, Tuning};
use crate::error::{CoreError, Result};
use crate::transport::Transport;
use std::ops::Range;

pub struct DoublingAllgather;

impl Algorithm for DoublingAllgather {
    fn name(&self) -> &'static str {
        "recursive_doubling"
    }

    fn description(&self) -> &'static str {
        "log2 N steps, each swapping everything held so far with the rank 2^k away; the same bytes as the ring; non-powers of two fold as MPICH does"
    }

    fn best_for(&self) -> &'static str {
        "short messages, many ranks"
    }

    fn cost(&self, ranks: usize, bytes: usize, _tuning: &Tuning) -> Cost {
        let pof2 = largest_power_of_two(ranks.max(1));
        let (n, p, m) = (ranks.max(1) as f64, pof2 as f64, bytes as f64);
        let core = Cost {
            messages: log2_floor(pof2) as f64,
            bytes: (p - 1.0) / p * m,
            reduced: 0.0,
        };
        if pof2 == ranks {
            return core;
        }
        // The fold: a block in, and everything else back out.
        Cost {
            messages: core.messages + 2.0,
            bytes: core.bytes + m / n + (n - 1.0) / n * m,
            reduced: 0.0,
        }
    }
}

impl Allgather for DoublingAllgather {
    fn run(
        &self,
        transport: &dyn Transport,
        buf: &mut [u8],
        blocks: &[Range<usize>],
    ) -> Result<()> {
        let (n, rank) = (transport.size(), transport.rank());
        if blocks.len() != n || blocks.iter().any(|b| b.start > b.end || b.end > buf.len()) {
            return Err(CoreError::InvalidArgument(format!(
                "recursive doubling needs one block per rank ({n}) inside the {}-byte buffer",
                buf.len()
            )));
        }
        let pof2 = largest_power_of_two(n);
        // The real ranks core rank c stands for: itself, and the folded rank below it.
        let stands_for = |c: usize| {
            let real = real_rank(c, n);
            match Role::of(real, n) {
                Role::Core {
                    absorbs: Some(folded),
                    ..
                } => folded..real + 1,
                _ => real..real + 1,
            }
        };
        let ranks_of = |cores: Range<usize>| -> Vec<usize> {
            cores.flat_map(&stands_for).collect()
        };
        match Role::of(rank, n) {
            Role::Folded { partner } => {
                exchange(transport, buf, blocks, &[rank], &[], partner)?;
                let others: Vec<usize> = (0..n).filter(|&r| r != rank).collect();
                exchange(transport, buf, blocks, &[], &others, partner)
            }
            Role::Core { core_rank, absorbs } => {
                if let Some(folded) = absorbs {
                    exchange(transport, buf, blocks, &[], &[folded], folded)?;
                }
                for step in 0..log2_floor(pof2) {
                    let mask = 1 << step;
                    let mine = core_rank & !(mask - 1);
                    let theirs = mine ^ mask;
                    let partner = real_rank(core_rank ^ mask, n);
                    let (send, recv) = (ranks_of(mine..mine + mask), ranks_of(theirs..theirs + mask));
                    exchange(transport, buf, blocks, &send, &recv, partner)?;
                }
                if let Some(folded) = absorbs {
                    let others: Vec<usize> = (0..n).filter(|&r| r != folded).collect();
                    exchange(transport, buf, blocks, &others, &[], folded)?;
                }
                Ok(())
            }
        }
    }
}

/// Send the blocks of ranks `send` to `peer` while receiving the blocks of ranks `recv` from
/// it (disjoint sets), in place; blocks adjacent in memory travel as one piece.
fn exchange(
    transport: &dyn Transport,
    buf: &mut [u8],
    blocks: &[Range<usize>],
    send: &[usize],
    recv: &[usize],
    peer: usize,
) -> Result<()> {
    let outgoing = merged(send.iter().map(|&r| blocks[r].clone()));
    let incoming = merged(recv.iter().map(|&r| blocks[r].clone()));
    shift(transport, buf, &outgoing, peer, &incoming, peer)
}
