//! `direct`: every rank sends its whole vector to every other rank and combines what it
//! receives in rank order, so every rank computes the same bits. One round of N-1 messages of
//! m bytes each way: for small messages on few ranks. (The worked example of CONTRIBUTING.md:
//! this file in src/schedules/ plus one line in the ALLREDUCE registry make it an algorithm.)

use super::{Algorithm, Allreduce, Cost, Reduction, Tuning};
use crate::error::Result;
use crate::scratch::Scratch;
use crate::transport::{Request, Transport};

pub struct Direct;

impl Algorithm for Direct {
    fn name(&self) -> &'static str {
        "direct"
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
        buf: &mut [u8],
        reduction: &Reduction,
        _tuning: &Tuning,
    ) -> Result<()> {
        let (n, rank, len) = (transport.size(), transport.rank(), buf.len());
        if n == 1 || len == 0 {
            return Ok(());
        }
        // Every rank's vector in rank order, this rank's own in its place.
        let mut scratch = Scratch::new(n * len);
        let mut vectors: Vec<&mut [u8]> = scratch.bytes(n * len)?.chunks_mut(len).collect();
        vectors[rank].copy_from_slice(buf);
        let mut requests: Vec<Request> = Vec::with_capacity(2 * n);
        for peer in (0..n).filter(|&peer| peer != rank) {
            requests.push(transport.isend(buf, peer)?);
        }
        for (peer, vector) in vectors.iter_mut().enumerate() {
            if peer != rank {
                requests.push(transport.irecv(vector, peer)?);
            }
        }
        requests.into_iter().try_for_each(Request::wait)?;
        buf.copy_from_slice(vectors[0]);
        for vector in &vectors[1..] {
            reduction.combine(buf, vector)?;
        }
        Ok(())
    }
}
