//! Measurements for the selector's cost model: point-to-point latency and bandwidth, and the
//! speed of a reduction kernel. Each returns this rank's median seconds per operation.

use crate::dtype::{DType, ReduceOp};
use crate::error::{CoreError, Result};
use crate::kernels::{self, Order};
use crate::scratch::Scratch;
use crate::transport::Transport;
use std::time::Instant;

fn median(mut samples: Vec<f64>) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples.get(samples.len() / 2).copied().unwrap_or(0.0)
}

/// Which pairs of ranks a measurement exchanges between.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tier {
    /// Rank r with rank r ^ 1, wherever they run.
    Any,
    /// Inside each node: its i-th rank with its (i ^ 1)-th.
    Within,
    /// Between nodes: each node's first rank sends to the next node's and receives from the
    /// previous node's, as a ring between nodes does (one flow each way on every link, each
    /// with its own peer: MPI's TCP transport is slower when two ranks send to each other).
    Across,
    /// Between pairs of nodes (node n with node n XOR `distance`, where there is one), every
    /// rank with the rank of the same index on the other node, both ways at once, as
    /// halving-doubling's steps do (its partners between nodes, over the powers of two).
    Pairs { distance: usize },
    /// As [`Tier::Pairs`], one way: the lower node's ranks send, the other's answer with an
    /// empty message once all has arrived.
    PairsOneWay { distance: usize },
}

impl Tier {
    /// The tier called `name`; `distance` (at least 1) pairs the nodes of "pairs" and
    /// "pairs_one_way".
    pub fn from_name(name: &str, distance: usize) -> Result<Tier> {
        if distance == 0 {
            return Err(CoreError::InvalidArgument(
                "the distance between paired nodes must be at least 1".into(),
            ));
        }
        match name {
            "any" => Ok(Tier::Any),
            "within" => Ok(Tier::Within),
            "across" => Ok(Tier::Across),
            "pairs" => Ok(Tier::Pairs { distance }),
            "pairs_one_way" => Ok(Tier::PairsOneWay { distance }),
            _ => Err(CoreError::InvalidArgument(format!(
                "unknown tier {name:?}; accepted: \"any\", \"within\", \"across\", \
                 \"pairs\", \"pairs_one_way\""
            ))),
        }
    }

    /// How many bytes this rank sends and receives per exchange of `nbytes` on the tier.
    fn lengths(self, transport: &dyn Transport, nbytes: usize) -> (usize, usize) {
        let nodes = transport.nodes();
        match self {
            Tier::PairsOneWay { distance } if nodes.of(transport.rank()) & distance == 0 => {
                (nbytes, 0)
            }
            Tier::PairsOneWay { .. } => (0, nbytes),
            _ => (nbytes, nbytes),
        }
    }

    /// Where this rank sends and whence it receives on the tier, if it takes part.
    fn peers(self, transport: &dyn Transport) -> Option<(usize, usize)> {
        let (rank, nodes) = (transport.rank(), transport.nodes());
        let (node, local, count) = (nodes.of(rank), nodes.local_index(rank), nodes.count());
        let pair = |partner: Option<usize>| partner.map(|p| (p, p));
        match self {
            Tier::Any => pair(Some(rank ^ 1).filter(|&p| p < transport.size())),
            Tier::Within => pair(nodes.members(node).get(local ^ 1).copied()),
            Tier::Across if local == 0 && count > 1 => {
                let first = |n: usize| nodes.members(n % count).first().copied();
                first(node + 1).zip(first(node + count - 1))
            }
            Tier::Across => None,
            Tier::Pairs { distance } | Tier::PairsOneWay { distance } => {
                let partner = node ^ distance;
                pair(
                    (partner < count)
                        .then(|| nodes.members(partner).get(local).copied())
                        .flatten(),
                )
            }
        }
    }
}

/// Send `nbytes` to this rank's peer on `tier` while receiving as many from its other peer (a
/// rank without peers idles), `repeats` times. Collective: every rank must call it with the
/// same arguments.
pub fn sendrecv_seconds(
    transport: &dyn Transport,
    nbytes: usize,
    repeats: usize,
    tier: Tier,
) -> Result<f64> {
    let peers = tier.peers(transport);
    let (sent, received) = tier.lengths(transport, nbytes);
    let mut send = Scratch::new(sent);
    let mut recv = Scratch::new(received);
    let send = send.bytes(sent)?;
    let recv = recv.bytes(received)?;
    let mut samples = Vec::with_capacity(repeats);
    for _ in 0..repeats.max(1) {
        let start = Instant::now();
        if let Some((to, from)) = peers {
            transport.sendrecv(send, to, recv, from)?;
        }
        samples.push(start.elapsed().as_secs_f64());
    }
    Ok(median(samples))
}

/// Combine `nbytes` of `dtype` (sum) `repeats` times, in cache; local, no communication.
pub fn combine_seconds(dtype: DType, nbytes: usize, repeats: usize) -> Result<f64> {
    let nbytes = nbytes / dtype.size() * dtype.size();
    let mut acc = Scratch::new(nbytes);
    let mut other = Scratch::new(nbytes);
    let acc = acc.bytes(nbytes)?;
    let other = other.bytes(nbytes)?;
    let mut samples = Vec::with_capacity(repeats);
    for _ in 0..repeats.max(1) {
        let start = Instant::now();
        kernels::combine(dtype, ReduceOp::Sum, acc, other, Order::AccFirst)?;
        samples.push(start.elapsed().as_secs_f64());
    }
    Ok(median(samples))
}

#[cfg(test)]
mod tests {
    use super::Tier;
    use crate::transport::local::LocalTransport;

    #[test]
    fn pairs_of_nodes_at_each_distance_match_ranks_of_the_same_index() {
        // Block: 4 nodes of 2 ranks. Distance 2 pairs node 0 with node 2 and 1 with 3.
        let block = LocalTransport::cluster(&[0, 0, 1, 1, 2, 2, 3, 3]);
        let pairs = Tier::from_name("pairs", 2).expect("a tier");
        let partners: Vec<_> = block.iter().map(|t| pairs.peers(t)).collect();
        let expected = [4, 5, 6, 7, 0, 1, 2, 3].map(|p| Some((p, p)));
        assert_eq!(partners, expected);
        // Three nodes, uneven: at distance 2 node 1 has no partner, and the node with fewer
        // ranks leaves the other's extra rank without one.
        let uneven = LocalTransport::cluster(&[0, 0, 1, 2]);
        let partners: Vec<_> = uneven.iter().map(|t| pairs.peers(t)).collect();
        assert_eq!(partners, [Some((3, 3)), None, None, Some((0, 0))]);
        // One way: the lower node of each pair sends, the other sends an empty answer.
        let one_way = Tier::from_name("pairs_one_way", 1).expect("a tier");
        let lengths: Vec<_> = block.iter().map(|t| one_way.lengths(t, 10)).collect();
        let send = (10, 0);
        let answer = (0, 10);
        assert_eq!(
            lengths,
            [send, send, answer, answer, send, send, answer, answer]
        );
        assert!(Tier::from_name("pairs", 0).is_err());
    }
}
