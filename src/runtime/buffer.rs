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

/// `Err` if two `results` share bytes (reducing them would race), or a result shares bytes with
/// one of the `inputs` (it would be written while it is read); inputs may share bytes with each
/// other, since they are only read. One sort and one sweep, however many buffers.
pub fn check_apart(results: &[Buffer], inputs: &[Buffer]) -> Result<()> {
    let span = |b: &Buffer, is_result: bool| (b.address, b.address + b.len, is_result);
    let mut spans: smallvec::SmallVec<[Span; 16]> = smallvec::SmallVec::new();
    spans.extend(
        results
            .iter()
            .map(|b| span(b, true))
            .chain(inputs.iter().map(|b| span(b, false)))
            .filter(|(start, end, _)| end > start),
    );
    // A training loop passes the same buffers call after call: those last found apart (before
    // sorting) are apart again. The comparison is exact, so nothing is assumed.
    if LAST_APART.with_borrow(|last| last.as_slice() == spans.as_slice()) {
        return Ok(());
    }
    let given = spans.clone();
    // Ties need no order: equal starts overlap whichever comes first. Arrays made one after
    // another often lie in address order, or in its reverse.
    if !spans.is_sorted_by_key(|s| s.0) {
        if spans.is_sorted_by(|a, b| a.0 >= b.0) {
            spans.reverse();
        } else {
            spans.sort_unstable_by_key(|s| s.0);
        }
    }
    // How far the results seen so far reach, and how far any buffer does.
    let (mut results_end, mut any_end) = (0, 0);
    for (start, end, is_result) in spans {
        if is_result && start < results_end {
            return Err(CoreError::InvalidArgument(
                "the arrays overlap in memory; each must be a separate buffer".into(),
            ));
        }
        if start < if is_result { any_end } else { results_end } {
            return Err(CoreError::InvalidArgument(
                "an input overlaps a result in memory; out of place, each result must be a \
                 separate buffer"
                    .into(),
            ));
        }
        any_end = any_end.max(end);
        if is_result {
            results_end = results_end.max(end);
        }
    }
    LAST_APART.set(given);
    Ok(())
}

/// A span of memory: start, end, and whether it is written (a result) or only read.
type Span = (usize, usize, bool);

thread_local! {
    /// The spans of the buffers [`check_apart`] last found apart on this thread, in the order
    /// they were given.
    static LAST_APART: std::cell::RefCell<smallvec::SmallVec<[Span; 16]>> =
        std::cell::RefCell::new(smallvec::SmallVec::new());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_must_be_apart_from_each_other_and_from_inputs_but_inputs_may_share() {
        let memory = [0u8; 64];
        let at = |range: std::ops::Range<usize>| Buffer::of_readable(&memory[range]);
        assert!(check_apart(&[at(0..8), at(8..16)], &[at(16..40), at(20..30)]).is_ok());
        assert!(check_apart(&[at(0..8), at(4..6)], &[]).is_err());
        // An input nested under a longer input still meets the result it overlaps.
        assert!(check_apart(&[at(0..10)], &[at(5..60), at(6..7)]).is_err());
        assert!(check_apart(&[at(20..30)], &[at(0..60)]).is_err());
        assert!(check_apart(&[at(10..20), at(30..40)], &[at(0..5), at(40..64)]).is_ok());
        // Empty buffers overlap nothing.
        assert!(check_apart(&[at(3..3), at(0..8)], &[at(4..4)]).is_ok());
    }

    #[test]
    fn buffers_found_apart_are_remembered_exactly_and_nothing_else_is() {
        let memory = [0u8; 64];
        let at = |range: std::ops::Range<usize>| Buffer::of_readable(&memory[range]);
        let apart = [at(8..16), at(0..8)];
        assert!(check_apart(&apart, &[]).is_ok());
        assert!(check_apart(&apart, &[]).is_ok(), "the same buffers again");
        // One byte longer, the same buffer as a result rather than an input, or in another
        // order: each is checked afresh.
        assert!(check_apart(&[at(8..16), at(0..9)], &[]).is_err());
        assert!(check_apart(&[at(8..16)], &[at(0..8)]).is_ok());
        assert!(check_apart(&[at(8..16)], &[at(0..9)]).is_err());
        assert!(check_apart(&[at(0..8), at(8..16), at(4..12)], &[]).is_err());
        assert!(check_apart(&apart, &[]).is_ok());
    }
}
