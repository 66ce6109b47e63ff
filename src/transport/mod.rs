//! Point-to-point byte messages between the ranks of one group. Nothing here knows what a
//! collective is.
//!
//! A schedule sees only this trait: ranks, nonblocking send and receive with wait, sendrecv.
//! What a send or a receive covers may be several pieces of memory (the parts of a vector that
//! spans several arrays): each piece travels as its own message (split at the message limits,
//! see [`MessageLimits`]), and the receiver posts the same piece lengths, into its own pieces or
//! into consecutive parts of one buffer.
//! Two implementations: [`mpi::MpiTransport`] over an MPI communicator, and
//! [`local::LocalTransport`], ranks as threads in one process, so that every schedule (and the
//! runtime above them) is tested by `cargo test` at any rank count without MPI.
//!
//! Ordering: messages from one rank to another arrive in the order they were sent (MPI's
//! non-overtaking rule for one communicator and tag), and receives are matched in the order
//! they are posted.
//!
//! Every transport knows which node each of its ranks runs on ([`Nodes`]), so that schedules
//! can keep traffic inside a node where they can; [`view::View`] runs a schedule on some of the
//! ranks, in an order of its own.
//!
//! When all of its ranks run on one node, a transport may also offer [`shm::SharedMemory`]:
//! flags, staging areas and arrays that every rank maps, for the shared-memory schedules.
//!
//! A transport over a communication library may also offer the library's own collectives
//! ([`LibraryCollectives`], MPI's), for the `mpi` algorithms; the others decline.
//!
//! Besides data, a transport carries *notices*: pairs of `u64`s on a separate channel that never
//! match data messages (the runtime's stall inspector reports with them, and a rank that shuts
//! down says so with one). And while a wait lasts, the transport tells its [`Watcher`], if it
//! has one, how long it has been waiting; the watcher may end the wait with an error, and the
//! wait then abandons what it started ([`Pending::abandon`]).

pub mod environment;
pub mod library;
pub mod local;
pub mod mpi;
pub mod mpi_call;
mod mpi_collectives;
pub mod mpi_shm;
pub mod nodes;
pub mod shm;
pub mod view;
pub mod waiting;

pub use library::{LibraryCollectives, LibraryElement, LibraryOp};
pub use nodes::{Nodes, Placement};

use crate::error::{CoreError, Result};
use smallvec::{smallvec, SmallVec};
use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Pieces of memory that travel as one logical message (one piece is the common case).
pub type Pieces<'a> = SmallVec<[&'a [u8]; 2]>;
pub type PiecesMut<'a> = SmallVec<[&'a mut [u8]; 2]>;
/// Lengths of consecutive pieces.
pub type Cuts = SmallVec<[usize; 2]>;
/// A notice: two words whose meaning is the runtime's.
pub type Notice = [u64; 2];

/// Where a receive puts what arrives.
pub enum Destination<'a> {
    /// Consecutive messages of the `cuts` lengths into the start of `buf`, which the wait
    /// hands back whole (a schedule's scratch slot).
    Cut { buf: &'a mut [u8], cuts: Cuts },
    /// One message per piece, into the pieces themselves.
    Pieces(PiecesMut<'a>),
}

impl<'a> Destination<'a> {
    /// All of `buf` as one message.
    pub fn whole(buf: &'a mut [u8]) -> Self {
        let len = buf.len();
        Destination::Cut {
            buf,
            cuts: smallvec![len],
        }
    }

    /// The pieces' lengths, in order.
    pub fn lengths(&self) -> Cuts {
        match self {
            Destination::Cut { cuts, .. } => cuts.clone(),
            Destination::Pieces(pieces) => pieces.iter().map(|p| p.len()).collect(),
        }
    }

    /// Piece `index`, to write into.
    pub fn piece_mut(&mut self, index: usize) -> Option<&mut [u8]> {
        match self {
            Destination::Cut { buf, cuts } => {
                let start: usize = cuts.get(..index)?.iter().sum();
                buf.get_mut(start..start + cuts.get(index)?)
            }
            Destination::Pieces(pieces) => pieces.get_mut(index).map(|p| &mut **p),
        }
    }

    pub(crate) fn check(&self) -> Result<()> {
        if let Destination::Cut { buf, cuts } = self {
            check_receive_length(cuts.iter().sum(), buf.len())?;
        }
        Ok(())
    }
}

/// An operation in flight, borrowing its memory for `'a`.
pub trait Pending<'a> {
    /// Wait at most `limit` for the operation to complete; `Ok(true)` once it has.
    fn wait_for(&mut self, limit: Duration) -> Result<bool>;
    /// The rank on the other end (for stall messages).
    fn peer(&self) -> usize;
    /// A completed receive's destination; `None` for sends.
    fn into_destination(self: Box<Self>) -> Option<Destination<'a>>;
    /// Give the operation up (its watcher ended the wait: the peer will never answer). Once this
    /// returns, nothing writes into the destination any more; a send may still be read from.
    fn abandon(&mut self) {}
}

/// Told how long a wait has lasted, now and then while it lasts (the runtime's stall
/// inspector). `flags` belongs to the watcher: it starts at 0 for each wait. An error ends the
/// wait with that error.
pub trait Watcher: Send + Sync {
    fn waiting(
        &self,
        transport: &dyn Transport,
        peer: usize,
        waited: Duration,
        flags: &mut u8,
    ) -> Result<()>;
}

/// How often a long wait reports to its watcher.
const WATCH_PERIOD: Duration = Duration::from_millis(50);

/// A started send or receive. Waiting consumes it; dropping it waits too (ignoring the
/// outcome), because the buffer it borrows must not be released while the transport may still
/// use it.
#[must_use = "a request must be waited on"]
pub struct Request<'a> {
    op: Option<Box<dyn Pending<'a> + 'a>>,
    transport: Option<&'a dyn Transport>,
}

impl<'a> Request<'a> {
    /// A request on `transport`, whose watcher hears about long waits.
    pub fn new(op: Box<dyn Pending<'a> + 'a>, transport: &'a dyn Transport) -> Self {
        Request {
            op: Some(op),
            transport: Some(transport),
        }
    }

    /// A request that is already complete (an eager send).
    pub fn done() -> Self {
        Request {
            op: None,
            transport: None,
        }
    }

    pub fn wait(mut self) -> Result<()> {
        self.complete().map(|_| ())
    }

    /// Wait for a receive into one buffer and get it back, to reduce what arrived.
    pub fn wait_for_data(mut self) -> Result<&'a mut [u8]> {
        match self.complete()? {
            Some(Destination::Cut { buf, .. }) => Ok(buf),
            _ => Err(internal("waited for data on a send or a scattered receive")),
        }
    }

    /// Wait for a receive and get its pieces back, to forward what arrived.
    pub fn wait_for_pieces(mut self) -> Result<PiecesMut<'a>> {
        match self.complete()? {
            Some(Destination::Pieces(pieces)) => Ok(pieces),
            Some(Destination::Cut { buf, .. }) => Ok(smallvec![buf]),
            None => Err(internal("waited for data on a send")),
        }
    }

    fn complete(&mut self) -> Result<Option<Destination<'a>>> {
        let Some(mut op) = self.op.take() else {
            return Ok(None);
        };
        if op.wait_for(WATCH_PERIOD)? {
            return Ok(op.into_destination());
        }
        let started = Instant::now();
        let watcher = self.transport.and_then(|t| t.watcher().map(|w| (t, w)));
        let mut flags = 0;
        loop {
            if let Some((transport, watcher)) = watcher {
                let waited = WATCH_PERIOD + started.elapsed();
                if let Err(error) = watcher.waiting(transport, op.peer(), waited, &mut flags) {
                    op.abandon();
                    return Err(error);
                }
            }
            if op.wait_for(WATCH_PERIOD)? {
                return Ok(op.into_destination());
            }
        }
    }
}

fn internal(what: &str) -> CoreError {
    CoreError::InvalidArgument(format!("internal: {what}"))
}

impl Drop for Request<'_> {
    fn drop(&mut self) {
        // Reached only on an early return after another error; that error is the one the
        // caller reports, so this one is dropped.
        let _ = self.complete();
    }
}

/// Every transport can wait in shared memory ([`shm::Waiter`]): see the blanket impl below.
pub trait Transport: shm::Waiter {
    fn rank(&self) -> usize;
    fn size(&self) -> usize;

    /// Start sending the pieces to `dest`, one message each (split at the message limit).
    fn isend_pieces<'a>(&'a self, pieces: &[&'a [u8]], dest: usize) -> Result<Request<'a>>;

    /// Start receiving from `source` into `destination`, one message per piece. A message of
    /// another length than its piece is an error.
    fn irecv_to<'a>(&'a self, destination: Destination<'a>, source: usize) -> Result<Request<'a>>;

    /// Start sending `data` to `dest`.
    fn isend<'a>(&'a self, data: &'a [u8], dest: usize) -> Result<Request<'a>> {
        self.isend_pieces(&[data], dest)
    }

    /// Start receiving exactly `len` bytes from `source` into `buf[..len]`. Waiting with
    /// [`Request::wait_for_data`] hands back all of `buf`, so a schedule can reuse a fixed set of
    /// scratch buffers for messages of varying size.
    fn irecv_into<'a>(
        &'a self,
        buf: &'a mut [u8],
        len: usize,
        source: usize,
    ) -> Result<Request<'a>> {
        self.irecv_to(
            Destination::Cut {
                buf,
                cuts: smallvec![len],
            },
            source,
        )
    }

    /// Start receiving exactly `data.len()` bytes from `source` into `data`.
    fn irecv<'a>(&'a self, data: &'a mut [u8], source: usize) -> Result<Request<'a>> {
        self.irecv_to(Destination::whole(data), source)
    }

    /// Send to `dest` and receive from `source` at the same time (deadlock-free).
    fn sendrecv(&self, send: &[u8], dest: usize, recv: &mut [u8], source: usize) -> Result<()> {
        self.sendrecv_pieces(&[send], dest, Destination::whole(recv), source)
    }

    /// [`sendrecv`](Self::sendrecv) of pieces.
    fn sendrecv_pieces<'a>(
        &'a self,
        send: &[&'a [u8]],
        dest: usize,
        recv: Destination<'a>,
        source: usize,
    ) -> Result<()> {
        let receiving = self.irecv_to(recv, source)?;
        let sending = self.isend_pieces(send, dest)?;
        let received = receiving.wait();
        let sent = sending.wait();
        received.and(sent)
    }

    /// How long a message may be before it goes as several.
    fn message_limits(&self) -> MessageLimits;
    fn set_message_limits(&mut self, limits: MessageLimits);

    /// Send a notice to `dest`; it does not wait for the receiver (at most briefly for the
    /// library to take it).
    fn send_notice(&self, dest: usize, notice: Notice) -> Result<()>;
    /// The notices that have arrived since the last call: (source, notice).
    fn take_notices(&self) -> Vec<(usize, Notice)>;

    /// Who hears about long waits.
    fn watcher(&self) -> Option<&dyn Watcher>;
    fn set_watcher(&mut self, watcher: Arc<dyn Watcher>);

    /// End every process of the job now.
    fn abort(&self, code: i32) -> !;

    /// The communication library's own collectives over exactly these ranks, if it has any.
    fn library_collectives(&self) -> Option<&dyn LibraryCollectives> {
        None
    }

    /// Let the library move messages that earlier calls left queued (MPI progresses only inside
    /// its calls: a rank that waits in shared memory must still let its eager sends drain).
    fn progress(&self) {}

    /// `Err(ProcessFailed)` if a process of the communicator is known to have died (MPI's fault
    /// tolerance, ULFM); asked now and then while a wait lasts. Transports that cannot lose a
    /// process say `Ok`.
    fn failed(&self) -> Result<()> {
        Ok(())
    }

    /// Memory every rank maps, if all ranks share one node and it could be had.
    fn shared(&self) -> Option<&dyn shm::SharedMemory> {
        None
    }

    /// Which node each rank runs on (the same list on every rank).
    fn nodes(&self) -> &Nodes;
}

impl<T: Transport> shm::Waiter for T {
    fn progress_while_waiting(&self) {
        self.progress();
    }

    fn report_wait(&self, peer: usize, waited: Duration, flags: &mut u8) -> Result<()> {
        match self.watcher() {
            Some(watcher) => watcher.waiting(self, peer, waited, flags),
            None => Ok(()),
        }
    }
}

/// How long one message may be before a transport sends it as several (the receiver cuts
/// alike, from the same limits).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MessageLimits {
    /// Any message: MPI counts are C ints.
    pub any: usize,
    /// A message between ranks on different nodes. Below the MPI library's eager limit, each
    /// piece goes without a rendezvous, which over Open MPI's TCP transport lets two ranks that
    /// exchange both ways do so at once: with whole messages a rank's rendezvous reply can wait
    /// behind its own outgoing transfer, and the exchange takes twice as long (measured in
    /// calibration, which picks this limit; see `benchmarks/RESULTS.md`).
    pub across: usize,
}

impl Default for MessageLimits {
    fn default() -> Self {
        MessageLimits {
            any: DEFAULT_MAX_MESSAGE_BYTES,
            across: DEFAULT_MAX_MESSAGE_BYTES,
        }
    }
}

impl MessageLimits {
    /// The limit for a message between ranks `a` and `b` of `nodes`.
    pub fn between(&self, nodes: &Nodes, a: usize, b: usize) -> usize {
        if nodes.of(a) == nodes.of(b) {
            self.any
        } else {
            self.any.min(self.across)
        }
    }

    /// Both limits at least 1 and at most MPI's count limit.
    pub fn clamped(self) -> Self {
        MessageLimits {
            any: self.any.clamp(1, DEFAULT_MAX_MESSAGE_BYTES),
            across: self.across.clamp(1, DEFAULT_MAX_MESSAGE_BYTES),
        }
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

/// A message of the wrong length: the two ranks disagree on what they exchange.
pub(crate) fn wrong_length(source: usize, expected: usize, got: usize) -> CoreError {
    CoreError::Communication(format!(
        "expected a message of {expected} bytes from rank {source}, got {got}: the ranks \
         disagree on what they exchange"
    ))
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
