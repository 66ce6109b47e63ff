//! The reduce schedules on in-process ranks: exact against the reference at every rank count,
//! root, count, dtype and op, and each sending what its algorithm says.

use crate::common::*;
use _core::dtype::{DType, ReduceOp};
use _core::schedules::reduce::k_chain::{chain, chains};
use _core::schedules::{Reduce, Reduction, REDUCE};
use _core::transport::local::LocalTransport;
use _core::transport::Transport;

const RANK_COUNTS: [usize; 14] = [1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 13, 16, 17, 24];

/// The schedules that run on in-process ranks (not "mpi").
fn schedules() -> Vec<&'static dyn Reduce> {
    REDUCE
        .iter()
        .copied()
        .filter(|s| s.name() != "mpi")
        .collect()
}

struct Outcome {
    buf: Vec<u8>,
    bytes_sent: usize,
    messages_sent: usize,
    unreceived: usize,
}

/// Run `schedule` with `inputs[r]` at rank r (each rank a thread) on `transports`.
fn run_on(
    schedule: &dyn Reduce,
    transports: Vec<LocalTransport>,
    inputs: Vec<Vec<u8>>,
    root: usize,
    dtype: DType,
    op: ReduceOp,
) -> Vec<Outcome> {
    let n = inputs.len();
    let reduction = Reduction {
        ranks: n,
        ..Reduction::plain(dtype, op)
    };
    let done: Vec<(Vec<u8>, LocalTransport)> = std::thread::scope(|scope| {
        let handles: Vec<_> = transports
            .into_iter()
            .zip(inputs)
            .map(|(t, input)| {
                scope.spawn(move || {
                    let mut buf = aligned_copy(&input);
                    if n > 1 {
                        if let Err(e) = schedule.run(&t, buf.as_mut_slice(), root, &reduction) {
                            panic!("{} rank {}: {e}", schedule.name(), t.rank());
                        }
                    }
                    (buf.as_slice().to_vec(), t)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a rank panicked"))
            .collect()
    });
    done.into_iter()
        .map(|(buf, t)| Outcome {
            buf,
            bytes_sent: t.bytes_sent(),
            messages_sent: t.messages_sent(),
            unreceived: t.unreceived_messages(),
        })
        .collect()
}

fn run(
    schedule: &dyn Reduce,
    inputs: Vec<Vec<u8>>,
    root: usize,
    dtype: DType,
    op: ReduceOp,
) -> Vec<Outcome> {
    let transports = LocalTransport::group(inputs.len());
    run_on(schedule, transports, inputs, root, dtype, op)
}

fn roots(n: usize) -> Vec<usize> {
    let mut roots = vec![0, n / 2, n - 1];
    roots.dedup();
    roots
}

#[test]
fn every_reduce_schedule_is_exact_at_every_rank_count_root_count_dtype_and_op() {
    for schedule in schedules() {
        for n in walked_rank_counts(&RANK_COUNTS) {
            for count in [0, 1, n + 1, 1000] {
                for root in roots(n) {
                    // Every dtype and op at a few rank counts, sum and max at the rest.
                    let ops: &[ReduceOp] = if n <= 5 || n == 13 {
                        &ReduceOp::ALL
                    } else {
                        &[ReduceOp::Sum, ReduceOp::Max]
                    };
                    for dtype in DType::ALL {
                        for &op in ops {
                            let per_rank: Vec<Vec<f64>> = (0..n)
                                .map(|r| (0..count).map(|i| exact_value(r, i, op)).collect())
                                .collect();
                            let inputs = per_rank.iter().map(|v| encode(dtype, v)).collect();
                            // The schedule combines; avg's division is the runtime's.
                            let expected = reference(dtype, op.combining(), &per_rank);
                            let outcomes = run(schedule, inputs, root, dtype, op);
                            let what = format!(
                                "{} N={n} root={root} count={count} {} {}",
                                schedule.name(),
                                dtype.name(),
                                op.name()
                            );
                            assert!(outcomes[root].buf == expected, "{what}: wrong result");
                            assert!(outcomes.iter().all(|o| o.unreceived == 0), "{what}");
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn a_non_power_of_two_fold_and_a_rotated_root_still_give_the_root_everything() {
    // Float noise: an answer that depends on which ranks were combined, not only how many.
    let (n, count) = (13, 4099);
    let per_rank: Vec<Vec<f64>> = (0..n).map(|r| noise(r as u64 + 1, count)).collect();
    let expected: Vec<f64> = (0..count)
        .map(|i| per_rank.iter().map(|v| v[i]).sum::<f64>())
        .collect();
    for schedule in schedules() {
        for root in 0..n {
            let inputs = per_rank.iter().map(|v| encode(DType::F64, v)).collect();
            let outcomes = run(schedule, inputs, root, DType::F64, ReduceOp::Sum);
            let got = decode(DType::F64, &outcomes[root].buf);
            for (i, (g, e)) in got.iter().zip(&expected).enumerate() {
                assert!(
                    (g - e).abs() <= 1e-9 * e.abs().max(1.0),
                    "{} root={root} element {i}: {g} != {e}",
                    schedule.name()
                );
            }
        }
    }
}

#[test]
fn k_chain_uses_the_ceiling_of_the_square_root_of_the_other_ranks() {
    for (ranks, k) in [
        (2, 1),
        (3, 2),
        (5, 2),
        (6, 3),
        (10, 3),
        (11, 4),
        (17, 4),
        (18, 5),
        (101, 10),
    ] {
        assert_eq!(chains(ranks), k, "N={ranks}");
        // The chains cover ranks 1..N, consecutive, lengths differing by at most one.
        let lengths: Vec<usize> = (0..k).map(|c| chain(ranks, k, c).len()).collect();
        assert_eq!(chain(ranks, k, 0).start, 1);
        for c in 1..k {
            assert_eq!(chain(ranks, k, c).start, chain(ranks, k, c - 1).end);
        }
        assert_eq!(chain(ranks, k, k - 1).end, ranks);
        assert!(lengths.iter().max().unwrap() - lengths.iter().min().unwrap() <= 1);
    }
}

/// Bytes and messages each rank sends, against each algorithm's description.
#[test]
fn each_schedule_sends_what_its_algorithm_says() {
    let count = 1 << 12; // divisible by every power of two used below
    let m = count * 4;
    for n in [2usize, 3, 4, 8, 10, 16] {
        let inputs: Vec<Vec<u8>> = (0..n)
            .map(|_| encode(DType::F32, &vec![1.0; count]))
            .collect();
        for schedule in schedules() {
            let outcomes = run(schedule, inputs.clone(), 0, DType::F32, ReduceOp::Sum);
            let sent: Vec<usize> = outcomes.iter().map(|o| o.bytes_sent).collect();
            let messages: usize = outcomes.iter().map(|o| o.messages_sent).sum();
            match schedule.name() {
                // Every rank but the root sends its partial result once.
                "binomial" | "k_chain" => {
                    assert_eq!(sent[0], 0, "{} N={n}", schedule.name());
                    assert!(
                        sent[1..].iter().all(|&b| b == m),
                        "{} N={n}: {sent:?}",
                        schedule.name()
                    );
                    assert_eq!(messages, n - 1, "{} N={n}", schedule.name());
                }
                "reduce_scatter_gather" if n.is_power_of_two() => {
                    // Halving: (p-1)/p·m per rank. The gather: in each of its log2 p steps half
                    // the ranks still in it send what they hold, m/2 in all; the root sends
                    // nothing then and receives (p-1)/p·m.
                    let halving = (n - 1) * m / n;
                    let gathered: usize = sent.iter().map(|b| b - halving).sum();
                    assert!(sent.iter().all(|&b| b >= halving), "N={n}: {sent:?}");
                    assert_eq!(sent[0], halving, "N={n}: the root sends only while halving");
                    assert_eq!(
                        gathered,
                        n.trailing_zeros() as usize * m / 2,
                        "N={n}: {sent:?}"
                    );
                }
                "reduce_scatter_gather" => {
                    // Folded ranks hand over the whole vector, in two halves.
                    let folded = n - n.next_power_of_two() / 2;
                    assert!(
                        sent.iter().filter(|&&b| b == m).count() >= folded,
                        "N={n}: {sent:?}"
                    );
                }
                other => panic!("no expectation for {other}"),
            }
        }
    }
}

#[test]
fn k_chain_root_receives_one_message_per_chain() {
    for n in [2usize, 5, 10, 17, 26] {
        let k = chains(n);
        let inputs: Vec<Vec<u8>> = (0..n)
            .map(|r| encode(DType::I64, &vec![r as f64; 64]))
            .collect();
        let transports = LocalTransport::group(n);
        let kchain = REDUCE
            .iter()
            .find(|s| s.name() == "k_chain")
            .expect("registered");
        let outcomes = run_on(*kchain, transports, inputs, 0, DType::I64, ReduceOp::Sum);
        let heads: Vec<usize> = (0..k).map(|c| chain(n, k, c).start).collect();
        for (rank, o) in outcomes.iter().enumerate().skip(1) {
            assert_eq!(o.messages_sent, 1, "N={n} rank {rank}");
        }
        let expected: f64 = (0..n).map(|r| r as f64).sum();
        assert!(decode(DType::I64, &outcomes[0].buf)
            .iter()
            .all(|&v| v == expected));
        assert_eq!(heads.len(), k);
    }
}

#[test]
fn auto_prices_every_algorithm_and_takes_the_cheapest_that_runs_here() {
    use _core::auto::{choose_cheapest, Parameters, Pricing};
    use _core::schedules::Tuning;
    let transports = LocalTransport::group(8);
    let here = &transports[0];
    let tuning = Tuning::default();
    let model = Parameters::default();
    let pricing = Pricing {
        parameters: &model,
        tuning: &tuning,
        corrected: false,
    };
    let pick = |bytes: usize, dtype: DType| {
        choose_cheapest(REDUCE, here, pricing, bytes, Some((dtype, ReduceOp::Sum)))
            .expect("something runs")
            .name()
    };
    // Default model: latency decides small messages, bandwidth large ones.
    assert_eq!(pick(8, DType::F32), "binomial");
    assert_eq!(pick(64 << 20, DType::F32), "reduce_scatter_gather");
    // "mpi" needs an MPI communicator: never picked in process.
    for bytes in [0, 8, 1 << 10, 1 << 16, 1 << 24] {
        assert_ne!(pick(bytes, DType::F64), "mpi");
    }
    // The pick is the minimum of the model's prices.
    for bytes in [8usize, 4 << 10, 256 << 10, 16 << 20] {
        let price = |name: &str| {
            let a = REDUCE
                .iter()
                .find(|a| a.name() == name)
                .expect("registered");
            model.seconds(&a.cost_on(here.nodes(), bytes, &tuning), Some(DType::F32))
        };
        let chosen = pick(bytes, DType::F32);
        for other in ["binomial", "k_chain", "reduce_scatter_gather"] {
            assert!(
                price(chosen) <= price(other),
                "{bytes} B: {chosen} over {other}"
            );
        }
    }
}
