//! Recursive doubling: log2(p') rounds, each exchanging the whole vector with the partner at
//! distance 1, 2, 4, ... and combining. Latency-optimal, so it is the choice for small messages.
//! Non-power-of-two N folds as in halving-doubling.
//!
//! Partners combine the same two partial results; the lower core rank's data goes on the left,
//! so that both compute the same bits even where the op is not bitwise commutative (NaN
//! payloads). Large buffers run as independent segments of at most `SEGMENT_BYTES`, which
//! bounds the scratch: the algorithm needs a receive buffer as large as what it exchanges.

use crate::schedules::common::exchange::send_and_receive;
use crate::schedules::common::fold::{largest_power_of_two, log2_floor, real_rank, Role};
use crate::schedules::{Algorithm, Allreduce, Cost, Input, Parts, Reduction, Tuning};
use crate::error::Result;
use crate::kernels::Order;
use crate::scratch::Scratch;
use crate::transport::{message_pieces, Destination, Transport};
use std::ops::Range;

pub struct RecursiveDoubling;

/// The largest segment (and scratch buffer) recursive doubling works on at once.
pub const SEGMENT_BYTES: usize = 64 * 1024;

impl Algorithm for RecursiveDoubling {
    fn name(&self) -> &'static str {
        "recursive_doubling"
    }

    fn description(&self) -> &'static str {
        "log2 N rounds exchanging the whole vector"
    }

    fn best_for(&self) -> &'static str {
        "small messages (latency-bound)"
    }

    fn cost(&self, ranks: usize, bytes: usize, _tuning: &Tuning) -> Cost {
        let pof2 = largest_power_of_two(ranks.max(1));
        let folded = pof2 != ranks;
        let segments = bytes.div_ceil(SEGMENT_BYTES).max(1) as f64;
        let rounds = (log2_floor(pof2) + if folded { 2 } else { 0 }) as f64;
        let m = bytes as f64;
        Cost {
            messages: rounds * segments,
            bytes: rounds * m,
            // The fold's way back carries a finished result: nothing to combine.
            reduced: (rounds - if folded { 1.0 } else { 0.0 }) * m,
        }
    }

    fn folds_scaling(&self) -> bool {
        true
    }
}

impl Allreduce for RecursiveDoubling {
    fn run(
        &self,
        transport: &dyn Transport,
        buf: &mut Parts,
        reduction: &Reduction,
        _tuning: &Tuning,
    ) -> Result<()> {
        recursive_doubling(transport, buf, None, reduction)
    }

    /// Out of place, a segment's first send reads the input, and the segment is copied from
    /// the input into the result just before its first combine, while it is in cache.
    fn run_from(
        &self,
        transport: &dyn Transport,
        input: &Input,
        output: &mut Parts,
        reduction: &Reduction,
        _tuning: &Tuning,
    ) -> Result<()> {
        recursive_doubling(transport, output, Some(input), reduction)
    }
}

/// Every segment in turn; this rank's vector is read from `input` where given (`buf` then
/// starts unwritten).
fn recursive_doubling(
    transport: &dyn Transport,
    buf: &mut Parts,
    input: Option<&Input>,
    reduction: &Reduction,
) -> Result<()> {
    let elem = reduction.elem_size();
    let len = buf.len();
    let mut scratch = Scratch::new(len.min(SEGMENT_BYTES / elem * elem));
    // Cut as the transport cuts its pieces: whole elements, at most SEGMENT_BYTES each.
    for segment in message_pieces(len, SEGMENT_BYTES, elem) {
        let incoming = scratch.bytes(segment.len())?;
        reduce_segment(transport, buf, input, segment, incoming, reduction)?;
    }
    Ok(())
}

/// Scaling: a rank's own data is fresh until its first combine (the fold, or round 0); a
/// partner's at round 0 unless it absorbed a folded rank; the last round finishes.
fn reduce_segment(
    transport: &dyn Transport,
    buf: &mut Parts,
    input: Option<&Input>,
    segment: Range<usize>,
    incoming: &mut [u8],
    reduction: &Reduction,
) -> Result<()> {
    let (n, rank) = (transport.size(), transport.rank());
    let absorbed = |real: usize| matches!(Role::of(real, n), Role::Core { absorbs: Some(_), .. });
    match Role::of(rank, n) {
        Role::Folded { partner } => {
            {
                let outgoing = match input {
                    Some(input) => input.get(segment.clone())?,
                    None => buf.get(segment.clone())?,
                };
                transport.isend_pieces(&outgoing, partner)?.wait()?;
            }
            let target = buf.get_mut(segment)?;
            transport.irecv_to(Destination::Pieces(target), partner)?.wait()
        }
        Role::Core { core_rank, absorbs } => {
            if let Some(folded) = absorbs {
                let cuts = buf.cuts(segment.clone())?;
                let destination = Destination::Cut { buf: &mut *incoming, cuts };
                transport.irecv_to(destination, folded)?.wait()?;
                if let Some(input) = input {
                    buf.copy_from(segment.clone(), input)?; // its first touch in the result
                }
                // The folded rank is the lower one.
                let scaling = reduction.scaling(true, true, false);
                let mut target = buf.get_mut(segment.clone())?;
                reduction.combine_into(&mut target, incoming, Order::OtherFirst, &scaling)?;
            }
            let rounds = log2_floor(largest_power_of_two(n));
            for round in 0..rounds {
                let partner_core = core_rank ^ (1 << round);
                let partner = real_rank(partner_core, n);
                let range = segment.clone();
                match input {
                    // The first exchange gives this rank's own segment, from the input.
                    Some(input) if round == 0 && absorbs.is_none() => {
                        let cuts = buf.cuts(range.clone())?;
                        let destination = Destination::Cut { buf: &mut *incoming, cuts };
                        let outgoing = input.get(range.clone())?;
                        transport.sendrecv_pieces(&outgoing, partner, destination, partner)?;
                        buf.copy_from(range, input)?;
                    }
                    _ => send_and_receive(transport, buf, range.clone(), partner, incoming, range, partner)?,
                }
                let order = if partner_core < core_rank {
                    Order::OtherFirst
                } else {
                    Order::AccFirst
                };
                let scaling = reduction.scaling(
                    round == 0 && absorbs.is_none(),
                    round == 0 && !absorbed(partner),
                    round + 1 == rounds,
                );
                let mut target = buf.get_mut(segment.clone())?;
                reduction.combine_into(&mut target, incoming, order, &scaling)?;
            }
            if let Some(folded) = absorbs {
                let outgoing = buf.get(segment)?;
                transport.isend_pieces(&outgoing, folded)?.wait()?;
            }
            Ok(())
        }
    }
}
