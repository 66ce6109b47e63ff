//! Working memory, counted.
//!
//! Every buffer a schedule, a fused group or a probe allocates comes from [`Scratch::new`],
//! which records the bytes in use per thread (and reuses buffers from earlier calls: the
//! largest few, and the last small one).
//! Tests run each rank in its own thread and read [`peak_bytes`] to prove the bounds the
//! algorithms promise (ring m/N, halving-doubling m/2, recursive doubling a piece).

use crate::error::{CoreError, Result};
use std::cell::{Cell, RefCell};

thread_local! {
    static IN_USE: Cell<usize> = const { Cell::new(0) };
    static PEAK: Cell<usize> = const { Cell::new(0) };
    /// Buffers kept from earlier calls: fresh pages cost a page fault each (a 32 MiB buffer is
    /// 8192 faults, more than the transfer itself on one node), so large ones are reused.
    static POOL: RefCell<Vec<Vec<u64>>> = const { RefCell::new(Vec::new()) };
    /// One small buffer kept from the last call: a small collective's scratch would otherwise
    /// be an allocation and a free on every call (a tenth of a 1 µs allreduce).
    static SMALL: Cell<Vec<u64>> = const { Cell::new(Vec::new()) };
}

/// Buffers below this are kept in `SMALL`, larger ones in `POOL`.
const SMALL_BYTES: usize = 64 << 10;

/// Buffers kept per thread, and the most memory they may hold.
const POOL_BUFFERS: usize = 4;
const POOL_BYTES: usize = 512 << 20;

/// An 8-byte-aligned buffer (aligned for every dtype the kernels read). Its contents start
/// unspecified (zeros, or an earlier call's bytes): schedules write before they read.
pub struct Scratch {
    words: Vec<u64>,
    len: usize,
}

impl Scratch {
    pub fn new(len: usize) -> Self {
        IN_USE.with(|in_use| {
            in_use.set(in_use.get() + len);
            PEAK.with(|peak| peak.set(peak.get().max(in_use.get())));
        });
        let words_needed = len.div_ceil(8);
        if words_needed == 0 {
            return Scratch {
                words: Vec::new(),
                len,
            };
        }
        if words_needed * 8 < SMALL_BYTES {
            let kept = SMALL.take();
            let words = if kept.len() >= words_needed {
                kept
            } else {
                vec![0; words_needed]
            };
            return Scratch { words, len };
        }
        let reused = POOL.with(|pool| {
            let mut pool = pool.borrow_mut();
            // The smallest kept buffer that is large enough.
            let best = (0..pool.len())
                .filter(|&i| pool[i].len() >= words_needed)
                .min_by_key(|&i| pool[i].len());
            best.map(|i| pool.swap_remove(i))
        });
        let words = reused.unwrap_or_else(|| vec![0; words_needed]);
        Scratch { words, len }
    }

    /// The first `len` bytes.
    pub fn bytes(&mut self, len: usize) -> Result<&mut [u8]> {
        let capacity = self.len;
        bytemuck::cast_slice_mut::<u64, u8>(&mut self.words)
            .get_mut(..len)
            .filter(|_| len <= capacity)
            .ok_or_else(|| {
                CoreError::InvalidArgument(format!(
                    "internal: {len} bytes asked of a {capacity}-byte scratch buffer"
                ))
            })
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        IN_USE.with(|in_use| in_use.set(in_use.get() - self.len));
        let words = std::mem::take(&mut self.words);
        if words.is_empty() {
            return;
        }
        if words.len() * 8 < SMALL_BYTES {
            // Keep the larger of this and the one kept.
            let kept = SMALL.take();
            SMALL.set(if kept.len() > words.len() {
                kept
            } else {
                words
            });
            return;
        }
        POOL.with(|pool| {
            let mut pool = pool.borrow_mut();
            pool.push(words);
            // Keep the largest few, within the byte budget.
            pool.sort_by_key(|w| std::cmp::Reverse(w.len()));
            pool.truncate(POOL_BUFFERS);
            while pool.iter().map(|w| w.len() * 8).sum::<usize>() > POOL_BYTES {
                pool.remove(0);
            }
        });
    }
}

/// The most scratch bytes this thread has held at once since [`reset_peak`].
pub fn peak_bytes() -> usize {
    PEAK.with(Cell::get)
}

pub fn reset_peak() {
    PEAK.with(|peak| peak.set(IN_USE.with(Cell::get)));
}
