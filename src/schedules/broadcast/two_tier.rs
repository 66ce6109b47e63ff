//! `two_tier` broadcast: across the nodes first, among one rank per node (the root on its own
//! node, each other node's lowest rank), then inside each node from that rank. Each phase runs
//! the binomial tree for short messages and scatter + ring allgather (van de Geijn) for long
//! ones, so the vector crosses each node's link about once (2(H-1)/H·m for long messages),
//! where a flat tree over ranks placed round-robin crosses links at every round. On one node
//! it is the binomial tree.

use super::binomial::{self, Binomial};
use super::scatter_allgather::ScatterAllgather;
use crate::schedules::{Algorithm, Broadcast, Cost, Tiered, Tuning};
use crate::error::Result;
use crate::transport::view::View;
use crate::transport::{Nodes, Transport};

pub struct TwoTierBroadcast;

/// Above this many bytes a phase scatters and allgathers rather than sending the whole vector
/// down a tree (where the tree's log2 P copies of it cost more than the P-1 extra messages).
const SCATTER_ABOVE: usize = 256 << 10;

/// The broadcast a phase of `ranks` ranks runs for `bytes`.
fn phase(ranks: usize, bytes: usize) -> &'static dyn Broadcast {
    if bytes > SCATTER_ABOVE && ranks > 2 {
        &ScatterAllgather
    } else {
        &Binomial
    }
}

impl Algorithm for TwoTierBroadcast {
    fn name(&self) -> &'static str {
        "two_tier"
    }

    fn description(&self) -> &'static str {
        "across the nodes among one rank per node, then inside each node, each phase binomial or scatter-allgather by size; on one node it is the binomial tree"
    }

    fn best_for(&self) -> &'static str {
        "ranks on several nodes, placed in any order"
    }

    /// On one node it is the binomial tree.
    fn cost(&self, ranks: usize, bytes: usize, tuning: &Tuning) -> Cost {
        Binomial.cost(ranks, bytes, tuning)
    }

    fn cost_on(&self, nodes: &Nodes, bytes: usize, tuning: &Tuning) -> Tiered {
        if nodes.count() <= 1 {
            return Tiered::within(self.cost(nodes.ranks(), bytes, tuning));
        }
        let (h, most) = (nodes.count(), nodes.per_node().1);
        Tiered {
            within: phase(most, bytes).cost(most, bytes, tuning),
            across: phase(h, bytes).cost(h, bytes, tuning),
        }
    }
}

impl Broadcast for TwoTierBroadcast {
    fn run(&self, transport: &dyn Transport, buf: &mut [u8], root: usize) -> Result<()> {
        let nodes = transport.nodes().clone();
        if nodes.count() <= 1 {
            return binomial::broadcast(transport, buf, root);
        }
        let rank = transport.rank();
        let (root_node, here) = (nodes.of(root), nodes.of(rank));
        // One rank per node, the root's node first: the root, else each node's lowest rank.
        let leader = |node: usize| {
            if node == root_node {
                root
            } else {
                nodes.members(node)[0]
            }
        };
        let mut leaders = vec![root];
        leaders.extend((0..nodes.count()).filter(|&j| j != root_node).map(leader));
        if rank == leader(here) {
            let across = View::new(transport, leaders)?;
            phase(across.size(), buf.len()).run(&across, buf, 0)?;
        }
        let members = nodes.members(here).to_vec();
        let from = members.iter().position(|&r| r == leader(here)).unwrap_or(0);
        let node = View::new(transport, members)?;
        if node.size() > 1 {
            phase(node.size(), buf.len()).run(&node, buf, from)?;
        }
        Ok(())
    }
}
