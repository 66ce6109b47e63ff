//! A transport that moves nothing: it records what one virtual rank sends, receives and waits
//! for, so that a schedule's real code yields its message pattern for any number of ranks.
//!
//! Each virtual rank runs alone, one after the other, on one thread: a receive completes at
//! once and leaves its buffer as it was (the schedules' control flow never depends on the
//! values they receive), and the kernels only count the bytes they would combine
//! ([`crate::kernels::counting`]). The network model then matches the k-th message from a to b
//! with b's k-th receive from a (MPI's non-overtaking order) and times them.

use crate::error::{CoreError, Result};
use crate::kernels;
use crate::transport::{
    Destination, MessageLimits, Nodes, Notice, Pending, Request, Transport, Watcher,
};
use std::cell::{Cell, RefCell};
use std::sync::Arc;
use std::time::Duration;

/// One step of a rank's program. Requests are numbered per rank from 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// Start sending `bytes` to rank `to`.
    Send { to: u32, bytes: u64, request: u32 },
    /// Start receiving `bytes` from rank `from`.
    Receive { from: u32, bytes: u64, request: u32 },
    /// Block until `request` has completed.
    Wait { request: u32 },
    /// Combine `bytes` (the reduction kernels' work between two transport calls).
    Combine { bytes: u64 },
}

/// What one virtual rank did, in order.
pub type Program = Vec<Op>;

pub struct Recorder {
    rank: usize,
    nodes: Nodes,
    program: RefCell<Program>,
    next_request: Cell<u32>,
    /// [`kernels::counted_bytes`] when the last op was recorded.
    combined: Cell<u64>,
    /// Kept for the trait: a recording counts logical messages, which the transports cut at
    /// these limits into pieces that travel one after the other (the network model times the
    /// whole).
    message_limits: MessageLimits,
}

impl Recorder {
    /// Virtual rank `rank` of the ranks on `nodes`.
    pub fn new(rank: usize, nodes: Nodes) -> Self {
        Recorder {
            rank,
            nodes,
            program: RefCell::new(Vec::new()),
            next_request: Cell::new(0),
            combined: Cell::new(kernels::counted_bytes()),
            message_limits: MessageLimits::default(),
        }
    }

    /// The program, with the combining done after the last transport call.
    pub fn finish(self) -> Program {
        self.note_combining();
        self.program.into_inner()
    }

    /// The bytes combined since the last op, as an op of their own.
    fn note_combining(&self) {
        let now = kernels::counted_bytes();
        let bytes = now.saturating_sub(self.combined.replace(now));
        if bytes > 0 {
            self.program.borrow_mut().push(Op::Combine { bytes });
        }
    }

    fn push(&self, op: Op) {
        self.note_combining();
        self.program.borrow_mut().push(op);
    }

    fn request(&self) -> u32 {
        let id = self.next_request.get();
        self.next_request.set(id + 1);
        id
    }

    fn check_peer(&self, peer: usize) -> Result<u32> {
        if peer < self.nodes.ranks() {
            Ok(peer as u32)
        } else {
            Err(CoreError::InvalidArgument(format!(
                "rank {peer} is outside a group of {}",
                self.nodes.ranks()
            )))
        }
    }
}

struct Recorded<'a> {
    recorder: &'a Recorder,
    request: u32,
    peer: usize,
    destination: Option<Destination<'a>>,
}

impl<'a> Pending<'a> for Recorded<'a> {
    fn wait_for(&mut self, _limit: Duration) -> Result<bool> {
        self.recorder.push(Op::Wait {
            request: self.request,
        });
        Ok(true)
    }

    fn peer(&self) -> usize {
        self.peer
    }

    fn into_destination(self: Box<Self>) -> Option<Destination<'a>> {
        self.destination
    }
}

impl Transport for Recorder {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.nodes.ranks()
    }

    fn isend_pieces<'a>(&'a self, pieces: &[&'a [u8]], dest: usize) -> Result<Request<'a>> {
        let to = self.check_peer(dest)?;
        let request = self.request();
        let bytes = pieces.iter().map(|p| p.len() as u64).sum();
        self.push(Op::Send { to, bytes, request });
        let pending = Recorded {
            recorder: self,
            request,
            peer: dest,
            destination: None,
        };
        Ok(Request::new(Box::new(pending), self))
    }

    fn irecv_to<'a>(&'a self, destination: Destination<'a>, source: usize) -> Result<Request<'a>> {
        let from = self.check_peer(source)?;
        destination.check()?;
        let request = self.request();
        let bytes = destination.lengths().iter().map(|&l| l as u64).sum();
        self.push(Op::Receive {
            from,
            bytes,
            request,
        });
        let pending = Recorded {
            recorder: self,
            request,
            peer: source,
            destination: Some(destination),
        };
        Ok(Request::new(Box::new(pending), self))
    }

    fn message_limits(&self) -> MessageLimits {
        self.message_limits
    }

    fn set_message_limits(&mut self, limits: MessageLimits) {
        self.message_limits = limits;
    }

    fn send_notice(&self, _dest: usize, _notice: Notice) -> Result<()> {
        Ok(())
    }

    fn take_notices(&self) -> Vec<(usize, Notice)> {
        Vec::new()
    }

    fn watcher(&self) -> Option<&dyn Watcher> {
        None
    }

    fn set_watcher(&mut self, _watcher: Arc<dyn Watcher>) {}

    fn abort(&self, code: i32) -> ! {
        std::process::exit(code)
    }

    fn nodes(&self) -> &Nodes {
        &self.nodes
    }
}
