//! `direct`: every rank sends its whole vector to every other rank and combines all N vectors
//! in rank order, so every rank computes the same bits. One round of N-1 messages of m bytes
//! each way: for small messages on few ranks. (The worked example of CONTRIBUTING.md: this file
//! as src/schedules/allreduce/direct.rs plus one line in the ALLREDUCE registry of
//! src/schedules/mod.rs make it an algorithm.)

use crate::schedules::{Algorithm, Allreduce, Cost, Parts, Reduction, Tuning};
use crate::error::Result;
use crate::kernels::Scaling;
use crate::scratch::Scratch;
use crate::transport::{Destination, Request, Transport};

pub struct Direct;

impl Algorithm for Direct {
    fn name(&self) -> &'static str {
        "direct"
    }

    fn description(&self) -> &'static str {
        "every rank sends its whole vector to every other rank and combines all N in rank order: one round of N-1 messages of m bytes"
    }

    fn best_for(&self) -> &'static str {
        "small messages on few ranks"
    }

    fn cost(&self, ranks: usize, bytes: usize, _tuning: &Tuning) -> Cost {
        let (others, m) = (ranks.saturating_sub(1) as f64, bytes as f64);
        Cost {
            messages: others,
            bytes: others * m,
            reduced: others * m,
        }
    }
}

impl Allreduce for Direct {
    fn run(
        &self,
        transport: &dyn Transport,
        buf: &mut Parts,
        reduction: &Reduction,
        _tuning: &Tuning,
    ) -> Result<()> {
        let (n, rank, len) = (transport.size(), transport.rank(), buf.len());
        if len == 0 {
            return Ok(()); // every rank has the same length: nobody sends anything
        }
        // Every rank's vector, back to back in rank order. The vector may be several buffers
        // (`Parts`): it travels as one message per piece, and arrives cut the same way.
        let mut scratch = Scratch::new(n * len);
        let all = scratch.bytes(n * len)?;
        let cuts = buf.cuts(0..len)?;
        {
            let own = buf.get(0..len)?;
            let mut requests: Vec<Request> = Vec::with_capacity(2 * n);
            for peer in (0..n).filter(|&peer| peer != rank) {
                requests.push(transport.isend_pieces(&own, peer)?);
            }
            for (peer, vector) in all.chunks_mut(len).enumerate() {
                if peer == rank {
                    vector.copy_from_slice(&own.concat());
                } else {
                    let cuts = cuts.clone();
                    requests.push(transport.irecv_to(Destination::Cut { buf: vector, cuts }, peer)?);
                }
            }
            requests.into_iter().try_for_each(Request::wait)?;
        }
        // Fold the vectors left to right, the same order on every rank.
        let (first, rest) = all.split_at_mut(len);
        for vector in rest.chunks(len) {
            reduction.combine(first, vector, &Scaling::NONE)?;
        }
        // Back into the vector's pieces.
        let mut offset = 0;
        for piece in buf.get_mut(0..len)?.iter_mut() {
            piece.copy_from_slice(&first[offset..offset + piece.len()]);
            offset += piece.len();
        }
        Ok(())
    }
}
