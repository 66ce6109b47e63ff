//! The bandwidth-optimal ring (Patarasuk & Yuan 2009, section 4).
//!
//! The buffer is cut into N blocks. Reduce-scatter: in N-1 steps each rank passes one block to
//! its right neighbour and folds the block arriving from its left into its own copy; afterwards
//! rank r holds the full reduction of block r+1. Allgather: N-1 more steps pass the finished
//! blocks around the ring. Each rank sends every block but two once in each phase:
//!
//! ```text
//! bytes sent by rank r = 2m - |block (r+1) mod N| - |block (r+2) mod N|
//! ```
//!
//! which is 2(N-1)/N·m when N divides the element count (the lower bound of Lemma 5), and
//! within one element per block of it otherwise. Scratch: one block, ⌈count/N⌉ elements.

use super::blocks::{split_pair, Blocks};
use super::scratch::Scratch;
use super::{Reduction, Schedule};
use crate::error::Result;
use crate::transport::Transport;

pub struct Ring;

impl Schedule for Ring {
    fn name(&self) -> &'static str {
        "ring"
    }

    fn run(&self, transport: &dyn Transport, buf: &mut [u8], reduction: &Reduction) -> Result<()> {
        let (n, rank) = (transport.size(), transport.rank());
        if n == 1 {
            return Ok(());
        }
        let elem = reduction.elem_size();
        let blocks = Blocks::new(buf.len() / elem, n, elem);
        let (left, right) = ((rank + n - 1) % n, (rank + 1) % n);
        // Block index `rank - k` (mod n), kept non-negative.
        let behind = |k: usize| (rank + 2 * n - k) % n;

        let mut scratch = Scratch::new(blocks.max_len());
        for step in 0..n - 1 {
            let (send, recv) = (blocks.block(behind(step)), blocks.block(behind(step + 1)));
            let incoming = scratch.bytes(recv.len())?;
            transport.sendrecv(&buf[send], right, incoming, left)?;
            reduction.combine(&mut buf[recv], incoming)?;
        }
        drop(scratch);

        // Rank r now owns block r+1; pass the finished blocks on.
        for step in 0..n - 1 {
            let send = blocks.block((rank + 1 + n - step) % n);
            let recv = blocks.block(behind(step));
            let (outgoing, incoming) = split_pair(buf, send, recv)?;
            transport.sendrecv(outgoing, right, incoming, left)?;
        }
        Ok(())
    }
}
