//! Recursive doubling: log2(p') rounds, each exchanging the whole vector with the partner at
//! distance 1, 2, 4, ... and combining. Latency-optimal, so it is the choice for small messages.
//! Non-power-of-two N folds as in halving-doubling.
//!
//! Partners combine the same two partial results; the lower core rank's data goes on the left,
//! so that both compute the same bits even where the op is not bitwise commutative (NaN
//! payloads). Large buffers run as independent pieces of at most `PIECE_BYTES`, which bounds
//! the scratch: the algorithm needs a receive buffer as large as what it exchanges.

use super::halving_doubling::{real_rank, Role};
use super::{largest_power_of_two, log2_floor, Algorithm, Allreduce, Cost, Reduction, Tuning};
use crate::error::Result;
use crate::scratch::Scratch;
use crate::kernels::Order;
use crate::transport::{message_pieces, Transport};

pub struct RecursiveDoubling;

/// The largest piece (and scratch buffer) recursive doubling works on at once.
pub const PIECE_BYTES: usize = 64 * 1024;

impl Algorithm for RecursiveDoubling {
    fn name(&self) -> &'static str {
        "recursive_doubling"
    }

    fn cost(&self, ranks: usize, bytes: usize, _tuning: &Tuning) -> Cost {
        let pof2 = largest_power_of_two(ranks.max(1));
        let folded = pof2 != ranks;
        let pieces = bytes.div_ceil(PIECE_BYTES).max(1) as f64;
        let rounds = (log2_floor(pof2) + if folded { 2 } else { 0 }) as f64;
        let m = bytes as f64;
        Cost {
            messages: rounds * pieces,
            bytes: rounds * m,
            // The fold's way back carries a finished result: nothing to combine.
            reduced: (rounds - if folded { 1.0 } else { 0.0 }) * m,
        }
    }
}

impl Allreduce for RecursiveDoubling {
    fn run(
        &self,
        transport: &dyn Transport,
        buf: &mut [u8],
        reduction: &Reduction,
        _tuning: &Tuning,
    ) -> Result<()> {
        let n = transport.size();
        if n == 1 {
            return Ok(());
        }
        let elem = reduction.elem_size();
        let mut scratch = Scratch::new(buf.len().min(PIECE_BYTES / elem * elem));
        for piece in message_pieces(buf.len(), PIECE_BYTES, elem) {
            let piece = &mut buf[piece];
            let incoming = scratch.bytes(piece.len())?;
            reduce_piece(transport, piece, incoming, reduction)?;
        }
        Ok(())
    }
}

fn reduce_piece(
    transport: &dyn Transport,
    buf: &mut [u8],
    incoming: &mut [u8],
    reduction: &Reduction,
) -> Result<()> {
    let (n, rank) = (transport.size(), transport.rank());
    match Role::of(rank, n) {
        Role::Folded { partner } => {
            transport.isend(buf, partner)?.wait()?;
            transport.irecv(buf, partner)?.wait()
        }
        Role::Core { core_rank, absorbs } => {
            if let Some(folded) = absorbs {
                transport.irecv(incoming, folded)?.wait()?;
                // The folded rank is the lower one.
                reduction.combine_ordered(buf, incoming, Order::OtherFirst)?;
            }
            let pof2 = largest_power_of_two(n);
            let mut mask = 1;
            while mask < pof2 {
                let partner_core = core_rank ^ mask;
                let partner = real_rank(partner_core, n);
                transport.sendrecv(buf, partner, incoming, partner)?;
                let order = if partner_core < core_rank {
                    Order::OtherFirst
                } else {
                    Order::AccFirst
                };
                reduction.combine_ordered(buf, incoming, order)?;
                mask <<= 1;
            }
            if let Some(folded) = absorbs {
                transport.isend(buf, folded)?.wait()?;
            }
            Ok(())
        }
    }
}
