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

use super::blocks::Blocks;
use super::{Algorithm, Allreduce, Cost, Reduction, Tuning};
use crate::error::{CoreError, Result};
use crate::scratch::Scratch;
use crate::transport::{Request, Transport};
use std::collections::VecDeque;

pub struct PipelinedRing;

/// Receives posted ahead of the one being reduced (and scratch slots for the reduce-scatter).
pub const RECEIVE_WINDOW: usize = 4;

/// The buffer cut into blocks, and each block into segments, as disjoint mutable cells that a
/// phase can hand out one by one.
type Cells<'p> = Vec<Vec<Option<&'p mut [u8]>>>;

fn cut<'p>(buf: &'p mut [u8], blocks: &Blocks, n: usize, segment: usize) -> Cells<'p> {
    let mut rest = buf;
    (0..n)
        .map(|b| {
            let (block, tail) = std::mem::take(&mut rest).split_at_mut(blocks.block(b).len());
            rest = tail;
            if block.is_empty() {
                vec![Some(block)] // still one (empty) message, so both sides count alike
            } else {
                block.chunks_mut(segment).map(Some).collect()
            }
        })
        .collect()
}

fn take<'p>(cells: &mut Cells<'p>, block: usize, segment: usize) -> Result<&'p mut [u8]> {
    cells[block][segment]
        .take()
        .ok_or_else(|| CoreError::InvalidArgument("internal: a segment was used twice".into()))
}

fn wait_all(requests: Vec<Request<'_>>) -> Result<()> {
    requests.into_iter().try_for_each(Request::wait)
}

impl Algorithm for PipelinedRing {
    fn name(&self) -> &'static str {
        "pipelined_ring"
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
}

impl Allreduce for PipelinedRing {
    fn run(
        &self,
        transport: &dyn Transport,
        buf: &mut [u8],
        reduction: &Reduction,
        tuning: &Tuning,
    ) -> Result<()> {
        let n = transport.size();
        if n == 1 {
            return Ok(());
        }
        let elem = reduction.elem_size();
        let blocks = Blocks::new(buf.len() / elem, n, elem);
        // Whole elements per segment, and never more than a block.
        let wanted = tuning.segment_bytes.max(1);
        let segment = (wanted / elem).max(1) * elem;
        let segment = segment.min(blocks.max_len().max(elem));
        reduce_scatter(transport, buf, &blocks, segment, reduction)?;
        allgather(transport, buf, &blocks, segment)
    }
}

/// After this, rank r holds the full reduction of block r (as in [`super::ring`]).
fn reduce_scatter(
    transport: &dyn Transport,
    buf: &mut [u8],
    blocks: &Blocks,
    segment: usize,
    reduction: &Reduction,
) -> Result<()> {
    let (n, rank) = (transport.size(), transport.rank());
    let (left, right) = ((rank + n - 1) % n, (rank + 1) % n);
    let behind = |k: usize| (rank + 2 * n - k) % n;
    let mut cells = cut(buf, blocks, n, segment);
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
        sending.push(transport.isend(take(&mut cells, first, j)?, right)?);
    }
    for next in 0..units.len() {
        while posted < units.len() && !free_slots.is_empty() {
            let (step, j) = units[posted];
            let len = cells[behind(step + 2)][j].as_ref().map_or(0, |c| c.len());
            let slot = free_slots.pop().ok_or_else(|| internal("no free slot"))?;
            receiving.push_back((posted, transport.irecv_into(slot, len, left)?));
            posted += 1;
        }
        let (unit, request) = receiving
            .pop_front()
            .ok_or_else(|| internal("no receive posted"))?;
        debug_assert_eq!(unit, next);
        let (step, j) = units[unit];
        let arrived = request.wait_for_data()?;
        let cell = take(&mut cells, behind(step + 2), j)?;
        reduction.combine(cell, &arrived[..cell.len()])?;
        free_slots.push(arrived);
        if step + 1 < n - 1 {
            sending.push(transport.isend(cell, right)?);
        }
    }
    wait_all(sending)
}

/// Pass the finished blocks around: rank r starts with block r, receives block r-s-1 at step s.
fn allgather(
    transport: &dyn Transport,
    buf: &mut [u8],
    blocks: &Blocks,
    segment: usize,
) -> Result<()> {
    let (n, rank) = (transport.size(), transport.rank());
    let (left, right) = ((rank + n - 1) % n, (rank + 1) % n);
    let behind = |k: usize| (rank + 2 * n - k) % n;
    let owned = rank;
    let mut cells = cut(buf, blocks, n, segment);
    let units: Vec<(usize, usize)> = (0..n - 1)
        .flat_map(|step| (0..cells[behind(step + 1)].len()).map(move |j| (step, j)))
        .collect();

    let mut receiving: VecDeque<Request> = VecDeque::with_capacity(RECEIVE_WINDOW);
    let mut sending: Vec<Request> = Vec::with_capacity(units.len() + cells[owned].len());
    let mut posted = 0;

    for j in 0..cells[owned].len() {
        sending.push(transport.isend(take(&mut cells, owned, j)?, right)?);
    }
    for &(step, _) in &units {
        while posted < units.len() && receiving.len() < RECEIVE_WINDOW {
            let (s, j) = units[posted];
            receiving.push_back(transport.irecv(take(&mut cells, behind(s + 1), j)?, left)?);
            posted += 1;
        }
        let arrived = receiving
            .pop_front()
            .ok_or_else(|| internal("no receive posted"))?
            .wait_for_data()?;
        if step + 1 < n - 1 {
            sending.push(transport.isend(arrived, right)?);
        }
    }
    wait_all(sending)
}

fn internal(what: &str) -> CoreError {
    CoreError::InvalidArgument(format!("internal: pipelined ring: {what}"))
}
