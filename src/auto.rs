//! The decision table behind `algorithm="auto"` for allreduce, and its refinement online.
//!
//! The Python selector works out, from its cost model and calibration, which algorithm wins
//! in each size range for each dtype and op, and installs the result here, so that a call
//! decides with a binary search instead of a trip through Python. An empty table means "ask
//! Python". Each range may name an alternative: a candidate the model predicts close to the
//! winner, which [`Refiner`] tries now and then on real calls.
//!
//! The other collectives choose in the core from the same cost model: [`Model`] holds its
//! parameters (the selector installs its calibration; built-in defaults before that), and
//! [`cheapest`] prices each registered algorithm with them.

use crate::dtype::{DType, ReduceOp};
use crate::error::{CoreError, Result};
use crate::schedules::{self, Algorithm, Allreduce, Support, Tiered, Tuning, ALLREDUCE};
use crate::transport::Transport;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::RwLock;

/// One size range: (largest message in bytes, algorithm, alternative).
type Range = (u64, &'static dyn Allreduce, Option<&'static dyn Allreduce>);

/// Per (dtype, op): its ranges, sorted by size; the last covers every larger message.
type Table = Vec<((DType, ReduceOp), Vec<Range>)>;

static TABLE: RwLock<Table> = RwLock::new(Vec::new());
/// Bumped by every install and clear: a refiner forgets what it learned of an older table.
static GENERATION: AtomicU64 = AtomicU64::new(0);

fn checked(dtype: &str, op: &str, algorithm: &str) -> Result<&'static dyn Allreduce> {
    let key = (DType::from_name(dtype)?, ReduceOp::from_name(op)?);
    let schedule = schedules::find(ALLREDUCE, algorithm)?;
    match schedule.support(key.0, key.1) {
        Support::Full => Ok(schedule),
        Support::No(reason) | Support::OwnArithmetic(reason) => Err(CoreError::InvalidArgument(
            format!("the auto table cannot send {dtype} {op} to {algorithm:?}: {reason}"),
        )),
    }
}

/// Replace the table. `entries` are (dtype, op, largest bytes, algorithm, alternative or "").
/// Both must reduce their dtype and op with ringlet's own arithmetic, so `auto` never changes
/// an answer.
pub fn install(entries: &[(String, String, u64, String, String)]) -> Result<()> {
    let mut table: Table = Vec::new();
    for (dtype, op, upper, algorithm, alternative) in entries {
        let key = (DType::from_name(dtype)?, ReduceOp::from_name(op)?);
        let schedule = checked(dtype, op, algorithm)?;
        let alternative = match alternative.as_str() {
            "" => None,
            name if name == algorithm => None,
            name => Some(checked(dtype, op, name)?),
        };
        let range = (*upper, schedule, alternative);
        match table.iter_mut().find(|(k, _)| *k == key) {
            Some((_, ranges)) => ranges.push(range),
            None => table.push((key, vec![range])),
        }
    }
    for (_, ranges) in table.iter_mut() {
        ranges.sort_by_key(|(upper, _, _)| *upper);
    }
    *TABLE.write().unwrap_or_else(|e| e.into_inner()) = table;
    GENERATION.fetch_add(1, Ordering::Relaxed);
    Ok(())
}

pub fn clear() {
    TABLE.write().unwrap_or_else(|e| e.into_inner()).clear();
    GENERATION.fetch_add(1, Ordering::Relaxed);
}

/// The range for `nbytes` of `dtype` under `op`: (its index, the range), if a table is
/// installed for them.
fn range(dtype: DType, op: ReduceOp, nbytes: usize) -> Option<(usize, Range)> {
    let table = TABLE.read().unwrap_or_else(|e| e.into_inner());
    let (_, ranges) = table.iter().find(|(k, _)| *k == (dtype, op))?;
    let index = ranges
        .partition_point(|(upper, _, _)| *upper < nbytes as u64)
        .min(ranges.len().checked_sub(1)?);
    ranges.get(index).map(|r| (index, *r))
}

/// The table's algorithm for `nbytes` of `dtype` under `op`, or `None` if no table is
/// installed for them.
pub fn choose(dtype: DType, op: ReduceOp, nbytes: usize) -> Option<&'static dyn Allreduce> {
    range(dtype, op, nbytes).map(|(_, (_, schedule, _))| schedule)
}

/// What a call runs under `auto`, as a [`Refiner`] decided it.
#[derive(Clone, Copy)]
pub struct Pick {
    pub schedule: &'static dyn Allreduce,
    /// This call tries the range's alternative.
    pub exploring: bool,
    /// What the call runs when it does not try.
    winner: &'static dyn Allreduce,
    key: (DType, ReduceOp, usize),
}

impl Pick {
    /// The same call without the try (where the alternative cannot run); the next try comes
    /// when it would have.
    pub fn without_try(self) -> Pick {
        Pick {
            schedule: self.winner,
            exploring: false,
            ..self
        }
    }
}

/// Calls in a range before it first tries its alternative; the gap then doubles up to
/// `MAX_EXPLORE_GAP`, so trying costs at most one call in that many.
const FIRST_EXPLORE: u64 = 8;
const MAX_EXPLORE_GAP: u64 = 1024;
/// The alternative takes over when its time is below this fraction of the winner's.
const SWITCH_BELOW: f64 = 0.9;
/// Recent times of the winner kept per range, to compare a try with.
const RECENT: usize = 4;

#[derive(Default)]
struct RangeState {
    calls: u64,
    next_try: u64,
    /// The alternative won a comparison (an odd number of times): the two trade places.
    swapped: bool,
    /// The winner's recent (bytes, seconds on this rank).
    recent: VecDeque<(usize, f64)>,
    tries: u64,
    switches: u64,
}

/// One communicator's online refinement of the table: it runs the table's winner, now and then
/// tries the range's alternative instead, and swaps the two when the alternative was faster on
/// every rank. Every decision depends only on the sequence of calls, which every rank shares
/// (the consistency check compares the algorithm each rank runs), and on timings agreed with
/// an allreduce of their maxima, so every rank decides alike.
#[derive(Default)]
pub struct Refiner {
    generation: u64,
    ranges: HashMap<(DType, ReduceOp, usize), RangeState>,
    /// `RINGLET_EXPLORE=0`: always the table's winner.
    off: bool,
}

/// A try's outcome to agree on: the winner's best recent time and the try's, on this rank.
pub type Timings = [f64; 2];

impl Refiner {
    pub fn new(enabled: bool) -> Self {
        Refiner {
            off: !enabled,
            ..Refiner::default()
        }
    }

    /// Forget everything (the ranks' call sequences may have diverged, as after a join).
    pub fn reset(&mut self) {
        self.ranges.clear();
    }

    fn state(&mut self, key: (DType, ReduceOp, usize)) -> &mut RangeState {
        let generation = GENERATION.load(Ordering::Relaxed);
        if generation != self.generation {
            self.generation = generation;
            self.ranges.clear();
        }
        self.ranges.entry(key).or_insert_with(|| RangeState {
            next_try: FIRST_EXPLORE,
            ..RangeState::default()
        })
    }

    /// What the next `auto` call on `nbytes` of `dtype` under `op` runs, without counting it
    /// (see [`commit`](Self::commit)); `None` if no table is installed for them.
    pub fn pick(&mut self, dtype: DType, op: ReduceOp, nbytes: usize) -> Option<Pick> {
        let (index, (_, winner, alternative)) = range(dtype, op, nbytes)?;
        let key = (dtype, op, index);
        let off = self.off;
        let state = self.state(key);
        let (first, second) = match (alternative, state.swapped) {
            (Some(alternative), true) => (alternative, Some(winner)),
            _ => (winner, alternative),
        };
        let exploring = !off && second.is_some() && state.calls + 1 == state.next_try;
        Some(Pick {
            schedule: if exploring {
                second.unwrap_or(first)
            } else {
                first
            },
            exploring,
            winner: first,
            key,
        })
    }

    /// Count `pick`'s call, once it has run (a call that failed its check counts on no rank, so
    /// the ranks stay in step).
    pub fn commit(&mut self, pick: &Pick) {
        let state = self.state(pick.key);
        state.calls += 1;
        if state.calls >= state.next_try {
            // A try, or the call that would have been one (its alternative could not run).
            state.tries += u64::from(pick.exploring);
            state.next_try = state.calls + state.calls.min(MAX_EXPLORE_GAP);
        }
    }

    /// Record a committed call's time. For a try with a recent winner's time at the same size,
    /// the two timings to agree on (every rank gets `Some` at the same call).
    pub fn observe(&mut self, pick: &Pick, nbytes: usize, seconds: f64) -> Option<Timings> {
        let state = self.state(pick.key);
        if !pick.exploring {
            if state.recent.len() == RECENT {
                state.recent.pop_front();
            }
            state.recent.push_back((nbytes, seconds));
            return None;
        }
        let winner = state
            .recent
            .iter()
            .filter(|(bytes, _)| *bytes == nbytes)
            .map(|(_, s)| *s)
            .min_by(f64::total_cmp)?;
        Some([winner, seconds])
    }

    /// Decide with the timings' maxima over the ranks (the same on every rank).
    pub fn decide(&mut self, pick: &Pick, slowest: Timings) {
        let state = self.state(pick.key);
        let [winner, tried] = slowest;
        if tried < SWITCH_BELOW * winner {
            state.swapped = !state.swapped;
            state.switches += 1;
            state.recent.clear(); // the new winner's times come next
        }
    }

    /// Per range tried or switched: (dtype, op, range index, winner now, calls, tries,
    /// switches).
    pub fn report(&self) -> Vec<(DType, ReduceOp, usize, &'static str, u64, u64, u64)> {
        if self.generation != GENERATION.load(Ordering::Relaxed) {
            return Vec::new(); // learned of an older table
        }
        let mut rows: Vec<_> = self
            .ranges
            .iter()
            .filter_map(|(&(dtype, op, index), state)| {
                let (_, (_, winner, alternative)) = range_at(dtype, op, index)?;
                let now = match (alternative, state.swapped) {
                    (Some(alternative), true) => alternative,
                    _ => winner,
                };
                Some((
                    dtype,
                    op,
                    index,
                    now.name(),
                    state.calls,
                    state.tries,
                    state.switches,
                ))
            })
            .collect();
        rows.sort_by_key(|r| (r.0.name(), r.1.name(), r.2));
        rows
    }
}

fn range_at(dtype: DType, op: ReduceOp, index: usize) -> Option<(usize, Range)> {
    let table = TABLE.read().unwrap_or_else(|e| e.into_inner());
    let (_, ranges) = table.iter().find(|(k, _)| *k == (dtype, op))?;
    ranges.get(index).map(|r| (index, *r))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// The table is global: its tests take turns.
    static SERIAL: Mutex<()> = Mutex::new(());

    fn entry(
        dtype: &str,
        op: &str,
        upper: u64,
        name: &str,
    ) -> (String, String, u64, String, String) {
        (dtype.into(), op.into(), upper, name.into(), String::new())
    }

    #[test]
    fn ranges_pick_the_first_upper_bound_at_or_above_the_size() {
        let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        install(&[
            entry("float32", "sum", 1024, "recursive_doubling"),
            entry("float32", "sum", 1 << 20, "halving_doubling"),
            entry("float32", "sum", u64::MAX, "pipelined_ring"),
        ])
        .expect("valid table");
        let name = |bytes| choose(DType::F32, ReduceOp::Sum, bytes).map(|s| s.name());
        assert_eq!(name(0), Some("recursive_doubling"));
        assert_eq!(name(1024), Some("recursive_doubling"));
        assert_eq!(name(1025), Some("halving_doubling"));
        assert_eq!(name(1 << 30), Some("pipelined_ring"));
        assert!(
            choose(DType::F64, ReduceOp::Sum, 8).is_none(),
            "no float64 table"
        );
        assert!(
            choose(DType::F32, ReduceOp::Max, 8).is_none(),
            "no max table"
        );
        install(&[entry("float32", "min", 8, "ring")]).expect("valid");
        assert_eq!(
            choose(DType::F32, ReduceOp::Min, 1).map(|s| s.name()),
            Some("ring")
        );
        assert!(install(&[entry("float32", "mean", 8, "ring")]).is_err());
        assert!(
            install(&[entry("float16", "sum", 8, "mpi")]).is_err(),
            "MPI has no float16"
        );
        assert!(
            install(&[entry("float32", "max", 8, "mpi")]).is_err(),
            "NaN semantics differ"
        );
        assert!(install(&[entry("int32", "max", 8, "mpi")]).is_ok());
        assert!(install(&[entry("float32", "sum", 8, "tree")]).is_err());
        clear();
        assert!(choose(DType::F32, ReduceOp::Min, 8).is_none());
    }

    fn install_with_alternative() {
        install(&[(
            "float32".into(),
            "sum".into(),
            u64::MAX,
            "ring".into(),
            "halving_doubling".into(),
        )])
        .expect("valid table");
    }

    /// Play `calls` committed calls of `nbytes`, the winner taking `winner_seconds` and a try
    /// `tried_seconds` (as every rank's maximum); the tries' call numbers.
    fn play(
        refiner: &mut Refiner,
        calls: u64,
        winner_seconds: f64,
        tried_seconds: f64,
    ) -> Vec<u64> {
        let mut tries = Vec::new();
        for call in 1..=calls {
            let pick = refiner
                .pick(DType::F32, ReduceOp::Sum, 4096)
                .expect("a table");
            refiner.commit(&pick);
            let seconds = if pick.exploring {
                tries.push(call);
                tried_seconds
            } else {
                winner_seconds
            };
            if let Some(timings) = refiner.observe(&pick, 4096, seconds) {
                refiner.decide(&pick, timings);
            }
        }
        tries
    }

    #[test]
    fn the_alternative_is_tried_ever_less_often_and_kept_out_while_slower() {
        let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        install_with_alternative();
        let mut refiner = Refiner::new(true);
        let tries = play(&mut refiner, 200, 1.0, 2.0);
        assert_eq!(tries, vec![8, 16, 32, 64, 128]);
        let pick = refiner
            .pick(DType::F32, ReduceOp::Sum, 4096)
            .expect("a table");
        assert_eq!(pick.schedule.name(), "ring");
        let report = refiner.report();
        assert_eq!(report.len(), 1);
        assert_eq!(report[0].3, "ring");
        assert_eq!((report[0].4, report[0].5, report[0].6), (200, 5, 0));
    }

    #[test]
    fn a_faster_alternative_takes_over_and_the_old_winner_is_tried_in_turn() {
        let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        install_with_alternative();
        let mut refiner = Refiner::new(true);
        let tries = play(&mut refiner, 10, 1.0, 0.5);
        assert_eq!(tries, vec![8]);
        let pick = refiner
            .pick(DType::F32, ReduceOp::Sum, 4096)
            .expect("a table");
        assert_eq!(pick.schedule.name(), "halving_doubling");
        // Now the ring is the one tried (call 16), and it is slower: it stays out.
        let tries = play(&mut refiner, 10, 0.5, 1.0);
        assert_eq!(tries, vec![6]); // the 16th call in the range
        assert_eq!(refiner.report()[0].3, "halving_doubling");
        // Within 10% is no reason to switch.
        let mut close = Refiner::new(true);
        play(&mut close, 8, 1.0, 0.95);
        assert_eq!(close.report()[0].3, "ring");
    }

    #[test]
    fn nothing_is_tried_when_turned_off_or_uncounted_and_a_new_table_starts_over() {
        let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        install_with_alternative();
        let mut off = Refiner::new(false);
        assert!(play(&mut off, 100, 1.0, 0.1).is_empty());
        // Picks that are never committed (their call failed its check) do not count.
        let mut refiner = Refiner::new(true);
        for _ in 0..20 {
            let pick = refiner
                .pick(DType::F32, ReduceOp::Sum, 4096)
                .expect("a table");
            assert!(!pick.exploring);
        }
        assert_eq!(play(&mut refiner, 8, 1.0, 0.5), vec![8]);
        assert_eq!(refiner.report()[0].3, "halving_doubling");
        install_with_alternative();
        assert!(
            refiner.report().is_empty(),
            "what it learned was of the old table"
        );
        let pick = refiner
            .pick(DType::F32, ReduceOp::Sum, 4096)
            .expect("a table");
        assert_eq!(
            pick.schedule.name(),
            "ring",
            "a new table: learned nothing yet"
        );
        refiner.reset();
        assert!(refiner.report().is_empty());
    }

    #[test]
    fn a_try_that_cannot_run_here_is_a_call_of_the_winner() {
        let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        install_with_alternative();
        let mut refiner = Refiner::new(true);
        assert!(play(&mut refiner, 7, 1.0, 0.5).is_empty());
        let pick = refiner
            .pick(DType::F32, ReduceOp::Sum, 4096)
            .expect("a table");
        assert!(pick.exploring && pick.schedule.name() == "halving_doubling");
        let plain = pick.without_try();
        assert!(!plain.exploring && plain.schedule.name() == "ring");
        refiner.commit(&plain);
        let next = refiner
            .pick(DType::F32, ReduceOp::Sum, 4096)
            .expect("a table");
        assert!(!next.exploring && next.schedule.name() == "ring");
        assert_eq!(refiner.report()[0].5, 0, "no try counted");
    }
}

/// The cost model's parameters, in seconds: alpha per message and beta per byte inside a node,
/// the same across nodes, and gamma per byte combined (per dtype, with a default).
#[derive(Clone, Debug, PartialEq)]
pub struct Model {
    pub alpha: f64,
    pub beta: f64,
    pub alpha_across: f64,
    pub beta_across: f64,
    pub gamma: f64,
    pub gamma_of: Vec<(DType, f64)>,
}

impl Model {
    /// The selector's built-in defaults (`selector.DEFAULT_*`), for calls before it calibrates.
    pub const DEFAULT: Model = Model {
        alpha: 1.5e-6,
        beta: 1.0 / 6e9,
        alpha_across: 30e-6,
        beta_across: 8.0 / 10e9,
        gamma: 1.0 / 30e9,
        gamma_of: Vec::new(),
    };

    /// The predicted seconds of `cost`, combining `dtype` (if anything is combined).
    pub fn seconds(&self, cost: &Tiered, dtype: Option<DType>) -> f64 {
        let gamma = dtype
            .and_then(|d| self.gamma_of.iter().find(|(g, _)| *g == d).map(|(_, v)| *v))
            .unwrap_or(self.gamma);
        self.alpha * cost.within.messages
            + self.beta * cost.within.bytes
            + gamma * (cost.within.reduced + cost.across.reduced)
            + self.alpha_across * cost.across.messages
            + self.beta_across * cost.across.bytes
    }
}

static MODEL: RwLock<Option<Model>> = RwLock::new(None);

/// Install the model's parameters (every rank the same ones: the selector's calibration, which
/// rank 0 measured and broadcast). Each must be a positive, finite number.
pub fn set_model(model: Model) -> Result<()> {
    let numbers = [
        model.alpha,
        model.beta,
        model.alpha_across,
        model.beta_across,
        model.gamma,
    ];
    let gammas = model.gamma_of.iter().map(|(_, g)| *g);
    if !numbers
        .into_iter()
        .chain(gammas)
        .all(|v| v.is_finite() && v > 0.0)
    {
        return Err(CoreError::InvalidArgument(format!(
            "the cost model's parameters must be positive, finite numbers, got {model:?}"
        )));
    }
    *MODEL.write().unwrap_or_else(|e| e.into_inner()) = Some(model);
    Ok(())
}

/// The installed model, or [`Model::DEFAULT`].
pub fn model() -> Model {
    MODEL
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .clone()
        .unwrap_or(Model::DEFAULT)
}

/// The registered algorithm the model prices lowest for `bytes` on `transport`'s ranks, among
/// those that can run there and, when it reduces (`reducing`), combine with ringlet's own
/// arithmetic; ties go to the first registered. Every rank holds the same model, nodes and
/// settings, so every rank picks alike.
pub fn cheapest<T: Algorithm + ?Sized>(
    registry: &[&'static T],
    transport: &dyn Transport,
    tuning: &Tuning,
    bytes: usize,
    reducing: Option<(DType, ReduceOp)>,
) -> Option<&'static T> {
    let model = model();
    let nodes = transport.nodes();
    let mut best: Option<(f64, &'static T)> = None;
    for &algorithm in registry {
        let exact = reducing.is_none_or(|(d, o)| algorithm.support(d, o) == Support::Full);
        if !exact || algorithm.unavailable(transport).is_some() {
            continue;
        }
        let seconds = model.seconds(
            &algorithm.cost_on(nodes, bytes, tuning),
            reducing.map(|r| r.0),
        );
        if best.is_none_or(|(b, _)| seconds < b) {
            best = Some((seconds, algorithm));
        }
    }
    best.map(|(_, algorithm)| algorithm)
}
