//! Measurements for the selector's cost model: point-to-point latency and bandwidth, and the
//! speed of a reduction kernel. Each returns this rank's median seconds per operation.

use crate::dtype::{DType, ReduceOp};
use crate::error::Result;
use crate::kernels::{self, Order};
use crate::scratch::Scratch;
use crate::transport::Transport;
use std::time::Instant;

fn median(mut samples: Vec<f64>) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples.get(samples.len() / 2).copied().unwrap_or(0.0)
}

/// Exchange `nbytes` with the partner rank (rank ^ 1; a rank without one idles) `repeats`
/// times. Collective: every rank must call it with the same arguments.
pub fn sendrecv_seconds(transport: &dyn Transport, nbytes: usize, repeats: usize) -> Result<f64> {
    let partner = transport.rank() ^ 1;
    let mut send = Scratch::new(nbytes);
    let mut recv = Scratch::new(nbytes);
    let send = send.bytes(nbytes)?;
    let recv = recv.bytes(nbytes)?;
    let mut samples = Vec::with_capacity(repeats);
    for _ in 0..repeats.max(1) {
        let start = Instant::now();
        if partner < transport.size() {
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
