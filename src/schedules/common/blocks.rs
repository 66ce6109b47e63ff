//! Cutting a buffer into near-equal blocks at element boundaries.

use std::ops::Range;

/// `parts` byte ranges covering `count` elements of `elem` bytes: the first `count % parts`
/// blocks hold one element more than the rest, so blocks differ by at most one element.
pub(crate) struct Blocks {
    count: usize,
    parts: usize,
    elem: usize,
}

impl Blocks {
    pub(crate) fn new(count: usize, parts: usize, elem: usize) -> Self {
        Blocks {
            count,
            parts: parts.max(1),
            elem,
        }
    }

    fn start_element(&self, index: usize) -> usize {
        let (base, extra) = (self.count / self.parts, self.count % self.parts);
        index * base + index.min(extra)
    }

    /// Bytes of block `index`.
    pub(crate) fn block(&self, index: usize) -> Range<usize> {
        self.span(index..index + 1)
    }

    /// Bytes of blocks `indices.start .. indices.end` (contiguous).
    pub(crate) fn span(&self, indices: Range<usize>) -> Range<usize> {
        self.start_element(indices.start) * self.elem..self.start_element(indices.end) * self.elem
    }

    /// The longest block, in bytes.
    pub(crate) fn max_len(&self) -> usize {
        self.count.div_ceil(self.parts) * self.elem
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_cover_in_order_and_differ_by_at_most_one_element() {
        for count in 0..40 {
            for parts in 1..12 {
                let b = Blocks::new(count, parts, 4);
                assert_eq!(b.block(0).start, 0);
                assert_eq!(b.block(parts - 1).end, count * 4);
                let lens: Vec<usize> = (0..parts).map(|i| b.block(i).len()).collect();
                let (min, max) = (lens.iter().min(), lens.iter().max());
                assert!(max.zip(min).is_some_and(|(a, b)| a - b <= 4));
                assert_eq!(b.max_len(), *max.unwrap_or(&0));
                for i in 1..parts {
                    assert_eq!(b.block(i - 1).end, b.block(i).start);
                }
            }
        }
    }
}
