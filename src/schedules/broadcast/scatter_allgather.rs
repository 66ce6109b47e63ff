//! Broadcast for long messages (van de Geijn; MPICH's and Open MPI's choice above a few
//! hundred KiB): the root scatters the vector in N blocks along a binomial tree, then the
//! ranks allgather the blocks around the ring. The root sends (N-1)/N·m and every rank
//! receives about 2(N-1)/N·m, where the binomial tree sends the whole vector ⌈log2 N⌉ times
//! from the root.
//!
//! The ranks are renumbered relative to the root, so that block i belongs to the i-th rank
//! after the root and every subtree of the scatter holds consecutive blocks.

use crate::schedules::common::blocks::Blocks;
use crate::schedules::allreduce::ring;
use crate::schedules::{Algorithm, Broadcast, Cost, Parts, Tuning};
use crate::error::Result;
use crate::transport::view::View;
use crate::transport::Transport;
use std::ops::Range;

pub struct ScatterAllgather;

impl Algorithm for ScatterAllgather {
    fn name(&self) -> &'static str {
        "scatter_allgather"
    }

    fn description(&self) -> &'static str {
        "van de Geijn: a binomial scatter of N blocks from the root, then a ring allgather; the root sends (N-1)/N·m"
    }

    fn best_for(&self) -> &'static str {
        "long messages"
    }

    fn cost(&self, ranks: usize, bytes: usize, _tuning: &Tuning) -> Cost {
        let (n, m) = (ranks.max(1) as f64, bytes as f64);
        let rounds = ranks.max(1).next_power_of_two().trailing_zeros() as f64;
        Cost {
            messages: rounds + n - 1.0,
            bytes: 2.0 * (n - 1.0) / n * m,
            reduced: 0.0,
        }
    }
}

impl Broadcast for ScatterAllgather {
    fn run(&self, transport: &dyn Transport, buf: &mut [u8], root: usize) -> Result<()> {
        let n = transport.size();
        if root == 0 {
            return broadcast(transport, buf);
        }
        let order = (0..n).map(|i| (i + root) % n).collect();
        broadcast(&View::new(transport, order)?, buf)
    }
}

/// From rank 0.
fn broadcast(transport: &dyn Transport, buf: &mut [u8]) -> Result<()> {
    let (n, rank) = (transport.size(), transport.rank());
    let blocks = Blocks::new(buf.len(), n, 1);
    let span = |ranks: Range<usize>| blocks.span(ranks.start.min(n)..ranks.end.min(n));
    // Scatter: each rank receives its subtree's blocks from its parent, then hands each child
    // the child's subtree.
    let mut mask = 1;
    while mask < n {
        if rank & mask != 0 {
            let subtree = span(rank..rank + mask);
            transport.irecv(&mut buf[subtree], rank - mask)?.wait()?;
            break;
        }
        mask <<= 1;
    }
    mask >>= 1;
    while mask > 0 {
        if rank + mask < n {
            let subtree = span(rank + mask..rank + 2 * mask);
            transport.isend(&buf[subtree], rank + mask)?.wait()?;
        }
        mask >>= 1;
    }
    let all: Vec<Range<usize>> = (0..n).map(|r| blocks.block(r)).collect();
    ring::allgather(transport, &mut Parts::one(buf), &all)
}
