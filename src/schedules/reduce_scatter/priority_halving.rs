//! Priority-aware reduce-scatter (Gavahi): recursive halving cut into one message per final
//! block, sent and received nonblocking, with each block reduced only when it is needed, in
//! the order it is needed. A block a rank will hand on in the next step is finished (its
//! postponed parts combined) and sent first, while the blocks it keeps until later are still
//! arriving; what it keeps to the end is combined last, while its own sends drain. The
//! partner sends in the order the receiver needs, and the receiver posts its receives in that
//! order, so the first message of a step is the one the next step waits for.
//!
//! The same bytes as [`super::recursive_halving`], in p'-1 messages per rank instead of
//! log2 p': more latency, so it pays only for long messages, where the reduction of one block
//! overlaps the transfer of the next (the paper: up to 7% at very large messages, worse below
//! 256 KiB). Scratch: everything a rank receives, (p'-1)/p' of the vector.

use crate::schedules::common::exchange::{cut, merged};
use super::recursive_halving::{check_blocks, fold_in, fold_out, halves, halving_cost, ranks_of};
use crate::schedules::common::fold::{largest_power_of_two, log2_floor, real_rank};
use crate::schedules::{Algorithm, Cost, Reduction, ReduceScatter, Tuning};
use crate::error::Result;
use crate::kernels::Scaling;
use crate::scratch::Scratch;
use crate::transport::{Destination, Request, Transport};
use smallvec::SmallVec;
use std::ops::Range;

pub struct PriorityHalving;

impl Algorithm for PriorityHalving {
    fn name(&self) -> &'static str {
        "priority_halving"
    }

    fn description(&self) -> &'static str {
        "Gavahi: recursive halving with one nonblocking message per block, each block reduced only when it is about to be sent on, so that reductions overlap the transfers; more messages"
    }

    fn best_for(&self) -> &'static str {
        "very long messages"
    }

    fn cost(&self, ranks: usize, bytes: usize, _tuning: &Tuning) -> Cost {
        halving_cost(ranks, bytes, |p| (p - 1) as f64)
    }
}

impl ReduceScatter for PriorityHalving {
    fn run(
        &self,
        transport: &dyn Transport,
        buf: &mut [u8],
        blocks: &[Range<usize>],
        reduction: &Reduction,
    ) -> Result<()> {
        check_blocks(transport.size(), buf.len(), blocks)?;
        let Some(core_rank) = fold_in(transport, buf, blocks, reduction)? else {
            return Ok(());
        };
        core(transport, buf, blocks, reduction, core_rank)?;
        fold_out(transport, buf, blocks)
    }
}

/// The step after `step` at which core rank `holder` hands slot `slot` on (`steps` if never:
/// it is `holder`'s own slot). Earlier means more urgent.
fn needed(slot: usize, holder: usize, step: usize, steps: usize) -> usize {
    (step + 1..steps)
        .find(|&t| {
            let mask = 1 << (steps - 1 - t);
            slot & mask != holder & mask
        })
        .unwrap_or(steps)
}

/// The order in which `holder` uses the slots it receives in `step`: by the step that hands
/// each on, then in the order that step sends them (its receiver's urgency, recursively), then
/// by slot. The sender sends in this order and the receiver posts and waits in it, so that the
/// receives complete in the order they were posted.
fn urgency(slot: usize, holder: usize, step: usize, steps: usize) -> SmallVec<[usize; 8]> {
    let mut key = SmallVec::new();
    let (mut holder, mut step) = (holder, step);
    loop {
        let at = needed(slot, holder, step, steps);
        key.push(at);
        if at == steps {
            key.push(slot);
            return key;
        }
        holder ^= 1 << (steps - 1 - at);
        step = at;
    }
}

type Pieces<'a> = SmallVec<[&'a mut [u8]; 1]>;

fn core(
    transport: &dyn Transport,
    buf: &mut [u8],
    blocks: &[Range<usize>],
    reduction: &Reduction,
    core_rank: usize,
) -> Result<()> {
    let n = transport.size();
    let pof2 = largest_power_of_two(n);
    let steps = log2_floor(pof2);
    // Each slot's bytes: the merged blocks of the ranks it stands for, as pieces of `buf`.
    let ranges: Vec<Vec<Range<usize>>> = (0..pof2)
        .map(|slot| merged(ranks_of(slot..slot + 1, n).iter().map(|&r| blocks[r].clone())))
        .collect();
    let lengths: Vec<usize> = ranges.iter().map(|r| r.iter().map(|r| r.len()).sum()).collect();
    let mut slots = split(buf, &ranges)?;
    // Scratch for everything this rank receives: slot x in every step that keeps it.
    let mut plan = Vec::new(); // (step, slots received in order, partner)
    let (mut held, mut total) = (0..pof2, 0);
    for step in 0..steps {
        let mask = pof2 >> (step + 1);
        let (keep, _) = halves(held.clone(), core_rank, mask);
        let mut order: Vec<usize> = keep.clone().collect();
        order.sort_by_cached_key(|&x| urgency(x, core_rank, step, steps));
        total += order.iter().map(|&x| lengths[x]).sum::<usize>();
        plan.push(order);
        held = keep;
    }
    let mut scratch = Scratch::new(total);
    let mut regions = scratch.bytes(total)?;
    let mut pending: Vec<Vec<Request>> = (0..pof2).map(|_| Vec::new()).collect();
    let mut sends = Vec::with_capacity(pof2);
    let mut held = 0..pof2;
    for (step, order) in plan.into_iter().enumerate() {
        let mask = pof2 >> (step + 1);
        let partner_core = core_rank ^ mask;
        let partner = real_rank(partner_core, n);
        let (keep, give) = halves(held.clone(), core_rank, mask);
        for x in order {
            let (region, rest) = std::mem::take(&mut regions).split_at_mut(lengths[x]);
            regions = rest;
            let cuts = ranges[x].iter().map(|r| r.len()).collect();
            let destination = Destination::Cut { buf: region, cuts };
            pending[x].push(transport.irecv_to(destination, partner)?);
        }
        let mut outgoing: Vec<usize> = give.collect();
        outgoing.sort_by_cached_key(|&g| urgency(g, partner_core, step, steps));
        for g in outgoing {
            finish(&mut slots[g], &mut pending[g], reduction)?;
            let pieces: SmallVec<[&[u8]; 1]> =
                std::mem::take(&mut slots[g]).into_iter().map(|p| &*p).collect();
            sends.push(transport.isend_pieces(&pieces, partner)?);
        }
        held = keep;
    }
    finish(&mut slots[core_rank], &mut pending[core_rank], reduction)?;
    for send in sends {
        send.wait()?;
    }
    Ok(())
}

/// Combine into `slot` what arrived for it, in the order it was received.
fn finish(slot: &mut Pieces, pending: &mut Vec<Request>, reduction: &Reduction) -> Result<()> {
    for request in pending.drain(..) {
        let incoming = request.wait_for_data()?;
        let mut offset = 0;
        for piece in slot.iter_mut() {
            let len = piece.len();
            reduction.combine(piece, &incoming[offset..offset + len], &Scaling::NONE)?;
            offset += len;
        }
    }
    Ok(())
}

/// `buf` cut into the disjoint `ranges` of each slot, each slot's pieces in the order given.
fn split<'a>(buf: &'a mut [u8], ranges: &[Vec<Range<usize>>]) -> Result<Vec<Pieces<'a>>> {
    let flat: Vec<Range<usize>> = ranges.iter().flatten().cloned().collect();
    let mut pieces = cut(buf, &flat)?.into_iter();
    Ok(ranges
        .iter()
        .map(|list| pieces.by_ref().take(list.len()).collect())
        .collect())
}
