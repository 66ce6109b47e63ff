//! The moves schedules make on a [`Parts`] vector: send a range while receiving into scratch
//! (cut as the matching range), or swap two disjoint ranges with a peer in place.

use super::Parts;
use crate::error::{CoreError, Result};
use crate::transport::{Destination, Pieces, Transport};
use std::ops::Range;

/// Send `buf[send]` to `to` while receiving from `from` into `incoming`, cut like `buf[recv]`
/// (the sender's pieces of that range, since every rank's vector has the same parts).
pub(super) fn send_and_receive(
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
pub(super) fn swap(
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
pub(super) fn send_all(transport: &dyn Transport, buf: &Parts, to: usize) -> Result<()> {
    let all = buf.get(0..buf.len())?;
    transport.isend_pieces(&all, to)?.wait()
}

/// Receive all of `buf` from `from` and wait.
pub(super) fn receive_all(transport: &dyn Transport, buf: &mut Parts, from: usize) -> Result<()> {
    let len = buf.len();
    let all = buf.get_mut(0..len)?;
    transport.irecv_to(Destination::Pieces(all), from)?.wait()
}
