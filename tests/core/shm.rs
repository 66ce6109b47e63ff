//! The shared-memory schedule on in-process ranks (threads sharing the heap): exact on both of
//! its paths, over separate buffers and over arrays that live in shared memory, bit-identical
//! on every rank, and refused where there is no shared memory.

use crate::common::*;
use _core::dtype::{DType, ReduceOp};
use _core::schedules::allreduce::shared_memory::{one_shot_max, Shm, SEGMENT_BYTES};
use _core::schedules::{self, Algorithm, Factors, Parts, Tuning};
use _core::transport::local::LocalTransport;
use _core::transport::waiting::set_wait_policy;
use _core::transport::Transport;
use std::time::Duration;

/// Threads outnumber cores here: yield at once instead of spinning.
fn yield_while_waiting() {
    set_wait_policy(Duration::ZERO, Duration::ZERO);
}

/// Element counts around each path's edges for `dtype`.
fn counts(n: usize, dtype: DType) -> Vec<usize> {
    let one_shot = one_shot_max(n) / dtype.size();
    let segment = SEGMENT_BYTES / dtype.size();
    vec![
        0,
        1,
        n + 1,
        one_shot,
        one_shot + 1,
        segment * 2 + n + 3,
        segment * 4 - 1,
    ]
}

fn check(n: usize, count: usize, dtype: DType, op: ReduceOp, parts: Option<Vec<usize>>) {
    let per_rank: Vec<Vec<f64>> = (0..n)
        .map(|r| (0..count).map(|i| exact_value(r, i, op)).collect())
        .collect();
    let expected = reference(dtype, op, &per_rank);
    let inputs = per_rank.iter().map(|v| encode(dtype, v)).collect();
    let setup = Setup {
        parts: parts.clone(),
        ..Setup::default()
    };
    for (rank, outcome) in run_with(&Shm, inputs, dtype, op, &setup).iter().enumerate() {
        assert!(
            outcome.result == expected,
            "shm N={n} count={count} {dtype:?} {op:?} parts {parts:?}: rank {rank} differs"
        );
        assert_eq!(outcome.messages_sent, 0, "shm sends no messages");
    }
}

#[test]
fn shm_is_exact_on_both_paths_for_every_dtype_and_op() {
    yield_while_waiting();
    for n in walked_rank_counts(&[1, 2, 3, 4, 5, 8]) {
        for dtype in DType::ALL {
            for count in counts(n, dtype) {
                for op in ReduceOp::ALL {
                    check(n, count, dtype, op, None);
                }
            }
        }
    }
}

#[test]
fn shm_is_exact_with_factors_and_avg_on_both_paths() {
    yield_while_waiting();
    let factors = Factors {
        pre: 2.0,
        post: 0.5,
    };
    for n in walked_rank_counts(&[2, 3, 5]) {
        for dtype in [DType::F32, DType::F64, DType::F16, DType::BF16] {
            for count in counts(n, dtype) {
                for op in [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max] {
                    let per_rank = exact_inputs(n, count, op);
                    let expected =
                        reference_scaled(dtype, op, &per_rank, factors.pre, factors.post);
                    let inputs = per_rank.iter().map(|v| encode(dtype, v)).collect();
                    let setup = Setup {
                        factors,
                        ..Setup::default()
                    };
                    for (rank, outcome) in
                        run_with(&Shm, inputs, dtype, op, &setup).iter().enumerate()
                    {
                        assert!(
                            outcome.result == expected,
                            "shm N={n} count={count} {dtype:?} {op:?} scaled: rank {rank} differs"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn shm_over_separate_buffers_is_exact() {
    yield_while_waiting();
    for n in walked_rank_counts(&[2, 3, 7]) {
        for dtype in [DType::F32, DType::BF16, DType::I64] {
            for (count, seed) in counts(n, dtype).into_iter().zip(1u64..) {
                let parts = random_parts(count, seed * 7 + n as u64);
                check(n, count, dtype, ReduceOp::Sum, Some(parts));
            }
        }
    }
}

#[test]
fn shm_results_are_bit_identical_on_every_rank_and_reduced_in_rank_order() {
    yield_while_waiting();
    for n in walked_rank_counts(&[2, 3, 5, 8]) {
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            for count in [4099usize, SEGMENT_BYTES / 2 * 3 + 5] {
                let values: Vec<Vec<f64>> = (0..n).map(|r| noise(r as u64 + 1, count)).collect();
                let inputs: Vec<Vec<u8>> = values.iter().map(|v| encode(dtype, v)).collect();
                let outcomes = run_group(&Shm, inputs.clone(), dtype, ReduceOp::Sum, usize::MAX);
                for (r, outcome) in outcomes.iter().enumerate() {
                    assert!(
                        outcome.result == outcomes[0].result,
                        "N={n} rank {r} differs"
                    );
                }
                // Rank order, accumulated in f32 for 16-bit floats (rounded once at the end).
                let got = decode(dtype, &outcomes[0].result);
                for i in (0..count).step_by(97) {
                    let mut acc = decode(dtype, &inputs[0][i * dtype.size()..][..dtype.size()])[0];
                    if dtype == DType::F32 || dtype.size() == 2 {
                        let mut acc32 = acc as f32;
                        for input in &inputs[1..] {
                            let x = decode(dtype, &input[i * dtype.size()..][..dtype.size()])[0];
                            acc32 += x as f32;
                        }
                        acc = acc32 as f64;
                    }
                    let rounded = decode(dtype, &encode(dtype, &[acc]))[0];
                    assert_eq!(got[i].to_bits(), rounded.to_bits(), "N={n} {dtype:?} [{i}]");
                }
            }
        }
    }
}

/// Every rank's float32 input of `count` exact values, and their sum.
fn float32_sums(n: usize, count: usize) -> (Vec<Vec<u8>>, Vec<u8>) {
    let per_rank: Vec<Vec<f64>> = (0..n)
        .map(|r| {
            (0..count)
                .map(|i| exact_value(r, i, ReduceOp::Sum))
                .collect()
        })
        .collect();
    let inputs = per_rank.iter().map(|v| encode(DType::F32, v)).collect();
    (inputs, reference(DType::F32, ReduceOp::Sum, &per_rank))
}

/// Run shm with each rank's vector in a shared array where `in_array[rank]` says, else in a
/// private buffer; every rank's result.
fn run_in_arrays(n: usize, values: &[Vec<u8>], in_array: &[bool], dtype: DType) -> Vec<Vec<u8>> {
    let transports = LocalTransport::group(n);
    std::thread::scope(|scope| {
        let handles: Vec<_> = transports
            .into_iter()
            .zip(values)
            .zip(in_array)
            .map(|((transport, input), &shared)| {
                scope.spawn(move || {
                    let memory = transport.shared().expect("in-process ranks share memory");
                    // Every rank allocates (collective), and uses it or not.
                    let array = memory
                        .allocate(&transport, input.len() + 64)
                        .expect("allocate");
                    let mut private = aligned_copy(input);
                    let buf: &mut [u8] = if shared {
                        // SAFETY: this rank's part of the array, which it alone writes here.
                        let whole =
                            unsafe { std::slice::from_raw_parts_mut(array.as_ptr(), array.len()) };
                        let at = &mut whole[8..8 + input.len()];
                        at.copy_from_slice(input);
                        at
                    } else {
                        private.as_mut_slice()
                    };
                    let mut parts = Parts::one(buf);
                    schedules::allreduce(
                        &transport,
                        &Shm,
                        &mut parts,
                        dtype,
                        ReduceOp::Sum,
                        Factors::NONE,
                        &Tuning::default(),
                    )
                    .expect("allreduce");
                    parts.parts()[0].to_vec()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("rank"))
            .collect()
    })
}

#[test]
fn vectors_in_shared_arrays_are_reduced_in_place_alone_or_mixed_with_private_ones() {
    yield_while_waiting();
    for n in [2usize, 3, 4] {
        for count in [10usize, SEGMENT_BYTES / 4 * 2 + 3] {
            let (inputs, expected) = float32_sums(n, count);
            for pattern in [vec![true; n], (0..n).map(|r| r % 2 == 0).collect()] {
                for (rank, result) in run_in_arrays(n, &inputs, &pattern, DType::F32)
                    .iter()
                    .enumerate()
                {
                    assert!(
                        *result == expected,
                        "N={n} count={count} {pattern:?}: rank {rank}"
                    );
                }
            }
        }
    }
}

#[test]
fn shm_is_refused_where_ranks_do_not_share_memory() {
    let transport = LocalTransport::group(2)
        .into_iter()
        .next()
        .expect("a rank")
        .without_shared_memory();
    let why = Shm.unavailable(&transport).expect("unavailable");
    assert!(why.contains("one node"), "{why}");
    let mut buf = vec![0u8; 16];
    let error = schedules::allreduce_one(
        &transport,
        &Shm,
        &mut buf,
        DType::F32,
        ReduceOp::Sum,
        &Tuning::default(),
    )
    .expect_err("refused");
    assert!(
        error.to_string().contains("\"shm\" is not available"),
        "{error}"
    );
}

/// A small run of both paths, shared arrays included: what valgrind checks (`make memcheck`).
#[test]
fn shm_both_paths_small() {
    yield_while_waiting();
    for n in [2usize, 3] {
        for dtype in [DType::F32, DType::BF16] {
            for count in [5, one_shot_max(n) / dtype.size() + 1] {
                check(n, count, dtype, ReduceOp::Sum, None);
            }
        }
        let count = SEGMENT_BYTES / 4 + 3;
        let (inputs, expected) = float32_sums(n, count);
        let pattern: Vec<bool> = (0..n).map(|r| r == 0).collect();
        for result in run_in_arrays(n, &inputs, &pattern, DType::F32) {
            assert!(result == expected, "N={n}");
        }
    }
}
