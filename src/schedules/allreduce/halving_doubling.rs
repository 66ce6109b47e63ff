//! Rabenseifner's allreduce: reduce-scatter by recursive halving, then allgather by recursive
//! doubling, over the largest power of two p' ≤ N ranks.
//!
//! Non-power-of-two N uses MPICH's fold: with r = N - p', each even rank below 2r sends its
//! vector to the odd rank above it and sits out; the odd rank combines the two. After the
//! core, the odd ranks send the result back (the 13-process example in Thakur, Rabenseifner & Gropp, "Optimization of Collective
//! Communication Operations in MPICH").
//! The fold's vector travels as two half messages, so scratch stays at m/2.
//!
//! Rounds per rank: 2·log2(p') in the core, plus one fold step in and one out for the 2r ranks
//! that fold. Scratch: the larger half of the blocks, at most ⌈count/2⌉ + p'/4 elements.

use crate::schedules::common::blocks::Blocks;
use crate::schedules::common::exchange::{receive_all, send_all, send_and_receive, swap};
use crate::schedules::common::fold::{largest_power_of_two, log2_floor, real_rank, Role};
use crate::schedules::{Algorithm, Allreduce, Cost, Input, Parts, Reduction, Tuning};
use crate::error::Result;
use crate::kernels::Order;
use crate::scratch::Scratch;
use crate::transport::{Destination, Pieces, Transport};
use std::ops::Range;

pub struct HalvingDoubling;

/// The fold's two halves, cut at an element boundary.
fn fold_halves(len: usize, elem: usize) -> [Range<usize>; 2] {
    let mid = (len / elem).div_ceil(2) * elem;
    [0..mid, mid..len]
}

impl Algorithm for HalvingDoubling {
    fn name(&self) -> &'static str {
        "halving_doubling"
    }

    fn description(&self) -> &'static str {
        "Rabenseifner: recursive halving reduce-scatter, recursive doubling allgather, 2·log2 N steps; non-powers of two fold the extra ranks first (MPICH)"
    }

    fn best_for(&self) -> &'static str {
        "large messages, many ranks"
    }

    fn cost(&self, ranks: usize, bytes: usize, _tuning: &Tuning) -> Cost {
        let (pof2, m) = (largest_power_of_two(ranks.max(1)), bytes as f64);
        let p = pof2 as f64;
        let core = Cost {
            messages: 2.0 * log2_floor(pof2) as f64,
            bytes: 2.0 * (p - 1.0) / p * m,
            reduced: (p - 1.0) / p * m,
        };
        if pof2 == ranks {
            return core;
        }
        // The fold: the whole vector in (as two halves, combined) and out again.
        Cost {
            messages: core.messages + 3.0,
            bytes: core.bytes + 2.0 * m,
            reduced: core.reduced + m,
        }
    }

    fn folds_scaling(&self) -> bool {
        true
    }
}

impl Allreduce for HalvingDoubling {
    fn run(
        &self,
        transport: &dyn Transport,
        buf: &mut Parts,
        reduction: &Reduction,
        _tuning: &Tuning,
    ) -> Result<()> {
        reduce(transport, buf, None, reduction)
    }

    /// Out of place, the first send and the first combine of each block read the input; the
    /// blocks only given away are written by the doubling.
    fn run_from(
        &self,
        transport: &dyn Transport,
        input: &Input,
        output: &mut Parts,
        reduction: &Reduction,
        _tuning: &Tuning,
    ) -> Result<()> {
        reduce(transport, output, Some(input), reduction)
    }
}

/// The fold and halvings, then the doublings; this rank's vector is read from `input` where
/// given (`buf` then starts unwritten).
fn reduce(transport: &dyn Transport, buf: &mut Parts, input: Option<&Input>, reduction: &Reduction) -> Result<()> {
    let blocks = Blocks::new(buf.len() / reduction.elem_size(), largest_power_of_two(transport.size()), reduction.elem_size());
    let halved = halve_from(transport, buf, input, reduction, &blocks)?;
    double(transport, buf, halved, &blocks)
}

/// The allgather half: undo the halvings in reverse (give what this rank finished, take what
/// the partner did), then hand a folded rank its result.
fn double(transport: &dyn Transport, buf: &mut Parts, halved: Halved, blocks: &Blocks) -> Result<()> {
    match halved {
        Halved::Folded { partner } => receive_all(transport, buf, partner),
        Halved::Core { absorbs, exchanges, .. } => {
            for step in exchanges.into_iter().rev() {
                swap(transport, buf, blocks.span(step.kept), step.partner, blocks.span(step.given), step.partner)?;
            }
            if let Some(folded) = absorbs {
                send_all(transport, buf, folded)?;
            }
            Ok(())
        }
    }
}

/// One halving step of a core rank: the partner, the blocks it kept and those it gave.
pub(crate) struct Exchange {
    pub partner: usize,
    pub kept: Range<usize>,
    pub given: Range<usize>,
}

/// What the reduce-scatter half of the algorithm left a rank with.
pub(crate) enum Halved {
    /// An even rank below 2r: it handed its vector to `partner`, which reduced it.
    Folded { partner: usize },
    /// A rank of the power-of-two core: after `exchanges` (in step order, step i over
    /// partner `core_rank ^ 2^i`) it holds the finished blocks of the last one's `kept`.
    Core {
        core_rank: usize,
        absorbs: Option<usize>,
        exchanges: Vec<Exchange>,
    },
}

/// The fold and the recursive halving over `blocks` (p' of them): the reduce-scatter that
/// Rabenseifner's allreduce and reduce begin with.
///
/// Scaling: a rank's own data is fresh until it first combines (the fold, or core step 0); the
/// partner's data at step 0 is fresh unless the partner absorbed a folded rank; the last
/// halving step finishes the block the rank keeps.
pub(crate) fn halve(
    transport: &dyn Transport,
    buf: &mut Parts,
    reduction: &Reduction,
    blocks: &Blocks,
) -> Result<Halved> {
    halve_from(transport, buf, None, reduction, blocks)
}

/// [`halve`], reading this rank's vector from `input` (as long as `buf`, which then starts
/// unwritten) where given: a block is copied into `buf` only when it is first combined.
fn halve_from(
    transport: &dyn Transport,
    buf: &mut Parts,
    input: Option<&Input>,
    reduction: &Reduction,
    blocks: &Blocks,
) -> Result<Halved> {
    let (n, rank) = (transport.size(), transport.rank());
    let elem = reduction.elem_size();
    let len = buf.len();
    let pof2 = largest_power_of_two(n);
    // The first halving step receives the larger half (the lower blocks hold the extra
    // elements); the fold's halves are no larger.
    let mut scratch = Scratch::new(blocks.span(0..pof2 / 2).len());
    let absorbed = |real: usize| matches!(Role::of(real, n), Role::Core { absorbs: Some(_), .. });

    let (core_rank, absorbs) = match Role::of(rank, n) {
        Role::Folded { partner } => {
            for half in fold_halves(len, elem) {
                let pieces: Pieces = match input {
                    Some(input) => input.get(half)?,
                    None => buf.get(half)?,
                };
                transport.isend_pieces(&pieces, partner)?.wait()?;
            }
            return Ok(Halved::Folded { partner });
        }
        Role::Core { core_rank, absorbs } => (core_rank, absorbs),
    };
    if let Some(folded) = absorbs {
        let scaling = reduction.scaling(true, true, false);
        for half in fold_halves(len, elem) {
            let incoming = scratch.bytes(half.len())?;
            let cuts = buf.cuts(half.clone())?;
            let destination = Destination::Cut { buf: &mut *incoming, cuts };
            transport.irecv_to(destination, folded)?.wait()?;
            if let Some(input) = input {
                buf.copy_from(half.clone(), input)?;
            }
            let mut target = buf.get_mut(half)?;
            reduction.combine_into(&mut target, incoming, Order::AccFirst, &scaling)?;
        }
    }
    // The input still to be read: the fold wrote the whole vector into `buf` already.
    let mut fresh = input.filter(|_| absorbs.is_none());
    let steps = log2_floor(pof2);
    let mut held = 0..pof2; // block indices this rank is responsible for
    let mut exchanges = Vec::with_capacity(steps);
    for step in 0..steps {
        let mask = 1 << step;
        let partner = real_rank(core_rank ^ mask, n);
        let mid = held.start + (held.end - held.start) / 2;
        let (kept, given) = if core_rank & mask == 0 {
            (held.start..mid, mid..held.end)
        } else {
            (mid..held.end, held.start..mid)
        };
        let (send, recv) = (blocks.span(given.clone()), blocks.span(kept.clone()));
        let incoming = scratch.bytes(recv.len())?;
        match fresh.take() {
            // The first step: what this rank gives and keeps comes from the input.
            Some(input) => {
                let cuts = buf.cuts(recv.clone())?;
                let outgoing = input.get(send)?;
                let destination = Destination::Cut { buf: &mut *incoming, cuts };
                transport.sendrecv_pieces(&outgoing, partner, destination, partner)?;
                buf.copy_from(recv.clone(), input)?;
            }
            None => send_and_receive(transport, buf, send, partner, incoming, recv.clone(), partner)?,
        }
        let scaling = reduction.scaling(
            step == 0 && absorbs.is_none(),
            step == 0 && !absorbed(partner),
            step + 1 == steps,
        );
        let mut target = buf.get_mut(recv)?;
        reduction.combine_into(&mut target, incoming, Order::AccFirst, &scaling)?;
        exchanges.push(Exchange {
            partner,
            kept: kept.clone(),
            given,
        });
        held = kept;
    }
    Ok(Halved::Core {
        core_rank,
        absorbs,
        exchanges,
    })
}
