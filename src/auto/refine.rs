//! `auto`'s online refinement: each communicator plays its decision table, tries a range's
//! runner-up now and then on real calls, and swaps the two when the runner-up was faster on
//! every rank.

use super::choice::Pricing;
use super::model;
use super::table::{Range, Source, Table};
use crate::dtype::{DType, ReduceOp};
use crate::error::{CoreError, Result};
use crate::schedules::{Allreduce, Tuning};
use crate::transport::Transport;
use rustc_hash::FxHashMap;
use std::collections::VecDeque;

/// What a call runs under `auto`, as a [`Refiner`] decided it.
#[derive(Clone, Copy)]
pub struct Pick {
    pub schedule: &'static dyn Allreduce,
    /// This call tries the range's runner-up.
    pub exploring: bool,
    key: (DType, ReduceOp, usize),
}

/// Calls in a range before it first tries its runner-up; the gap then doubles up to
/// `MAX_EXPLORE_GAP`, so trying costs at most one call in that many.
const FIRST_EXPLORE: u64 = 8;
const MAX_EXPLORE_GAP: u64 = 1024;
/// The runner-up takes over when its time is below this fraction of the winner's.
const SWITCH_BELOW: f64 = 0.9;
/// Recent times of the winner kept per range, to compare a try with.
const RECENT: usize = 4;

#[derive(Default)]
struct RangeState {
    calls: u64,
    next_try: u64,
    /// The runner-up won a comparison (an odd number of times): the two trade places.
    swapped: bool,
    /// The winner's recent (bytes, seconds on this rank).
    recent: VecDeque<(usize, f64)>,
    tries: u64,
    switches: u64,
}

/// The table a refiner plays, and what it was built from.
struct Built {
    table: Table,
    generation: u64,
    tuning: Tuning,
}

/// One communicator's online refinement of its decision table: it runs the table's winner, now
/// and then tries the range's runner-up instead, and swaps the two when the runner-up was
/// faster on every rank. Every decision depends only on the sequence of calls, which every rank
/// shares (the consistency check compares the algorithm each rank runs), and on timings agreed
/// with an allreduce of their maxima, so every rank decides alike.
#[derive(Default)]
pub struct Refiner {
    built: Option<Built>,
    /// Looked up a few times per call: a fast hash, not SipHash (keys are ours, not hostile).
    ranges: FxHashMap<(DType, ReduceOp, usize), RangeState>,
    /// `RINGLET_EXPLORE=0`: always the table's winner.
    off: bool,
}

/// A try's outcome to agree on: the winner's best recent time and the try's, on this rank.
pub type Timings = [f64; 2];

/// Per range played: (dtype, op, range index, its largest message, algorithm now, calls,
/// tries, switches).
pub type Refinement = (DType, ReduceOp, usize, u64, &'static str, u64, u64, u64);

/// The table's source: the environment's override if it sets one, else the installed model.
fn source<'a>(
    spec: &'a Option<String>,
    parameters: &'a model::Parameters,
    tuning: &'a Tuning,
) -> Source<'a> {
    match spec {
        Some(spec) => Source::Spec(spec),
        None => Source::Model(Pricing {
            parameters,
            tuning,
            corrected: true,
        }),
    }
}

/// `RINGLET_ALGORITHM=name` (other than "auto") or `RINGLET_AUTO_TABLE`, read when a table is
/// built.
pub fn environment_spec() -> Option<String> {
    let set = |name| {
        std::env::var(name)
            .ok()
            .filter(|v: &String| !v.trim().is_empty())
    };
    match set("RINGLET_ALGORITHM") {
        Some(name) if name.trim() != "auto" => Some(name),
        _ => set("RINGLET_AUTO_TABLE"),
    }
}

impl Refiner {
    pub fn new(enabled: bool) -> Self {
        Refiner {
            off: !enabled,
            ..Refiner::default()
        }
    }

    /// Forget everything learned (the ranks' call sequences may have diverged, as after a join).
    pub fn reset(&mut self) {
        self.ranges.clear();
    }

    /// The table for `transport` with `tuning`, built now from the installed parameters if
    /// they or the settings changed since.
    fn table(&mut self, transport: &dyn Transport, tuning: &Tuning) -> Result<&Table> {
        let generation = model::generation();
        let current = self
            .built
            .as_ref()
            .is_some_and(|b| b.generation == generation && b.tuning == *tuning);
        if !current {
            let parameters = model::installed().ok_or_else(no_parameters)?;
            let spec = environment_spec();
            let table = Table::build(transport, source(&spec, &parameters, tuning))?;
            self.ranges.clear();
            self.built = Some(Built {
                table,
                generation,
                tuning: *tuning,
            });
        }
        self.built
            .as_ref()
            .map(|b| &b.table)
            .ok_or_else(no_parameters)
    }

    fn state(&mut self, key: (DType, ReduceOp, usize)) -> &mut RangeState {
        self.ranges.entry(key).or_insert_with(|| RangeState {
            next_try: FIRST_EXPLORE,
            ..RangeState::default()
        })
    }

    /// The range's (winner, runner-up) as they stand after what was learned.
    fn standing(
        &self,
        key: (DType, ReduceOp, usize),
        range: &Range,
    ) -> (&'static dyn Allreduce, Option<&'static dyn Allreduce>) {
        standing(range, self.ranges.get(&key).is_some_and(|s| s.swapped))
    }

    /// The range of the table that `nbytes` of `dtype` under `op` falls in, and its key.
    fn range(
        &mut self,
        dtype: DType,
        op: ReduceOp,
        nbytes: usize,
        transport: &dyn Transport,
        tuning: &Tuning,
    ) -> Result<((DType, ReduceOp, usize), Range)> {
        let (index, range) = self
            .table(transport, tuning)?
            .range(dtype, op, nbytes)
            .ok_or_else(|| no_range(dtype, op))?;
        Ok(((dtype, op, index), range))
    }

    /// What the next `auto` call on `nbytes` of `dtype` under `op` runs on `transport`, without
    /// counting it (see [`commit`](Self::commit)). Collective only in that every rank must ask
    /// alike; `Err` before any parameters are installed.
    pub fn pick(
        &mut self,
        dtype: DType,
        op: ReduceOp,
        nbytes: usize,
        transport: &dyn Transport,
        tuning: &Tuning,
    ) -> Result<Pick> {
        let (key, range) = self.range(dtype, op, nbytes, transport, tuning)?;
        let off = self.off;
        let state = self.state(key);
        let (first, second) = standing(&range, state.swapped);
        let exploring = !off && second.is_some() && state.calls + 1 == state.next_try;
        Ok(Pick {
            schedule: match second {
                Some(second) if exploring => second,
                _ => first,
            },
            exploring,
            key,
        })
    }

    /// The algorithm `auto` runs now for `nbytes` of `dtype` under `op` when it does not try
    /// (nothing is counted).
    pub fn winner(
        &mut self,
        dtype: DType,
        op: ReduceOp,
        nbytes: usize,
        transport: &dyn Transport,
        tuning: &Tuning,
    ) -> Result<&'static dyn Allreduce> {
        let (key, range) = self.range(dtype, op, nbytes, transport, tuning)?;
        Ok(self.standing(key, &range).0)
    }

    /// Whether the table was set by the environment (so no runner-up is ever tried).
    pub fn overridden(&self) -> bool {
        self.built.as_ref().is_some_and(|b| b.table.overridden)
    }

    /// Count `pick`'s call, once it has run (a call that failed its check counts on no rank, so
    /// the ranks stay in step).
    pub fn commit(&mut self, pick: &Pick) {
        let state = self.state(pick.key);
        state.calls += 1;
        if state.calls >= state.next_try {
            // A try (or the call that would have been one, where the range has no runner-up).
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

    /// Per range played since the table was built.
    pub fn report(&self) -> Vec<Refinement> {
        let Some(built) = self
            .built
            .as_ref()
            .filter(|b| b.generation == model::generation())
        else {
            return Vec::new(); // learned of older parameters
        };
        let mut rows: Vec<_> = self
            .ranges
            .iter()
            .filter_map(|(&(dtype, op, index), state)| {
                let range = built.table.range_at(dtype, op, index)?;
                let now = self.standing((dtype, op, index), &range).0;
                Some((
                    dtype,
                    op,
                    index,
                    range.upper,
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

/// A range's (winner, runner-up), `swapped` or not.
fn standing(
    range: &Range,
    swapped: bool,
) -> (&'static dyn Allreduce, Option<&'static dyn Allreduce>) {
    match (range.runner_up, swapped) {
        (Some(runner_up), true) => (runner_up, Some(range.winner)),
        (runner_up, _) => (range.winner, runner_up),
    }
}

fn no_parameters() -> CoreError {
    CoreError::InvalidArgument(
        "\"auto\" has no cost model installed: the first auto allreduce on ringlet's whole \
         communicator installs it, on every rank (ringlet.selector.prepare() does too); a \
         process set's auto cannot, as that is collective over every rank"
            .into(),
    )
}

fn no_range(dtype: DType, op: ReduceOp) -> CoreError {
    CoreError::InvalidArgument(format!(
        "internal: the auto table has no range for {} {}",
        dtype.name(),
        op.name()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedules::{by_name, ALLREDUCE};
    use crate::transport::local::LocalTransport;

    /// A refiner playing one range for float32 sums: the ring, with halving-doubling as the
    /// runner-up.
    fn refiner_with_runner_up(enabled: bool) -> Refiner {
        let named = |name| by_name(ALLREDUCE, name).expect("registered");
        let range = Range {
            upper: u64::MAX,
            winner: named("ring"),
            runner_up: Some(named("halving_doubling")),
        };
        Refiner {
            built: Some(Built {
                table: Table::of(vec![((DType::F32, ReduceOp::Sum), vec![range])]),
                generation: model::generation(),
                tuning: Tuning::default(),
            }),
            ..Refiner::new(enabled)
        }
    }

    fn next(refiner: &mut Refiner) -> Pick {
        let transport = &LocalTransport::group(2)[0];
        refiner
            .pick(
                DType::F32,
                ReduceOp::Sum,
                4096,
                transport,
                &Tuning::default(),
            )
            .expect("a table")
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
            let pick = next(refiner);
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
    fn the_runner_up_is_tried_ever_less_often_and_kept_out_while_slower() {
        let mut refiner = refiner_with_runner_up(true);
        let tries = play(&mut refiner, 200, 1.0, 2.0);
        assert_eq!(tries, vec![8, 16, 32, 64, 128]);
        assert_eq!(next(&mut refiner).schedule.name(), "ring");
        let report = refiner.report();
        assert_eq!(report.len(), 1);
        assert_eq!((report[0].3, report[0].4), (u64::MAX, "ring"));
        assert_eq!((report[0].5, report[0].6, report[0].7), (200, 5, 0));
    }

    #[test]
    fn a_faster_runner_up_takes_over_and_the_old_winner_is_tried_in_turn() {
        let mut refiner = refiner_with_runner_up(true);
        let tries = play(&mut refiner, 10, 1.0, 0.5);
        assert_eq!(tries, vec![8]);
        assert_eq!(next(&mut refiner).schedule.name(), "halving_doubling");
        // Now the ring is the one tried (call 16), and it is slower: it stays out.
        let tries = play(&mut refiner, 10, 0.5, 1.0);
        assert_eq!(tries, vec![6]); // the 16th call in the range
        assert_eq!(refiner.report()[0].4, "halving_doubling");
        // Within 10% is no reason to switch.
        let mut close = refiner_with_runner_up(true);
        play(&mut close, 8, 1.0, 0.95);
        assert_eq!(close.report()[0].4, "ring");
    }

    #[test]
    fn nothing_is_tried_when_turned_off_or_uncounted_and_new_parameters_start_over() {
        let mut off = refiner_with_runner_up(false);
        assert!(play(&mut off, 100, 1.0, 0.1).is_empty());
        // Picks that are never committed (their call failed its check) do not count.
        let mut refiner = refiner_with_runner_up(true);
        for _ in 0..20 {
            assert!(!next(&mut refiner).exploring);
        }
        assert_eq!(play(&mut refiner, 8, 1.0, 0.5), vec![8]);
        assert_eq!(refiner.report()[0].4, "halving_doubling");
        if let Some(built) = refiner.built.as_mut() {
            built.generation = built.generation.wrapping_sub(1); // as after an install
        }
        assert!(
            refiner.report().is_empty(),
            "what it learned was of older parameters"
        );
        refiner.reset();
        assert!(refiner.ranges.is_empty());
    }
}
