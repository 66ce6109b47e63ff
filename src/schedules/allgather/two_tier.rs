//! `two_tier` allgather (Jain, Lau & Kale's two-tier scheme, with every rank of a node a
//! leader for its share):
//!
//! 1. inside each node, a ring allgather of the node's blocks, so that every rank of the node
//!    holds all of them;
//! 2. each node's data cut into k shares (k = the fewest ranks on any node); the ranks with
//!    local index i < k, one per node, allgather share i of every node around a ring across the
//!    nodes, all k rings at once;
//! 3. inside each node, a ring allgather of what each of those ranks brought back.
//!
//! A node's link carries each other node's data in once and its own out once per other node
//! in k parallel pieces: (H-1)/H·m each way for equal nodes, the bound for any allgather
//! between nodes, however the ranks were placed; no byte crosses a link twice. Blocks may
//! differ in size and be empty; uneven nodes work. On one node it is the ring.

use crate::schedules::common::exchange::shift;
use crate::schedules::allreduce::ring;
use crate::schedules::{Algorithm, Allgather, Cost, Parts, Tiered, Tuning};
use crate::error::{CoreError, Result};
use crate::transport::view::View;
use crate::transport::{Nodes, Transport};
use std::ops::Range;

pub struct TwoTierAllgather;

impl Algorithm for TwoTierAllgather {
    fn name(&self) -> &'static str {
        "two_tier"
    }

    fn description(&self) -> &'static str {
        "inside each node, then k rings across the nodes at once (one per local rank, each with a share), then inside each node; a node's link carries (H-1)/H·m each way; on one node it is the ring"
    }

    fn best_for(&self) -> &'static str {
        "ranks on several nodes, placed in any order"
    }

    /// On one node it is the ring.
    fn cost(&self, ranks: usize, bytes: usize, _tuning: &Tuning) -> Cost {
        let (n, m) = (ranks.max(1) as f64, bytes as f64);
        Cost {
            messages: n - 1.0,
            bytes: (n - 1.0) / n * m,
            reduced: 0.0,
        }
    }

    fn cost_on(&self, nodes: &Nodes, bytes: usize, tuning: &Tuning) -> Tiered {
        if nodes.count() <= 1 {
            return Tiered::within(self.cost(nodes.ranks(), bytes, tuning));
        }
        let (h, l, m) = (nodes.count() as f64, nodes.per_node().1 as f64, bytes as f64);
        Tiered {
            // The node's own blocks, then the other nodes' data, each in L-1 ring steps.
            within: Cost {
                messages: 2.0 * (l - 1.0),
                bytes: (l - 1.0) / l * m,
                reduced: 0.0,
            },
            // All of a node's leaders send at once over its link: (H-1)/H·m in all.
            across: Cost {
                messages: h - 1.0,
                bytes: (h - 1.0) / h * m,
                reduced: 0.0,
            },
        }
    }
}

impl Allgather for TwoTierAllgather {
    fn run(
        &self,
        transport: &dyn Transport,
        buf: &mut [u8],
        blocks: &[Range<usize>],
    ) -> Result<()> {
        let n = transport.size();
        if blocks.len() != n || blocks.iter().any(|b| b.start > b.end || b.end > buf.len()) {
            return Err(CoreError::InvalidArgument(format!(
                "two_tier needs one block per rank ({n}) inside the {}-byte buffer",
                buf.len()
            )));
        }
        let nodes = transport.nodes().clone();
        if nodes.count() <= 1 {
            return ring::allgather(transport, &mut Parts::one(buf), blocks);
        }
        let rank = transport.rank();
        let here = nodes.of(rank);
        let (shares, _) = nodes.per_node();
        let mine = nodes.local_index(rank);
        let node = View::new(transport, nodes.members(here).to_vec())?;

        // 1. The node's blocks to all of its ranks.
        let node_blocks: Vec<Range<usize>> =
            nodes.members(here).iter().map(|&r| blocks[r].clone()).collect();
        ring::allgather(&node, &mut Parts::one(buf), &node_blocks)?;

        // Share i of node j: the i-th of k near-equal cuts of node j's blocks, back to back.
        let share = |j: usize, i: usize| -> Vec<Range<usize>> {
            let ranges: Vec<Range<usize>> =
                nodes.members(j).iter().map(|&r| blocks[r].clone()).collect();
            cut(&ranges, shares, i)
        };

        // 2. Share `mine` of every node, around a ring of the nodes' `mine`-th ranks.
        if mine < shares {
            let peers: Vec<usize> = (0..nodes.count()).map(|j| nodes.members(j)[mine]).collect();
            let peers = View::new(transport, peers)?;
            let h = peers.size();
            let (me, right, left) = (here, (here + 1) % h, (here + h - 1) % h);
            for step in 0..h - 1 {
                let (send, recv) = ((me + h - step) % h, (me + 2 * h - step - 1) % h);
                shift(&peers, buf, &share(send, mine), right, &share(recv, mine), left)?;
            }
        }

        // 3. What each leader brought: share i of every other node, from the node's i-th rank.
        let size = node.size();
        let brought = |i: usize| -> Vec<Range<usize>> {
            if i >= shares {
                return Vec::new();
            }
            (0..nodes.count())
                .filter(|&j| j != here)
                .flat_map(|j| share(j, i))
                .collect()
        };
        let (right, left) = ((mine + 1) % size, (mine + size - 1) % size);
        for step in 0..size.saturating_sub(1) {
            let (send, recv) = ((mine + size - step) % size, (mine + 2 * size - step - 1) % size);
            shift(&node, buf, &brought(send), right, &brought(recv), left)?;
        }
        Ok(())
    }
}

/// Cut `i` of `k` near-equal cuts of the bytes of `ranges` taken back to back, as ranges of
/// the buffer (the first `total % k` cuts hold one byte more).
fn cut(ranges: &[Range<usize>], k: usize, i: usize) -> Vec<Range<usize>> {
    let total: usize = ranges.iter().map(|r| r.len()).sum();
    let (base, extra) = (total / k.max(1), total % k.max(1));
    let start = i * base + i.min(extra);
    let end = start + base + usize::from(i < extra);
    let (mut out, mut offset) = (Vec::new(), 0);
    for range in ranges {
        let (from, to) = (start.max(offset), end.min(offset + range.len()));
        if from < to {
            out.push(range.start + from - offset..range.start + to - offset);
        }
        offset += range.len();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::cut;

    #[test]
    fn cuts_cover_the_ranges_in_order() {
        let ranges = vec![0..5, 10..10, 20..23];
        let cuts: Vec<_> = (0..3).map(|i| cut(&ranges, 3, i)).collect();
        assert_eq!(cuts, vec![vec![0..3], vec![3..5, 20..21], vec![21..23]]);
        assert_eq!(cut(&[], 2, 1), Vec::<std::ops::Range<usize>>::new());
    }
}
