//! The bandwidth-optimal ring (Patarasuk & Yuan 2009, section 4).
//!
//! The buffer is cut into N blocks. Reduce-scatter: in N-1 steps each rank passes one block to
//! its right neighbour and folds the block arriving from its left into its own copy; afterwards
//! rank r holds the full reduction of block r. Allgather: N-1 more steps pass the finished
//! blocks around the ring. Each rank sends every block but its own once in the first phase and
//! every block but its right neighbour's once in the second:
//!
//! ```text
//! bytes sent by rank r = 2m - |block r| - |block (r+1) mod N|
//! ```
//!
//! which is 2(N-1)/N·m when N divides the element count (the lower bound of Lemma 5), and
//! within one element per block of it otherwise. Scratch: one block, ⌈count/N⌉ elements.
//!
//! When the ranks span nodes, the ring runs in node-major order
//! ([`crate::schedules::node_major`]), so that each step crosses each node's link once whatever
//! the placement.
//!
//! The two phases work on any disjoint blocks, so they also serve reduce-scatter and
//! allgather with uneven per-rank sizes ([`crate::schedules::reduce_scatter::ring`],
//! [`crate::schedules::allgather::ring`]).

use crate::schedules::common::blocks::Blocks;
use crate::schedules::common::exchange::{send_and_receive, swap};
use crate::schedules::{
    node_major, node_major_cost, Algorithm, Allreduce, Cost, Input, Parts, Reduction, Tiered,
    Tuning,
};
use crate::error::{CoreError, Result};
use crate::kernels::Order;
use crate::scratch::Scratch;
use crate::transport::{Destination, Nodes, Transport};
use std::ops::Range;

pub struct Ring;

impl Algorithm for Ring {
    fn name(&self) -> &'static str {
        "ring"
    }

    fn description(&self) -> &'static str {
        "reduce-scatter then allgather around a ring, 2(N-1) steps of m/N bytes; each rank sends 2(N-1)/N·m, the lower bound"
    }

    fn best_for(&self) -> &'static str {
        "large messages"
    }

    fn cost(&self, ranks: usize, bytes: usize, _tuning: &Tuning) -> Cost {
        let (n, m) = (ranks as f64, bytes as f64);
        Cost {
            messages: 2.0 * (n - 1.0),
            bytes: 2.0 * (n - 1.0) / n * m,
            reduced: (n - 1.0) / n * m,
        }
    }

    fn cost_on(&self, nodes: &Nodes, bytes: usize, tuning: &Tuning) -> Tiered {
        node_major_cost(self.cost(nodes.ranks(), bytes, tuning), nodes, tuning)
    }

    fn folds_scaling(&self) -> bool {
        true
    }
}

impl Allreduce for Ring {
    fn run(
        &self,
        transport: &dyn Transport,
        buf: &mut Parts,
        reduction: &Reduction,
        tuning: &Tuning,
    ) -> Result<()> {
        ring(transport, buf, None, reduction, tuning)
    }

    /// Out of place, the first step sends this rank's block from the input, and each block is
    /// copied from the input into the result only when its partial sum arrives, just before it
    /// is combined (the block that is only sent is never copied: the allgather writes it).
    fn run_from(
        &self,
        transport: &dyn Transport,
        input: &Input,
        output: &mut Parts,
        reduction: &Reduction,
        tuning: &Tuning,
    ) -> Result<()> {
        ring(transport, output, Some(input), reduction, tuning)
    }
}

/// The reduce-scatter and the allgather over even blocks, node-major where ranks span nodes;
/// this rank's vector is read from `input` where given (`buf` then starts unwritten).
fn ring(
    transport: &dyn Transport,
    buf: &mut Parts,
    input: Option<&Input>,
    reduction: &Reduction,
    tuning: &Tuning,
) -> Result<()> {
    let ordered = node_major(transport, tuning)?;
    let transport: &dyn Transport = match &ordered {
        Some(view) => view,
        None => transport,
    };
    let n = transport.size();
    let elem = reduction.elem_size();
    let even = Blocks::new(buf.len() / elem, n, elem);
    let blocks: Vec<Range<usize>> = (0..n).map(|b| even.block(b)).collect();
    reduce_scatter_from(transport, buf, input, &blocks, reduction)?;
    allgather(transport, buf, &blocks)
}

fn check_blocks(transport: &dyn Transport, len: usize, blocks: &[Range<usize>]) -> Result<()> {
    if blocks.len() != transport.size() || blocks.iter().any(|b| b.start > b.end || b.end > len)
    {
        return Err(CoreError::InvalidArgument(format!(
            "the ring needs one block per rank ({}) inside the {len}-byte buffer",
            transport.size(),
        )));
    }
    Ok(())
}

/// After this, rank r holds the reduction over all ranks of `buf[blocks[r]]`. Blocks must be
/// disjoint and a whole number of elements each.
///
/// Each rank's own block b is combined exactly once (when the partial sum of b arrives), and
/// what arrives is a partial sum except at the first step, when it is the left neighbour's own
/// block: so `pre` goes on the own side always and on the incoming side at step 0, and the last
/// step finishes the block.
pub fn reduce_scatter(
    transport: &dyn Transport,
    buf: &mut Parts,
    blocks: &[Range<usize>],
    reduction: &Reduction,
) -> Result<()> {
    reduce_scatter_from(transport, buf, None, blocks, reduction)
}

/// [`reduce_scatter`], reading this rank's vector from `input` (as long as `buf`, which then
/// starts unwritten) where given: every block but the one sent first is written.
pub(crate) fn reduce_scatter_from(
    transport: &dyn Transport,
    buf: &mut Parts,
    input: Option<&Input>,
    blocks: &[Range<usize>],
    reduction: &Reduction,
) -> Result<()> {
    check_blocks(transport, buf.len(), blocks)?;
    if input.is_some_and(|input| input.len() != buf.len()) {
        return Err(CoreError::InvalidArgument(
            "internal: the ring's input differs in length from its result".into(),
        ));
    }
    let (n, rank) = (transport.size(), transport.rank());
    let (left, right) = ((rank + n - 1) % n, (rank + 1) % n);
    // Block index `rank - k` (mod n), kept non-negative.
    let behind = |k: usize| (rank + 2 * n - k) % n;
    let largest = blocks.iter().map(|b| b.len()).max().unwrap_or(0);
    let mut scratch = Scratch::new(largest);
    let steps = n.saturating_sub(1);
    for step in 0..steps {
        let (send, recv) = (&blocks[behind(step + 1)], &blocks[behind(step + 2)]);
        let incoming = scratch.bytes(recv.len())?;
        match input {
            // The first block sent is this rank's own, not yet in the result.
            Some(input) if step == 0 => {
                let cuts = buf.cuts(recv.clone())?;
                let outgoing = input.get(send.clone())?;
                let destination = Destination::Cut {
                    buf: incoming,
                    cuts,
                };
                transport.sendrecv_pieces(&outgoing, right, destination, left)?;
            }
            _ => send_and_receive(transport, buf, send.clone(), right, incoming, recv.clone(), left)?,
        }
        if let Some(input) = input {
            // This block's first touch in the result: it starts as this rank's own.
            buf.copy_from(recv.clone(), input)?;
        }
        let scaling = reduction.scaling(true, step == 0, step + 1 == steps);
        let mut target = buf.get_mut(recv.clone())?;
        reduction.combine_into(&mut target, incoming, Order::AccFirst, &scaling)?;
    }
    Ok(())
}

/// Rank r starts with `buf[blocks[r]]` filled and ends with every block filled.
pub fn allgather(transport: &dyn Transport, buf: &mut Parts, blocks: &[Range<usize>]) -> Result<()> {
    check_blocks(transport, buf.len(), blocks)?;
    let (n, rank) = (transport.size(), transport.rank());
    let (left, right) = ((rank + n - 1) % n, (rank + 1) % n);
    let behind = |k: usize| (rank + 2 * n - k) % n;
    for step in 0..n.saturating_sub(1) {
        let (send, recv) = (
            blocks[behind(step)].clone(),
            blocks[behind(step + 1)].clone(),
        );
        swap(transport, buf, send, right, recv, left)?;
    }
    Ok(())
}
