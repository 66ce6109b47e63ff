//! The stall inspector (after Horovod's): it watches every wait of the transport, and when one
//! lasts, says which collective this rank is in and which rank it waits for; rank 0 gathers
//! the other ranks' reports and names the ranks that have not joined; with a timeout set, a
//! rank that has waited too long ends the job rather than hang forever.
//!
//! It works over any [`Transport`] (reports travel as notices), so the in-process transport
//! tests it with the same messages as MPI.

use super::call::Label;
use crate::transport::{Transport, Watcher};
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
    /// The collective in progress.
    current: Mutex<Option<Label>>,
    /// On rank 0: the last collective each rank reported waiting in.
    reports: Mutex<Vec<Option<u64>>>,
    sink: Sink,
}

/// Per-wait flags.
const WARNED: u8 = 1;
const SUMMARIZED: u8 = 2;

impl StallInspector {
    pub fn new(policy: StallPolicy, ranks: usize, sink: Sink) -> Self {
        StallInspector {
            policy,
            current: Mutex::new(None),
            reports: Mutex::new(vec![None; ranks]),
            sink,
        }
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

    /// On rank 0: take in the reports that have arrived, and name the ranks that have not
    /// reported waiting in collective `seq` (rank 0 itself is waiting in it).
    fn missing_from(&self, transport: &dyn Transport, seq: u64) -> Vec<usize> {
        let mut reports = self.reports.lock().unwrap_or_else(|e| e.into_inner());
        for (source, reported) in transport.take_notices() {
            if let Some(slot) = reports.get_mut(source) {
                *slot = Some(reported);
            }
        }
        (1..transport.size())
            .filter(|&r| reports.get(r).copied().flatten() != Some(seq))
            .collect()
    }
}

impl Watcher for StallInspector {
    fn waiting(&self, transport: &dyn Transport, peer: usize, waited: Duration, flags: &mut u8) {
        let rank = transport.rank();
        let seconds = waited.as_secs_f64();
        if let Some(limit) = self.policy.warning {
            if *flags & WARNED == 0 && waited >= limit {
                (self.sink)(&format!(
                    "ringlet: rank {rank} has waited {seconds:.0} s in {} for rank {peer}, which \
                     has not joined it (or is itself waiting); RINGLET_STALL_WARNING={}",
                    self.describe_current(),
                    limit.as_secs_f64()
                ));
                *flags |= WARNED;
                if let (Some(label), true) = (self.current(), rank != 0) {
                    // Diagnostics: if the report cannot be sent, the local warning stands.
                    let _ = transport.send_notice(0, label.seq);
                }
            }
            // Rank 0, half a period later, names the ranks it heard nothing from.
            if rank == 0 && *flags & SUMMARIZED == 0 && waited >= limit * 3 / 2 {
                if let Some(label) = self.current() {
                    let missing = self.missing_from(transport, label.seq);
                    if !missing.is_empty() {
                        let list: Vec<String> = missing.iter().map(usize::to_string).collect();
                        (self.sink)(&format!(
                            "ringlet: {label} has waited {seconds:.0} s: rank(s) {} have not \
                             joined it (every other rank reports waiting)",
                            list.join(", ")
                        ));
                    }
                }
                *flags |= SUMMARIZED;
            }
        }
        if let Some(limit) = self.policy.timeout.filter(|limit| waited >= *limit) {
            (self.sink)(&format!(
                "ringlet: rank {rank} gives up after {seconds:.0} s in {} waiting for rank \
                 {peer} (RINGLET_TIMEOUT={}): ending the job",
                self.describe_current(),
                limit.as_secs_f64()
            ));
            transport.abort(1);
        }
    }
}
