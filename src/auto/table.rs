//! The decision table behind allreduce's `auto`: per dtype and op, size ranges and the
//! algorithm that wins each, worked out once per communicator from the model, so that a call
//! decides with a binary search. Each range may name a runner-up, a candidate the model
//! predicts close to the winner, which the refiner tries now and then on real calls.

use super::choice::{candidates, cheapest, priced, Pricing, FALLBACK};
use crate::dtype::{DType, ReduceOp};
use crate::error::{CoreError, Result};
use crate::schedules::{self, Allreduce, ALLREDUCE};
use crate::transport::Transport;

/// A range's runner-up is tried on real calls when the model predicts it within this factor
/// of the winner.
pub const RUNNER_UP_WITHIN: f64 = 1.5;
/// The runner-up is judged at a range's middle in log-size, with an open-ended last range
/// taken to end here.
const RUNNER_UP_SIZE_CAP: u64 = 256 << 20;
/// The model is asked at sizes 2^(k/2) bytes up to 2^(GRID_HALF_STEPS/2); a switch between two
/// winners happens halfway (in log) between the sizes where each wins.
const GRID_HALF_STEPS: u32 = 80;

/// One size range: every message up to `upper` bytes.
#[derive(Clone, Copy)]
pub struct Range {
    pub upper: u64,
    pub winner: &'static dyn Allreduce,
    pub runner_up: Option<&'static dyn Allreduce>,
}

/// Per (dtype, op): its ranges, sorted by size; the last covers every larger message.
pub struct Table {
    ranges: Vec<((DType, ReduceOp), Vec<Range>)>,
    /// Set by the environment (`RINGLET_ALGORITHM`, `RINGLET_AUTO_TABLE`): runner-ups only
    /// where it names them.
    pub overridden: bool,
}

/// Where the table comes from: the model, or the environment.
pub enum Source<'a> {
    Model(Pricing<'a>),
    /// `RINGLET_ALGORITHM=name` or `RINGLET_AUTO_TABLE="name:32K,name:8M,name"`.
    Spec(&'a str),
}

impl Table {
    /// The table for `transport`'s ranks.
    pub fn build(transport: &dyn Transport, source: Source<'_>) -> Result<Table> {
        if let Source::Spec(spec) = source {
            from_spec(spec, &[])?; // a bad override is an error on any number of ranks
        }
        let mut ranges = Vec::new();
        let mut by_candidates: Vec<(DType, Vec<&'static str>, Vec<Range>)> = Vec::new();
        for dtype in DType::ALL {
            for op in crate::dtype::ReduceOp::ALL {
                let options = candidates(ALLREDUCE, transport, Some((dtype, op)));
                let row = if transport.size() <= 1 {
                    vec![Range::whole(fallback()?)]
                } else {
                    match source {
                        Source::Spec(spec) => from_spec(spec, &options)?,
                        Source::Model(pricing) => {
                            // The model depends on the dtype and on which algorithms may run,
                            // not on the op.
                            let names: Vec<_> = options.iter().map(|a| a.name()).collect();
                            let known = by_candidates
                                .iter()
                                .find(|(d, n, _)| *d == dtype && *n == names);
                            match known {
                                Some((_, _, row)) => row.clone(),
                                None => {
                                    let row = from_model(&options, transport, pricing, dtype);
                                    by_candidates.push((dtype, names, row.clone()));
                                    row
                                }
                            }
                        }
                    }
                };
                ranges.push(((dtype, op), row));
            }
        }
        Ok(Table {
            ranges,
            overridden: matches!(source, Source::Spec(_)),
        })
    }

    /// The range for `nbytes` of `dtype` under `op`, and its index.
    pub fn range(&self, dtype: DType, op: ReduceOp, nbytes: usize) -> Option<(usize, Range)> {
        let (_, ranges) = self.ranges.iter().find(|(k, _)| *k == (dtype, op))?;
        let index = ranges
            .partition_point(|r| r.upper < nbytes as u64)
            .min(ranges.len().checked_sub(1)?);
        ranges.get(index).map(|r| (index, *r))
    }

    #[cfg(test)]
    pub(super) fn of(ranges: Vec<((DType, ReduceOp), Vec<Range>)>) -> Table {
        Table {
            ranges,
            overridden: false,
        }
    }

    pub fn range_at(&self, dtype: DType, op: ReduceOp, index: usize) -> Option<Range> {
        let (_, ranges) = self.ranges.iter().find(|(k, _)| *k == (dtype, op))?;
        ranges.get(index).copied()
    }
}

impl Range {
    fn whole(winner: &'static dyn Allreduce) -> Range {
        Range {
            upper: u64::MAX,
            winner,
            runner_up: None,
        }
    }
}

fn fallback() -> Result<&'static dyn Allreduce> {
    schedules::by_name(ALLREDUCE, FALLBACK)
}

/// The winner at sizes 2^(k/2), merged into ranges, each with its runner-up.
fn from_model(
    options: &[&'static dyn Allreduce],
    transport: &dyn Transport,
    pricing: Pricing<'_>,
    dtype: DType,
) -> Vec<Range> {
    let winner_at = |bytes: u64| {
        cheapest(&priced(
            options,
            transport.nodes(),
            pricing,
            bytes as usize,
            Some(dtype),
        ))
    };
    let mut grid: Vec<u64> = (0..=GRID_HALF_STEPS)
        .map(|k| 2f64.powf(f64::from(k) / 2.0).round().max(1.0) as u64)
        .collect();
    grid.dedup();
    let mut winners: Vec<(u64, &'static dyn Allreduce)> = Vec::new();
    let mut previous_size = grid[0];
    let Some(mut previous) = winner_at(previous_size) else {
        return Vec::new();
    };
    for &bytes in &grid[1..] {
        let Some(winner) = winner_at(bytes) else {
            continue;
        };
        if winner.name() != previous.name() {
            let switch = ((previous_size as f64) * (bytes as f64)).sqrt() as u64;
            winners.push((switch, previous));
            previous = winner;
        }
        previous_size = bytes;
    }
    winners.push((u64::MAX, previous));
    let mut low = 1u64;
    winners
        .into_iter()
        .map(|(upper, winner)| {
            let middle = ((low as f64) * (upper.min(RUNNER_UP_SIZE_CAP) as f64)).sqrt() as usize;
            low = upper.saturating_add(1);
            Range {
                upper,
                winner,
                runner_up: runner_up(options, transport, pricing, dtype, winner, middle),
            }
        })
        .collect()
}

/// The candidate the model ranks second at `bytes`, if it is within [`RUNNER_UP_WITHIN`] of
/// the winner.
fn runner_up(
    options: &[&'static dyn Allreduce],
    transport: &dyn Transport,
    pricing: Pricing<'_>,
    dtype: DType,
    winner: &'static dyn Allreduce,
    bytes: usize,
) -> Option<&'static dyn Allreduce> {
    let prices = priced(options, transport.nodes(), pricing, bytes, Some(dtype));
    let best = prices.iter().find(|(a, _)| a.name() == winner.name())?.1;
    let (second, price) = prices
        .iter()
        .filter(|(a, _)| a.name() != winner.name())
        .min_by(|x, y| x.1.seconds.total_cmp(&y.1.seconds))?;
    (price.seconds <= RUNNER_UP_WITHIN * best.seconds).then_some(*second)
}

/// `"recursive_doubling:32K,halving_doubling:8M,pipelined_ring"` as ranges: each algorithm up
/// to and including its size, the last for everything larger; `ring/halving_doubling` names a
/// runner-up to try on real calls. An algorithm that cannot take this dtype and op here (e.g.
/// "mpi" for 16-bit floats) gives way to the fallback (a runner-up, to none).
fn from_spec(spec: &str, options: &[&'static dyn Allreduce]) -> Result<Vec<Range>> {
    let candidate = |name: &str| -> Result<Option<&'static dyn Allreduce>> {
        let named = schedules::by_name(ALLREDUCE, name.trim()).map_err(|e| {
            CoreError::InvalidArgument(format!("in the environment's auto table ({spec:?}): {e}"))
        })?;
        Ok(options.iter().copied().find(|a| a.name() == named.name()))
    };
    let mut ranges = Vec::new();
    for part in spec.split(',') {
        let (names, limit) = match part.trim().split_once(':') {
            Some((names, limit)) => (names, Some(limit)),
            None => (part.trim(), None),
        };
        let (name, runner_up) = match names.split_once('/') {
            Some((name, runner_up)) => (name, candidate(runner_up)?),
            None => (names, None),
        };
        let winner = match candidate(name)? {
            Some(algorithm) => algorithm,
            None => fallback()?,
        };
        let runner_up = runner_up.filter(|r| r.name() != winner.name());
        let upper = match limit.filter(|l| !l.trim().is_empty()) {
            Some(limit) => parse_bytes(limit).ok_or_else(|| {
                CoreError::InvalidArgument(format!(
                    "{limit:?} in the environment's auto table ({spec:?}) is not a size \
                     (bytes, or with K, M or G)"
                ))
            })?,
            None => u64::MAX,
        };
        ranges.push(Range {
            upper,
            winner,
            runner_up,
        });
    }
    if ranges.last().is_none_or(|r| r.upper != u64::MAX) {
        let winner = match ranges.last() {
            Some(range) => range.winner,
            None => fallback()?,
        };
        ranges.push(Range::whole(winner));
    }
    ranges.sort_by_key(|r| r.upper);
    Ok(ranges)
}

/// "32K", "8M", "1.5G", "64KB", "4096" as bytes.
fn parse_bytes(text: &str) -> Option<u64> {
    let text = text.trim().to_ascii_uppercase();
    let text = text.strip_suffix('B').unwrap_or(&text);
    let (number, scale) = match text.chars().last()? {
        'K' => (&text[..text.len() - 1], 1u64 << 10),
        'M' => (&text[..text.len() - 1], 1 << 20),
        'G' => (&text[..text.len() - 1], 1 << 30),
        _ => (text, 1),
    };
    let value: f64 = number.trim().parse().ok()?;
    (value.is_finite() && value >= 0.0).then_some((value * scale as f64) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::auto::model::Parameters;
    use crate::schedules::{Support, Tuning};
    use crate::transport::local::LocalTransport;

    fn model_table(ranks: usize, parameters: &Parameters) -> Table {
        let transport = &LocalTransport::group(ranks)[0];
        let tuning = Tuning::default();
        let pricing = Pricing {
            parameters,
            tuning: &tuning,
            corrected: true,
        };
        Table::build(transport, Source::Model(pricing)).expect("a table")
    }

    #[test]
    fn the_model_table_covers_every_dtype_and_op_with_exact_candidates() {
        let parameters = Parameters {
            alpha: 1e-7, // a latency at which MPI's own allreduce would win small messages
            ..Parameters::default()
        };
        let table = model_table(4, &parameters);
        let mut tried = false;
        for dtype in DType::ALL {
            for op in ReduceOp::ALL {
                let (_, ranges) = table
                    .ranges
                    .iter()
                    .find(|(k, _)| *k == (dtype, op))
                    .expect("every dtype and op");
                assert_eq!(ranges.last().map(|r| r.upper), Some(u64::MAX));
                assert!(ranges.windows(2).all(|w| w[0].upper < w[1].upper));
                for range in ranges {
                    for algorithm in [Some(range.winner), range.runner_up].into_iter().flatten() {
                        assert_eq!(algorithm.support(dtype, op), Support::Full);
                    }
                    let runner_up = range.runner_up.map(|r| r.name());
                    assert_ne!(runner_up, Some(range.winner.name()));
                    tried |= runner_up.is_some();
                }
            }
        }
        assert!(
            tried,
            "some range has a runner-up within {RUNNER_UP_WITHIN}x"
        );
        // Small messages go to a latency-bound algorithm, large ones to a bandwidth-bound one.
        let name = |bytes| {
            table
                .range(DType::F32, ReduceOp::Sum, bytes)
                .map(|r| r.1.winner.name())
        };
        assert!(
            matches!(name(8), Some("recursive_doubling" | "shm")),
            "{:?}",
            name(8)
        );
        assert_ne!(name(256 << 20), Some("recursive_doubling"));
        // One rank: the fallback, with nothing to try.
        let alone = model_table(1, &parameters);
        let (_, range) = alone
            .range(DType::BF16, ReduceOp::Max, 1 << 20)
            .expect("a range");
        assert_eq!(range.winner.name(), FALLBACK);
        assert!(range.runner_up.is_none());
    }

    #[test]
    fn sizes_parse_with_their_units() {
        assert_eq!(parse_bytes("32K"), Some(32 << 10));
        assert_eq!(parse_bytes("8m"), Some(8 << 20));
        assert_eq!(parse_bytes("1.5G"), Some(3 << 29));
        assert_eq!(parse_bytes("64KB"), Some(64 << 10));
        assert_eq!(parse_bytes("4096"), Some(4096));
        assert_eq!(parse_bytes("lots"), None);
        assert_eq!(parse_bytes(""), None);
    }

    #[test]
    fn a_spec_becomes_sorted_ranges_ending_open() {
        let all: Vec<&'static dyn Allreduce> = ALLREDUCE.to_vec();
        let ranges = from_spec("recursive_doubling:32K, halving_doubling:8M", &all).expect("valid");
        let got: Vec<_> = ranges.iter().map(|r| (r.upper, r.winner.name())).collect();
        assert_eq!(
            got,
            [
                (32 << 10, "recursive_doubling"),
                (8 << 20, "halving_doubling"),
                (u64::MAX, "halving_doubling")
            ]
        );
        let without_mpi: Vec<_> = all.iter().copied().filter(|a| a.name() != "mpi").collect();
        let ranges = from_spec("mpi", &without_mpi).expect("valid");
        assert_eq!(ranges[0].winner.name(), FALLBACK);
        let error = from_spec("tree:8K", &all).err().map(|e| e.to_string());
        assert!(error.is_some_and(|e| e.contains("\"tree\"") && e.contains("accepted")));
        let ranges = from_spec("ring/halving_doubling", &all).expect("valid");
        assert_eq!(
            ranges[0].runner_up.map(|r| r.name()),
            Some("halving_doubling")
        );
        let ranges = from_spec("ring/mpi", &without_mpi).expect("valid");
        assert!(
            ranges[0].runner_up.is_none(),
            "a runner-up that cannot run is none"
        );
        assert!(from_spec("ring:lots", &all).is_err());
        let open = from_spec("recursive_doubling:4K,ring:", &all).expect("an empty size is open");
        assert_eq!(
            open.last().map(|r| (r.upper, r.winner.name())),
            Some((u64::MAX, "ring"))
        );
    }
}
