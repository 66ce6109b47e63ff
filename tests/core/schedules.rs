//! Every schedule on the in-process transport: exact results at many rank counts, identical
//! bytes on every rank, exact traffic, bounded scratch, and message splitting.
//!
//! The tests that hold for any allreduce walk the ALLREDUCE registry (every algorithm that can
//! run in process; `RINGLET_TEST_ALGORITHMS=name,...` narrows them) and assert they ran every one
//! of them, so a newly registered schedule is tested with no edit here.

use crate::common::*;
use _core::dtype::{DType, ReduceOp};
use _core::schedules::allreduce::halving_doubling::HalvingDoubling;
use _core::schedules::allreduce::pipelined_ring::{PipelinedRing, RECEIVE_WINDOW};
use _core::schedules::allreduce::recursive_doubling::{RecursiveDoubling, SEGMENT_BYTES};
use _core::schedules::allreduce::ring::Ring;
use _core::schedules::{Algorithm, Allreduce, Cost, Factors, Parts, Reduction, Tuning};
use _core::transport::local::LocalTransport;
use _core::transport::waiting::set_wait_policy;
use _core::transport::DEFAULT_MAX_MESSAGE_BYTES;
use std::time::Duration;

const RANK_COUNTS: [usize; 19] = [
    1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 24, 32,
];

fn counts_for(n: usize) -> Vec<usize> {
    let mut counts = vec![0, 1, n.saturating_sub(1), n, n + 1, 1000];
    // Long vectors up to 17 ranks: above, the short counts cover the blocks' edge cases, and a
    // long vector on so many threads costs the suite more than it finds.
    if n <= 17 {
        counts.push(65537);
    }
    counts.dedup();
    counts
}

fn segments(segment_bytes: usize) -> Tuning {
    Tuning {
        segment_bytes,
        ..Tuning::default()
    }
}

fn check_exact(schedule: &dyn Allreduce, n: usize, count: usize, dtype: DType, op: ReduceOp) {
    check_exact_tuned(schedule, n, count, dtype, op, Tuning::default());
}

fn check_exact_tuned(
    schedule: &dyn Allreduce,
    n: usize,
    count: usize,
    dtype: DType,
    op: ReduceOp,
    tuning: Tuning,
) {
    let per_rank: Vec<Vec<f64>> = (0..n)
        .map(|r| (0..count).map(|i| exact_value(r, i, op)).collect())
        .collect();
    let inputs = per_rank.iter().map(|v| encode(dtype, v)).collect();
    let expected = reference(dtype, op, &per_rank);
    let outcomes = run_group_tuned(
        schedule,
        inputs,
        dtype,
        op,
        DEFAULT_MAX_MESSAGE_BYTES,
        tuning,
    );
    for (rank, outcome) in outcomes.iter().enumerate() {
        assert!(
            outcome.result == expected,
            "{} N={n} count={count} {} {}: rank {rank} differs from the reference",
            schedule.name(),
            dtype.name(),
            op.name()
        );
        assert_eq!(
            outcome.unreceived,
            0,
            "{} N={n}: messages left unreceived",
            schedule.name()
        );
    }
}

/// Threads outnumber cores here: ranks waiting in shared memory (`shm`) yield at once instead
/// of spinning.
fn yield_while_waiting() {
    set_wait_policy(Duration::ZERO, Duration::ZERO);
}

/// Every allreduce that runs in process, exact at each of `rank_counts` for every count, dtype
/// and op; asserts it ran all of them.
fn exhaustive(test: &str, rank_counts: &[usize]) {
    yield_while_waiting();
    let mut ran = Vec::new();
    for schedule in allreduce_under_test() {
        for &n in rank_counts {
            for count in counts_for(n) {
                for dtype in DType::ALL {
                    for op in ReduceOp::ALL {
                        check_exact(schedule, n, count, dtype, op);
                    }
                }
            }
        }
        ran.push(schedule.name());
    }
    assert_covered(test, &ran);
}

// Every other rank count in each of two tests, which weigh about the same and run side by side.
#[test]
fn every_schedule_is_exact_for_every_rank_count_count_dtype_and_op_part_1() {
    let counts: Vec<usize> = RANK_COUNTS.iter().copied().step_by(2).collect();
    exhaustive("exhaustive, part 1", &walked_rank_counts(&counts));
}

#[test]
fn every_schedule_is_exact_for_every_rank_count_count_dtype_and_op_part_2() {
    let counts: Vec<usize> = RANK_COUNTS.iter().copied().skip(1).step_by(2).collect();
    exhaustive("exhaustive, part 2", &walked_rank_counts(&counts));
}

#[test]
fn pipelined_ring_with_many_small_segments_is_exact() {
    // Segments of a few elements: many segments per block, uneven last segments, and more
    // segments than receive slots, at rank counts around the window size.
    for segment_bytes in [1, 8, 24, 100] {
        for n in [2usize, 3, 4, 5, 6, 9] {
            for count in [0usize, 1, n + 1, 97, 1000] {
                for (dtype, op) in [
                    (DType::F32, ReduceOp::Sum),
                    (DType::BF16, ReduceOp::Max),
                    (DType::I64, ReduceOp::Prod),
                ] {
                    check_exact_tuned(&PipelinedRing, n, count, dtype, op, segments(segment_bytes));
                }
            }
        }
    }
}

/// Block sizes computed here, independently of the schedule's own partition.
fn block_len(count: usize, n: usize, index: usize) -> usize {
    count / n + usize::from(index < count % n)
}

#[test]
fn ring_sends_two_m_minus_two_blocks_per_rank() {
    // bytes sent by rank r = 2m - |block r| - |block (r+1) mod N|,
    // i.e. 2(N-1)/N·m when N divides the count (Patarasuk & Yuan, Lemma 5).
    for n in [2usize, 3, 4, 5, 7, 8, 13] {
        for count in [0usize, 1, n - 1, n, n + 1, 1000, 4096, 65537] {
            let dtype = DType::F32;
            let inputs = (0..n).map(|_| encode(dtype, &vec![1.0; count])).collect();
            let outcomes = run_group(
                &Ring,
                inputs,
                dtype,
                ReduceOp::Sum,
                DEFAULT_MAX_MESSAGE_BYTES,
            );
            let m = count * 4;
            for (r, outcome) in outcomes.iter().enumerate() {
                let expected =
                    2 * m - 4 * (block_len(count, n, r) + block_len(count, n, (r + 1) % n));
                assert_eq!(outcome.bytes_sent, expected, "N={n} count={count} rank {r}");
                assert_eq!(outcome.messages_sent, 2 * (n - 1), "N={n}: 2(N-1) steps");
                if count % n == 0 {
                    assert_eq!(
                        outcome.bytes_sent * n,
                        2 * (n - 1) * m,
                        "the lower bound exactly"
                    );
                }
            }
        }
    }
}

#[test]
fn pipelined_ring_sends_the_same_bytes_as_the_ring() {
    for n in [2usize, 3, 5, 8] {
        for count in [0usize, 1, n + 1, 1000, 65537] {
            let inputs: Vec<Vec<u8>> = (0..n)
                .map(|_| encode(DType::F32, &vec![1.0; count]))
                .collect();
            let plain = run_group(
                &Ring,
                inputs.clone(),
                DType::F32,
                ReduceOp::Sum,
                DEFAULT_MAX_MESSAGE_BYTES,
            );
            let piped = run_group_tuned(
                &PipelinedRing,
                inputs,
                DType::F32,
                ReduceOp::Sum,
                DEFAULT_MAX_MESSAGE_BYTES,
                segments(4096),
            );
            for r in 0..n {
                assert_eq!(
                    piped[r].bytes_sent, plain[r].bytes_sent,
                    "N={n} count={count}"
                );
                assert!(piped[r].largest_message <= 4096);
            }
        }
    }
}

#[test]
fn halving_doubling_rounds_are_two_log2_p_plus_the_fold() {
    for n in 2usize..=33 {
        let pof2 = 1usize << (usize::BITS - 1 - n.leading_zeros());
        let rem = n - pof2;
        let log2 = pof2.trailing_zeros() as usize;
        let inputs = (0..n).map(|_| encode(DType::F64, &[1.0; 100])).collect();
        let outcomes = run_group(
            &HalvingDoubling,
            inputs,
            DType::F64,
            ReduceOp::Sum,
            DEFAULT_MAX_MESSAGE_BYTES,
        );
        for (r, outcome) in outcomes.iter().enumerate() {
            let expected = if r < 2 * rem && r % 2 == 0 {
                2 // the fold's two halves; then it only receives the result
            } else if r < 2 * rem {
                2 * log2 + 1 // the core, then the result back to the folded rank
            } else {
                2 * log2
            };
            assert_eq!(outcome.messages_sent, expected, "N={n} rank {r}");
        }
    }
}

#[test]
fn scratch_stays_within_each_algorithms_bound() {
    for n in walked_rank_counts(&[2, 3, 4, 5, 8, 13, 16]) {
        for count in [1usize, 999, 65537, 300_001] {
            for dtype in [DType::F32, DType::F16, DType::F64] {
                let m = count * dtype.size();
                let inputs: Vec<Vec<u8>> =
                    (0..n).map(|_| encode(dtype, &vec![1.0; count])).collect();
                let ring = run_group(
                    &Ring,
                    inputs.clone(),
                    dtype,
                    ReduceOp::Sum,
                    DEFAULT_MAX_MESSAGE_BYTES,
                );
                let hd = run_group(
                    &HalvingDoubling,
                    inputs.clone(),
                    dtype,
                    ReduceOp::Sum,
                    DEFAULT_MAX_MESSAGE_BYTES,
                );
                let rd = run_group(
                    &RecursiveDoubling,
                    inputs.clone(),
                    dtype,
                    ReduceOp::Sum,
                    DEFAULT_MAX_MESSAGE_BYTES,
                );
                let segment = 16 * 1024;
                let piped = run_group_tuned(
                    &PipelinedRing,
                    inputs,
                    dtype,
                    ReduceOp::Sum,
                    DEFAULT_MAX_MESSAGE_BYTES,
                    segments(segment),
                );
                for r in 0..n {
                    assert!(
                        ring[r].peak_scratch <= count.div_ceil(n) * dtype.size(),
                        "ring N={n} m={m}"
                    );
                    let pof2 = 1usize << (usize::BITS - 1 - n.leading_zeros());
                    let hd_bound = (count.div_ceil(2) + pof2 / 4) * dtype.size();
                    assert!(hd[r].peak_scratch <= hd_bound, "hd N={n} m={m}");
                    assert!(rd[r].peak_scratch <= m.min(SEGMENT_BYTES), "rd N={n} m={m}");
                    assert!(
                        piped[r].peak_scratch <= RECEIVE_WINDOW * segment,
                        "pipelined N={n} m={m}"
                    );
                    assert!(ring[r].peak_scratch < m && hd[r].peak_scratch < m || count == 1);
                }
            }
        }
    }
}

#[test]
fn long_messages_are_split_at_the_limit() {
    // The path a message longer than i32::MAX bytes takes, at a testable size.
    let limit = 64;
    yield_while_waiting();
    let mut ran = Vec::new();
    for schedule in allreduce_under_test() {
        ran.push(schedule.name());
        for n in [2usize, 3, 5, 8] {
            let count = 1001;
            let per_rank: Vec<Vec<f64>> = (0..n)
                .map(|r| {
                    (0..count)
                        .map(|i| exact_value(r, i, ReduceOp::Sum))
                        .collect()
                })
                .collect();
            let expected = reference(DType::F32, ReduceOp::Sum, &per_rank);
            let inputs = per_rank.iter().map(|v| encode(DType::F32, v)).collect();
            for outcome in run_group(schedule, inputs, DType::F32, ReduceOp::Sum, limit) {
                let name = schedule.name();
                assert!(outcome.result == expected, "{name} N={n}");
                assert!(outcome.largest_message <= limit, "{name} N={n}");
                // Every schedule sends messages but one that meets in shared memory.
                assert!(outcome.largest_message > 0 || outcome.messages_sent == 0);
                assert_eq!(outcome.unreceived, 0, "{name} N={n}");
            }
        }
    }
    assert_covered("long messages", &ran);
}

#[test]
fn inexact_results_are_bit_identical_on_every_rank_and_every_run() {
    yield_while_waiting();
    let tuning = segments(1000); // several segments for the pipelined ring
    let mut ran = Vec::new();
    for schedule in allreduce_under_test() {
        ran.push(schedule.name());
        for n in walked_rank_counts(&[2, 3, 6, 7, 16]) {
            for dtype in [DType::F32, DType::F16, DType::BF16] {
                for op in [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Prod] {
                    let inputs: Vec<Vec<u8>> = (0..n)
                        .map(|r| encode(dtype, &noise(r as u64 + 1, 4099)))
                        .collect();
                    let run = || {
                        let limit = DEFAULT_MAX_MESSAGE_BYTES;
                        run_group_tuned(schedule, inputs.clone(), dtype, op, limit, tuning)
                    };
                    let (first, second) = (run(), run());
                    for r in 0..n {
                        assert!(
                            first[r].result == first[0].result,
                            "{} N={n}: rank {r} differs",
                            schedule.name()
                        );
                        assert!(
                            second[r].result == first[0].result,
                            "{} N={n}: run 2 differs",
                            schedule.name()
                        );
                    }
                    // And close to the true sum: a wrong block would be far off.
                    if op == ReduceOp::Sum && dtype == DType::F32 {
                        let got: &[f32] = bytemuck::cast_slice(&first[0].result);
                        let truth: Vec<f64> = (0..4099)
                            .map(|i| {
                                (0..n)
                                    .map(|r| noise(r as u64 + 1, 4099)[i] as f32 as f64)
                                    .sum()
                            })
                            .collect();
                        for (g, t) in got.iter().zip(&truth) {
                            assert!((*g as f64 - t).abs() < 1e-4, "{} N={n}", schedule.name());
                        }
                    }
                }
            }
        }
    }
    assert_covered("bit-identical", &ran);
}

#[test]
fn broadcast_delivers_the_roots_bytes_to_every_rank() {
    use _core::schedules::broadcast::binomial::broadcast;
    use _core::transport::local::LocalTransport;
    for n in [1usize, 2, 3, 4, 5, 7, 8, 13, 16, 17] {
        for root in [0, n / 2, n - 1] {
            let transports = LocalTransport::group(n);
            let results: Vec<(Vec<u8>, usize)> = std::thread::scope(|scope| {
                let handles: Vec<_> = transports
                    .into_iter()
                    .enumerate()
                    .map(|(rank, t)| {
                        scope.spawn(move || {
                            let mut buf = vec![rank as u8; 1000];
                            broadcast(&t, &mut buf, root).expect("broadcast");
                            (buf, t.unreceived_messages())
                        })
                    })
                    .collect();
                handles
                    .into_iter()
                    .map(|h| h.join().expect("rank"))
                    .collect()
            });
            for (rank, (buf, leftover)) in results.iter().enumerate() {
                assert!(
                    buf.iter().all(|&b| b == root as u8),
                    "N={n} root={root} rank {rank}"
                );
                assert_eq!(*leftover, 0);
            }
        }
    }
}

/// The schedules that send one logical message per step over separate buffers, and fold
/// scaling into their combines.
fn ring_and_doubling_family() -> Vec<(&'static str, &'static dyn Allreduce, Tuning)> {
    vec![
        ("ring", &Ring, Tuning::default()),
        ("pipelined_ring", &PipelinedRing, segments(24)),
        ("halving_doubling", &HalvingDoubling, Tuning::default()),
        ("recursive_doubling", &RecursiveDoubling, Tuning::default()),
    ]
}

#[test]
fn every_schedule_over_separate_buffers_is_exact() {
    // Part boundaries at random places, empty parts included; blocks and segments span them.
    yield_while_waiting();
    let tuning = segments(24); // the pipelined ring's segments span parts too
    let mut ran = Vec::new();
    for schedule in allreduce_under_test() {
        let name = schedule.name();
        ran.push(name);
        for n in walked_rank_counts(&[1, 2, 3, 4, 5, 7, 8, 13]) {
            for (count, seed) in [0usize, 1, n + 1, 1000, 4099].into_iter().zip(1u64..) {
                for dtype in DType::ALL {
                    for op in ReduceOp::ALL {
                        let per_rank = exact_inputs(n, count, op);
                        let expected = reference(dtype, op, &per_rank);
                        let inputs = per_rank.iter().map(|v| encode(dtype, v)).collect();
                        let setup = Setup {
                            tuning,
                            parts: Some(random_parts(count, seed * 31 + n as u64)),
                            ..Setup::default()
                        };
                        for (rank, outcome) in run_with(schedule, inputs, dtype, op, &setup)
                            .iter()
                            .enumerate()
                        {
                            assert!(
                                outcome.result == expected,
                                "{name} N={n} count={count} {dtype:?} {op:?} {:?}: rank {rank}",
                                setup.parts
                            );
                            assert_eq!(outcome.unreceived, 0, "{name} N={n}");
                        }
                    }
                }
            }
        }
    }
    assert_covered("separate buffers", &ran);
}

#[test]
fn separate_buffers_send_the_same_bytes_as_one() {
    for (name, schedule, tuning) in ring_and_doubling_family() {
        for n in [2usize, 3, 5, 8] {
            for count in [1usize, 97, 1000, 4099] {
                let inputs: Vec<Vec<u8>> = (0..n)
                    .map(|_| encode(DType::F32, &vec![1.0; count]))
                    .collect();
                let one = Setup {
                    tuning,
                    ..Setup::default()
                };
                let split = Setup {
                    parts: Some(random_parts(count, count as u64)),
                    ..one.clone()
                };
                let contiguous =
                    run_with(schedule, inputs.clone(), DType::F32, ReduceOp::Sum, &one);
                let parts = run_with(schedule, inputs, DType::F32, ReduceOp::Sum, &split);
                for r in 0..n {
                    assert_eq!(
                        parts[r].bytes_sent, contiguous[r].bytes_sent,
                        "{name} N={n}"
                    );
                    assert_eq!(
                        parts[r].messages_sent, contiguous[r].messages_sent,
                        "{name} N={n}: one logical message per step, however many pieces"
                    );
                    assert!(
                        parts[r].peak_scratch <= contiguous[r].peak_scratch,
                        "{name} N={n}"
                    );
                }
            }
        }
    }
}

/// A schedule that does not fold scaling: the caller sweeps before and after.
struct Unfolded(&'static dyn Allreduce);

impl Algorithm for Unfolded {
    fn name(&self) -> &'static str {
        "unfolded"
    }
    fn description(&self) -> &'static str {
        self.0.description()
    }
    fn best_for(&self) -> &'static str {
        self.0.best_for()
    }
    fn cost(&self, ranks: usize, bytes: usize, tuning: &Tuning) -> Cost {
        self.0.cost(ranks, bytes, tuning)
    }
}

impl Allreduce for Unfolded {
    fn run(
        &self,
        transport: &dyn _core::transport::Transport,
        buf: &mut Parts,
        reduction: &Reduction,
        tuning: &Tuning,
    ) -> _core::error::Result<()> {
        self.0.run(transport, buf, reduction, tuning)
    }
}

#[test]
fn every_schedule_reduces_out_of_place_as_in_place_and_leaves_the_input() {
    // Counts from empty to two-shot shared memory over two segments (`shm`'s own path); the
    // result starts as junk, so every byte must be written.
    yield_while_waiting();
    let factors = Factors {
        pre: 2.0,
        post: 0.5,
    };
    let mut ran = Vec::new();
    for schedule in allreduce_under_test() {
        let name = schedule.name();
        ran.push(name);
        for n in walked_rank_counts(&[1, 2, 3, 4, 5]) {
            for count in [0usize, 1, 37, 1000, 20_000, 300_000] {
                for dtype in [DType::F32, DType::BF16, DType::F64, DType::I64] {
                    for op in [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max] {
                        if count == 300_000 && (n > 3 || op != ReduceOp::Sum) {
                            continue; // the long vector once per dtype: it is slow on threads
                        }
                        let integer = matches!(dtype, DType::I32 | DType::I64);
                        let factors = if integer { Factors::NONE } else { factors };
                        let per_rank = exact_inputs(n, count, op);
                        let expected =
                            reference_scaled(dtype, op, &per_rank, factors.pre, factors.post);
                        let inputs: Vec<Vec<u8>> =
                            per_rank.iter().map(|v| encode(dtype, v)).collect();
                        let setup = Setup {
                            factors,
                            ..Setup::default()
                        };
                        let in_place = run_with(schedule, inputs.clone(), dtype, op, &setup);
                        let setup = Setup {
                            out_of_place: true,
                            ..setup
                        };
                        let out_of_place = run_with(schedule, inputs.clone(), dtype, op, &setup);
                        // A fused group: parts of every size, an empty one among them.
                        let setup = Setup {
                            parts: Some(vec![
                                count / 7,
                                0,
                                count / 2,
                                count - count / 7 - count / 2,
                            ]),
                            ..setup
                        };
                        let in_parts = run_with(schedule, inputs, dtype, op, &setup);
                        for r in 0..n {
                            let what = format!("{name} N={n} count={count} {dtype:?} {op:?}");
                            assert!(out_of_place[r].result == expected, "{what}: rank {r}");
                            assert!(in_parts[r].result == expected, "{what} in parts: rank {r}");
                            assert!(in_place[r].result == expected, "{what}: rank {r}");
                            assert_eq!(out_of_place[r].unreceived, 0, "{what}");
                        }
                    }
                }
            }
        }
    }
    assert_covered("out of place", &ran);
    // Ranks spread over nodes, in block and round-robin placement (the ring runs node-major).
    for schedule in allreduce_under_test() {
        for nodes in [vec![0, 0, 1, 1], vec![0, 1, 0, 1, 2]] {
            let probe = LocalTransport::cluster(&nodes).remove(0);
            if schedule.unavailable(&probe).is_some() {
                continue; // shm: one node only
            }
            let n = nodes.len();
            for count in [37usize, 20_000] {
                let per_rank = exact_inputs(n, count, ReduceOp::Sum);
                let expected = reference(DType::F32, ReduceOp::Sum, &per_rank);
                let inputs = per_rank.iter().map(|v| encode(DType::F32, v)).collect();
                let setup = Setup {
                    nodes: Some(nodes.clone()),
                    out_of_place: true,
                    ..Setup::default()
                };
                let outcomes = run_with(schedule, inputs, DType::F32, ReduceOp::Sum, &setup);
                for (r, outcome) in outcomes.iter().enumerate() {
                    let name = schedule.name();
                    assert!(outcome.result == expected, "{name} on {nodes:?}: rank {r}");
                }
            }
        }
    }
}

#[test]
fn scaling_folded_into_the_combines_equals_sweeps_before_and_after() {
    let factors = Factors {
        pre: 2.0,
        post: 0.5,
    };
    // Every schedule scales exactly; those that fold it match the caller's sweeps bit for bit.
    for (name, _, _) in ring_and_doubling_family() {
        let schedule = _core::schedules::by_name(_core::schedules::ALLREDUCE, name).unwrap();
        assert!(schedule.folds_scaling(), "{name} folds");
    }
    yield_while_waiting();
    let tuning = segments(24);
    let mut ran = Vec::new();
    for schedule in allreduce_under_test() {
        let name = schedule.name();
        ran.push(name);
        let sweeping: &'static dyn Allreduce = Box::leak(Box::new(Unfolded(schedule)));
        for n in walked_rank_counts(&[1, 2, 3, 5, 8]) {
            for count in [0usize, 1, 37, 1000] {
                for dtype in DType::ALL {
                    for op in [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Min, ReduceOp::Max] {
                        let integer = matches!(dtype, DType::I32 | DType::I64);
                        let factors = if integer { Factors::NONE } else { factors };
                        let per_rank = exact_inputs(n, count, op);
                        let expected =
                            reference_scaled(dtype, op, &per_rank, factors.pre, factors.post);
                        let inputs: Vec<Vec<u8>> =
                            per_rank.iter().map(|v| encode(dtype, v)).collect();
                        let setup = Setup {
                            tuning,
                            factors,
                            parts: Some(random_parts(count, 7)),
                            ..Setup::default()
                        };
                        let folded = run_with(schedule, inputs.clone(), dtype, op, &setup);
                        let swept = schedule
                            .folds_scaling()
                            .then(|| run_with(sweeping, inputs, dtype, op, &setup));
                        for r in 0..n {
                            assert!(
                                folded[r].result == expected,
                                "{name} N={n} count={count} {dtype:?} {op:?}: rank {r}"
                            );
                            if let Some(swept) = &swept {
                                assert!(folded[r].result == swept[r].result, "{name} N={n}");
                            }
                        }
                    }
                }
            }
        }
    }
    assert_covered("scaling", &ran);
}

#[test]
fn pairwise_alltoall_delivers_every_pairs_block_and_sends_each_once() {
    use _core::schedules::alltoall::pairwise::PairwiseAlltoall;
    use _core::schedules::Alltoall;
    use _core::transport::local::LocalTransport;
    // Rows rank r sends rank q: anything from 0 to 4, different per pair.
    let rows = |r: usize, q: usize| (r * 7 + q * 3) % 5;
    let byte = |r: usize, q: usize, i: usize| (r * 31 + q * 7 + i) as u8;
    for n in [1usize, 2, 3, 4, 5, 7, 8, 13] {
        let transports = LocalTransport::group(n);
        let results: Vec<(Vec<u8>, usize, usize)> = std::thread::scope(|scope| {
            let handles: Vec<_> = transports
                .into_iter()
                .enumerate()
                .map(|(me, t)| {
                    scope.spawn(move || {
                        let (mut send, mut send_blocks) = (Vec::new(), Vec::new());
                        for q in 0..n {
                            let start = send.len();
                            send.extend((0..rows(me, q) * 3).map(|i| byte(me, q, i)));
                            send_blocks.push(start..send.len());
                        }
                        let mut recv_blocks = Vec::new();
                        let mut end = 0;
                        for r in 0..n {
                            recv_blocks.push(end..end + rows(r, me) * 3);
                            end += rows(r, me) * 3;
                        }
                        let mut recv = vec![0xEEu8; end];
                        PairwiseAlltoall
                            .run(&t, &send, &send_blocks, &mut recv, &recv_blocks)
                            .expect("alltoall");
                        (recv, t.bytes_sent(), t.unreceived_messages())
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("rank"))
                .collect()
        });
        for (me, (recv, sent, leftover)) in results.iter().enumerate() {
            let expected: Vec<u8> = (0..n)
                .flat_map(|r| (0..rows(r, me) * 3).map(move |i| byte(r, me, i)))
                .collect();
            assert_eq!(recv, &expected, "N={n} rank {me}");
            let to_others: usize = (0..n).filter(|&q| q != me).map(|q| rows(me, q) * 3).sum();
            assert_eq!(*sent, to_others, "N={n} rank {me} sends each block once");
            assert_eq!(*leftover, 0);
        }
    }
}
