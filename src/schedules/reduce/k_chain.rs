//! Reduce to `root` over k parallel chains (Kurnosov, section 5): the other N-1 ranks form k
//! chains of consecutive ranks (relative to the root); each chain passes its partial result
//! from its tail to its head, every rank combining its own vector in, and each head sends the
//! chain's result to the root, which combines the k of them, the shortest chains first.
//!
//! In the LogP model the time is t(k) = ((N-1)/k + 1)·a + (k-1)·b, with a the cost of one hop
//! of a chain and b the root's cost per chain (Kurnosov's formula (1)); it is least at
//! k* = √(a(N-1)/b), and since a > b, at least √(N-1). ringlet takes k = ⌈√(N-1)⌉, which
//! gives O(√N) time where a fixed k (Open MPI's 4) gives O(N). The ranks of a chain are
//! consecutive, so with block placement a chain stays on one node as long as it can.

use crate::schedules::{Algorithm, Cost, Reduce, Reduction, Tuning};
use crate::error::Result;
use crate::kernels::Scaling;
use crate::scratch::Scratch;
use crate::transport::Transport;
use std::ops::Range;

pub struct KChain;

/// How many chains for `ranks` ranks: ⌈√(N-1)⌉ (at least 1, at most N-1).
pub fn chains(ranks: usize) -> usize {
    let others = ranks.saturating_sub(1);
    let mut k = (others as f64).sqrt().ceil() as usize;
    // Exact integer ceiling, whatever the float rounding did.
    while k > 0 && (k - 1) * (k - 1) >= others {
        k -= 1;
    }
    while k * k < others {
        k += 1;
    }
    k.clamp(1, others.max(1))
}

/// The relative ranks of chain `c` of `k` over ranks 1..N: the first (N-1) % k chains hold one
/// rank more. The first rank of the range is the chain's head (next to the root).
pub fn chain(ranks: usize, k: usize, c: usize) -> Range<usize> {
    let others = ranks.saturating_sub(1);
    let (base, extra) = (others / k, others % k);
    let start = 1 + c * base + c.min(extra);
    start..start + base + usize::from(c < extra)
}

impl Algorithm for KChain {
    fn name(&self) -> &'static str {
        "k_chain"
    }

    fn description(&self) -> &'static str {
        "Kurnosov: the other ranks form k = ⌈√(N-1)⌉ chains passing partial results to their heads, which send them to the root; O(√N) time"
    }

    fn best_for(&self) -> &'static str {
        "many ranks, where a hop costs more than the root's combine (Kurnosov's LogP analysis)"
    }

    fn cost(&self, ranks: usize, bytes: usize, _tuning: &Tuning) -> Cost {
        if ranks <= 1 {
            return Cost::default();
        }
        let k = chains(ranks);
        let longest = chain(ranks, k, 0).len() as f64;
        let (k, m) = (k as f64, bytes as f64);
        // The longest chain's hops, its head's send to the root, then the root takes in the
        // other k-1 chains' results one after the other.
        Cost {
            messages: longest + k - 1.0,
            bytes: (longest + k - 1.0) * m,
            reduced: (longest - 1.0 + k) * m,
        }
    }
}

impl Reduce for KChain {
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
        let k = chains(n);
        let mut scratch = Scratch::new(buf.len());
        if relative == 0 {
            // Shortest chains first: they finish first (Kurnosov). A fixed order keeps the
            // combination the same from run to run.
            let mut order: Vec<usize> = (0..k).collect();
            order.sort_by_key(|&c| (chain(n, k, c).len(), c));
            for c in order {
                let incoming = scratch.bytes(buf.len())?;
                transport.irecv(incoming, real(chain(n, k, c).start))?.wait()?;
                reduction.combine(buf, incoming, &Scaling::NONE)?;
            }
            return Ok(());
        }
        let Some(mine) = (0..k).map(|c| chain(n, k, c)).find(|c| c.contains(&relative)) else {
            return Err(crate::error::CoreError::InvalidArgument(format!(
                "internal: relative rank {relative} is in none of the {k} chains of {n} ranks"
            )));
        };
        if relative + 1 < mine.end {
            let incoming = scratch.bytes(buf.len())?;
            transport.irecv(incoming, real(relative + 1))?.wait()?;
            reduction.combine(buf, incoming, &Scaling::NONE)?;
        }
        let next = if relative == mine.start { 0 } else { relative - 1 };
        transport.isend(buf, real(next))?.wait()
    }
}
