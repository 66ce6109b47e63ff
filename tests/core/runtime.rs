//! The runtime on in-process ranks: every collective's results, the consistency check (every
//! kind of disagreement, for every collective, at 2, 3 and 5 ranks), refused calls, settings,
//! the stall inspector's messages, and ranks that shut down while the others wait.

use _core::dtype::{DType, ReduceOp};
use _core::error::CoreError;
use _core::runtime::allgather::allgather_on;
use _core::runtime::allreduce::allreduce_on;
use _core::runtime::alltoall::alltoall_on;
use _core::runtime::barrier_on;
use _core::runtime::broadcast::{broadcast_on, Array};
use _core::runtime::communicator::{Communicator, Options, Settings};
use _core::runtime::grouped_allreduce::{allreduce_group_on, Group};
use _core::runtime::join::join_on;
use _core::runtime::reduce::{reduce_on, Data};
use _core::runtime::reduce_scatter::reduce_scatter_on;
use _core::runtime::stall::{Sink, StallPolicy};
use _core::transport::local::LocalTransport;
use _core::transport::DEFAULT_MAX_MESSAGE_BYTES;
use smallvec::smallvec;
use std::sync::{Arc, Mutex};
use std::time::Duration;

const GROUPS: [usize; 3] = [2, 3, 5];

fn quiet() -> Sink {
    Arc::new(|_: &str| {})
}

/// Run `body` on each rank of an `n`-rank in-process group, each rank in its own thread.
fn on_ranks<R: Send>(
    n: usize,
    policy: StallPolicy,
    sink: Sink,
    body: impl Fn(&mut Communicator<LocalTransport>) -> R + Sync,
) -> Vec<R> {
    on_transports(LocalTransport::group(n), policy, sink, body)
}

/// [`on_ranks`] over the given transports (one per rank).
fn on_transports<R: Send>(
    transports: Vec<LocalTransport>,
    policy: StallPolicy,
    sink: Sink,
    body: impl Fn(&mut Communicator<LocalTransport>) -> R + Sync,
) -> Vec<R> {
    let body = &body;
    std::thread::scope(|scope| {
        let handles: Vec<_> = transports
            .into_iter()
            .enumerate()
            .map(|(rank, transport)| {
                let sink = sink.clone();
                scope.spawn(move || {
                    let options = Options {
                        check: true,
                        stall: policy,
                        host: format!("host{}", rank / 2),
                        ranks: Vec::new(),
                        sink,
                        explore: true,
                    };
                    let mut comm = Communicator::new(transport, options).expect("set up");
                    body(&mut comm)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a rank panicked"))
            .collect()
    })
}

fn on<R: Send>(n: usize, body: impl Fn(&mut Communicator<LocalTransport>) -> R + Sync) -> Vec<R> {
    on_ranks(n, StallPolicy::default(), quiet(), body)
}

fn f32_bytes(values: &[f32]) -> Vec<u8> {
    bytemuck::cast_slice(values).to_vec()
}

fn f32_values(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks(4)
        .map(|c| f32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// An aligned f32 buffer of `values`.
fn buffer(values: &[f32]) -> Vec<f32> {
    values.to_vec()
}

/// A call that every rank makes afterwards: the ranks must still be in step.
fn in_step(comm: &Communicator) -> bool {
    let mut x = buffer(&[1.0; 7]);
    let result = allreduce_on(
        comm,
        bytemuck::cast_slice_mut(&mut x),
        DType::F32,
        ReduceOp::Sum,
        &[7],
        "ring",
        0,
    );
    result.is_ok() && x.iter().all(|&v| v == comm.size() as f32)
}

#[test]
fn collectives_give_the_reference_results() {
    for n in [1, 2, 3, 5] {
        let results = on(n, |comm| {
            let rank = comm.rank();
            // allreduce
            let mut x: Vec<f32> = (0..10).map(|i| (rank * 10 + i) as f32).collect();
            let bytes = bytemuck::cast_slice_mut(&mut x);
            allreduce_on(comm, bytes, DType::F32, ReduceOp::Sum, &[2, 5], "ring", 0).expect("ar");
            // broadcast from the last rank
            let mut b = vec![rank as u8; 33];
            let array = Array {
                bytes: &mut b,
                dtype: "uint8",
                shape: &[33],
            };
            broadcast_on(comm, array, n - 1, "auto", 0).expect("broadcast");
            // allgather: rank r contributes r rows of 3
            let rows: Vec<f32> = (0..rank * 3).map(|i| (rank * 100 + i) as f32).collect();
            let gathered =
                allgather_on(comm, &f32_bytes(&rows), "float32", 4, &[rank, 3], "auto", 0)
                    .expect("allgather");
            let gathered_values =
                f32_values(&bytemuck::cast_slice::<u64, u8>(&gathered.storage)[..gathered.bytes]);
            // reduce-scatter of 2n+1 rows of 2, split by numpy.array_split's rule
            let total_rows = 2 * n + 1;
            let counts: Vec<usize> = (0..n)
                .map(|r| total_rows / n + usize::from(r < total_rows % n))
                .collect();
            let input: Vec<f32> = (0..total_rows * 2).map(|i| (i + rank) as f32).collect();
            let block = reduce_scatter_on(
                comm,
                &f32_bytes(&input),
                DType::F32,
                ReduceOp::Sum,
                &[total_rows, 2],
                &counts,
                "auto",
                0,
            )
            .expect("reduce_scatter");
            let block_values =
                f32_values(&bytemuck::cast_slice::<u64, u8>(&block.storage)[..block.bytes]);
            barrier_on(comm, 0).expect("barrier");
            (x, b, gathered_values, gathered.counts, counts, block_values)
        });
        for (rank, (x, b, gathered, counts, split, block)) in results.into_iter().enumerate() {
            let expected: Vec<f32> = (0..10)
                .map(|i| (0..n).map(|r| (r * 10 + i) as f32).sum())
                .collect();
            assert_eq!(x, expected, "allreduce N={n}");
            assert!(b.iter().all(|&v| v == (n - 1) as u8), "broadcast N={n}");
            let rows: Vec<f32> = (0..n)
                .flat_map(|r| (0..r * 3).map(move |i| (r * 100 + i) as f32))
                .collect();
            assert_eq!(gathered, rows, "allgather N={n}");
            assert_eq!(counts, (0..n).collect::<Vec<_>>());
            let start: usize = split[..rank].iter().sum::<usize>() * 2;
            let want: Vec<f32> = (start..start + split[rank] * 2)
                .map(|i| (0..n).map(|r| (i + r) as f32).sum())
                .collect();
            assert_eq!(block, want, "reduce_scatter N={n} rank {rank}");
        }
    }
}

#[test]
fn reduce_gives_the_root_the_reference_and_the_others_nothing() {
    for n in [1, 2, 3, 5, 8] {
        for name in ["auto", "binomial", "k_chain", "reduce_scatter_gather"] {
            let root = n / 2;
            let results = on(n, |comm| {
                let input: Vec<f32> = (0..7).map(|i| (i * 10 + comm.rank()) as f32).collect();
                let bytes = f32_bytes(&input);
                let mut out = vec![0u8; bytes.len()];
                let data = if comm.rank() == root {
                    Data::Into(&bytes, &mut out)
                } else {
                    Data::Read(&bytes)
                };
                let at_root = reduce_on(comm, data, DType::F32, ReduceOp::Avg, &[7], root, name, 0)
                    .expect("reduce");
                assert_eq!(f32_bytes(&input), bytes, "the input is untouched");
                // In place on the root: its input becomes the result.
                let mut mine = bytes.clone();
                let data = if comm.rank() == root {
                    Data::InPlace(&mut mine)
                } else {
                    Data::Read(&bytes)
                };
                reduce_on(comm, data, DType::F32, ReduceOp::Avg, &[7], root, name, 0)
                    .expect("in place");
                at_root.then(|| {
                    assert_eq!(mine, out, "in place and into out agree");
                    f32_values(&out)
                })
            });
            for (rank, result) in results.into_iter().enumerate() {
                if rank != root {
                    assert!(result.is_none(), "{name} N={n} rank {rank}");
                    continue;
                }
                let mean = (0..n).sum::<usize>() as f32 / n as f32;
                let want: Vec<f32> = (0..7).map(|i| (i * 10) as f32 + mean).collect();
                assert_eq!(result, Some(want), "{name} N={n}");
            }
        }
    }
}

#[test]
fn a_fused_group_equals_one_allreduce_per_array() {
    for n in GROUPS {
        let results = on(n, |comm| {
            let rank = comm.rank() as f32;
            let mut a = buffer(&[rank, 1.0, 2.0]);
            let mut b = buffer(&[rank * 2.0; 5]);
            let mut c = buffer(&[3.0; 2]);
            let group = Group {
                dtype: DType::F32,
                wire: DType::F32,
                op: ReduceOp::Avg,
                algorithm: "ring".into(),
                prescale: 1.0,
                postscale: 1.0,
                fusion_bytes: 24, // a and c fit a buffer only with b apart
                pack_below: Some(0),
                shapes: smallvec![smallvec![3], smallvec![5], smallvec![2]],
                thread: 0,
                set: _core::runtime::process::WORLD,
            };
            let mut arrays: Vec<&mut [u8]> = vec![
                bytemuck::cast_slice_mut(&mut a),
                bytemuck::cast_slice_mut(&mut b),
                bytemuck::cast_slice_mut(&mut c),
            ];
            allreduce_group_on(comm, &mut arrays, &group).expect("group");
            (a, b, c)
        });
        let mean = (0..n).map(|r| r as f32).sum::<f32>() / n as f32;
        for (a, b, c) in results {
            assert_eq!(a, vec![mean, 1.0, 2.0]);
            assert_eq!(b, vec![2.0 * mean; 5]);
            assert_eq!(c, vec![3.0; 2]);
        }
    }
}

#[test]
fn a_group_reduced_in_place_equals_the_group_packed_with_factors_and_compression() {
    for n in GROUPS {
        let results = on(n, |comm| {
            let rank = comm.rank() as f32;
            let run = |pack_below: usize, wire: DType| {
                let mut a = buffer(&[rank, 1.0, 2.0, -3.0]);
                let mut b = buffer(&[rank * 2.0; 6]);
                let mut c = buffer(&[0.5 + rank; 3]);
                let group = Group {
                    dtype: DType::F32,
                    wire,
                    op: ReduceOp::Avg,
                    algorithm: "ring".into(),
                    prescale: 2.0,
                    postscale: 0.25,
                    fusion_bytes: 1 << 20,
                    pack_below: Some(pack_below),
                    shapes: smallvec![smallvec![4], smallvec![6], smallvec![3]],
                    thread: 0,
                    set: _core::runtime::process::WORLD,
                };
                let mut arrays: Vec<&mut [u8]> = vec![
                    bytemuck::cast_slice_mut(&mut a),
                    bytemuck::cast_slice_mut(&mut b),
                    bytemuck::cast_slice_mut(&mut c),
                ];
                allreduce_group_on(comm, &mut arrays, &group).expect("group");
                [a, b, c].concat()
            };
            (
                run(0, DType::F32),
                run(usize::MAX, DType::F32),
                run(0, DType::BF16),
            )
        });
        let mean = |f: &dyn Fn(f32) -> f32| (0..n).map(|r| f(r as f32)).sum::<f32>() / n as f32;
        let mut expected = vec![mean(&|r| r), 1.0, 2.0, -3.0];
        expected.extend([mean(&|r| 2.0 * r); 6]);
        expected.extend([mean(&|r| 0.5 + r); 3]);
        let expected: Vec<f32> = expected.iter().map(|v| v * 2.0 * 0.25).collect();
        for (in_place, packed, compressed) in results {
            assert_eq!(in_place, expected, "N={n}: in place, factors folded");
            assert_eq!(packed, expected, "N={n}: packed");
            assert_eq!(
                compressed, expected,
                "N={n}: compressed to bfloat16 (exact here)"
            );
        }
    }
}

/// Every rank runs `call(comm, odd)` where `odd` is true on the last rank only; every rank
/// must get `MismatchError` whose message contains each of `expected`, and stay in step.
fn every_rank_mismatches(
    what: &str,
    expected: &[&str],
    call: impl Fn(&Communicator, bool) -> Result<(), CoreError> + Sync,
) {
    for n in GROUPS {
        let outcomes = on(n, |comm| {
            let odd = comm.rank() == comm.size() - 1;
            let outcome = call(comm, odd);
            (outcome, in_step(comm))
        });
        for (rank, (outcome, in_step)) in outcomes.into_iter().enumerate() {
            match outcome {
                Err(CoreError::Mismatch(message)) => {
                    for part in expected {
                        assert!(
                            message.contains(part),
                            "{what} N={n} rank {rank}: {message}"
                        );
                    }
                    let last = format!("rank {} passed", n - 1);
                    assert!(message.contains(&last), "{what} N={n}: {message}");
                }
                other => panic!("{what} N={n} rank {rank}: expected a mismatch, got {other:?}"),
            }
            assert!(in_step, "{what} N={n} rank {rank}: out of step afterwards");
        }
    }
}

fn allreduce_of(
    comm: &Communicator,
    shape: &[usize],
    dtype: DType,
    op: ReduceOp,
    algorithm: &str,
) -> Result<(), CoreError> {
    let count: usize = shape.iter().product();
    let mut data = vec![0u64; count];
    let before = data.clone();
    let bytes = &mut bytemuck::cast_slice_mut::<u64, u8>(&mut data)[..count * dtype.size()];
    let outcome = allreduce_on(comm, bytes, dtype, op, shape, algorithm, 0);
    if outcome.is_err() {
        assert_eq!(data, before, "data changed although the call failed");
    }
    outcome
}

#[test]
fn allreduce_disagreements_are_mismatches_on_every_rank() {
    use DType::*;
    use ReduceOp::*;
    every_rank_mismatches("shape", &["float32[4, 6]", "float32[4, 2, 3]"], |c, odd| {
        allreduce_of(c, if odd { &[4, 2, 3] } else { &[4, 6] }, F32, Sum, "ring")
    });
    every_rank_mismatches("count", &["float32[1000]", "float32[999]"], |c, odd| {
        allreduce_of(c, &[1000 - usize::from(odd)], F32, Sum, "ring")
    });
    every_rank_mismatches("dtype", &["float32[8]", "float64[8]"], |c, odd| {
        allreduce_of(c, &[8], if odd { F64 } else { F32 }, Sum, "ring")
    });
    every_rank_mismatches("op", &["sum", "max"], |c, odd| {
        allreduce_of(c, &[8], F32, if odd { Max } else { Sum }, "ring")
    });
    every_rank_mismatches(
        "algorithm",
        &["(ring)", "(recursive_doubling)"],
        |c, odd| {
            allreduce_of(
                c,
                &[8],
                F32,
                Sum,
                if odd { "recursive_doubling" } else { "ring" },
            )
        },
    );
    every_rank_mismatches("order", &["allreduce #", "barrier #"], |c, odd| {
        if odd {
            barrier_on(c, 0)
        } else {
            allreduce_of(c, &[8], F32, Sum, "ring")
        }
    });
    every_rank_mismatches(
        "thread",
        &["thread keyed 0x1", "thread keyed 0x2"],
        |c, odd| {
            let mut x = [0u8; 32];
            allreduce_on(c, &mut x, F32, Sum, &[8], "ring", if odd { 2 } else { 1 })
        },
    );
}

#[test]
fn a_call_one_rank_refuses_is_a_mismatch_for_the_others_and_its_own_error_for_it() {
    for n in GROUPS {
        let outcomes = on(n, |comm| {
            let refusing = comm.rank() == 0;
            // "mpi" cannot reduce float16: rank 0 refuses; the others pass a valid call.
            let algorithm = if refusing { "mpi" } else { "ring" };
            (
                allreduce_of(comm, &[8], DType::F16, ReduceOp::Sum, algorithm),
                in_step(comm),
            )
        });
        for (rank, (outcome, in_step)) in outcomes.into_iter().enumerate() {
            match (rank, outcome) {
                (0, Err(CoreError::InvalidArgument(message))) => {
                    assert!(
                        message.contains("MPI has no 16-bit float type"),
                        "{message}"
                    )
                }
                (_, Err(CoreError::Mismatch(message))) => {
                    assert!(
                        message.contains("rank 0 passed allreduce #0, which it refused"),
                        "{message}"
                    );
                    assert!(message.contains("float16[8] sum (ring)"), "{message}");
                }
                (rank, other) => panic!("N={n} rank {rank}: {other:?}"),
            }
            assert!(in_step, "N={n} rank {rank}");
        }
        // When every rank refuses, each raises its own error, and nothing is out of step.
        let outcomes = on(n, |comm| {
            let refused = allreduce_of(comm, &[8], DType::F16, ReduceOp::Sum, "mpi");
            (refused, in_step(comm))
        });
        for (outcome, in_step) in outcomes {
            assert!(
                matches!(outcome, Err(CoreError::InvalidArgument(_))),
                "{outcome:?}"
            );
            assert!(in_step);
        }
    }
}

#[test]
fn broadcast_allgather_reduce_scatter_and_group_disagreements_are_mismatches() {
    every_rank_mismatches("broadcast shape", &["uint8[4]", "uint8[5]"], |c, odd| {
        let mut b = vec![0u8; 4 + usize::from(odd)];
        let shape = [b.len()];
        broadcast_on(
            c,
            Array {
                bytes: &mut b,
                dtype: "uint8",
                shape: &shape,
            },
            0,
            "auto",
            0,
        )
    });
    every_rank_mismatches("broadcast dtype", &["uint8[4]", "int8[4]"], |c, odd| {
        let mut b = vec![0u8; 4];
        let dtype = if odd { "int8" } else { "uint8" };
        broadcast_on(
            c,
            Array {
                bytes: &mut b,
                dtype,
                shape: &[4],
            },
            0,
            "auto",
            0,
        )
    });
    every_rank_mismatches(
        "broadcast root",
        &["from root 0", "from root 1"],
        |c, odd| {
            let mut b = vec![0u8; 4];
            broadcast_on(
                c,
                Array {
                    bytes: &mut b,
                    dtype: "uint8",
                    shape: &[4],
                },
                usize::from(odd),
                "auto",
                0,
            )
        },
    );
    every_rank_mismatches(
        "allgather trailing",
        &["float32[2, 3]", "float32[2, 4]"],
        |c, odd| {
            let cols = 3 + usize::from(odd);
            let input = vec![0u8; 2 * cols * 4];
            allgather_on(c, &input, "float32", 4, &[2, cols], "auto", 0).map(|_| ())
        },
    );
    every_rank_mismatches(
        "allgather dtype",
        &["float32[2, 3]", "int32[2, 3]"],
        |c, odd| {
            let input = vec![0u8; 24];
            let dtype = if odd { "int32" } else { "float32" };
            allgather_on(c, &input, dtype, 4, &[2, 3], "auto", 0).map(|_| ())
        },
    );
    every_rank_mismatches(
        "alltoall trailing",
        &["alltoall", "float32[", ", 3]", ", 4]"],
        |c, odd| {
            let cols = 3 + usize::from(odd);
            let n = c.size();
            let input = vec![0u8; n * cols * 4];
            alltoall_on(c, &input, "float32", 4, &[n, cols], &vec![1; n], "auto", 0).map(|_| ())
        },
    );
    every_rank_mismatches("reduce_scatter op", &["sum", "max"], |c, odd| {
        let n = c.size();
        let input = vec![0u8; 4 * n];
        let op = if odd { ReduceOp::Max } else { ReduceOp::Sum };
        let counts = vec![1; n];
        reduce_scatter_on(c, &input, DType::F32, op, &[n], &counts, "auto", 0).map(|_| ())
    });
    every_rank_mismatches("reduce root", &["reduce", "root 0", "root 1"], |c, odd| {
        let input = vec![0u8; 8];
        let root = usize::from(odd);
        let mut out = vec![0u8; 8];
        let data = if c.rank() == root {
            Data::Into(&input, &mut out)
        } else {
            Data::Read(&input)
        };
        reduce_on(c, data, DType::F32, ReduceOp::Sum, &[2], root, "auto", 0).map(|_| ())
    });
    every_rank_mismatches("reduce algorithm", &["k_chain", "binomial"], |c, odd| {
        let input = vec![0u8; 8];
        let name = if odd { "k_chain" } else { "binomial" };
        let mut out = vec![0u8; 8];
        let data = if c.rank() == 0 {
            Data::Into(&input, &mut out)
        } else {
            Data::Read(&input)
        };
        reduce_on(c, data, DType::F32, ReduceOp::Sum, &[2], 0, name, 0).map(|_| ())
    });
    every_rank_mismatches("reduce_scatter counts", &["into rows"], |c, odd| {
        let n = c.size();
        let input = vec![0u8; 4 * 2 * n];
        let mut counts = vec![2; n];
        if odd {
            counts[0] = 3;
            counts[n - 1] = 1;
        }
        reduce_scatter_on(
            c,
            &input,
            DType::F32,
            ReduceOp::Sum,
            &[2 * n],
            &counts,
            "auto",
            0,
        )
        .map(|_| ())
    });
    every_rank_mismatches("group shapes", &["[3], [5]", "[3], [4]"], |c, odd| {
        let mut a = [0f32; 3];
        let mut b = [0f32; 5];
        let second = if odd { 4 } else { 5 };
        let group = Group {
            dtype: DType::F32,
            wire: DType::F32,
            op: ReduceOp::Sum,
            algorithm: "ring".into(),
            prescale: 1.0,
            postscale: 1.0,
            fusion_bytes: 1 << 20,
            pack_below: Some(0),
            shapes: smallvec![smallvec![3], smallvec![second]],
            thread: 0,
            set: _core::runtime::process::WORLD,
        };
        let mut arrays: Vec<&mut [u8]> = vec![
            bytemuck::cast_slice_mut(&mut a),
            &mut bytemuck::cast_slice_mut(&mut b)[..second * 4],
        ];
        allreduce_group_on(c, &mut arrays, &group)
    });
}

#[test]
fn settings_are_part_of_every_call() {
    type Change = fn(&mut Settings);
    let changes: [(Change, &str); 3] = [
        (
            |s| s.tuning.segment_bytes = 1024,
            ", with segment_bytes=1024",
        ),
        // Calibration's choice as much as the user's: the pieces must agree on both ends.
        (
            |s| s.calibrated_across_bytes = 4096,
            ", with across_message_bytes=4096",
        ),
        (
            |s| s.across_message_bytes = Some(512),
            ", with across_message_bytes=512",
        ),
    ];
    for (change, said) in changes {
        for n in GROUPS {
            let outcomes = on(n, |comm| {
                if comm.rank() == n - 1 {
                    let mut settings = comm.settings();
                    change(&mut settings);
                    comm.set_settings(settings).expect("valid settings");
                }
                allreduce_of(comm, &[8], DType::F32, ReduceOp::Sum, "pipelined_ring")
            });
            for outcome in outcomes {
                match outcome {
                    Err(CoreError::Mismatch(message)) => {
                        assert!(message.contains(said), "{message}")
                    }
                    other => panic!("N={n}: {other:?}"),
                }
            }
        }
    }
}

#[test]
fn the_stall_inspector_names_who_waits_for_whom_and_who_has_not_joined() {
    let messages: Arc<Mutex<Vec<String>>> = Arc::default();
    let sink: Sink = {
        let messages = messages.clone();
        Arc::new(move |m: &str| messages.lock().expect("lock").push(m.to_string()))
    };
    let policy = StallPolicy {
        warning: Some(Duration::from_millis(300)),
        timeout: None,
    };
    let results = on_ranks(3, policy, sink, |comm| {
        if comm.rank() == 2 {
            std::thread::sleep(Duration::from_millis(1500)); // late to the collective
        }
        let mut x = buffer(&[1.0; 4]);
        let bytes = bytemuck::cast_slice_mut(&mut x);
        allreduce_on(comm, bytes, DType::F32, ReduceOp::Sum, &[4], "ring", 0).expect("joins");
        x
    });
    assert!(
        results.iter().all(|x| x == &vec![3.0; 4]),
        "the late rank still takes part"
    );
    let messages = messages.lock().expect("lock").clone();
    let waited = |rank: usize| {
        messages.iter().any(|m| {
            m.starts_with(&format!("ringlet: rank {rank} has waited"))
                && m.contains("in allreduce #0 of float32[4] sum (ring) for rank")
                && m.contains("RINGLET_STALL_WARNING=0.3")
        })
    };
    assert!(waited(0) && waited(1), "{messages:#?}");
    assert!(
        messages.iter().any(|m| m
            .starts_with("ringlet: allreduce #0 of float32[4] sum (ring) has waited")
            && m.contains("rank(s) 2 (host host1) have not joined it")),
        "{messages:#?}"
    );
}

/// `n` ranks in one node (shared memory) and `n` ranks on as many nodes (messages).
fn both_kinds_of_group(n: usize) -> [Vec<LocalTransport>; 2] {
    [
        LocalTransport::group(n),
        LocalTransport::cluster(&(0..n).collect::<Vec<_>>()),
    ]
}

/// The error of a call on a rank that waits for one that has left, with how long it took.
fn timed(call: impl FnOnce() -> Result<(), CoreError>) -> (String, Duration) {
    let started = std::time::Instant::now();
    let error = call().expect_err("a call that needs a departed rank must fail");
    assert!(
        matches!(error, CoreError::Communication(_)),
        "RingletError expected, got {error:?}"
    );
    (error.to_string(), started.elapsed())
}

fn sum_of_ones(comm: &Communicator) -> Result<(), CoreError> {
    let mut x = buffer(&[1.0; 5]);
    let bytes = bytemuck::cast_slice_mut(&mut x);
    allreduce_on(comm, bytes, DType::F32, ReduceOp::Sum, &[5], "ring", 0)?;
    assert_eq!(x, vec![comm.size() as f32; 5]);
    Ok(())
}

#[test]
fn a_rank_that_shuts_down_makes_the_others_raise_within_seconds_and_at_every_later_call() {
    for n in GROUPS {
        for transports in both_kinds_of_group(n) {
            let leaver = n - 1;
            let left = std::sync::Barrier::new(n);
            let errors = on_transports(transports, StallPolicy::default(), quiet(), |comm| {
                sum_of_ones(comm).expect("first");
                sum_of_ones(comm).expect("second");
                if comm.rank() == leaver {
                    comm.depart();
                    left.wait(); // keep its transport until the others have seen it go
                    return None;
                }
                let (waiting, seconds) = timed(|| sum_of_ones(comm));
                let (later, _) = timed(|| barrier_on(comm, 0));
                left.wait();
                Some((waiting, seconds, later))
            });
            for (rank, found) in errors.into_iter().enumerate().take(leaver) {
                let (waiting, seconds, later) = found.expect("an error");
                // on_transports puts ranks 2r and 2r+1 on host r: named when the hosts differ.
                let host = if n > 2 {
                    format!(" (host host{})", leaver / 2)
                } else {
                    String::new()
                };
                assert!(
                    waiting.starts_with(&format!("rank {leaver}{host} has shut down")),
                    "rank {rank} of {n}: {waiting}"
                );
                // It raises while it waits in #2, or as it starts #2 if its wait in #1
                // already brought the notice.
                let expected = |doing: &str| {
                    format!(
                        "has shut down ringlet (ringlet.shutdown() or the end of its program) \
                         after 2 collectives while this rank {doing} allreduce #2 of \
                         float32[5] sum (ring); no collective on this communicator can complete \
                         without it"
                    )
                };
                assert!(
                    waiting.contains(&expected("waits in"))
                        || waiting.contains(&expected("starts")),
                    "rank {rank} of {n}: {waiting}"
                );
                assert!(seconds < Duration::from_secs(5), "{seconds:?}");
                assert!(
                    later.contains("after 2 collectives while this rank starts barrier #3"),
                    "{later}"
                );
            }
        }
    }
}

#[test]
fn a_slow_rank_is_never_taken_for_one_that_left() {
    for transports in both_kinds_of_group(3) {
        let results = on_transports(transports, StallPolicy::default(), quiet(), |comm| {
            if comm.rank() == 1 {
                std::thread::sleep(Duration::from_secs(3));
            }
            sum_of_ones(comm).and_then(|_| sum_of_ones(comm))
        });
        assert!(results.iter().all(Result::is_ok), "{results:?}");
    }
}

#[test]
fn a_rank_that_leaves_while_the_others_have_joined_makes_them_raise() {
    for n in GROUPS {
        for transports in both_kinds_of_group(n) {
            let leaver = n - 1;
            let left = std::sync::Barrier::new(n);
            let errors = on_transports(transports, StallPolicy::default(), quiet(), |comm| {
                if comm.rank() == leaver {
                    // One more allreduce, which the joined ranks take part in with zeros, then
                    // it leaves without joining.
                    let mut x = buffer(&[1.0; 5]);
                    let bytes = bytemuck::cast_slice_mut(&mut x);
                    allreduce_on(comm, bytes, DType::F32, ReduceOp::Sum, &[5], "ring", 0)
                        .expect("replayed by the joined ranks");
                    assert_eq!(x, vec![1.0; 5]);
                    comm.depart();
                    left.wait();
                    return None;
                }
                let (error, seconds) = timed(|| join_on(comm, 0).map(|_| ()));
                left.wait();
                Some((error, seconds))
            });
            for found in errors.into_iter().take(leaver) {
                let (error, seconds) = found.expect("an error");
                assert!(
                    error.starts_with(&format!("rank {leaver} "))
                        && (error.contains("after 1 collective while this rank waits in join #1")
                            || error.contains("after 1 collective while this rank starts join #1")),
                    "{error}"
                );
                assert!(seconds < Duration::from_secs(5), "{seconds:?}");
            }
        }
    }
}

#[test]
fn hosts_are_gathered_in_rank_order() {
    let hosts = on(5, |comm| comm.hosts().to_vec());
    for list in hosts {
        assert_eq!(list, ["host0", "host0", "host1", "host1", "host2"]);
    }
}

#[test]
fn settings_are_checked() {
    let results = on(1, |comm| {
        let before = comm.settings();
        let bad = [
            Settings {
                max_message_bytes: 0,
                ..before
            },
            Settings {
                across_message_bytes: Some(0),
                ..before
            },
            Settings {
                calibrated_across_bytes: usize::MAX,
                ..before
            },
        ];
        let refused = bad.map(|settings| comm.set_settings(settings).is_err());
        (refused, comm.settings() == before)
    });
    assert_eq!(
        results[0],
        ([true; 3], true),
        "refused each, and kept the settings"
    );
}

#[test]
fn the_users_limit_between_nodes_wins_over_calibrations() {
    let settings = Settings {
        calibrated_across_bytes: 4096,
        ..Settings::default()
    };
    assert_eq!(settings.limits().across, 4096);
    let chosen = Settings {
        across_message_bytes: Some(100),
        ..settings
    };
    assert_eq!(chosen.limits().across, 100);
    assert_eq!(chosen.limits().any, DEFAULT_MAX_MESSAGE_BYTES);
}

#[test]
fn alltoall_sends_each_rank_its_rows_and_refuses_bad_splits_in_step() {
    for n in GROUPS {
        // Rank r sends rank q (r + q) % 3 rows of 2 float32s, each row holding (r, q).
        let outcomes = on(n, |comm| {
            let me = comm.rank();
            let splits: Vec<usize> = (0..n).map(|q| (me + q) % 3).collect();
            let rows: Vec<f32> = (0..n)
                .flat_map(|q| std::iter::repeat_n([me as f32, q as f32], (me + q) % 3).flatten())
                .collect();
            let shape = [splits.iter().sum(), 2];
            let received = alltoall_on(
                comm,
                &f32_bytes(&rows),
                "float32",
                4,
                &shape,
                &splits,
                "auto",
                0,
            )
            .expect("alltoall");
            let bad = alltoall_on(
                comm,
                &f32_bytes(&rows),
                "float32",
                4,
                &shape,
                &splits[..n - usize::from(me == 0)],
                "auto",
                0,
            );
            (received, bad.map(|_| ()), in_step(comm))
        });
        for (me, (received, bad, in_step)) in outcomes.into_iter().enumerate() {
            let expected: Vec<f32> = (0..n)
                .flat_map(|r| std::iter::repeat_n([r as f32, me as f32], (r + me) % 3).flatten())
                .collect();
            let got: &[f32] = bytemuck::cast_slice(&received.storage);
            assert_eq!(&got[..expected.len()], &expected[..], "N={n} rank {me}");
            assert_eq!(received.bytes, expected.len() * 4);
            assert_eq!(
                received.counts,
                (0..n).map(|r| (r + me) % 3).collect::<Vec<_>>()
            );
            match (me, bad) {
                (0, Err(CoreError::InvalidArgument(m))) => {
                    assert!(m.contains("one split per rank"), "{m}")
                }
                (_, Err(CoreError::Mismatch(m))) => assert!(m.contains("which it refused"), "{m}"),
                (rank, other) => panic!("N={n} rank {rank}: {other:?}"),
            }
            assert!(in_step, "N={n} rank {me}");
        }
    }
}

/// The group of `a_joined_rank_...`: three arrays, fused two ways, with factors.
fn joined_group(wire: DType, pack_below: usize) -> Group {
    Group {
        dtype: DType::F32,
        wire,
        op: ReduceOp::Avg,
        algorithm: "ring".into(),
        prescale: 2.0,
        postscale: 0.5,
        fusion_bytes: 24,
        pack_below: Some(pack_below),
        shapes: smallvec![smallvec![3], smallvec![5], smallvec![2]],
        thread: 0,
        set: _core::runtime::process::WORLD,
    }
}

#[test]
fn a_joined_rank_adds_zeros_to_sum_and_avg_allreduces_until_every_rank_joins() {
    for n in GROUPS {
        for first in 0..n {
            let results = on(n, |comm| {
                let rank = comm.rank();
                if rank == first {
                    let last = join_on(comm, 0).expect("join");
                    return (last, Vec::new());
                }
                let value = rank as f32 + 1.0;
                let mut outputs = Vec::new();
                for (op, algorithm) in [
                    (ReduceOp::Sum, "ring"),
                    (ReduceOp::Avg, "halving_doubling"),
                    (ReduceOp::Sum, "recursive_doubling"),
                    (ReduceOp::Avg, "pipelined_ring"),
                ] {
                    let mut x = buffer(&[value; 37]);
                    let bytes = bytemuck::cast_slice_mut(&mut x);
                    allreduce_on(comm, bytes, DType::F32, op, &[37], algorithm, 0).expect("op");
                    outputs.push(x);
                }
                // In place, packed, and compressed (bfloat16 on the wire).
                for (wire, pack_below) in [(DType::F32, 0), (DType::F32, 1 << 20), (DType::BF16, 0)]
                {
                    let group = joined_group(wire, pack_below);
                    let (mut a, mut b, mut c) = (vec![value; 3], vec![value; 5], vec![value; 2]);
                    let mut arrays: Vec<&mut [u8]> = vec![
                        bytemuck::cast_slice_mut(&mut a),
                        bytemuck::cast_slice_mut(&mut b),
                        bytemuck::cast_slice_mut(&mut c),
                    ];
                    allreduce_group_on(comm, &mut arrays, &group).expect("group");
                    outputs.extend([a, b, c]);
                }
                (join_on(comm, 0).expect("join"), outputs)
            });
            // The joined rank adds nothing; avg still divides by every rank, as Horovod's does.
            let sum: f32 = (0..n).filter(|&r| r != first).map(|r| r as f32 + 1.0).sum();
            let avg = sum / n as f32;
            let scaled = 2.0 * avg * 0.5;
            let expected = [sum, avg, sum, avg];
            let last = results[0].0;
            assert_ne!(last, first, "the first to join cannot be the last (n={n})");
            for (rank, (joined_last, outputs)) in results.iter().enumerate() {
                assert_eq!(*joined_last, last, "every rank names the same last rank");
                if rank == first {
                    continue;
                }
                for (x, want) in outputs.iter().zip(expected) {
                    assert_eq!(x, &vec![want; 37], "n={n} first={first}");
                }
                for array in &outputs[4..] {
                    // Within bfloat16's precision for the compressed group.
                    assert!(array
                        .iter()
                        .all(|&v| (v - scaled).abs() <= scaled.abs() / 64.0));
                }
            }
        }
    }
}

#[test]
fn other_calls_while_a_rank_has_joined_raise_on_the_others_and_keep_them_in_step() {
    for n in GROUPS {
        let results = on(n, |comm| {
            if comm.rank() == 0 {
                return (join_on(comm, 0).expect("join"), Vec::new());
            }
            let mut errors = Vec::new();
            let mut rows = buffer(&[1.0; 4]);
            let bytes = bytemuck::cast_slice_mut(&mut rows);
            errors.push(allgather_on(comm, bytes, "float32", 4, &[4], "auto", 0).err());
            let mut root = buffer(&[1.0; 4]);
            let array = Array {
                bytes: bytemuck::cast_slice_mut(&mut root),
                dtype: "float32",
                shape: &[4],
            };
            errors.push(broadcast_on(comm, array, 1, "auto", 0).err());
            errors.push(allreduce_of(comm, &[5], DType::F32, ReduceOp::Max, "ring").err());
            errors.push(barrier_on(comm, 0).err());
            (
                join_on(comm, 0).expect("join"),
                errors
                    .into_iter()
                    .map(|e| e.map(|e| e.to_string()))
                    .collect(),
            )
        });
        for (rank, (last, errors)) in results.iter().enumerate() {
            assert_eq!(*last, n - 1, "the highest rank of those that joined last");
            if rank == 0 {
                continue;
            }
            assert_eq!(errors.len(), 4);
            for error in errors {
                let text = error
                    .as_deref()
                    .expect("a call while rank 0 has joined must fail");
                assert!(
                    text.contains("rank 0 has joined") && text.contains("rank 0 passed join"),
                    "{text}"
                );
            }
        }
    }
}

#[test]
fn join_on_one_rank_returns_at_once_and_every_rank_joining_together_agrees() {
    assert_eq!(on(1, |comm| join_on(comm, 0).expect("join")), vec![0]);
    for n in GROUPS {
        let lasts = on(n, |comm| join_on(comm, 0).expect("join"));
        assert_eq!(lasts, vec![n - 1; n]);
        assert!(on(n, |comm| join_on(comm, 0).is_ok() && in_step(comm))
            .iter()
            .all(|&ok| ok));
    }
}

#[test]
fn a_departure_counts_only_for_collectives_the_rank_never_made_and_only_on_its_communicator() {
    use _core::runtime::call::{Call, Kind, Label};
    use _core::runtime::stall::StallInspector;
    use _core::transport::{Transport, Watcher};
    let transports = LocalTransport::group(2);
    let inspector = |key| {
        StallInspector::new(
            StallPolicy::default(),
            key,
            vec!["h".into(); 2],
            vec![4, 6],
            quiet(),
        )
    };
    let (mine, theirs, earlier) = (inspector(42), inspector(42), inspector(7));
    // Rank 1 made 3 collectives (#0-#2) and left; a notice of an earlier communicator (another
    // key, as after shutdown() and init()) says it left after none.
    transports[1]
        .send_notice(0, theirs.departure(3))
        .expect("sent");
    transports[1]
        .send_notice(0, earlier.departure(0))
        .expect("sent");
    let barrier = Call::new(Kind::Barrier, 0);
    let wait = |seq| {
        mine.enter(Label::of(&barrier, seq));
        mine.waiting(&transports[0], 1, Duration::from_millis(100), &mut 0)
    };
    // It took part in #2, so its data for #2 is on the way (it left right after sending).
    assert_eq!(wait(2), Ok(()));
    let error = wait(3).expect_err("rank 1 never made #3");
    assert!(
        error.to_string().starts_with("rank 6 has shut down")
            && error
                .to_string()
                .contains("after 3 collectives while this rank waits in barrier #3"),
        "{error}"
    );
}

#[test]
fn a_rank_knows_when_every_other_rank_has_left_and_only_then() {
    for n in [2, 3, 5] {
        for transports in both_kinds_of_group(n) {
            let stayer = n - 1;
            let all_left = std::sync::Barrier::new(n);
            let heard = on_transports(transports, StallPolicy::default(), quiet(), |comm| {
                sum_of_ones(comm).expect("an allreduce first");
                if comm.rank() != stayer {
                    comm.depart();
                }
                all_left.wait(); // every notice has been sent
                let before_the_last = comm.all_others_departed();
                all_left.wait();
                if comm.rank() == stayer {
                    comm.depart();
                }
                all_left.wait();
                (before_the_last, comm.all_others_departed())
            });
            for (rank, (before_the_last, after)) in heard.into_iter().enumerate() {
                // Only the rank that stays has heard every other one before it leaves.
                assert_eq!(before_the_last, rank == stayer, "rank {rank} of {n}");
                assert!(
                    after,
                    "rank {rank} of {n} did not hear every other rank leave"
                );
            }
        }
    }
}

#[test]
fn of_several_ranks_that_left_the_one_that_left_first_is_named() {
    use _core::runtime::call::{Call, Kind, Label};
    use _core::runtime::stall::StallInspector;
    use _core::transport::{Transport, Watcher};
    let transports = LocalTransport::group(3);
    let inspector = || {
        StallInspector::new(
            StallPolicy::default(),
            9,
            vec!["h".into(); 3],
            vec![],
            quiet(),
        )
    };
    let (mine, theirs) = (inspector(), inspector());
    // Rank 2 left after 4 collectives; rank 1 then made one more and left too (because of it).
    transports[1]
        .send_notice(0, theirs.departure(5))
        .expect("sent");
    transports[2]
        .send_notice(0, theirs.departure(4))
        .expect("sent");
    mine.enter(Label::of(&Call::new(Kind::Broadcast, 0), 5));
    let error = mine
        .waiting(&transports[0], 1, Duration::from_millis(100), &mut 0)
        .expect_err("neither made #5");
    assert!(
        error
            .to_string()
            .starts_with("rank 2 has shut down ringlet (ringlet.shutdown() or the end of its program) after 4 collectives"),
        "{error}"
    );
}
