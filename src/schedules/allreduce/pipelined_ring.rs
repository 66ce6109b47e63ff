//! The ring, pipelined: every block travels as segments, and a segment moves on as soon as it
//! is ready instead of waiting for its whole block.
//!
//! Same reduce-scatter + allgather as [`super::ring`], same bytes on the wire, but each block
//! is cut into segments of [`Tuning::segment_bytes`], sends and receives are nonblocking,
//! and up to [`RECEIVE_WINDOW`] receives are posted ahead. Segment k arrives into a small
//! scratch slot and is reduced while it is still in cache, while segments k+1.. are in flight;
//! the reduced segment is forwarded at once (reduce first what the neighbour needs next, as in
//! Gavahi's priority-aware reduce-scatter). Scratch: at most `RECEIVE_WINDOW` segments (and no
//! more than N-1 blocks), whatever the message size.

use crate::schedules::common::blocks::Blocks;
use crate::schedules::{
    node_major, node_major_cost, Algorithm, Allreduce, Cost, Input, Parts, Reduction, Tiered,
    Tuning,
};
use crate::error::{CoreError, Result};
use crate::kernels::Order;
use crate::scratch::Scratch;
use crate::transport::{Destination, Nodes, Pieces, PiecesMut, Request, Transport};
use std::collections::VecDeque;

pub struct PipelinedRing;

/// Receives posted ahead of the one being reduced (and scratch slots for the reduce-scatter).
pub const RECEIVE_WINDOW: usize = 4;

/// The vector cut into blocks, and each block into segments, as disjoint mutable cells (each
/// the pieces of one segment) that a phase can hand out one by one.
type Cells<'p> = Vec<Vec<Option<PiecesMut<'p>>>>;

fn cut<'p>(buf: &'p mut Parts, blocks: &Blocks, n: usize, segment: usize) -> Result<Cells<'p>> {
    let mut ranges = Vec::new();
    let mut per_block = Vec::with_capacity(n);
    for b in 0..n {
        let block = blocks.block(b);
        let before = ranges.len();
        if block.is_empty() {
            ranges.push(block); // still one (empty) message, so both sides count alike
        } else {
            let mut start = block.start;
            while start < block.end {
                let end = (start + segment).min(block.end);
                ranges.push(start..end);
                start = end;
            }
        }
        per_block.push(ranges.len() - before);
    }
    let mut carved = buf.carve(&ranges)?.into_iter();
    Ok(per_block
        .into_iter()
        .map(|count| carved.by_ref().take(count).map(Some).collect())
        .collect())
}

/// Bytes of segment `j` of block `b`, as [`cut`] cuts them.
fn segment_range(blocks: &Blocks, b: usize, j: usize, segment: usize) -> std::ops::Range<usize> {
    let block = blocks.block(b);
    let start = (block.start + j * segment).min(block.end);
    start..(start + segment).min(block.end)
}

/// Copy bytes `range` of `input` into `cell` (its pieces, as long in all).
fn fill(cell: &mut PiecesMut<'_>, input: &Input, range: std::ops::Range<usize>) -> Result<()> {
    let mut at = range.start;
    for piece in cell.iter_mut() {
        input.read_into(at..at + piece.len(), piece)?;
        at += piece.len();
    }
    Ok(())
}

fn take<'p>(cells: &mut Cells<'p>, block: usize, segment: usize) -> Result<PiecesMut<'p>> {
    cells[block][segment]
        .take()
        .ok_or_else(|| CoreError::InvalidArgument("internal: a segment was used twice".into()))
}

fn freeze(cell: PiecesMut<'_>) -> Pieces<'_> {
    cell.into_iter().map(|p| -> &[u8] { p }).collect()
}

fn wait_all(requests: Vec<Request<'_>>) -> Result<()> {
    requests.into_iter().try_for_each(Request::wait)
}

impl Algorithm for PipelinedRing {
    fn name(&self) -> &'static str {
        "pipelined_ring"
    }

    fn description(&self) -> &'static str {
        "the ring with each block cut into segments (256 KiB, `ringlet.settings(segment_bytes=...)`) sent nonblocking; a segment is reduced while the next is in flight and forwarded at once"
    }

    fn best_for(&self) -> &'static str {
        "large messages, beyond the cache"
    }

    fn cost(&self, ranks: usize, bytes: usize, tuning: &Tuning) -> Cost {
        let (n, m) = (ranks as f64, bytes as f64);
        let segments = (m / n / tuning.segment_bytes.max(1) as f64).ceil().max(1.0);
        Cost {
            messages: 2.0 * (n - 1.0) * segments,
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

impl Allreduce for PipelinedRing {
    fn run(
        &self,
        transport: &dyn Transport,
        buf: &mut Parts,
        reduction: &Reduction,
        tuning: &Tuning,
    ) -> Result<()> {
        pipelined_ring(transport, buf, None, reduction, tuning)
    }

    /// Out of place, the first segments sent are read from the input, and each segment is
    /// copied from the input into the result only when its partial sum arrives, just before it
    /// is combined (as the ring does).
    fn run_from(
        &self,
        transport: &dyn Transport,
        input: &Input,
        output: &mut Parts,
        reduction: &Reduction,
        tuning: &Tuning,
    ) -> Result<()> {
        pipelined_ring(transport, output, Some(input), reduction, tuning)
    }
}

/// The reduce-scatter and the allgather, segment by segment, node-major where ranks span
/// nodes; this rank's vector is read from `input` where given (`buf` then starts unwritten).
fn pipelined_ring(
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
    let blocks = Blocks::new(buf.len() / elem, n, elem);
    // Whole elements per segment, and never more than a block.
    let wanted = tuning.segment_bytes.max(1);
    let segment = (wanted / elem).max(1) * elem;
    let segment = segment.min(blocks.max_len().max(elem));
    reduce_scatter(transport, buf, input, &blocks, segment, reduction)?;
    allgather(transport, buf, &blocks, segment)
}

/// After this, rank r holds the full reduction of block r (scaled as in [`super::ring`]).
fn reduce_scatter(
    transport: &dyn Transport,
    buf: &mut Parts,
    input: Option<&Input>,
    blocks: &Blocks,
    segment: usize,
    reduction: &Reduction,
) -> Result<()> {
    let (n, rank) = (transport.size(), transport.rank());
    let (left, right) = ((rank + n - 1) % n, (rank + 1) % n);
    let behind = |k: usize| (rank + 2 * n - k) % n;
    let mut cells = cut(buf, blocks, n, segment)?;
    // Step s sends block r-s-1 and receives block r-s-2, segment by segment: (step, segment)
    // in wire order.
    let first = behind(1);
    let units: Vec<(usize, usize)> = (0..n - 1)
        .flat_map(|step| (0..cells[behind(step + 2)].len()).map(move |j| (step, j)))
        .collect();

    let slots = RECEIVE_WINDOW.min(units.len()).max(1);
    let mut scratch = Scratch::new(slots * segment);
    let mut free_slots: Vec<&mut [u8]> = scratch
        .bytes(slots * segment)?
        .chunks_mut(segment)
        .collect();
    let mut receiving: VecDeque<(usize, Request)> = VecDeque::with_capacity(RECEIVE_WINDOW);
    let mut sending: Vec<Request> = Vec::with_capacity(units.len() + cells[first].len());
    let mut posted = 0;

    for j in 0..cells[first].len() {
        let cell = match input {
            // This rank's own block, not yet in the result (the allgather writes it).
            Some(input) => input.get(segment_range(blocks, first, j, segment))?,
            None => freeze(take(&mut cells, first, j)?),
        };
        sending.push(transport.isend_pieces(&cell, right)?);
    }
    for next in 0..units.len() {
        while posted < units.len() && !free_slots.is_empty() {
            let (step, j) = units[posted];
            let cell = cells[behind(step + 2)][j].as_ref();
            let cuts = cell.map(|c| c.iter().map(|p| p.len()).collect()).unwrap_or_default();
            let slot = free_slots.pop().ok_or_else(|| internal("no free slot"))?;
            let destination = Destination::Cut { buf: slot, cuts };
            receiving.push_back((posted, transport.irecv_to(destination, left)?));
            posted += 1;
        }
        let (unit, request) = receiving
            .pop_front()
            .ok_or_else(|| internal("no receive posted"))?;
        debug_assert_eq!(unit, next);
        let (step, j) = units[unit];
        let arrived = request.wait_for_data()?;
        let mut cell = take(&mut cells, behind(step + 2), j)?;
        if let Some(input) = input {
            // This segment's first touch in the result: it starts as this rank's own.
            fill(&mut cell, input, segment_range(blocks, behind(step + 2), j, segment))?;
        }
        let scaling = reduction.scaling(true, step == 0, step + 2 == n);
        reduction.combine_into(&mut cell, arrived, Order::AccFirst, &scaling)?;
        free_slots.push(arrived);
        if step + 1 < n - 1 {
            sending.push(transport.isend_pieces(&freeze(cell), right)?);
        }
    }
    wait_all(sending)
}

/// Pass the finished blocks around: rank r starts with block r, receives block r-s-1 at step s.
fn allgather(
    transport: &dyn Transport,
    buf: &mut Parts,
    blocks: &Blocks,
    segment: usize,
) -> Result<()> {
    let (n, rank) = (transport.size(), transport.rank());
    let (left, right) = ((rank + n - 1) % n, (rank + 1) % n);
    let behind = |k: usize| (rank + 2 * n - k) % n;
    let owned = rank;
    let mut cells = cut(buf, blocks, n, segment)?;
    let units: Vec<(usize, usize)> = (0..n - 1)
        .flat_map(|step| (0..cells[behind(step + 1)].len()).map(move |j| (step, j)))
        .collect();

    let mut receiving: VecDeque<Request> = VecDeque::with_capacity(RECEIVE_WINDOW);
    let mut sending: Vec<Request> = Vec::with_capacity(units.len() + cells[owned].len());
    let mut posted = 0;

    for j in 0..cells[owned].len() {
        let cell = freeze(take(&mut cells, owned, j)?);
        sending.push(transport.isend_pieces(&cell, right)?);
    }
    for &(step, _) in &units {
        while posted < units.len() && receiving.len() < RECEIVE_WINDOW {
            let (s, j) = units[posted];
            let cell = take(&mut cells, behind(s + 1), j)?;
            receiving.push_back(transport.irecv_to(Destination::Pieces(cell), left)?);
            posted += 1;
        }
        let arrived = receiving
            .pop_front()
            .ok_or_else(|| internal("no receive posted"))?
            .wait_for_pieces()?;
        if step + 1 < n - 1 {
            sending.push(transport.isend_pieces(&freeze(arrived), right)?);
        }
    }
    wait_all(sending)
}

fn internal(what: &str) -> CoreError {
    CoreError::InvalidArgument(format!("internal: pipelined ring: {what}"))
}
