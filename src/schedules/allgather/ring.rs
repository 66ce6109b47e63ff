//! Allgather around the ring: the second phase of [`crate::schedules::allreduce::ring`] on its own.
//! N-1 steps, each rank passing on the block it received last; blocks may differ in size per rank
//! (allgatherv). Each rank sends every block but its right neighbour's once: (N-1)/N·m for equal
//! blocks, the lower bound for allgather.

use crate::schedules::allreduce::ring;
use crate::schedules::{Algorithm, Allgather, Cost, Parts, Tuning};
use crate::error::Result;
use crate::transport::Transport;
use std::ops::Range;

pub struct RingAllgather;

impl Algorithm for RingAllgather {
    fn name(&self) -> &'static str {
        "ring"
    }

    fn description(&self) -> &'static str {
        "N-1 steps around the ring, each rank passing on the block it received last; each rank sends (N-1)/N·m, the lower bound"
    }

    fn best_for(&self) -> &'static str {
        "long messages"
    }

    fn cost(&self, ranks: usize, bytes: usize, _tuning: &Tuning) -> Cost {
        let (n, m) = (ranks as f64, bytes as f64);
        Cost {
            messages: n - 1.0,
            bytes: (n - 1.0) / n * m,
            reduced: 0.0,
        }
    }
}

impl Allgather for RingAllgather {
    fn run(
        &self,
        transport: &dyn Transport,
        buf: &mut [u8],
        blocks: &[Range<usize>],
    ) -> Result<()> {
        ring::allgather(transport, &mut Parts::one(buf), blocks)
    }
}
