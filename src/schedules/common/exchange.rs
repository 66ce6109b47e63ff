//! The moves schedules make on a [`Parts`] vector: send a range while receiving into scratch
//! (cut as the matching range), or swap two disjoint ranges with a peer in place.

use crate::error::{CoreError, Result};
use crate::schedules::Parts;
use crate::transport::{Destination, Pieces, PiecesMut, Transport};
use std::ops::Range;

/// Send `buf[send]` to `to` while receiving from `from` into `incoming`, cut like `buf[recv]`
/// (the sender's pieces of that range, since every rank's vector has the same parts).
pub(crate) fn send_and_receive(
    transport: &dyn Transport,
    buf: &Parts,
    send: Range<usize>,
    to: usize,
    incoming: &mut [u8],
    recv: Range<usize>,
    from: usize,
) -> Result<()> {
    let cuts = buf.cuts(recv)?;
    let outgoing = buf.get(send)?;
    transport.sendrecv_pieces(
        &outgoing,
        to,
        Destination::Cut {
            buf: incoming,
            cuts,
        },
        from,
    )
}

/// Send `buf[send]` to `to` while receiving `buf[recv]` from `from`, in place.
pub(crate) fn swap(
    transport: &dyn Transport,
    buf: &mut Parts,
    send: Range<usize>,
    to: usize,
    recv: Range<usize>,
    from: usize,
) -> Result<()> {
    let mut carved = buf.carve(&[send, recv])?;
    let (Some(incoming), Some(outgoing)) = (carved.pop(), carved.pop()) else {
        return Err(CoreError::InvalidArgument(
            "internal: carving failed".into(),
        ));
    };
    let outgoing: Pieces = outgoing.into_iter().map(|p| -> &[u8] { p }).collect();
    transport.sendrecv_pieces(&outgoing, to, Destination::Pieces(incoming), from)
}

/// Send all of `buf` to `to` and wait.
pub(crate) fn send_all(transport: &dyn Transport, buf: &Parts, to: usize) -> Result<()> {
    let all = buf.get(0..buf.len())?;
    transport.isend_pieces(&all, to)?.wait()
}

/// Receive all of `buf` from `from` and wait.
pub(crate) fn receive_all(transport: &dyn Transport, buf: &mut Parts, from: usize) -> Result<()> {
    let len = buf.len();
    let all = buf.get_mut(0..len)?;
    transport.irecv_to(Destination::Pieces(all), from)?.wait()
}

/// `ranges` in order, adjacent ones joined and empty ones left out (both sides of an exchange
/// see the same blocks, so they cut alike).
pub(crate) fn merged(ranges: impl Iterator<Item = Range<usize>>) -> Vec<Range<usize>> {
    let mut out: Vec<Range<usize>> = Vec::new();
    for range in ranges.filter(|r| !r.is_empty()) {
        match out.last_mut() {
            Some(last) if last.end == range.start => last.end = range.end,
            _ => out.push(range),
        }
    }
    out
}

/// The disjoint `ranges` of `buf` as pieces of their own, in the order of `ranges`.
pub(crate) fn cut<'a>(buf: &'a mut [u8], ranges: &[Range<usize>]) -> Result<Vec<&'a mut [u8]>> {
    let mut order: Vec<usize> = (0..ranges.len()).collect();
    order.sort_by_key(|&i| ranges[i].start);
    let mut pieces: Vec<Option<&'a mut [u8]>> = (0..ranges.len()).map(|_| None).collect();
    let (mut rest, mut offset) = (buf, 0);
    for i in order {
        let range = &ranges[i];
        let skip = range.start.checked_sub(offset).ok_or_else(|| {
            CoreError::InvalidArgument("internal: overlapping ranges of one buffer".into())
        })?;
        let (piece, tail) = std::mem::take(&mut rest)
            .get_mut(skip..)
            .filter(|tail| tail.len() >= range.len())
            .ok_or_else(|| CoreError::InvalidArgument("internal: a range past the buffer".into()))?
            .split_at_mut(range.len());
        pieces[i] = Some(piece);
        rest = tail;
        offset = range.end;
    }
    Ok(pieces.into_iter().flatten().collect())
}

/// Send the bytes of `send` to `to` while receiving those of `recv` from `from`, in place: each
/// range a piece of one message (the two sets disjoint; empty ranges left out on both sides).
pub(crate) fn shift(
    transport: &dyn Transport,
    buf: &mut [u8],
    send: &[Range<usize>],
    to: usize,
    recv: &[Range<usize>],
    from: usize,
) -> Result<()> {
    let send: Vec<Range<usize>> = send.iter().filter(|r| !r.is_empty()).cloned().collect();
    let recv: Vec<Range<usize>> = recv.iter().filter(|r| !r.is_empty()).cloned().collect();
    let all: Vec<Range<usize>> = send.iter().chain(&recv).cloned().collect();
    let mut pieces = cut(buf, &all)?;
    let incoming: PiecesMut = pieces.drain(send.len()..).collect();
    let outgoing: Pieces = pieces.into_iter().map(|p| -> &[u8] { p }).collect();
    match (outgoing.is_empty(), incoming.is_empty()) {
        (true, true) => Ok(()),
        (false, true) => transport.isend_pieces(&outgoing, to)?.wait(),
        (true, false) => transport
            .irecv_to(Destination::Pieces(incoming), from)?
            .wait(),
        (false, false) => {
            transport.sendrecv_pieces(&outgoing, to, Destination::Pieces(incoming), from)
        }
    }
}
