//! Working memory for schedules, counted.
//!
//! Every buffer a schedule allocates comes from [`Scratch::new`], which records the bytes in
//! use per thread. Tests run each rank in its own thread and read [`peak_bytes`] to prove the
//! bounds the algorithms promise (ring m/N, halving-doubling m/2, recursive doubling a piece).

use crate::error::{CoreError, Result};
use std::cell::Cell;

thread_local! {
    static IN_USE: Cell<usize> = const { Cell::new(0) };
    static PEAK: Cell<usize> = const { Cell::new(0) };
}

/// A zeroed, 8-byte-aligned buffer (aligned for every dtype the kernels read).
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
        Scratch {
            words: vec![0; len.div_ceil(8)],
            len,
        }
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
    }
}

/// The most scratch bytes this thread has held at once since [`reset_peak`].
pub fn peak_bytes() -> usize {
    PEAK.with(Cell::get)
}

pub fn reset_peak() {
    PEAK.with(|peak| peak.set(IN_USE.with(Cell::get)));
}
