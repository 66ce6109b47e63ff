//! Reduce-scatter around the ring: the first phase of [`crate::schedules::allreduce::ring`] on its
//! own. N-1 steps, each rank passing one block to its right neighbour and folding in the block from
//! its left; blocks may differ in size per rank. Each rank sends (N-1)/N·m for equal blocks, the
//! lower bound for reduce-scatter; scratch is one block.

use crate::schedules::allreduce::ring;
use crate::schedules::{Algorithm, Cost, Parts, Reduction, ReduceScatter, Tuning};
use crate::error::Result;
use crate::transport::Transport;
use std::ops::Range;

pub struct RingReduceScatter;

impl Algorithm for RingReduceScatter {
    fn name(&self) -> &'static str {
        "ring"
    }

    fn description(&self) -> &'static str {
        "N-1 steps around the ring, each rank folding in the block from its left and passing one to its right; (N-1)/N·m sent per rank, the lower bound; scratch is one block"
    }

    fn best_for(&self) -> &'static str {
        "long messages"
    }

    fn cost(&self, ranks: usize, bytes: usize, _tuning: &Tuning) -> Cost {
        let (n, m) = (ranks as f64, bytes as f64);
        Cost {
            messages: n - 1.0,
            bytes: (n - 1.0) / n * m,
            reduced: (n - 1.0) / n * m,
        }
    }

    fn folds_scaling(&self) -> bool {
        true
    }
}

impl ReduceScatter for RingReduceScatter {
    fn run(
        &self,
        transport: &dyn Transport,
        buf: &mut [u8],
        blocks: &[Range<usize>],
        reduction: &Reduction,
    ) -> Result<()> {
        ring::reduce_scatter(transport, &mut Parts::one(buf), blocks, reduction)
    }
}
