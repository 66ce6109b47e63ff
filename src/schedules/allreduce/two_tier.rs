//! `two_tier`: reduce inside each node, reduce across nodes in parallel, share inside each node
//! (Jain, Lau & Kale's two-tier scheme, with every rank of a node a leader for its share).
//!
//! With H nodes of L ranks each (k = the fewest ranks on any node, shares of m/k bytes):
//!
//! 1. inside each node, a ring reduce-scatter leaves share i, reduced over the node, on the
//!    node's i-th rank (ranks beyond the k-th own no share: uneven nodes work);
//! 2. the k ranks of each node with the same index i allreduce share i across the H nodes, all
//!    k at once, with the ring or recursive doubling (whichever the model finds fastest for
//!    m/k bytes on H ranks over a network; see [`across`] for why not halving-doubling);
//! 3. inside each node, a ring allgather hands every share to every rank.
//!
//! A node's link carries k concurrent allreduces of m/k bytes: 2(H-1)/H·m for the ring, the
//! bound for any allreduce between nodes, however the ranks were placed. Every share is
//! finished by one allreduce whose schedules give all its ranks the same bits, then copied:
//! the result is bit-identical on every rank.

use crate::schedules::common::blocks::Blocks;
use super::recursive_doubling::RecursiveDoubling;
use super::ring::{self, Ring};
use crate::schedules::{Algorithm, Allreduce, Cost, Input, Parts, Reduction, Tiered, Tuning};
use crate::error::Result;
use crate::kernels::convert;
use crate::transport::view::View;
use crate::transport::{Nodes, Transport};
use std::ops::Range;

pub struct TwoTier;

/// What the choice of the algorithm between nodes assumes of a network (fixed, so that every
/// rank makes the same choice without talking): 50 us per message, 1 Gbit/s.
const NETWORK_ALPHA: f64 = 50e-6;
const NETWORK_BETA: f64 = 8.0 / 1e9;

/// The allreduce between nodes for `bytes` on `nodes` ranks: the ring, or recursive doubling
/// where latency dominates. Not halving-doubling, although it sends as few bytes in fewer
/// steps: each of its steps sends and receives with one peer at once, and MPI's TCP transport
/// runs such an exchange of whole messages at about half the link's rate (Open MPI 4.1, 8 MiB
/// between two hosts: 82 ms one way, 150 ms both ways at once, where plain TCP takes the same
/// time both ways), while a ring sends to one neighbour and receives from the other. The pieces
/// calibration may choose between nodes restore the full rate, but a schedule cannot know
/// whether it chose them, and the ring sends as few bytes.
fn across(nodes: usize, bytes: usize, tuning: &Tuning) -> &'static dyn Allreduce {
    let options: [&'static dyn Allreduce; 2] = [&Ring, &RecursiveDoubling];
    let time = |a: &&'static dyn Allreduce| {
        let cost = a.cost(nodes, bytes, tuning);
        NETWORK_ALPHA * cost.messages + NETWORK_BETA * cost.bytes
    };
    options
        .into_iter()
        .min_by(|a, b| time(a).total_cmp(&time(b)))
        .unwrap_or(&Ring)
}

/// Share i's bytes, for i below `shares`, as blocks of a node's ring over `ranks` ranks: the
/// node's ranks beyond the `shares`-th get empty blocks at the end.
fn share_blocks(len: usize, elem: usize, shares: usize, ranks: usize) -> Vec<Range<usize>> {
    let even = Blocks::new(len / elem, shares, elem);
    (0..ranks)
        .map(|i| if i < shares { even.block(i) } else { len..len })
        .collect()
}

impl Algorithm for TwoTier {
    fn name(&self) -> &'static str {
        "two_tier"
    }

    fn description(&self) -> &'static str {
        "reduce-scatter inside each node, then one allreduce per local rank across the nodes, all at once, on its share (ring, halving-doubling or recursive doubling, whichever the model prefers for a network), then allgather inside each node; a node's link carries 2(H-1)/H·m, the bound for H nodes; on one node it is the ring"
    }

    fn best_for(&self) -> &'static str {
        "large messages across nodes"
    }

    /// On one node it is the ring.
    fn cost(&self, ranks: usize, bytes: usize, tuning: &Tuning) -> Cost {
        Ring.cost(ranks, bytes, tuning)
    }

    fn cost_on(&self, nodes: &Nodes, bytes: usize, tuning: &Tuning) -> Tiered {
        let (shares, most) = nodes.per_node();
        let (h, l, m) = (nodes.count(), most as f64, bytes as f64);
        let share = bytes.div_ceil(shares.max(1));
        let between = across(h, share, tuning).cost(h, share, tuning);
        let node_phase = (l - 1.0) / l * m;
        Tiered {
            within: Cost {
                messages: 2.0 * (l - 1.0),
                bytes: 2.0 * node_phase,
                reduced: node_phase + between.reduced,
            },
            across: Cost {
                messages: between.messages,
                // The node's k ranks send their shares over its link at once.
                bytes: between.bytes * shares as f64,
                reduced: 0.0,
            },
        }
    }

    fn folds_scaling(&self) -> bool {
        true
    }
}

impl Allreduce for TwoTier {
    fn run(
        &self,
        transport: &dyn Transport,
        buf: &mut Parts,
        reduction: &Reduction,
        tuning: &Tuning,
    ) -> Result<()> {
        two_tier(transport, buf, None, reduction, tuning)
    }

    /// Out of place, the node's reduce-scatter reads the input (as the ring does).
    fn run_from(
        &self,
        transport: &dyn Transport,
        input: &Input,
        output: &mut Parts,
        reduction: &Reduction,
        tuning: &Tuning,
    ) -> Result<()> {
        two_tier(transport, output, Some(input), reduction, tuning)
    }
}

/// The three phases; this rank's vector is read from `input` where given (`buf` then starts
/// unwritten).
fn two_tier(
    transport: &dyn Transport,
    buf: &mut Parts,
    input: Option<&Input>,
    reduction: &Reduction,
    tuning: &Tuning,
) -> Result<()> {
    let nodes = transport.nodes();
    let rank = transport.rank();
    let (shares, _) = nodes.per_node();
    let node = View::new(transport, nodes.members(nodes.of(rank)).to_vec())?;
    let mine = nodes.local_index(rank);
    let blocks = share_blocks(buf.len(), reduction.elem_size(), shares, node.size());

    // 1. The node's sum of each share, on its owner: inputs scaled, nothing finished yet.
    let partial = Reduction {
        op: reduction.op.combining(),
        post: 1.0,
        ..*reduction
    };
    ring::reduce_scatter_from(&node, buf, input, &blocks, &partial)?;
    if let (1, Some(input)) = (node.size(), input) {
        buf.copy_from(0..input.len(), input)?; // alone: nothing was read from the input
    }
    if node.size() == 1 && reduction.scaled && reduction.pre != 1.0 {
        // Alone on its node, this rank's input was combined with nothing: scale it now, as
        // the other nodes' rings did theirs, so that the nodes' shares agree on `pre`.
        for part in buf.parts_mut() {
            convert::scale(reduction.dtype, part, reduction.pre)?;
        }
    }

    // 2. Share `mine` across the nodes, among the ranks with the same index on each.
    if mine < shares {
        let peers: Vec<usize> = (0..nodes.count())
            .map(|n| nodes.members(n)[mine])
            .collect();
        let peers = View::new(transport, peers)?;
        let share = blocks[mine].clone();
        // Every node's share is scaled already.
        let whole = Reduction {
            pre: 1.0,
            ..*reduction
        };
        let mut pieces = Parts::new(buf.get_mut(share.clone())?);
        let schedule = across(peers.size(), share.len(), tuning);
        if peers.size() > 1 {
            schedule.run(&peers, &mut pieces, &whole, tuning)?;
        } else if let Some(finish) = whole.finish().filter(|_| whole.scaled) {
            // One node: nothing to exchange, but the share still needs its finish.
            for part in pieces.parts_mut() {
                crate::kernels::finish(whole.dtype, part, finish)?;
            }
        }
    }

    // 3. Every share to every rank of the node.
    ring::allgather(&node, buf, &blocks)
}

#[cfg(test)]
mod tests {
    use super::share_blocks;

    #[test]
    fn ranks_beyond_the_shares_own_nothing() {
        let blocks = share_blocks(40, 4, 2, 3);
        assert_eq!(blocks, vec![0..20, 20..40, 40..40]);
    }
}
