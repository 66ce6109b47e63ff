//! A caller's buffer, as raw parts, for work that outlives the call that queued it.

use crate::error::{CoreError, Result};

/// The address and length of memory the caller keeps alive (a NumPy array's data).
#[derive(Clone, Copy, Debug)]
pub struct Buffer {
    address: usize,
    len: usize,
}

impl Buffer {
    pub fn of(bytes: &mut [u8]) -> Self {
        Buffer {
            address: bytes.as_mut_ptr() as usize,
            len: bytes.len(),
        }
    }

    /// A buffer that will only be read.
    pub fn of_readable(bytes: &[u8]) -> Self {
        Buffer {
            address: bytes.as_ptr() as usize,
            len: bytes.len(),
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// # Safety
    /// The memory it came from must be alive and untouched by anyone else, and no other slice
    /// over the same bytes may exist, for as long as the result is used.
    pub unsafe fn slice<'a>(&self) -> &'a mut [u8] {
        if self.len == 0 {
            return &mut [];
        }
        // SAFETY: the caller's contract: `address..address + len` is live, exclusive memory.
        unsafe { std::slice::from_raw_parts_mut(self.address as *mut u8, self.len) }
    }
}

impl Buffer {
    /// # Safety
    /// The memory it came from must be alive, and nobody may write it, for as long as the
    /// result is used.
    pub unsafe fn bytes<'a>(&self) -> &'a [u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: the caller's contract: `address..address + len` is live, unchanging memory.
        unsafe { std::slice::from_raw_parts(self.address as *const u8, self.len) }
    }
}

/// `Err` if two buffers share bytes: reducing them in place would race.
pub fn check_disjoint(buffers: &[Buffer]) -> Result<()> {
    let mut spans: smallvec::SmallVec<[(usize, usize); 16]> = buffers
        .iter()
        .filter(|b| b.len > 0)
        .map(|b| (b.address, b.address + b.len))
        .collect();
    spans.sort_unstable();
    if spans.windows(2).any(|w| w[1].0 < w[0].1) {
        return Err(CoreError::InvalidArgument(
            "the arrays overlap in memory; each must be a separate buffer".into(),
        ));
    }
    Ok(())
}
