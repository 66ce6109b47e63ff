//! Reduce-scatter by recursive halving (MPICH's algorithm for commutative ops): log2 p' steps
//! over the largest power of two p' ≤ N ranks; in each step a rank swaps half of what it is
//! still responsible for with the rank half the group away and combines the half it keeps.
//! Each rank sends (p'-1)/p' of the vector in log2 p' messages, where the ring needs N-1.
//!
//! The halves go high bit first, so that core rank c ends with the c-th slot, and slot c is the
//! block of the real rank(s) it stands for. Non-power-of-two N folds as MPICH does: each even
//! rank below 2r (r = N - p') hands its whole vector to the odd rank above it, which stands for
//! both in the core and hands the even rank its block at the end.

use crate::schedules::common::exchange::merged;
use crate::schedules::common::fold::{largest_power_of_two, log2_floor, real_rank, Role};
use crate::schedules::{Algorithm, Cost, Reduction, ReduceScatter, Tuning};
use crate::error::{CoreError, Result};
use crate::kernels::Scaling;
use crate::scratch::Scratch;
use crate::transport::{Destination, Transport};
use smallvec::SmallVec;
use std::ops::Range;

pub struct RecursiveHalving;

impl Algorithm for RecursiveHalving {
    fn name(&self) -> &'static str {
        "recursive_halving"
    }

    fn description(&self) -> &'static str {
        "MPICH's: log2 N steps, each swapping half of what a rank is still responsible for with the rank half the group away; the same bytes as the ring; non-powers of two fold first"
    }

    fn best_for(&self) -> &'static str {
        "short and medium messages"
    }

    fn cost(&self, ranks: usize, bytes: usize, _tuning: &Tuning) -> Cost {
        halving_cost(ranks, bytes, |p| log2_floor(p) as f64)
    }
}

/// The cost of a recursive-halving reduce-scatter whose core sends `messages(p')` messages.
pub(crate) fn halving_cost(ranks: usize, bytes: usize, messages: impl Fn(usize) -> f64) -> Cost {
    let pof2 = largest_power_of_two(ranks.max(1));
    let (n, p, m) = (ranks.max(1) as f64, pof2 as f64, bytes as f64);
    let core = Cost {
        messages: messages(pof2),
        bytes: (p - 1.0) / p * m,
        reduced: (p - 1.0) / p * m,
    };
    if pof2 == ranks {
        return core;
    }
    // The fold: the whole vector in (combined), and a block back out.
    Cost {
        messages: core.messages + 2.0,
        bytes: core.bytes + m + m / n,
        reduced: core.reduced + m,
    }
}

impl ReduceScatter for RecursiveHalving {
    fn run(
        &self,
        transport: &dyn Transport,
        buf: &mut [u8],
        blocks: &[Range<usize>],
        reduction: &Reduction,
    ) -> Result<()> {
        let n = transport.size();
        check_blocks(n, buf.len(), blocks)?;
        let Some(core_rank) = fold_in(transport, buf, blocks, reduction)? else {
            return Ok(());
        };
        let pof2 = largest_power_of_two(n);
        // The first step keeps the most (the halves shrink after it).
        let (first, _) = halves(0..pof2, core_rank, pof2 / 2);
        let largest: usize = ranks_of(first, n).iter().map(|&r| blocks[r].len()).sum();
        let mut scratch = Scratch::new(largest);
        let (mut held, mut mask) = (0..pof2, pof2 / 2);
        while mask > 0 {
            let partner = real_rank(core_rank ^ mask, n);
            let (keep, give) = halves(held.clone(), core_rank, mask);
            let (sends, keeps) = (
                merged(ranks_of(give, n).iter().map(|&r| blocks[r].clone())),
                merged(ranks_of(keep.clone(), n).iter().map(|&r| blocks[r].clone())),
            );
            let cuts = keeps.iter().map(|r| r.len()).collect();
            let incoming = scratch.bytes(keeps.iter().map(|r| r.len()).sum())?;
            let outgoing: SmallVec<[&[u8]; 2]> = sends.iter().map(|r| &buf[r.clone()]).collect();
            let destination = Destination::Cut {
                buf: &mut *incoming,
                cuts,
            };
            transport.sendrecv_pieces(&outgoing, partner, destination, partner)?;
            drop(outgoing);
            let mut offset = 0;
            for range in keeps {
                let len = range.len();
                reduction.combine(&mut buf[range], &incoming[offset..offset + len], &Scaling::NONE)?;
                offset += len;
            }
            held = keep;
            mask >>= 1;
        }
        fold_out(transport, buf, blocks)
    }
}

/// The half of `held` (2·mask slots) that `core_rank` keeps, and the half it gives.
pub(crate) fn halves(held: Range<usize>, core_rank: usize, mask: usize) -> (Range<usize>, Range<usize>) {
    let mid = held.start + mask;
    if core_rank & mask == 0 {
        (held.start..mid, mid..held.end)
    } else {
        (mid..held.end, held.start..mid)
    }
}

/// The real ranks whose blocks the core slots `cores` hold: each core rank's own, and the
/// folded rank's below it.
pub(crate) fn ranks_of(cores: Range<usize>, n: usize) -> Vec<usize> {
    let mut ranks = Vec::new();
    for core in cores {
        let real = real_rank(core, n);
        if let Role::Core {
            absorbs: Some(folded),
            ..
        } = Role::of(real, n)
        {
            ranks.push(folded);
        }
        ranks.push(real);
    }
    ranks
}

pub(crate) fn check_blocks(n: usize, len: usize, blocks: &[Range<usize>]) -> Result<()> {
    if blocks.len() != n || blocks.iter().any(|b| b.start > b.end || b.end > len) {
        return Err(CoreError::InvalidArgument(format!(
            "recursive halving needs one block per rank ({n}) inside the {len}-byte buffer"
        )));
    }
    Ok(())
}

/// The fold before the core: a folded rank hands over its vector and waits for its block
/// (`None`: it is done); a rank that absorbs one combines it in. `Some(core rank)` otherwise.
pub(crate) fn fold_in(
    transport: &dyn Transport,
    buf: &mut [u8],
    blocks: &[Range<usize>],
    reduction: &Reduction,
) -> Result<Option<usize>> {
    let (n, rank) = (transport.size(), transport.rank());
    match Role::of(rank, n) {
        Role::Folded { partner } => {
            transport.isend(buf, partner)?.wait()?;
            transport.irecv(&mut buf[blocks[rank].clone()], partner)?.wait()?;
            Ok(None)
        }
        Role::Core { core_rank, absorbs } => {
            if let Some(folded) = absorbs {
                let mut scratch = Scratch::new(buf.len());
                let incoming = scratch.bytes(buf.len())?;
                transport.irecv(incoming, folded)?.wait()?;
                reduction.combine(buf, incoming, &Scaling::NONE)?;
            }
            Ok(Some(core_rank))
        }
    }
}

/// After the core: hand a folded rank its finished block.
pub(crate) fn fold_out(transport: &dyn Transport, buf: &[u8], blocks: &[Range<usize>]) -> Result<()> {
    let n = transport.size();
    if let Role::Core {
        absorbs: Some(folded),
        ..
    } = Role::of(transport.rank(), n)
    {
        transport.isend(&buf[blocks[folded].clone()], folded)?.wait()?;
    }
    Ok(())
}
