//! Rabenseifner's reduce: the reduce-scatter of [`crate::schedules::allreduce::halving_doubling`]
//! (MPICH's fold for non-power-of-two N, then recursive halving over p' ranks), then a binomial
//! gather of the finished blocks to the root, undoing the halvings: in the step that split off a
//! block range, the rank that kept the upper half sends what it holds to the one that kept the
//! lower half. The root sends and receives (p'-1)/p'·m each way instead of the binomial tree's
//! log2(N)·m, so it suits long messages.
//!
//! The ranks are renumbered so that the root is the core rank that gathers everything.

use crate::schedules::common::blocks::Blocks;
use crate::schedules::allreduce::halving_doubling::{halve, Halved, HalvingDoubling};
use crate::schedules::common::fold::{largest_power_of_two, real_rank};
use crate::schedules::{Algorithm, Cost, Parts, Reduce, Reduction, Tuning};
use crate::error::Result;
use crate::transport::view::View;
use crate::transport::{Destination, Transport};

pub struct ReduceScatterGather;

impl Algorithm for ReduceScatterGather {
    fn name(&self) -> &'static str {
        "reduce_scatter_gather"
    }

    fn description(&self) -> &'static str {
        "Rabenseifner: recursive-halving reduce-scatter (MPICH's fold for non-powers of two), then a binomial gather to the root, which moves (N-1)/N·m each way"
    }

    fn best_for(&self) -> &'static str {
        "long messages"
    }

    fn cost(&self, ranks: usize, bytes: usize, tuning: &Tuning) -> Cost {
        // Halving-doubling's allreduce has the same rounds and bytes: the gather moves what
        // its allgather does, along one side of each pair.
        HalvingDoubling.cost(ranks, bytes, tuning)
    }
}

impl Reduce for ReduceScatterGather {
    fn run(
        &self,
        transport: &dyn Transport,
        buf: &mut [u8],
        root: usize,
        reduction: &Reduction,
    ) -> Result<()> {
        let n = transport.size();
        // Core rank 0 ends with every block: renumber so that it is the root.
        let gatherer = real_rank(0, n);
        if root == gatherer {
            return reduce(transport, buf, reduction);
        }
        let order = (0..n).map(|i| (i + n + root - gatherer) % n).collect();
        reduce(&View::new(transport, order)?, buf, reduction)
    }
}

/// Reduce to core rank 0.
fn reduce(transport: &dyn Transport, buf: &mut [u8], reduction: &Reduction) -> Result<()> {
    let elem = reduction.elem_size();
    let blocks = Blocks::new(buf.len() / elem, largest_power_of_two(transport.size()), elem);
    let mut buf = Parts::one(buf);
    let Halved::Core {
        core_rank,
        exchanges,
        ..
    } = halve(transport, &mut buf, reduction, &blocks)?
    else {
        return Ok(()); // a folded rank's vector is in its partner's
    };
    // A rank still here at step i has no bit above i set; it holds that step's kept blocks.
    for (step, exchange) in exchanges.into_iter().enumerate().rev() {
        if core_rank & (1 << step) != 0 {
            let pieces = buf.get(blocks.span(exchange.kept))?;
            return transport.isend_pieces(&pieces, exchange.partner)?.wait();
        }
        let pieces = buf.get_mut(blocks.span(exchange.given))?;
        transport
            .irecv_to(Destination::Pieces(pieces), exchange.partner)?
            .wait()?;
    }
    Ok(())
}
