//! Ranks as threads of one process, messages over channels: the test transport.
//!
//! Sends are eager (the bytes are copied into the channel), so a send completes at once; a
//! receive completes when the matching bytes are taken from the channel. Each transport counts
//! what it sends, so tests can check a schedule's traffic exactly.

use super::nodes::Nodes;
use super::shm::{LocalShared, SharedMemory};
use super::{
    message_pieces, wrong_length, Destination, MessageLimits, Notice, Pending, Request, Transport,
    Watcher,
};
use crate::error::{CoreError, Result};
use std::cell::Cell;
use std::ops::Range;
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a receive waits before it reports a stuck schedule instead of hanging the tests.
const RECEIVE_TIMEOUT: Duration = Duration::from_secs(60);

pub struct LocalTransport {
    rank: usize,
    to: Vec<Sender<Vec<u8>>>,
    from: Vec<Receiver<Vec<u8>>>,
    notices_to: Vec<Sender<(usize, Notice)>>,
    notices: Receiver<(usize, Notice)>,
    limits: MessageLimits,
    watcher: Option<Arc<dyn Watcher>>,
    bytes_sent: Cell<usize>,
    messages_sent: Cell<usize>,
    largest_message: Cell<usize>,
    /// The longest wire message to a rank on another node.
    largest_across: Cell<usize>,
    shared: Option<LocalShared>,
    nodes: Nodes,
    /// Payload bytes sent to ranks on other nodes.
    bytes_across: Cell<usize>,
}

impl LocalTransport {
    /// One transport per rank of a group of `size`; move each into its own thread.
    pub fn group(size: usize) -> Vec<LocalTransport> {
        Self::group_with_limit(size, MessageLimits::default().any)
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
        let (notices_to, notices): (Vec<_>, Vec<_>) = (0..size).map(|_| channel()).unzip();
        senders
            .into_iter()
            .zip(receivers)
            .zip(notices)
            .zip(LocalShared::group(size))
            .enumerate()
            .map(|(rank, (((to, from), notices), shared))| LocalTransport {
                rank,
                to,
                from,
                notices_to: notices_to.clone(),
                notices,
                limits: MessageLimits {
                    any: max_message_bytes.max(1),
                    ..MessageLimits::default()
                },
                watcher: None,
                bytes_sent: Cell::new(0),
                messages_sent: Cell::new(0),
                largest_message: Cell::new(0),
                largest_across: Cell::new(0),
                shared: Some(shared),
                nodes: Nodes::single(size),
                bytes_across: Cell::new(0),
            })
            .collect()
    }

    /// One transport per rank, rank r on node `nodes[r]` (any labels; equal labels share a
    /// node). With several nodes there is no shared memory, as with MPI across hosts.
    pub fn cluster<T: Eq + std::hash::Hash>(nodes: &[T]) -> Vec<LocalTransport> {
        let nodes = Nodes::from_labels(nodes);
        Self::group(nodes.ranks())
            .into_iter()
            .map(|mut t| {
                if nodes.count() > 1 {
                    t.shared = None;
                }
                t.nodes = nodes.clone();
                t
            })
            .collect()
    }

    /// This rank without shared memory, as ranks on different nodes are (every rank of a group
    /// must make the same choice).
    pub fn without_shared_memory(mut self) -> Self {
        self.shared = None;
        self
    }

    /// Payload bytes this rank has sent.
    pub fn bytes_sent(&self) -> usize {
        self.bytes_sent.get()
    }

    /// Payload bytes this rank has sent to ranks on other nodes.
    pub fn bytes_across(&self) -> usize {
        self.bytes_across.get()
    }

    /// Logical sends (`isend` calls, including the send half of each sendrecv).
    pub fn messages_sent(&self) -> usize {
        self.messages_sent.get()
    }

    /// The longest single wire message, after splitting.
    pub fn largest_message(&self) -> usize {
        self.largest_message.get()
    }

    /// The longest single wire message to a rank on another node, after splitting.
    pub fn largest_across(&self) -> usize {
        self.largest_across.get()
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
    destination: Destination<'a>,
    /// (piece of the destination, byte range within it) per wire message, in order.
    messages: Vec<(usize, Range<usize>)>,
    next: usize,
    channel: &'a Receiver<Vec<u8>>,
    source: usize,
    posted: Instant,
}

impl<'a> Pending<'a> for LocalReceive<'a> {
    fn wait_for(&mut self, limit: Duration) -> Result<bool> {
        let deadline = Instant::now() + limit;
        while let Some((index, piece)) = self.messages.get(self.next).cloned() {
            let left = deadline.saturating_duration_since(Instant::now());
            let message = match self.channel.recv_timeout(left) {
                Ok(message) => message,
                Err(RecvTimeoutError::Timeout) if self.posted.elapsed() < RECEIVE_TIMEOUT => {
                    return Ok(false)
                }
                Err(RecvTimeoutError::Timeout) => {
                    return Err(CoreError::Communication(format!(
                        "no message from rank {} within {RECEIVE_TIMEOUT:?}",
                        self.source
                    )))
                }
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(CoreError::Communication(format!(
                        "rank {} has exited",
                        self.source
                    )))
                }
            };
            if message.len() != piece.len() {
                return Err(wrong_length(self.source, piece.len(), message.len()));
            }
            let target = self
                .destination
                .piece_mut(index)
                .and_then(|p| p.get_mut(piece))
                .ok_or_else(|| CoreError::InvalidArgument("internal: no such piece".into()))?;
            target.copy_from_slice(&message);
            self.next += 1;
        }
        Ok(true)
    }

    fn peer(&self) -> usize {
        self.source
    }

    fn into_destination(self: Box<Self>) -> Option<Destination<'a>> {
        Some(self.destination)
    }
}

impl Transport for LocalTransport {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.to.len()
    }

    fn isend_pieces<'a>(&'a self, pieces: &[&'a [u8]], dest: usize) -> Result<Request<'a>> {
        self.check_peer(dest)?;
        let limit = self.limits.between(&self.nodes, self.rank, dest);
        let across = self.nodes.of(dest) != self.nodes.of(self.rank);
        for data in pieces {
            for piece in message_pieces(data.len(), limit, 1) {
                self.largest_message
                    .set(self.largest_message.get().max(piece.len()));
                if across {
                    self.largest_across
                        .set(self.largest_across.get().max(piece.len()));
                }
                self.to[dest]
                    .send(data[piece].to_vec())
                    .map_err(|_| CoreError::Communication(format!("rank {dest} has exited")))?;
            }
        }
        let bytes: usize = pieces.iter().map(|p| p.len()).sum();
        self.bytes_sent.set(self.bytes_sent.get() + bytes);
        if across {
            self.bytes_across.set(self.bytes_across.get() + bytes);
        }
        self.messages_sent.set(self.messages_sent.get() + 1);
        Ok(Request::done())
    }

    fn irecv_to<'a>(&'a self, destination: Destination<'a>, source: usize) -> Result<Request<'a>> {
        self.check_peer(source)?;
        destination.check()?;
        let limit = self.limits.between(&self.nodes, source, self.rank);
        let messages = destination
            .lengths()
            .iter()
            .enumerate()
            .flat_map(|(index, &len)| {
                message_pieces(len, limit, 1).map(move |piece| (index, piece))
            })
            .collect();
        let receive = LocalReceive {
            destination,
            messages,
            next: 0,
            channel: &self.from[source],
            source,
            posted: Instant::now(),
        };
        Ok(Request::new(Box::new(receive), self))
    }

    fn message_limits(&self) -> MessageLimits {
        self.limits
    }

    fn set_message_limits(&mut self, limits: MessageLimits) {
        self.limits = limits.clamped();
    }

    fn send_notice(&self, dest: usize, notice: Notice) -> Result<()> {
        self.check_peer(dest)?;
        // A rank that has exited hears nothing; notices are diagnostics, so that is fine.
        let _ = self.notices_to[dest].send((self.rank, notice));
        Ok(())
    }

    fn take_notices(&self) -> Vec<(usize, Notice)> {
        self.notices.try_iter().collect()
    }

    fn watcher(&self) -> Option<&dyn Watcher> {
        self.watcher.as_deref()
    }

    fn set_watcher(&mut self, watcher: Arc<dyn Watcher>) {
        self.watcher = Some(watcher);
    }

    /// The ranks are threads of a test: stop this one loudly.
    fn abort(&self, code: i32) -> ! {
        panic!("rank {} aborted the group (code {code})", self.rank)
    }

    fn shared(&self) -> Option<&dyn SharedMemory> {
        self.shared.as_ref().map(|s| s as &dyn SharedMemory)
    }

    fn nodes(&self) -> &Nodes {
        &self.nodes
    }
}
