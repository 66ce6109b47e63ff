//! The stall inspector (after Horovod's): it watches every wait of the transport, and when one
//! lasts, says which collective this rank is in and which rank it waits for; rank 0 gathers
//! the other ranks' reports and names the ranks that have not joined (and, of those that are
//! still in an earlier collective, which rank they wait for: the chain leads to the one that is
//! gone); with a timeout set, a rank that has waited too long ends the job rather than hang
//! forever.
//!
//! It also hears when a rank shuts ringlet down ([`StallInspector::departure`], sent by
//! [`super::communicator::Communicator::depart`]): a wait for a collective that the departed
//! rank never took part in can never end, so it ends with an error naming the rank and how far
//! it got, and so does every later call. A rank that is only slow has sent no such notice, so it
//! is never taken for one that left.
//!
//! It works over any [`Transport`] (reports travel as notices), so the in-process transport
//! tests it with the same messages as MPI.

use super::call::Label;
use crate::error::{CoreError, Result};
use crate::transport::{Notice, Transport, Watcher};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What to do when a wait takes long: warn after `warning`, end the job after `timeout`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StallPolicy {
    pub warning: Option<Duration>,
    pub timeout: Option<Duration>,
}

/// Where the inspector's messages go: stderr in a real job, a list in tests.
pub type Sink = Arc<dyn Fn(&str) + Send + Sync>;

pub fn stderr_sink() -> Sink {
    Arc::new(|message: &str| eprintln!("{message}"))
}

pub struct StallInspector {
    policy: StallPolicy,
    /// The same on every rank of the communicator, and (almost surely) different from any
    /// earlier communicator's: notices sent on a communicator that has since been freed and
    /// whose context MPI reuses are told apart by it.
    key: u64,
    /// Each rank's host, to name it in messages (when the ranks span several hosts).
    hosts: Vec<String>,
    /// Each rank's number in ringlet's communicator, which messages use (a process set numbers
    /// its ranks from 0).
    ranks: Vec<usize>,
    /// The collective in progress.
    current: Mutex<Option<Label>>,
    /// On rank 0: what each rank last reported waiting in and for.
    reports: Mutex<Vec<Report>>,
    /// For each rank that has shut down: how many collectives it had made.
    departed: Mutex<Vec<Option<u64>>>,
    /// Whether `departed` has an entry (checked at every call, so without the lock).
    any_departed: AtomicBool,
    sink: Sink,
}

/// What a notice says, in its first word's top byte (the rest is the communicator's key).
/// A waiting rank sends WAITING (the collective's number) and then WAITING_FOR (the rank it
/// waits for); MPI keeps the two in order.
const WAITING: u64 = 1;
const DEPARTED: u64 = 2;
const WAITING_FOR: u64 = 3;
const KIND_SHIFT: u32 = 56;
const KEY_MASK: u64 = (1 << KIND_SHIFT) - 1;

/// A rank's last stall report, as rank 0 has it.
#[derive(Clone, Copy, Debug, Default)]
struct Report {
    /// The collective it waits in.
    seq: Option<u64>,
    /// The rank it waits for there (this communicator's number).
    peer: Option<usize>,
}

/// Per-wait flags.
const WARNED: u8 = 1;
const SUMMARIZED: u8 = 2;

impl StallInspector {
    /// An inspector for a communicator whose ranks run on `hosts` (one per rank), are `ranks`
    /// of ringlet's communicator (empty: the same numbers) and agreed on `key`.
    pub fn new(
        policy: StallPolicy,
        key: u64,
        hosts: Vec<String>,
        ranks: Vec<usize>,
        sink: Sink,
    ) -> Self {
        let size = hosts.len();
        let ranks = if ranks.len() == size {
            ranks
        } else {
            (0..size).collect()
        };
        StallInspector {
            policy,
            key: key & KEY_MASK,
            hosts,
            ranks,
            current: Mutex::new(None),
            reports: Mutex::new(vec![Report::default(); size]),
            departed: Mutex::new(vec![None; size]),
            any_departed: AtomicBool::new(false),
            sink,
        }
    }

    fn notice(&self, kind: u64, value: u64) -> Notice {
        [kind << KIND_SHIFT | self.key, value]
    }

    /// The notice that tells the other ranks this one has shut down after `completed`
    /// collectives.
    pub fn departure(&self, completed: u64) -> Notice {
        self.notice(DEPARTED, completed)
    }

    /// "rank 3", as ringlet's communicator numbers it, with " (host h)" when the ranks span
    /// several hosts.
    fn name(&self, rank: usize) -> String {
        format!("rank {}{}", self.number(rank), self.host_of(rank))
    }

    fn number(&self, rank: usize) -> usize {
        self.ranks.get(rank).copied().unwrap_or(rank)
    }

    fn host_of(&self, rank: usize) -> String {
        match self.hosts.get(rank) {
            Some(host) if self.hosts.iter().any(|h| h != host) => format!(" (host {host})"),
            _ => String::new(),
        }
    }

    /// Sort the notices that have arrived: stall reports (kept on rank 0) and departures. Notices
    /// of another communicator (one freed before this was made) are dropped.
    fn take_notices(&self, transport: &dyn Transport) {
        for (source, [head, value]) in transport.take_notices() {
            if head & KEY_MASK != self.key {
                continue;
            }
            let kind = head >> KIND_SHIFT;
            match kind {
                WAITING | WAITING_FOR => {
                    let mut reports = self.reports.lock().unwrap_or_else(|e| e.into_inner());
                    if let Some(report) = reports.get_mut(source) {
                        if kind == WAITING {
                            *report = Report {
                                seq: Some(value),
                                peer: None,
                            };
                        } else {
                            report.peer = usize::try_from(value).ok();
                        }
                    }
                }
                DEPARTED => {
                    self.any_departed.store(true, Ordering::Release);
                    if let Some(slot) = self
                        .departed
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .get_mut(source)
                    {
                        *slot = Some(value);
                    }
                }
                _ => {}
            }
        }
    }

    /// Whether every rank but `me` has said that it left (taking the notices that arrived).
    pub fn all_others_departed(&self, transport: &dyn Transport) -> bool {
        self.take_notices(transport);
        let me = transport.rank();
        self.departed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .enumerate()
            .all(|(rank, completed)| rank == me || completed.is_some())
    }

    /// `Err` if a rank has shut down before taking part in collective `seq` (which can then
    /// never complete); `doing` says what this rank does, for the message.
    pub fn check_departed(&self, seq: u64, doing: impl FnOnce() -> String) -> Result<()> {
        if !self.any_departed.load(Ordering::Acquire) {
            return Ok(());
        }
        let departed = self.departed.lock().unwrap_or_else(|e| e.into_inner());
        // The rank that left first is named: the others may have left because of it (a test
        // fixture, a handler that shuts down on the error this raises).
        let Some((rank, completed)) = departed
            .iter()
            .enumerate()
            .filter_map(|(rank, completed)| completed.filter(|&c| c <= seq).map(|c| (rank, c)))
            .min_by_key(|&(rank, completed)| (completed, rank))
        else {
            return Ok(());
        };
        let plural = if completed == 1 { "" } else { "s" };
        Err(CoreError::Communication(format!(
            "{} has shut down ringlet (ringlet.shutdown() or the end of its program) after \
             {completed} collective{plural} while this rank {}; no collective on this \
             communicator can complete without it",
            self.name(rank),
            doing()
        )))
    }

    pub fn policy(&self) -> StallPolicy {
        self.policy
    }

    /// The collective this rank is now in.
    pub fn enter(&self, label: Label) {
        *self.current.lock().unwrap_or_else(|e| e.into_inner()) = Some(label);
    }

    fn current(&self) -> Option<Label> {
        self.current
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn describe_current(&self) -> String {
        self.current()
            .map_or_else(|| "a collective".into(), |label| label.to_string())
    }

    /// On rank 0, waiting in `label`: the ranks that have not joined it, or `None` if every
    /// rank has. A rank that reports waiting in a later collective has done its part of this one
    /// (in a ring, its neighbours finish before rank 0 when rank 0's predecessor is cut off).
    /// The ranks that sent no report come first, as the likely cause; a rank still in an
    /// earlier collective (it finished rank 0's part of it, not its own) is named with the rank
    /// it waits for there, which leads to the cause.
    fn summary(&self, transport: &dyn Transport, label: &Label, seconds: f64) -> Option<String> {
        let reports = self.reports.lock().unwrap_or_else(|e| e.into_inner());
        let absent = |r: &usize| !matches!(reports[*r].seq, Some(s) if s >= label.seq);
        let (silent, behind): (Vec<usize>, Vec<usize>) = (1..transport.size().min(reports.len()))
            .filter(absent)
            .partition(|&r| reports[r].seq.is_none());
        if silent.is_empty() && behind.is_empty() {
            return None;
        }
        let mut parts = Vec::new();
        if !silent.is_empty() {
            let list: Vec<String> = silent
                .iter()
                .map(|&r| format!("{}{}", self.number(r), self.host_of(r)))
                .collect();
            parts.push(format!(
                "rank(s) {} have not joined it (every other rank reports waiting)",
                list.join(", ")
            ));
        }
        for &r in &behind {
            let Report { seq, peer } = reports[r];
            let seq = seq.unwrap_or_default();
            let waits_for =
                peer.map_or_else(String::new, |p| format!(", waiting for {}", self.name(p)));
            parts.push(format!(
                "{} is still in collective #{seq}{waits_for}",
                self.name(r)
            ));
        }
        Some(format!(
            "ringlet: {label} has waited {seconds:.0} s: {}",
            parts.join("; ")
        ))
    }
}

impl Watcher for StallInspector {
    fn waiting(
        &self,
        transport: &dyn Transport,
        peer: usize,
        waited: Duration,
        flags: &mut u8,
    ) -> Result<()> {
        self.take_notices(transport);
        if let Some(label) = self.current() {
            self.check_departed(label.seq, || format!("waits in {label}"))?;
        }
        transport.failed()?;
        let rank = transport.rank();
        let seconds = waited.as_secs_f64();
        if let Some(limit) = self.policy.warning {
            if *flags & WARNED == 0 && waited >= limit {
                (self.sink)(&format!(
                    "ringlet: rank {} has waited {seconds:.0} s in {} for {}, which has not \
                     joined it (or is itself waiting); RINGLET_STALL_WARNING={}",
                    self.number(rank),
                    self.describe_current(),
                    self.name(peer),
                    limit.as_secs_f64()
                ));
                *flags |= WARNED;
                if let (Some(label), true) = (self.current(), rank != 0) {
                    // Diagnostics: if the report cannot be sent, the local warning stands.
                    let _ = transport.send_notice(0, self.notice(WAITING, label.seq));
                    let _ = transport.send_notice(0, self.notice(WAITING_FOR, peer as u64));
                }
            }
            // Rank 0, half a period later, names the ranks it heard nothing from.
            if rank == 0 && *flags & SUMMARIZED == 0 && waited >= limit * 3 / 2 {
                if let Some(summary) = self
                    .current()
                    .and_then(|label| self.summary(transport, &label, seconds))
                {
                    (self.sink)(&summary);
                }
                *flags |= SUMMARIZED;
            }
        }
        if let Some(limit) = self.policy.timeout.filter(|limit| waited >= *limit) {
            (self.sink)(&format!(
                "ringlet: rank {} gives up after {seconds:.0} s in {} waiting for {} \
                 (RINGLET_TIMEOUT={}): ending the job",
                self.number(rank),
                self.describe_current(),
                self.name(peer),
                limit.as_secs_f64()
            ));
            transport.abort(1);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::{DType, ReduceOp};
    use crate::runtime::call::{Call, Element, Kind, Shape};
    use crate::transport::local::LocalTransport;

    fn label(seq: u64) -> Label {
        let call = Call {
            element: Element::Typed(DType::F32),
            op: Some(ReduceOp::Sum),
            shape: Shape::Array(&[8]),
            algorithm: "halving_doubling",
            ..Call::new(Kind::Allreduce, 0)
        };
        Label::of(&call, seq)
    }

    /// Four ranks on four hosts: rank 1 waits in collective `seq_1` for `peer_1`, rank 2 in
    /// `seq_2` for rank 3, rank 3 sends nothing; rank 0 waits in #1 for rank 3 long enough
    /// to summarize. Returns rank 0's summary.
    fn summary_when(seq_1: u64, seq_2: u64) -> String {
        let transports = LocalTransport::cluster(&[0, 1, 2, 3]);
        let hosts: Vec<String> = (0..4).map(|h| format!("h{h}")).collect();
        let messages: Arc<Mutex<Vec<String>>> = Arc::default();
        let sink: Sink = {
            let messages = messages.clone();
            Arc::new(move |m: &str| messages.lock().expect("lock").push(m.to_string()))
        };
        let policy = StallPolicy {
            warning: Some(Duration::from_secs(2)),
            timeout: None,
        };
        let inspector = || StallInspector::new(policy, 7, hosts.clone(), vec![], sink.clone());
        for (rank, seq) in [(1, seq_1), (2, seq_2)] {
            let reporter = inspector();
            reporter.enter(label(seq));
            let mut flags = 0;
            reporter
                .waiting(&transports[rank], 3, Duration::from_secs(2), &mut flags)
                .expect("no departures");
        }
        let rank_0 = inspector();
        rank_0.enter(label(1));
        let mut flags = 0;
        rank_0
            .waiting(&transports[0], 3, Duration::from_secs(3), &mut flags)
            .expect("no departures");
        let messages = messages.lock().expect("lock");
        let summaries: Vec<&String> = messages
            .iter()
            .filter(|m| m.starts_with("ringlet: allreduce #1"))
            .collect();
        assert_eq!(summaries.len(), 1, "{messages:#?}");
        summaries[0].clone()
    }

    #[test]
    fn rank_0_names_the_silent_rank_first_and_who_a_rank_behind_waits_for() {
        assert_eq!(
            summary_when(1, 0),
            "ringlet: allreduce #1 of float32[8] sum (halving_doubling) has waited 3 s: \
             rank(s) 3 (host h3) have not joined it (every other rank reports waiting); \
             rank 2 (host h2) is still in collective #0, waiting for rank 3 (host h3)"
        );
    }

    #[test]
    fn a_rank_in_a_later_collective_has_joined_and_one_in_this_one_is_not_named() {
        assert_eq!(
            summary_when(2, 1),
            "ringlet: allreduce #1 of float32[8] sum (halving_doubling) has waited 3 s: \
             rank(s) 3 (host h3) have not joined it (every other rank reports waiting)"
        );
    }
}
