//! The vector a collective works on: one buffer, or several disjoint buffers seen as their
//! concatenation (a fused group of gradients, reduced where the arrays live). Schedules address
//! it by byte ranges of the concatenation; a range may span several buffers, and then travels
//! as one message per piece.
//!
//! Every rank's vector has the same parts (the consistency check compares the arrays' shapes),
//! so a receiver cuts a range exactly as its sender does.

use crate::error::{CoreError, Result};
use crate::transport::{Cuts, Pieces, PiecesMut};
use smallvec::{smallvec, SmallVec};
use std::ops::Range;

/// (part, byte range within it) per piece of a range.
type Located = SmallVec<[(usize, Range<usize>); 2]>;

/// Parts held inline: a step's bucket of small gradients allocates nothing per call.
const INLINE_PARTS: usize = 16;

pub struct Parts<'a> {
    parts: SmallVec<[&'a mut [u8]; INLINE_PARTS]>,
    /// `starts[i]` is where part i begins in the concatenation; the last entry is the length.
    starts: SmallVec<[usize; INLINE_PARTS + 1]>,
}

impl<'a> Parts<'a> {
    pub fn new(parts: impl IntoIterator<Item = &'a mut [u8]>) -> Self {
        let mut new = Parts {
            parts: SmallVec::new(),
            starts: smallvec![0],
        };
        push_parts(&mut new.parts, &mut new.starts, parts);
        new
    }

    /// One contiguous buffer.
    pub fn one(buf: &'a mut [u8]) -> Self {
        Parts::new([buf])
    }

    /// Bytes in all.
    pub fn len(&self) -> usize {
        self.starts.last().copied().unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The buffers themselves.
    pub fn parts(&self) -> &[&'a mut [u8]] {
        &self.parts
    }

    pub fn parts_mut(&mut self) -> &mut [&'a mut [u8]] {
        &mut self.parts
    }

    /// (part, range within it) of the non-empty pieces that make up `range`; an empty range is
    /// one empty piece, so that it still travels as one (empty) message.
    fn locate(&self, range: &Range<usize>) -> Result<Located> {
        if range.start > range.end || range.end > self.len() {
            return Err(CoreError::InvalidArgument(format!(
                "internal: bytes {range:?} of a {}-byte vector",
                self.len()
            )));
        }
        if range.is_empty() {
            return Ok(smallvec![(usize::MAX, 0..0)]);
        }
        // The first part that ends after range.start.
        let first = self.starts.partition_point(|&s| s <= range.start) - 1;
        let mut pieces = SmallVec::new();
        for part in first..self.parts.len() {
            let (start, end) = (self.starts[part], self.starts[part + 1]);
            if start >= range.end {
                break;
            }
            let (from, to) = (range.start.max(start), range.end.min(end));
            if from < to {
                pieces.push((part, from - start..to - start));
            }
        }
        Ok(pieces)
    }

    /// Copy bytes `range` of the vector into `out` (exactly as long).
    pub fn read_into(&self, range: Range<usize>, out: &mut [u8]) -> Result<()> {
        read_spans(&self.parts, &self.starts, range, out)
    }

    /// Copy `data` into bytes `range` of the vector (exactly as long).
    pub fn write_from(&mut self, range: Range<usize>, data: &[u8]) -> Result<()> {
        check_length(&range, data.len())?;
        let mut read = 0;
        for (part, within) in spans(&self.starts, range)? {
            let piece = &mut self.parts[part][within];
            let len = piece.len();
            piece.copy_from_slice(&data[read..read + len]);
            read += len;
        }
        Ok(())
    }

    /// The lengths of `range`'s pieces.
    pub fn cuts(&self, range: Range<usize>) -> Result<Cuts> {
        Ok(self.locate(&range)?.iter().map(|(_, r)| r.len()).collect())
    }

    /// `range`'s pieces, to read.
    pub fn get(&self, range: Range<usize>) -> Result<Pieces<'_>> {
        Ok(self
            .locate(&range)?
            .into_iter()
            .map(|(part, r)| match self.parts.get(part) {
                Some(buf) => &buf[r],
                None => &[][..],
            })
            .collect())
    }

    /// `range`'s pieces, to write.
    pub fn get_mut(&mut self, range: Range<usize>) -> Result<PiecesMut<'_>> {
        let mut carved = self.carve(std::slice::from_ref(&range))?;
        Ok(carved.pop().unwrap_or_default())
    }

    /// Several disjoint ranges' pieces at once, to write, in the order of `ranges`.
    pub fn carve(&mut self, ranges: &[Range<usize>]) -> Result<Vec<PiecesMut<'_>>> {
        let mut order: Vec<usize> = (0..ranges.len()).collect();
        order.sort_by_key(|&i| (ranges[i].start, ranges[i].end));
        for pair in order.windows(2) {
            let (a, b) = (&ranges[pair[0]], &ranges[pair[1]]);
            if a.end > b.start && !a.is_empty() && !b.is_empty() {
                return Err(CoreError::InvalidArgument(format!(
                    "internal: overlapping byte ranges {a:?} and {b:?}"
                )));
            }
        }
        let len = self.len();
        let mut carved: Vec<PiecesMut<'_>> = ranges.iter().map(|_| SmallVec::new()).collect();
        // Walk the parts once, cutting each range's pieces off the front of what is left.
        let mut parts = self.parts.iter_mut().map(|p| &mut **p);
        let mut rest: &mut [u8] = &mut [];
        let mut rest_start = 0; // where `rest` begins in the concatenation
        for &i in &order {
            let range = ranges[i].clone();
            if range.start > range.end || range.end > len {
                return Err(CoreError::InvalidArgument(format!(
                    "internal: bytes {range:?} of a {len}-byte vector"
                )));
            }
            if range.is_empty() {
                carved[i].push(&mut []);
                continue;
            }
            let mut at = range.start;
            while at < range.end {
                while rest_start + rest.len() <= at {
                    rest_start += rest.len();
                    rest = parts.next().ok_or_else(|| {
                        CoreError::InvalidArgument("internal: ran out of parts".into())
                    })?;
                }
                let skipped = std::mem::take(&mut rest).split_at_mut(at - rest_start).1;
                let take = (range.end - at).min(skipped.len());
                let (piece, after) = skipped.split_at_mut(take);
                carved[i].push(piece);
                rest = after;
                at += take;
                rest_start = at;
            }
        }
        Ok(carved)
    }
}

/// A vector to read only: the caller's input to an out-of-place collective, one buffer or
/// several seen as their concatenation, as [`Parts`] are.
pub struct Input<'a> {
    parts: SmallVec<[&'a [u8]; INLINE_PARTS]>,
    starts: SmallVec<[usize; INLINE_PARTS + 1]>,
}

impl<'a> Input<'a> {
    pub fn new(parts: impl IntoIterator<Item = &'a [u8]>) -> Self {
        let mut new = Input {
            parts: SmallVec::new(),
            starts: smallvec![0],
        };
        push_parts(&mut new.parts, &mut new.starts, parts);
        new
    }

    /// One contiguous buffer.
    pub fn one(buf: &'a [u8]) -> Self {
        Input::new([buf])
    }

    /// Bytes in all.
    pub fn len(&self) -> usize {
        self.starts.last().copied().unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn parts(&self) -> &[&'a [u8]] {
        &self.parts
    }

    /// The whole vector, if it is one buffer.
    pub fn single(&self) -> Option<&'a [u8]> {
        match self.parts.as_slice() {
            [only] => Some(only),
            _ => None,
        }
    }

    /// Whether its parts are as long as `output`'s, one for one.
    pub fn matches(&self, output: &Parts) -> bool {
        self.starts == output.starts
    }

    /// Copy bytes `range` of the vector into `out` (exactly as long).
    pub fn read_into(&self, range: Range<usize>, out: &mut [u8]) -> Result<()> {
        read_spans(&self.parts, &self.starts, range, out)
    }

    /// `range`'s pieces, to send (an empty range is one empty piece, as [`Parts::get`]).
    pub fn get(&self, range: Range<usize>) -> Result<Pieces<'_>> {
        if range.is_empty() && range.end <= self.len() {
            return Ok(smallvec![&[][..]]);
        }
        Ok(spans(&self.starts, range)?
            .map(|(part, within)| &self.parts[part][within])
            .collect())
    }
}

impl Parts<'_> {
    /// Copy bytes `range` of `input` into the same bytes of this vector.
    pub fn copy_from(&mut self, range: Range<usize>, input: &Input) -> Result<()> {
        let mut at = range.start;
        for piece in input.get(range)? {
            self.write_from(at..at + piece.len(), piece)?;
            at += piece.len();
        }
        Ok(())
    }
}

/// Append `more` to `parts`, and where each ends in the concatenation to `starts` (which
/// holds the concatenation's length as its last entry). Filled where the vector is built, not
/// collected and then moved: every collective call builds one.
fn push_parts<P: AsRef<[u8]>>(
    parts: &mut SmallVec<[P; INLINE_PARTS]>,
    starts: &mut SmallVec<[usize; INLINE_PARTS + 1]>,
    more: impl IntoIterator<Item = P>,
) {
    for part in more {
        starts.push(starts.last().copied().unwrap_or(0) + part.as_ref().len());
        parts.push(part);
    }
}

/// Copy bytes `range` of the concatenation of `parts` (beginning at `starts`) into `out`
/// (exactly as long): [`Parts`] and [`Input`] alike.
fn read_spans<P: AsRef<[u8]>>(
    parts: &[P],
    starts: &[usize],
    range: Range<usize>,
    out: &mut [u8],
) -> Result<()> {
    check_length(&range, out.len())?;
    let mut written = 0;
    for (part, within) in spans(starts, range)? {
        let piece = &parts[part].as_ref()[within];
        out[written..written + piece.len()].copy_from_slice(piece);
        written += piece.len();
    }
    Ok(())
}

/// Each part's (index, range within it) that `range` of the concatenation covers, in order,
/// given the parts' `starts`; without allocating (a fused run of many small arrays is copied
/// in and out on every call).
fn spans(
    starts: &[usize],
    range: Range<usize>,
) -> Result<impl Iterator<Item = (usize, Range<usize>)> + '_> {
    let len = starts.last().copied().unwrap_or(0);
    if range.start > range.end || range.end > len {
        return Err(CoreError::InvalidArgument(format!(
            "internal: bytes {range:?} of a {len}-byte vector"
        )));
    }
    let first = starts
        .partition_point(|&s| s <= range.start)
        .saturating_sub(1);
    Ok(starts
        .windows(2)
        .enumerate()
        .skip(first)
        .take_while(move |(_, w)| w[0] < range.end)
        .filter_map(move |(part, w)| {
            let (from, to) = (range.start.max(w[0]), range.end.min(w[1]));
            (from < to).then(|| (part, from - w[0]..to - w[0]))
        }))
}

fn check_length(range: &Range<usize>, len: usize) -> Result<()> {
    if range.len() != len {
        return Err(CoreError::InvalidArgument(format!(
            "internal: {len} bytes for the {}-byte range {range:?}",
            range.len()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_cut_at_part_boundaries_and_empty_parts_are_skipped() {
        let (mut a, mut b, mut c, mut d) = ([0u8; 3], [0u8; 0], [0u8; 5], [0u8; 2]);
        let mut parts = Parts::new([&mut a[..], &mut b[..], &mut c[..], &mut d[..]]);
        assert_eq!(parts.len(), 10);
        assert_eq!(parts.cuts(0..10).expect("cuts").as_slice(), &[3, 5, 2]);
        assert_eq!(parts.cuts(2..4).expect("cuts").as_slice(), &[1, 1]);
        assert_eq!(parts.cuts(4..4).expect("cuts").as_slice(), &[0]);
        assert_eq!(parts.cuts(3..8).expect("cuts").as_slice(), &[5]);
        assert!(parts.cuts(9..11).is_err());
        {
            let mut carved = parts.carve(&[6..9, 1..4]).expect("disjoint");
            for piece in carved[0].iter_mut() {
                piece.fill(9);
            }
            for piece in carved[1].iter_mut() {
                piece.fill(1);
            }
            assert_eq!(
                carved[1].iter().map(|p| p.len()).collect::<Vec<_>>(),
                [2, 1]
            );
        }
        assert!(parts.carve(&[0..4, 3..5]).is_err());
        let flat: Vec<u8> = parts.get(0..10).expect("all").concat();
        assert_eq!(flat, [0, 1, 1, 1, 0, 0, 9, 9, 9, 0]);
    }

    #[test]
    fn copies_in_and_out_span_parts_and_skip_empty_ones() {
        let (mut a, mut b, mut c, mut d) = ([0u8; 3], [0u8; 0], [0u8; 5], [0u8; 2]);
        let mut parts = Parts::new([&mut a[..], &mut b[..], &mut c[..], &mut d[..]]);
        parts
            .write_from(2..9, &[1, 2, 3, 4, 5, 6, 7])
            .expect("in range");
        let mut out = [0u8; 10];
        parts.read_into(0..10, &mut out).expect("in range");
        assert_eq!(out, [0, 0, 1, 2, 3, 4, 5, 6, 7, 0]);
        let mut middle = [0u8; 4];
        parts.read_into(3..7, &mut middle).expect("in range");
        assert_eq!(middle, [2, 3, 4, 5]);
        assert!(parts.read_into(8..11, &mut [0u8; 3]).is_err());
        assert!(parts.write_from(0..2, &[1]).is_err());
        parts
            .read_into(4..4, &mut [])
            .expect("an empty range copies nothing");
    }
}
