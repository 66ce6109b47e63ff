//! Point-to-point byte messages between the ranks of one group.
//!
//! A schedule sees only this trait: ranks, nonblocking send and receive with wait, sendrecv,
//! and (optionally) the library's own allreduce. Two implementations: [`mpi::MpiTransport`]
//! over an MPI communicator, and [`local::LocalTransport`], ranks as threads in one process, so
//! that every schedule is tested by `cargo test` at any rank count without MPI.
//!
//! Ordering: messages from one rank to another arrive in the order they were sent (MPI's
//! non-overtaking rule for one communicator and tag), and receives are matched in the order
//! they are posted.

pub mod local;
pub mod mpi;

use crate::dtype::{DType, ReduceOp};
use crate::error::{CoreError, Result};
use std::ops::Range;

/// An operation in flight, borrowing its buffer for `'a`.
pub trait Pending<'a> {
    /// Block until the operation completes. A receive hands its buffer back, filled.
    fn wait(self: Box<Self>) -> Result<Option<&'a mut [u8]>>;
}

/// A started send or receive. Waiting consumes it; dropping it waits too (ignoring the
/// outcome), because the buffer it borrows must not be released while the transport may still
/// use it.
#[must_use = "a request must be waited on"]
pub struct Request<'a> {
    op: Option<Box<dyn Pending<'a> + 'a>>,
}

impl<'a> Request<'a> {
    pub fn new(op: Box<dyn Pending<'a> + 'a>) -> Self {
        Request { op: Some(op) }
    }

    /// A request that is already complete (an eager send).
    pub fn done() -> Self {
        Request { op: None }
    }

    pub fn wait(mut self) -> Result<()> {
        match self.op.take() {
            Some(op) => op.wait().map(|_| ()),
            None => Ok(()),
        }
    }

    /// Wait for a receive and get its buffer back, to reduce or forward what arrived.
    pub fn wait_for_data(mut self) -> Result<&'a mut [u8]> {
        self.op
            .take()
            .map_or(Ok(None), |op| op.wait())?
            .ok_or_else(|| CoreError::InvalidArgument("internal: waited for data on a send".into()))
    }
}

impl Drop for Request<'_> {
    fn drop(&mut self) {
        if let Some(op) = self.op.take() {
            // Reached only on an early return after another error; that error is the one the
            // caller reports, so this one is dropped.
            let _ = op.wait();
        }
    }
}

pub trait Transport {
    fn rank(&self) -> usize;
    fn size(&self) -> usize;

    /// Start sending `data` to `dest`.
    fn isend<'a>(&'a self, data: &'a [u8], dest: usize) -> Result<Request<'a>>;

    /// Start receiving exactly `len` bytes from `source` into `buf[..len]`. Waiting with
    /// [`Request::wait_for_data`] hands back all of `buf`, so a schedule can reuse a fixed set of
    /// scratch buffers for messages of varying size.
    fn irecv_into<'a>(
        &'a self,
        buf: &'a mut [u8],
        len: usize,
        source: usize,
    ) -> Result<Request<'a>>;

    /// Start receiving exactly `data.len()` bytes from `source` into `data`.
    fn irecv<'a>(&'a self, data: &'a mut [u8], source: usize) -> Result<Request<'a>> {
        let len = data.len();
        self.irecv_into(data, len, source)
    }

    /// Send to `dest` and receive from `source` at the same time (deadlock-free).
    fn sendrecv(&self, send: &[u8], dest: usize, recv: &mut [u8], source: usize) -> Result<()> {
        let receiving = self.irecv(recv, source)?;
        let sending = self.isend(send, dest)?;
        let received = receiving.wait();
        let sent = sending.wait();
        received.and(sent)
    }

    /// The communication library's own allreduce, in place, of the combining part of `op`
    /// (`avg` reduces as `sum`; the caller divides). Transports without one say so.
    fn native_allreduce(&self, _buf: &mut [u8], _dtype: DType, _op: ReduceOp) -> Result<()> {
        Err(CoreError::InvalidArgument(
            "this transport has no native allreduce".into(),
        ))
    }
}

/// Byte ranges of at most `limit` bytes, cut at multiples of `align`, covering `0..len`.
///
/// MPI counts are C ints: a message longer than `i32::MAX` goes as several.
pub fn message_pieces(
    len: usize,
    limit: usize,
    align: usize,
) -> impl Iterator<Item = Range<usize>> {
    let step = (limit / align.max(1)).max(1) * align.max(1);
    let pieces = len.div_ceil(step).max(1);
    (0..pieces).map(move |i| (i * step).min(len)..((i + 1) * step).min(len))
}

pub(crate) fn check_receive_length(len: usize, capacity: usize) -> Result<()> {
    if len <= capacity {
        Ok(())
    } else {
        Err(CoreError::InvalidArgument(format!(
            "internal: receiving {len} bytes into a {capacity}-byte buffer"
        )))
    }
}

/// The largest message any transport sends by default: MPI's count limit.
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = i32::MAX as usize;

#[cfg(test)]
mod tests {
    use super::message_pieces;

    #[test]
    fn pieces_cover_the_range_and_respect_the_limit() {
        for len in [0usize, 1, 7, 8, 9, 64, 1000] {
            for limit in [1usize, 3, 8, 100, usize::MAX / 2] {
                let pieces: Vec<_> = message_pieces(len, limit, 1).collect();
                assert_eq!(pieces.first().map(|r| r.start), Some(0));
                assert_eq!(pieces.last().map(|r| r.end), Some(len));
                for w in pieces.windows(2) {
                    assert_eq!(w[0].end, w[1].start);
                }
                assert!(pieces.iter().all(|r| r.len() <= limit));
            }
        }
    }

    #[test]
    fn pieces_keep_element_boundaries() {
        let pieces: Vec<_> = message_pieces(40, 10, 4).collect();
        assert!(pieces.iter().all(|r| r.start % 4 == 0 && r.len() <= 10));
        assert_eq!(pieces.len(), 5);
    }
}
