//! Ranks as threads of one process, messages over channels: the test transport.
//!
//! Sends are eager (the bytes are copied into the channel), so a send completes at once; a
//! receive completes when the matching bytes are taken from the channel. Each transport counts
//! what it sends, so tests can check a schedule's traffic exactly.

use super::{
    check_receive_length, message_pieces, Pending, Request, Transport, DEFAULT_MAX_MESSAGE_BYTES,
};
use crate::error::{CoreError, Result};
use std::cell::Cell;
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::time::Duration;

/// How long a receive waits before it reports a stuck schedule instead of hanging the tests.
const RECEIVE_TIMEOUT: Duration = Duration::from_secs(60);

pub struct LocalTransport {
    rank: usize,
    to: Vec<Sender<Vec<u8>>>,
    from: Vec<Receiver<Vec<u8>>>,
    max_message_bytes: usize,
    bytes_sent: Cell<usize>,
    messages_sent: Cell<usize>,
    largest_message: Cell<usize>,
}

impl LocalTransport {
    /// One transport per rank of a group of `size`; move each into its own thread.
    pub fn group(size: usize) -> Vec<LocalTransport> {
        Self::group_with_limit(size, DEFAULT_MAX_MESSAGE_BYTES)
    }

    /// As [`group`](Self::group), splitting messages longer than `max_message_bytes`.
    pub fn group_with_limit(size: usize, max_message_bytes: usize) -> Vec<LocalTransport> {
        // senders[src][dst] / receivers[dst][src]: one FIFO channel per ordered pair.
        let mut senders: Vec<Vec<Sender<Vec<u8>>>> = (0..size).map(|_| Vec::new()).collect();
        let mut receivers: Vec<Vec<Receiver<Vec<u8>>>> = (0..size).map(|_| Vec::new()).collect();
        for src_senders in senders.iter_mut() {
            for dst_receivers in receivers.iter_mut() {
                let (tx, rx) = channel();
                src_senders.push(tx);
                dst_receivers.push(rx);
            }
        }
        senders
            .into_iter()
            .zip(receivers)
            .enumerate()
            .map(|(rank, (to, from))| LocalTransport {
                rank,
                to,
                from,
                max_message_bytes,
                bytes_sent: Cell::new(0),
                messages_sent: Cell::new(0),
                largest_message: Cell::new(0),
            })
            .collect()
    }

    /// Payload bytes this rank has sent.
    pub fn bytes_sent(&self) -> usize {
        self.bytes_sent.get()
    }

    /// Logical sends (`isend` calls, including the send half of each sendrecv).
    pub fn messages_sent(&self) -> usize {
        self.messages_sent.get()
    }

    /// The longest single wire message, after splitting.
    pub fn largest_message(&self) -> usize {
        self.largest_message.get()
    }

    /// Messages sent to this rank that nobody received. A correct schedule leaves none.
    pub fn unreceived_messages(&self) -> usize {
        self.from.iter().map(|rx| rx.try_iter().count()).sum()
    }

    fn check_peer(&self, peer: usize) -> Result<()> {
        if peer < self.to.len() {
            Ok(())
        } else {
            Err(CoreError::InvalidArgument(format!(
                "rank {peer} is outside a group of {}",
                self.to.len()
            )))
        }
    }
}

struct LocalReceive<'a> {
    buf: &'a mut [u8],
    len: usize,
    channel: &'a Receiver<Vec<u8>>,
    max_message_bytes: usize,
    source: usize,
}

impl<'a> Pending<'a> for LocalReceive<'a> {
    fn wait(self: Box<Self>) -> Result<Option<&'a mut [u8]>> {
        let this = *self;
        let LocalReceive {
            buf,
            len,
            channel,
            max_message_bytes,
            source,
        } = this;
        for piece in message_pieces(len, max_message_bytes, 1) {
            let message = channel.recv_timeout(RECEIVE_TIMEOUT).map_err(|e| {
                CoreError::Communication(match e {
                    RecvTimeoutError::Timeout => {
                        format!("no message from rank {source} within {RECEIVE_TIMEOUT:?}")
                    }
                    RecvTimeoutError::Disconnected => format!("rank {source} has exited"),
                })
            })?;
            if message.len() != piece.len() {
                return Err(CoreError::Communication(format!(
                    "expected {} bytes from rank {source}, got {}",
                    piece.len(),
                    message.len()
                )));
            }
            buf[piece].copy_from_slice(&message);
        }
        Ok(Some(buf))
    }
}

impl Transport for LocalTransport {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.to.len()
    }

    fn isend<'a>(&'a self, data: &'a [u8], dest: usize) -> Result<Request<'a>> {
        self.check_peer(dest)?;
        for piece in message_pieces(data.len(), self.max_message_bytes, 1) {
            self.largest_message
                .set(self.largest_message.get().max(piece.len()));
            self.to[dest]
                .send(data[piece].to_vec())
                .map_err(|_| CoreError::Communication(format!("rank {dest} has exited")))?;
        }
        self.bytes_sent.set(self.bytes_sent.get() + data.len());
        self.messages_sent.set(self.messages_sent.get() + 1);
        Ok(Request::done())
    }

    fn irecv_into<'a>(
        &'a self,
        buf: &'a mut [u8],
        len: usize,
        source: usize,
    ) -> Result<Request<'a>> {
        self.check_peer(source)?;
        check_receive_length(len, buf.len())?;
        Ok(Request::new(Box::new(LocalReceive {
            buf,
            len,
            channel: &self.from[source],
            max_message_bytes: self.max_message_bytes,
            source,
        })))
    }
}
