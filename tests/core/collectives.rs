//! Every registered broadcast and allgather schedule on in-process ranks: the right bytes at
//! every rank count, root and block layout, and the traffic each algorithm promises.

use _core::schedules::{Allgather, Broadcast, ALLGATHER, BROADCAST};
use _core::transport::local::LocalTransport;
use _core::transport::Transport;
use std::ops::Range;

const RANK_COUNTS: [usize; 13] = [1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 13, 16, 17];

/// (buffer, bytes sent, messages sent, messages left unreceived) per rank.
type Outcome = (Vec<u8>, usize, usize, usize);

fn on_ranks(n: usize, body: impl Fn(&LocalTransport) -> Vec<u8> + Sync) -> Vec<Outcome> {
    on_nodes(&vec![0; n], body)
        .into_iter()
        .map(|(outcome, _)| outcome)
        .collect()
}

/// [`on_ranks`] on ranks laid out on nodes (rank r on `labels[r]`), with each rank's bytes
/// sent to other nodes.
fn on_nodes(
    labels: &[usize],
    body: impl Fn(&LocalTransport) -> Vec<u8> + Sync,
) -> Vec<(Outcome, usize)> {
    let transports = LocalTransport::cluster(labels);
    std::thread::scope(|scope| {
        let body = &body;
        let handles: Vec<_> = transports
            .into_iter()
            .map(|t| {
                scope.spawn(move || {
                    let buf = body(&t);
                    (buf, t)
                })
            })
            .collect();
        let done: Vec<(Vec<u8>, LocalTransport)> = handles
            .into_iter()
            .map(|h| h.join().expect("a rank panicked"))
            .collect();
        done.into_iter()
            .map(|(buf, t)| {
                let (sent, messages) = (t.bytes_sent(), t.messages_sent());
                (
                    (buf, sent, messages, t.unreceived_messages()),
                    t.bytes_across(),
                )
            })
            .collect()
    })
}

fn broadcast_run(schedule: &dyn Broadcast, n: usize, len: usize, root: usize) -> Vec<Outcome> {
    on_ranks(n, |t| {
        let rank = t.rank();
        let mut buf: Vec<u8> = (0..len).map(|i| (i * 7 + rank * 31) as u8).collect();
        if n > 1 {
            schedule.run(t, &mut buf, root).expect("broadcast");
        }
        buf
    })
}

#[test]
fn every_broadcast_delivers_the_roots_bytes_to_every_rank() {
    for schedule in BROADCAST {
        for n in RANK_COUNTS {
            for len in [0, 1, n.saturating_sub(1), n + 1, 1000, 65537] {
                let mut roots = vec![0, n / 2, n - 1];
                roots.dedup();
                for root in roots {
                    let expected: Vec<u8> = (0..len).map(|i| (i * 7 + root * 31) as u8).collect();
                    for (rank, (buf, _, _, left)) in broadcast_run(*schedule, n, len, root)
                        .into_iter()
                        .enumerate()
                    {
                        let what = format!("{} N={n} len={len} root={root}", schedule.name());
                        assert!(buf == expected, "{what}: rank {rank} differs");
                        assert_eq!(left, 0, "{what}: messages left unreceived");
                    }
                }
            }
        }
    }
}

#[test]
fn scatter_allgather_sends_the_root_a_share_where_the_tree_sends_it_all() {
    let find = |name: &str| {
        *BROADCAST
            .iter()
            .find(|b| b.name() == name)
            .expect("registered")
    };
    let len = 1 << 16;
    for n in [2usize, 4, 8, 16] {
        let tree = broadcast_run(find("binomial"), n, len, 0);
        let scatter = broadcast_run(find("scatter_allgather"), n, len, 0);
        // The tree's root sends the whole vector once per round.
        assert_eq!(tree[0].1, len * n.trailing_zeros() as usize, "N={n}");
        // Scattered: the root sends (N-1)/N of it, then its share around the ring (N-1)/N;
        // every rank sends at most 2(N-1)/N of the vector.
        let share = (n - 1) * len / n;
        assert_eq!(scatter[0].1, share + share, "N={n}");
        assert!(scatter.iter().all(|o| o.1 <= 2 * share), "N={n}");
    }
}

/// Blocks in rank order, of the given lengths, back to back.
fn blocks_of(lengths: &[usize]) -> Vec<Range<usize>> {
    let mut start = 0;
    lengths
        .iter()
        .map(|&len| {
            start += len;
            start - len..start
        })
        .collect()
}

fn allgather_run(schedule: &dyn Allgather, blocks: &[Range<usize>]) -> Vec<Outcome> {
    let n = blocks.len();
    let total = blocks.iter().map(|b| b.end).max().unwrap_or(0);
    on_ranks(n, |t| {
        let rank = t.rank();
        let mut buf = vec![0xEEu8; total];
        for (i, byte) in buf[blocks[rank].clone()].iter_mut().enumerate() {
            *byte = (i + 13 * rank) as u8;
        }
        schedule.run(t, &mut buf, blocks).expect("allgather");
        buf
    })
}

#[test]
fn every_allgather_fills_every_block_of_any_size() {
    for schedule in ALLGATHER {
        for n in RANK_COUNTS {
            let layouts: Vec<Vec<usize>> = vec![
                vec![0; n],
                vec![5; n],
                (0..n).map(|r| r * 3 % 7).collect(), // some empty, all different
                (0..n).map(|r| if r == n / 2 { 4096 } else { 1 }).collect(),
            ];
            for lengths in layouts {
                let blocks = blocks_of(&lengths);
                let mut expected = Vec::new();
                for (rank, &len) in lengths.iter().enumerate() {
                    expected.extend((0..len).map(|i| (i + 13 * rank) as u8));
                }
                for (rank, (buf, _, _, left)) in
                    allgather_run(*schedule, &blocks).into_iter().enumerate()
                {
                    let what = format!("{} N={n} {lengths:?}", schedule.name());
                    assert!(buf == expected, "{what}: rank {rank} differs");
                    assert_eq!(left, 0, "{what}: messages left unreceived");
                }
            }
        }
    }
}

#[test]
fn recursive_doubling_allgather_takes_log2_steps_and_sends_the_ring_s_bytes() {
    let find = |name: &str| {
        *ALLGATHER
            .iter()
            .find(|a| a.name() == name)
            .expect("registered")
    };
    for n in [2usize, 4, 8, 16] {
        let blocks = blocks_of(&vec![64; n]);
        let doubling = allgather_run(find("recursive_doubling"), &blocks);
        let ring = allgather_run(find("ring"), &blocks);
        for rank in 0..n {
            assert_eq!(
                doubling[rank].2,
                n.trailing_zeros() as usize,
                "N={n}: messages"
            );
            assert_eq!(ring[rank].2, n - 1, "N={n}: the ring's messages");
            assert_eq!(
                doubling[rank].1, ring[rank].1,
                "N={n}: (N-1)/N of the data each"
            );
        }
    }
}

const LAYOUTS: [&[usize]; 6] = [
    &[0, 0, 1, 1],
    &[0, 1, 0, 1],
    &[0, 0, 1, 1, 1, 2],
    &[0, 1, 2, 0, 1, 2, 0],
    &[0, 1, 2, 3],
    &[1, 1, 0, 0, 0, 0, 2, 2],
];

#[test]
fn every_broadcast_and_allgather_is_exact_on_clusters() {
    for labels in LAYOUTS {
        let n = labels.len();
        for schedule in BROADCAST {
            for len in [0, 1, 7, 1000, 300_000] {
                for root in 0..n {
                    let outcomes = on_nodes(labels, |t| {
                        let rank = t.rank();
                        let mut buf: Vec<u8> =
                            (0..len).map(|i| (i * 7 + rank * 31) as u8).collect();
                        schedule.run(t, &mut buf, root).expect("broadcast");
                        buf
                    });
                    let expected: Vec<u8> = (0..len).map(|i| (i * 7 + root * 31) as u8).collect();
                    for (rank, ((buf, _, _, left), _)) in outcomes.iter().enumerate() {
                        let what = format!("{} {labels:?} len={len} root={root}", schedule.name());
                        assert!(*buf == expected, "{what}: rank {rank} differs");
                        assert_eq!(*left, 0, "{what}: messages left unreceived");
                    }
                }
            }
        }
        for schedule in ALLGATHER {
            let layouts: Vec<Vec<usize>> = vec![
                vec![3; n],
                (0..n).map(|r| r % 3).collect(),
                (0..n).map(|r| if r == n / 2 { 5000 } else { 17 }).collect(),
            ];
            for lengths in layouts {
                let blocks = blocks_of(&lengths);
                let total = blocks.last().map_or(0, |b| b.end);
                let outcomes = on_nodes(labels, |t| {
                    let rank = t.rank();
                    let mut buf = vec![0xEEu8; total];
                    for (i, byte) in buf[blocks[rank].clone()].iter_mut().enumerate() {
                        *byte = (i + 13 * rank) as u8;
                    }
                    schedule.run(t, &mut buf, &blocks).expect("allgather");
                    buf
                });
                let mut expected = Vec::new();
                for (rank, &len) in lengths.iter().enumerate() {
                    expected.extend((0..len).map(|i| (i + 13 * rank) as u8));
                }
                for (rank, ((buf, _, _, left), _)) in outcomes.iter().enumerate() {
                    let what = format!("{} {labels:?} {lengths:?}", schedule.name());
                    assert!(*buf == expected, "{what}: rank {rank} differs");
                    assert_eq!(*left, 0, "{what}: messages left unreceived");
                }
            }
        }
    }
}

#[test]
fn two_tier_allgather_and_broadcast_cross_each_link_about_once() {
    let find_gather = *ALLGATHER
        .iter()
        .find(|a| a.name() == "two_tier")
        .expect("registered");
    let find_cast = *BROADCAST
        .iter()
        .find(|a| a.name() == "two_tier")
        .expect("registered");
    let flat_gather = *ALLGATHER
        .iter()
        .find(|a| a.name() == "ring")
        .expect("registered");
    for labels in [
        &[0usize, 1, 2, 3, 0, 1, 2, 3][..],
        &[0, 0, 1, 1, 2, 2, 3, 3],
    ] {
        let (n, h) = (labels.len(), 4);
        let block = 1000;
        let blocks = blocks_of(&vec![block; n]);
        let m = block * n;
        let across_per_node = |outcomes: &[(Outcome, usize)]| {
            let mut per_node = vec![0usize; h];
            for (rank, (_, across)) in outcomes.iter().enumerate() {
                per_node[labels[rank]] += across;
            }
            per_node
        };
        let gather = |schedule: &'static dyn Allgather| {
            on_nodes(labels, |t| {
                let mut buf = vec![0u8; m];
                schedule.run(t, &mut buf, &blocks).expect("allgather");
                buf
            })
        };
        // Each node sends its own data out once per other node: (H-1)/H·m.
        for sent in across_per_node(&gather(find_gather)) {
            assert_eq!(sent, (h - 1) * m / h, "{labels:?}");
        }
        // The ring in rank order with ranks dealt round-robin crosses at every step.
        if labels[1] == 1 {
            let flat = across_per_node(&gather(flat_gather));
            assert!(flat.iter().all(|&s| s == 2 * (n - 1) * block), "{flat:?}");
        }
        // Broadcast of m bytes: every link carries at most the scatter + allgather's 2(H-1)/H·m.
        let cast = on_nodes(labels, |t| {
            let mut buf = vec![t.rank() as u8; m * 100];
            find_cast.run(t, &mut buf, 0).expect("broadcast");
            buf
        });
        for sent in across_per_node(&cast) {
            assert!(sent <= 2 * (h - 1) * m * 100 / h + h, "{labels:?}: {sent}");
        }
    }
}

mod reduce_scatter {
    use super::{blocks_of, on_ranks, RANK_COUNTS};
    use _core::dtype::{DType, ReduceOp};
    use _core::schedules::{Reduction, REDUCE_SCATTER};
    use _core::transport::Transport;

    /// Rank r's element i: small integers, so that every dtype and op is exact.
    fn value(rank: usize, i: usize, op: ReduceOp) -> f64 {
        match op {
            ReduceOp::Prod => [1.0, 2.0, -1.0][(rank + i) % 3],
            _ => ((rank * 7 + i * 3) % 11) as f64 - 5.0,
        }
    }

    fn encode(dtype: DType, values: &[f64]) -> Vec<u8> {
        let mut out = Vec::new();
        for &v in values {
            match dtype {
                DType::F32 => out.extend((v as f32).to_ne_bytes()),
                DType::F64 => out.extend(v.to_ne_bytes()),
                DType::I32 => out.extend((v as i32).to_ne_bytes()),
                DType::I64 => out.extend((v as i64).to_ne_bytes()),
                DType::F16 => out.extend(half::f16::from_f64(v).to_ne_bytes()),
                DType::BF16 => out.extend(half::bf16::from_f64(v).to_ne_bytes()),
            }
        }
        out
    }

    fn combine(op: ReduceOp, a: f64, b: f64) -> f64 {
        match op {
            ReduceOp::Sum | ReduceOp::Avg => a + b,
            ReduceOp::Prod => a * b,
            ReduceOp::Min => a.min(b),
            ReduceOp::Max => a.max(b),
        }
    }

    #[test]
    fn every_reduce_scatter_gives_each_rank_its_reduced_block() {
        for schedule in REDUCE_SCATTER {
            for n in RANK_COUNTS {
                let layouts: Vec<Vec<usize>> = vec![
                    vec![3; n],
                    (0..n).map(|r| r % 3).collect(), // some empty
                    (0..n).map(|r| if r == n - 1 { 40 } else { 1 }).collect(),
                ];
                for counts in layouts {
                    for dtype in DType::ALL {
                        for op in ReduceOp::ALL {
                            let total: usize = counts.iter().sum();
                            let elem = dtype.size();
                            let blocks =
                                blocks_of(&counts.iter().map(|c| c * elem).collect::<Vec<_>>());
                            let reduction = Reduction {
                                ranks: n,
                                ..Reduction::plain(dtype, op)
                            };
                            let outcomes = on_ranks(n, |t| {
                                let values: Vec<f64> =
                                    (0..total).map(|i| value(t.rank(), i, op)).collect();
                                let mut words = vec![0u64; (total * elem).div_ceil(8)];
                                let buf: &mut [u8] =
                                    &mut bytemuck::cast_slice_mut(&mut words)[..total * elem];
                                buf.copy_from_slice(&encode(dtype, &values));
                                if n > 1 {
                                    schedule
                                        .run(t, buf, &blocks, &reduction)
                                        .expect("reduce_scatter");
                                }
                                buf.to_vec()
                            });
                            let reduced: Vec<f64> = (0..total)
                                .map(|i| {
                                    (1..n).fold(value(0, i, op), |acc, r| {
                                        combine(op, acc, value(r, i, op))
                                    })
                                })
                                .collect();
                            let expected = encode(dtype, &reduced);
                            for (rank, (buf, _, _, left)) in outcomes.iter().enumerate() {
                                let what = format!(
                                    "{} N={n} {counts:?} {} {}",
                                    schedule.name(),
                                    dtype.name(),
                                    op.name()
                                );
                                assert_eq!(
                                    buf[blocks[rank].clone()],
                                    expected[blocks[rank].clone()],
                                    "{what}: rank {rank}"
                                );
                                assert_eq!(*left, 0, "{what}: messages left unreceived");
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn halving_sends_the_ring_s_bytes_in_log2_steps_and_priority_in_one_message_per_block() {
        let find = |name: &str| {
            *REDUCE_SCATTER
                .iter()
                .find(|a| a.name() == name)
                .expect("registered")
        };
        for n in [2usize, 4, 8, 16] {
            let blocks = blocks_of(&vec![256; n]);
            let reduction = Reduction::plain(DType::F32, ReduceOp::Sum);
            let run = |name: &str| {
                on_ranks(n, |t| {
                    let mut buf = vec![0u8; 256 * n];
                    find(name)
                        .run(t, &mut buf, &blocks, &reduction)
                        .expect("runs");
                    buf
                })
            };
            let (ring, halving, priority) = (
                run("ring"),
                run("recursive_halving"),
                run("priority_halving"),
            );
            for rank in 0..n {
                assert_eq!(
                    halving[rank].1, ring[rank].1,
                    "N={n}: (N-1)/N of the vector"
                );
                assert_eq!(priority[rank].1, ring[rank].1, "N={n}");
                assert_eq!(halving[rank].2, n.trailing_zeros() as usize, "N={n}");
                assert_eq!(priority[rank].2, n - 1, "N={n}");
            }
        }
    }

    #[test]
    fn priority_halving_is_exact_at_many_steps() {
        let priority = *REDUCE_SCATTER
            .iter()
            .find(|a| a.name() == "priority_halving")
            .expect("registered");
        for n in [32usize, 33, 64] {
            let count = 5 * n + 3;
            let blocks = blocks_of(
                &(0..n)
                    .map(|r| 4 * (count / n + usize::from(r < count % n)))
                    .collect::<Vec<_>>(),
            );
            let reduction = Reduction::plain(DType::I32, ReduceOp::Sum);
            let outcomes = on_ranks(n, |t| {
                let values: Vec<i32> = (0..count).map(|i| (i * 31 + t.rank() * 7) as i32).collect();
                let mut buf = bytemuck::cast_slice::<i32, u8>(&values).to_vec();
                priority
                    .run(t, &mut buf, &blocks, &reduction)
                    .expect("runs");
                buf
            });
            for (rank, (buf, _, _, left)) in outcomes.iter().enumerate() {
                let mine: &[i32] = bytemuck::cast_slice(&buf[blocks[rank].clone()]);
                let first = blocks[rank].start / 4;
                for (k, &v) in mine.iter().enumerate() {
                    let i = first + k;
                    let want: i32 = (0..n).map(|r| (i * 31 + r * 7) as i32).sum();
                    assert_eq!(v, want, "N={n} rank {rank} element {i}");
                }
                assert_eq!(*left, 0);
            }
        }
    }
}
