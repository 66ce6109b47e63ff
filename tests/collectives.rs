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
    let transports = LocalTransport::group(n);
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
                (buf, sent, messages, t.unreceived_messages())
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
