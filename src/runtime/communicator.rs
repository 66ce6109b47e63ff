//! A communicator as the collectives see it: a transport, and what the runtime keeps per
//! communicator: the collectives' sequence number, the settings that shape traffic, whether
//! calls are checked, the stall inspector, and which host each rank runs on.
//!
//! Every collective starts with [`Communicator::begin`]: number the call, tell the stall
//! inspector, and (unless checking is off) agree with the other ranks on it.

use super::call::{Call, Kind, Label};
use super::consistency::{self, Agreement, Description, Role};
use super::stall::{Sink, StallInspector, StallPolicy};
use crate::auto::Refiner;
use crate::error::{CoreError, Result};
use crate::schedules::Tuning;
use crate::transport::{MessageLimits, Transport, DEFAULT_MAX_MESSAGE_BYTES};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// Settings that change what goes on the wire; part of every call's fingerprint, so ranks
/// that set them differently get `MismatchError` instead of a garbled exchange.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Settings {
    pub tuning: Tuning,
    /// Messages above this are split (MPI counts are C ints).
    pub max_message_bytes: usize,
    /// Messages between nodes above this are split, if the user says so; `None`: what
    /// calibration chose.
    pub across_message_bytes: Option<usize>,
    /// What calibration found fastest between nodes (whole messages until it has run).
    pub calibrated_across_bytes: usize,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            tuning: Tuning::default(),
            max_message_bytes: DEFAULT_MAX_MESSAGE_BYTES,
            across_message_bytes: None,
            calibrated_across_bytes: DEFAULT_MAX_MESSAGE_BYTES,
        }
    }
}

impl Settings {
    /// The limits the transport cuts messages at.
    pub fn limits(&self) -> MessageLimits {
        MessageLimits {
            any: self.max_message_bytes,
            across: self
                .across_message_bytes
                .unwrap_or(self.calibrated_across_bytes),
        }
    }

    fn words(&self) -> [u64; 4] {
        [
            self.tuning.segment_bytes as u64,
            self.max_message_bytes as u64,
            self.limits().across as u64,
            self.tuning.node_major as u64,
        ]
    }

    /// ", with segment_bytes=1024" for the settings that differ from the defaults.
    fn describe(&self) -> String {
        let defaults = Settings::default();
        let mut parts = Vec::new();
        if self.tuning.segment_bytes != defaults.tuning.segment_bytes {
            parts.push(format!("segment_bytes={}", self.tuning.segment_bytes));
        }
        if self.tuning.node_major != defaults.tuning.node_major {
            parts.push(format!("node_major_rings={}", self.tuning.node_major));
        }
        if self.max_message_bytes != defaults.max_message_bytes {
            parts.push(format!("max_message_bytes={}", self.max_message_bytes));
        }
        if self.limits().across != defaults.limits().across {
            parts.push(format!("across_message_bytes={}", self.limits().across));
        }
        if parts.is_empty() {
            String::new()
        } else {
            format!(", with {}", parts.join(", "))
        }
    }
}

/// How a communicator is set up.
pub struct Options {
    /// Check every call with the other ranks (`RINGLET_CHECK`).
    pub check: bool,
    pub stall: StallPolicy,
    /// This rank's host name (gathered from every rank at construction).
    pub host: String,
    /// Each rank's number in ringlet's communicator, for messages (a process set's members);
    /// empty: the communicator is ringlet's own.
    pub ranks: Vec<usize>,
    /// Where the stall inspector's messages go.
    pub sink: Sink,
    /// Let `auto` try close alternatives on real calls (`RINGLET_EXPLORE`).
    pub explore: bool,
}

pub struct Communicator<T: ?Sized + Transport = dyn Transport> {
    sequence: AtomicU64,
    check: bool,
    settings: Settings,
    inspector: Arc<StallInspector>,
    hosts: Vec<String>,
    /// Whether `auto` refines its table on this communicator (part of every call's digest: ranks
    /// that differ would try alternatives at different calls).
    explore: bool,
    refiner: Mutex<Refiner>,
    transport: T,
}

impl<T: Transport> Communicator<T> {
    /// Set up `transport` as a communicator. Collective: the ranks exchange host names, and
    /// take rank 0's random key for the communicator's notices.
    pub fn new(mut transport: T, options: Options) -> Result<Self> {
        let settings = Settings::default();
        transport.set_message_limits(settings.limits());
        let gathered = consistency::gather_descriptions(&transport, random_key(), &options.host)?;
        let key = gathered.first().map_or(0, |(key, _)| *key);
        let hosts: Vec<String> = gathered.into_iter().map(|(_, host)| host).collect();
        let inspector = Arc::new(StallInspector::new(
            options.stall,
            key,
            hosts.clone(),
            options.ranks,
            options.sink,
        ));
        transport.set_watcher(inspector.clone());
        Ok(Communicator {
            sequence: AtomicU64::new(0),
            check: options.check,
            settings,
            inspector,
            hosts,
            // Without the check nothing would catch ranks that try at different calls.
            explore: options.explore && options.check,
            refiner: Mutex::new(Refiner::new(options.explore && options.check)),
            transport,
        })
    }

    pub fn into_transport(self) -> T {
        self.transport
    }

    /// Tell the other ranks that this one leaves the communicator (it shuts ringlet down), and
    /// after how many collectives: a rank that waits, or will wait, in a later one raises
    /// instead of waiting forever. Best effort: a rank that cannot be told learns nothing.
    pub fn depart(&self) {
        let notice = self
            .inspector
            .departure(self.sequence.load(Ordering::Relaxed));
        for peer in (0..self.size()).filter(|&r| r != self.rank()) {
            let _ = self.transport.send_notice(peer, notice);
        }
    }

    /// Whether every other rank has left this communicator too, as far as the notices that
    /// have arrived tell (it takes them from the transport); or whether it has lost a process
    /// (ULFM), after which no notice comes: nothing is left to wait for.
    pub fn all_others_departed(&self) -> bool {
        self.inspector.all_others_departed(&self.transport) || self.transport.failed().is_err()
    }
}

/// A number that differs between communicators (and processes) with high probability: std's
/// randomly seeded hasher over the time.
fn random_key() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    if let Ok(now) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
        hasher.write_u128(now.as_nanos());
    }
    hasher.finish()
}

impl<T: ?Sized + Transport> Communicator<T> {
    pub fn transport(&self) -> &T {
        &self.transport
    }

    pub fn rank(&self) -> usize {
        self.transport.rank()
    }

    pub fn size(&self) -> usize {
        self.transport.size()
    }

    /// `auto`'s online refinement on this communicator.
    pub fn refiner(&self) -> MutexGuard<'_, Refiner> {
        self.refiner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Each rank's host name, in rank order.
    pub fn hosts(&self) -> &[String] {
        &self.hosts
    }

    pub fn settings(&self) -> Settings {
        self.settings
    }

    pub fn stall_policy(&self) -> StallPolicy {
        self.inspector.policy()
    }

    /// Change the settings. Every rank must make the same change before its next collective
    /// (the next call's check sees to it).
    pub fn set_settings(&mut self, settings: Settings) -> Result<()> {
        if settings.tuning.segment_bytes == 0 {
            return Err(CoreError::InvalidArgument(
                "segment_bytes must be at least 1, got 0".into(),
            ));
        }
        let limits = [
            ("max_message_bytes", settings.max_message_bytes),
            ("across_message_bytes", settings.limits().across),
        ];
        for (name, bytes) in limits {
            if bytes == 0 || bytes > DEFAULT_MAX_MESSAGE_BYTES {
                return Err(CoreError::InvalidArgument(format!(
                    "{name} must be 1 to {DEFAULT_MAX_MESSAGE_BYTES} (MPI's count limit), got \
                     {bytes}"
                )));
            }
        }
        self.transport.set_message_limits(settings.limits());
        self.settings = settings;
        Ok(())
    }
}

impl Communicator {
    /// Start collective `call`: number it, tell the stall inspector, and agree on it with the
    /// other ranks. A rank that `refused` the call (bad arguments) still takes part, so that
    /// the ranks stay in step: if every rank refused, each returns `Ok` here (and then its own
    /// error); otherwise every rank gets `MismatchError` naming who passed what.
    ///
    /// Ranks that have joined take part in the call if they can (its [`Call::replay`]).
    pub fn begin(&self, call: &Call, refused: Option<&CoreError>) -> Result<u64> {
        self.check_call(call, refused, false).map(|(seq, _)| seq)
    }

    /// [`begin`](Self::begin) for a call that no rank refused; also says whether every rank
    /// made this very call (false when some have joined and replay it).
    pub fn begin_together(&self, call: &Call) -> Result<(u64, bool)> {
        self.check_call(call, None, false)
            .map(|(seq, agreement)| (seq, matches!(agreement, Agreement::Same)))
    }

    /// On a rank that has joined: take part in the others' next call's check, as a join.
    /// Whether the call can be replayed here, and if so how, is in the agreement.
    pub fn begin_joined(&self, thread: u64) -> Result<Agreement> {
        let call = Call::new(Kind::Join, thread);
        self.check_call(&call, None, true)
            .map(|(_, agreement)| agreement)
    }

    /// Whether calls are checked (`RINGLET_CHECK`); joining needs it.
    pub fn is_checked(&self) -> bool {
        self.check
    }

    /// The number the next collective will have.
    pub fn next_sequence(&self) -> u64 {
        self.sequence.load(Ordering::Relaxed)
    }

    /// Number `call` and tell the stall inspector; `Err` without numbering it if a rank that
    /// must take part has shut down.
    fn number(&self, call: &Call) -> Result<u64> {
        let seq = self.next_sequence();
        self.inspector
            .check_departed(seq, || format!("starts {}", Label::of(call, seq)))?;
        let seq = self.sequence.fetch_add(1, Ordering::Relaxed);
        self.inspector.enter(Label::of(call, seq));
        Ok(seq)
    }

    fn check_call(
        &self,
        call: &Call,
        refused: Option<&CoreError>,
        joined: bool,
    ) -> Result<(u64, Agreement)> {
        let seq = self.number(call)?;
        if !self.check {
            return Ok((seq, Agreement::Same));
        }
        let digest = call.digest(refused.is_some(), &self.words());
        let describe = || self.description(call, seq, refused, joined);
        let agreement = consistency::agree(&self.transport, seq, digest, describe)
            .inspect_err(|_| self.out_of_step())?;
        Ok((seq, agreement))
    }

    fn description(
        &self,
        call: &Call,
        seq: u64,
        refused: Option<&CoreError>,
        joined: bool,
    ) -> Description {
        // Encoded only here: the role travels only when the ranks' calls differ.
        let role = match call.replay {
            _ if joined => Role::Joined,
            Some(replay) if refused.is_none() => Role::Replay(replay.encode()),
            _ => Role::Plain,
        };
        let reason = refused.map(|e| e.to_string());
        let mut text = call.describe(seq, reason.as_deref());
        if refused.is_none() {
            text += &self.settings.describe();
            if !self.explore {
                text += ", with auto's refinement off (RINGLET_EXPLORE=0)";
            }
        }
        Description {
            thread: call.thread,
            text,
            role,
        }
    }

    /// [`begin`](Self::begin) for a call whose schedule meets the other ranks in shared memory
    /// before it writes anything ([`crate::schedules::Algorithm::checks_at_first_meeting`]):
    /// the check rides on that meeting instead of one of its own. Returns the call's number;
    /// if the schedule then fails with `Unsettled`, [`settle`](Self::settle) says why.
    pub fn begin_at_first_meeting(&self, call: &Call) -> Result<u64> {
        let Some(shared) = self.transport.shared().filter(|_| self.check) else {
            return self.begin(call, None);
        };
        let seq = self.number(call)?;
        let digest = call.digest(false, &self.words());
        shared.flags().expect([seq, digest]);
        Ok(seq)
    }

    /// After a schedule's first meeting found that the calls differ: `Err(Mismatch)` as
    /// [`begin`](Self::begin) would have raised, or, when the difference is only ranks that
    /// have joined and this call can be replayed, `Ok`: run it again (nothing was written).
    pub fn settle(&self, call: &Call, seq: u64) -> Result<()> {
        let describe = || self.description(call, seq, None, false);
        consistency::settle(&self.transport, describe)
            .map(|_| ())
            .inspect_err(|_| self.out_of_step())
    }

    /// What every call's digest covers besides the call: the settings, and whether `auto`
    /// refines.
    fn words(&self) -> [u64; 5] {
        let [segment, limit, across, node_major] = self.settings.words();
        [segment, limit, across, node_major, self.explore as u64]
    }

    /// A call's check failed (on every rank, so in step): `auto`'s refinement starts over, in
    /// case the ranks had come to count its calls differently.
    fn out_of_step(&self) {
        self.refiner().reset();
    }

    /// [`begin`](Self::begin) for a call that this rank refused with `error`: returns `error`
    /// once the ranks have agreed (or not) on it.
    pub fn refuse<R>(&self, call: &Call, error: CoreError) -> Result<R> {
        let _ = self.begin(call, Some(&error));
        Err(error)
    }
}
