//! Which node (host) each rank of a transport runs on.
//!
//! Nodes are numbered by their lowest rank, so every rank computes the same numbering from the
//! same list. The MPI transport learns the list from `MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)`
//! (what the library itself considers one node); the in-process transport is told it, so that
//! tests can lay out any cluster.

use std::collections::HashMap;
use std::hash::Hash;

/// How the ranks of each node sit in rank order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// Every node's ranks are consecutive (`--map-by core`, `-npernode`, Slurm's block).
    Block,
    /// Rank r runs on node r mod H and every node holds as many (`--map-by node`, cyclic).
    RoundRobin,
    /// Anything else.
    Irregular,
}

impl Placement {
    pub fn name(self) -> &'static str {
        match self {
            Placement::Block => "block",
            Placement::RoundRobin => "round-robin",
            Placement::Irregular => "irregular",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Nodes {
    /// `of[r]`: rank r's node.
    of: Vec<usize>,
    /// Each node's ranks, in rank order.
    members: Vec<Vec<usize>>,
}

impl Nodes {
    /// `ranks` ranks on one node.
    pub fn single(ranks: usize) -> Self {
        Self::from_labels(&vec![0; ranks])
    }

    /// From any label per rank (a host name's index, a node leader's rank): ranks with equal
    /// labels share a node.
    pub fn from_labels<T: Eq + Hash>(labels: &[T]) -> Self {
        let mut numbers: HashMap<&T, usize> = HashMap::new();
        let mut members: Vec<Vec<usize>> = Vec::new();
        let of = labels
            .iter()
            .enumerate()
            .map(|(rank, label)| {
                let node = *numbers.entry(label).or_insert_with(|| {
                    members.push(Vec::new());
                    members.len() - 1
                });
                members[node].push(rank);
                node
            })
            .collect();
        Nodes { of, members }
    }

    pub fn ranks(&self) -> usize {
        self.of.len()
    }

    /// How many nodes.
    pub fn count(&self) -> usize {
        self.members.len()
    }

    /// Rank `rank`'s node.
    pub fn of(&self, rank: usize) -> usize {
        self.of.get(rank).copied().unwrap_or(0)
    }

    /// The labels, one per rank.
    pub fn labels(&self) -> &[usize] {
        &self.of
    }

    /// Node `node`'s ranks, in rank order.
    pub fn members(&self, node: usize) -> &[usize] {
        self.members.get(node).map_or(&[], Vec::as_slice)
    }

    /// Rank `rank`'s index among its node's ranks.
    pub fn local_index(&self, rank: usize) -> usize {
        self.members(self.of(rank))
            .iter()
            .position(|&r| r == rank)
            .unwrap_or(0)
    }

    /// The fewest and the most ranks on one node.
    pub fn per_node(&self) -> (usize, usize) {
        let sizes = self.members.iter().map(Vec::len);
        (sizes.clone().min().unwrap_or(0), sizes.max().unwrap_or(0))
    }

    pub fn placement(&self) -> Placement {
        let nodes = self.count();
        if self
            .members
            .iter()
            .all(|m| m.windows(2).all(|w| w[1] == w[0] + 1))
        {
            return Placement::Block;
        }
        let (fewest, most) = self.per_node();
        if fewest == most && self.of.iter().enumerate().all(|(r, &n)| n == r % nodes) {
            return Placement::RoundRobin;
        }
        Placement::Irregular
    }

    /// Every rank, node by node: the order in which a ring crosses each node's link once.
    pub fn node_major_order(&self) -> Vec<usize> {
        self.members.iter().flatten().copied().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::{Nodes, Placement};

    #[test]
    fn numbering_follows_the_lowest_rank() {
        let nodes = Nodes::from_labels(&["b", "a", "b", "c", "a"]);
        assert_eq!(nodes.labels(), &[0, 1, 0, 2, 1]);
        assert_eq!(nodes.members(1), &[1, 4]);
        assert_eq!(nodes.local_index(4), 1);
        assert_eq!(nodes.per_node(), (1, 2));
        assert_eq!(nodes.node_major_order(), vec![0, 2, 1, 4, 3]);
    }

    #[test]
    fn placements() {
        assert_eq!(Nodes::single(3).placement(), Placement::Block);
        assert_eq!(
            Nodes::from_labels(&[0, 0, 1, 1]).placement(),
            Placement::Block
        );
        assert_eq!(
            Nodes::from_labels(&[0, 1, 0, 1]).placement(),
            Placement::RoundRobin
        );
        assert_eq!(
            Nodes::from_labels(&[0, 1, 0]).placement(),
            Placement::Irregular
        );
        assert_eq!(
            Nodes::from_labels(&[0, 0, 0, 1]).placement(),
            Placement::Block
        );
    }
}
