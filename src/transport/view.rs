//! Some ranks of a transport, in an order of their own, as a transport: what a schedule runs
//! a phase on when it works per node, across nodes, or in node-major order.
//!
//! A view creates no communicator; its messages are the underlying transport's, between the
//! underlying ranks. Two views used one after the other on the same ranks are safe because
//! messages between a pair arrive in order; views used at the same time must not share a pair
//! of ranks (those of one node and those across nodes never do).

use super::nodes::Nodes;
use super::{Destination, LibraryCollectives, MessageLimits, Notice, Request, Transport, Watcher};
use crate::error::{CoreError, Result};
use std::sync::Arc;

pub struct View<'t> {
    inner: &'t dyn Transport,
    /// `members[i]`: the underlying rank of this view's rank i.
    members: Vec<usize>,
    rank: usize,
    nodes: Nodes,
}

impl<'t> View<'t> {
    /// The ranks `members` of `inner` (distinct, this rank among them), renumbered 0.. in that
    /// order.
    pub fn new(inner: &'t dyn Transport, members: Vec<usize>) -> Result<Self> {
        let me = inner.rank();
        let rank = members.iter().position(|&r| r == me).ok_or_else(|| {
            CoreError::InvalidArgument(format!("internal: rank {me} is not in its view"))
        })?;
        let mut sorted = members.clone();
        sorted.sort_unstable();
        sorted.dedup();
        if sorted.len() != members.len() || sorted.last().is_some_and(|&r| r >= inner.size()) {
            return Err(CoreError::InvalidArgument(format!(
                "internal: a view needs distinct ranks below {}; got {members:?}",
                inner.size()
            )));
        }
        let labels: Vec<usize> = members.iter().map(|&r| inner.nodes().of(r)).collect();
        Ok(View {
            inner,
            nodes: Nodes::from_labels(&labels),
            members,
            rank,
        })
    }

    fn underlying(&self, rank: usize) -> Result<usize> {
        self.members.get(rank).copied().ok_or_else(|| {
            CoreError::InvalidArgument(format!(
                "rank {rank} is outside a view of {}",
                self.members.len()
            ))
        })
    }
}

impl Transport for View<'_> {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.members.len()
    }

    fn isend_pieces<'a>(&'a self, pieces: &[&'a [u8]], dest: usize) -> Result<Request<'a>> {
        self.inner.isend_pieces(pieces, self.underlying(dest)?)
    }

    fn irecv_to<'a>(&'a self, destination: Destination<'a>, source: usize) -> Result<Request<'a>> {
        self.inner.irecv_to(destination, self.underlying(source)?)
    }

    fn message_limits(&self) -> MessageLimits {
        self.inner.message_limits()
    }

    /// The underlying transport splits the messages, at its own limits.
    fn set_message_limits(&mut self, _limits: MessageLimits) {}

    fn send_notice(&self, dest: usize, notice: Notice) -> Result<()> {
        self.inner.send_notice(self.underlying(dest)?, notice)
    }

    /// Notices stay with the underlying transport, whose owner takes them.
    fn take_notices(&self) -> Vec<(usize, Notice)> {
        Vec::new()
    }

    fn watcher(&self) -> Option<&dyn Watcher> {
        self.inner.watcher()
    }

    /// The underlying transport's watcher hears about long waits (with its own rank numbers).
    fn set_watcher(&mut self, _watcher: Arc<dyn Watcher>) {}

    fn abort(&self, code: i32) -> ! {
        self.inner.abort(code)
    }

    /// None: the underlying transport's would involve ranks outside the view.
    fn library_collectives(&self) -> Option<&dyn LibraryCollectives> {
        None
    }

    fn progress(&self) {
        self.inner.progress()
    }

    fn failed(&self) -> Result<()> {
        self.inner.failed()
    }

    fn nodes(&self) -> &Nodes {
        &self.nodes
    }
}
