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
    /// Between nodes: node j's first rank with node (j ^ 1)'s, one pair per link.
    Across,
}

impl Tier {
    pub fn from_name(name: &str) -> Result<Tier> {
        match name {
            "any" => Ok(Tier::Any),
            "within" => Ok(Tier::Within),
            "across" => Ok(Tier::Across),
            _ => Err(CoreError::InvalidArgument(format!(
                "unknown tier {name:?}; accepted: \"any\", \"within\", \"across\""
            ))),
        }
    }

    /// This rank's partner on the tier, if it has one.
    fn partner(self, transport: &dyn Transport) -> Option<usize> {
        let (rank, nodes) = (transport.rank(), transport.nodes());
        let (node, local) = (nodes.of(rank), nodes.local_index(rank));
        match self {
            Tier::Any => Some(rank ^ 1).filter(|&p| p < transport.size()),
            Tier::Within => nodes.members(node).get(local ^ 1).copied(),
            Tier::Across if local == 0 => nodes.members(node ^ 1).first().copied(),
            Tier::Across => None,
        }
    }
}

/// Exchange `nbytes` with this rank's partner on `tier` (a rank without one idles) `repeats`
/// times. Collective: every rank must call it with the same arguments.
pub fn sendrecv_seconds(
    transport: &dyn Transport,
    nbytes: usize,
    repeats: usize,
    tier: Tier,
) -> Result<f64> {
    let partner = tier.partner(transport);
    let mut send = Scratch::new(nbytes);
    let mut recv = Scratch::new(nbytes);
    let send = send.bytes(nbytes)?;
    let recv = recv.bytes(nbytes)?;
    let mut samples = Vec::with_capacity(repeats);
    for _ in 0..repeats.max(1) {
        let start = Instant::now();
        if let Some(partner) = partner {
            transport.sendrecv(send, partner, recv, partner)?;
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
