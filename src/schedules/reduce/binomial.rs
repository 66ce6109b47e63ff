//! Reduce to `root` along a binomial tree: ⌈log2 N⌉ rounds; in round i every rank whose
//! relative rank (to the root) has bit i set sends its partial result to the rank without it
//! and leaves. The root receives and combines ⌈log2 N⌉ whole vectors, so it suits short
//! messages (Kurnosov, section 4.1; Open MPI's and MPICH's choice below a few KiB).

use crate::schedules::{Algorithm, Cost, Reduce, Reduction, Tuning};
use crate::error::Result;
use crate::kernels::Scaling;
use crate::scratch::Scratch;
use crate::transport::Transport;

pub struct BinomialReduce;

impl Algorithm for BinomialReduce {
    fn name(&self) -> &'static str {
        "binomial"
    }

    fn description(&self) -> &'static str {
        "partial results up a binomial tree to the root: ⌈log2 N⌉ rounds, the root combines ⌈log2 N⌉ whole vectors"
    }

    fn best_for(&self) -> &'static str {
        "short messages"
    }

    fn cost(&self, ranks: usize, bytes: usize, _tuning: &Tuning) -> Cost {
        // The root receives and combines the whole vector once per round.
        let rounds = ranks.max(1).next_power_of_two().trailing_zeros() as f64;
        Cost {
            messages: rounds,
            bytes: rounds * bytes as f64,
            reduced: rounds * bytes as f64,
        }
    }
}

impl Reduce for BinomialReduce {
    fn run(
        &self,
        transport: &dyn Transport,
        buf: &mut [u8],
        root: usize,
        reduction: &Reduction,
    ) -> Result<()> {
        let (n, rank) = (transport.size(), transport.rank());
        let relative = (rank + n - root) % n;
        let real = |r: usize| (r + root) % n;
        let mut scratch = Scratch::new(buf.len());
        let mut mask = 1;
        while mask < n {
            if relative & mask != 0 {
                return transport.isend(buf, real(relative - mask))?.wait();
            }
            if relative + mask < n {
                let incoming = scratch.bytes(buf.len())?;
                transport.irecv(incoming, real(relative + mask))?.wait()?;
                reduction.combine(buf, incoming, &Scaling::NONE)?;
            }
            mask <<= 1;
        }
        Ok(())
    }
}
