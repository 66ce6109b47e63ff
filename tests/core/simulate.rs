//! The simulator: the programs it records are the schedules' real traffic (message for message
//! against the in-process transport, for every registered algorithm), and its network model
//! times simple patterns as their formulas say.

use _core::dtype::{DType, ReduceOp};
use _core::schedules::{
    self, Algorithm, Factors, Parts, Reduction, Tuning, ALLGATHER, ALLREDUCE, BROADCAST, REDUCE,
    REDUCE_SCATTER,
};
use _core::simulate::network::{run, Link, Network};
use _core::simulate::trace::Op;
use _core::simulate::{algorithms, programs, simulate, COLLECTIVES};
use _core::transport::local::LocalTransport;
use _core::transport::Nodes;
use std::ops::Range;

fn blocks(len: usize, n: usize) -> Vec<Range<usize>> {
    let (count, elem) = (len / 4, 4);
    let (base, extra) = (count / n, count % n);
    (0..n)
        .map(|r| {
            let start = r * base + r.min(extra);
            start * elem..(start + base + usize::from(r < extra)) * elem
        })
        .collect()
}

/// (messages, bytes) each rank sends when `algorithm` really runs on in-process ranks.
fn measured(collective: &str, algorithm: &str, labels: &[usize], len: usize) -> Vec<(u64, u64)> {
    let n = labels.len();
    let transports = LocalTransport::cluster(labels)
        .into_iter()
        .map(|t| t.without_shared_memory())
        .collect::<Vec<_>>();
    std::thread::scope(|scope| {
        let handles: Vec<_> = transports
            .into_iter()
            .map(|t| {
                scope.spawn(move || {
                    let mut words = vec![0u64; len.div_ceil(8)];
                    let buf: &mut [u8] = &mut bytemuck::cast_slice_mut(&mut words)[..len];
                    let reduction = Reduction {
                        ranks: n,
                        ..Reduction::plain(DType::F32, ReduceOp::Sum)
                    };
                    let blocks = blocks(len, n);
                    let result = match collective {
                        "allreduce" => schedules::allreduce(
                            &t,
                            schedules::by_name(ALLREDUCE, algorithm).unwrap(),
                            &mut Parts::one(buf),
                            DType::F32,
                            ReduceOp::Sum,
                            Factors::NONE,
                            &Tuning::default(),
                        ),
                        "reduce" => schedules::by_name(REDUCE, algorithm)
                            .unwrap()
                            .run(&t, buf, 0, &reduction),
                        "broadcast" => schedules::by_name(BROADCAST, algorithm)
                            .unwrap()
                            .run(&t, buf, 0),
                        "allgather" => schedules::by_name(ALLGATHER, algorithm)
                            .unwrap()
                            .run(&t, buf, &blocks),
                        _ => schedules::by_name(REDUCE_SCATTER, algorithm)
                            .unwrap()
                            .run(&t, buf, &blocks, &reduction),
                    };
                    let skip_single = n == 1 && collective != "allreduce";
                    if !skip_single {
                        result.expect("the schedule runs");
                    }
                    (t.messages_sent() as u64, t.bytes_sent() as u64)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("rank"))
            .collect()
    })
}

/// The registry of `collective`.
fn registered(collective: &str) -> Vec<&'static dyn Algorithm> {
    macro_rules! upcast {
        ($registry:expr) => {
            $registry.iter().map(|&a| a as &dyn Algorithm).collect()
        };
    }
    match collective {
        "allreduce" => upcast!(ALLREDUCE),
        "reduce" => upcast!(REDUCE),
        "broadcast" => upcast!(BROADCAST),
        "allgather" => upcast!(ALLGATHER),
        "reduce_scatter" => upcast!(REDUCE_SCATTER),
        other => panic!("no registry for {other}"),
    }
}

/// Every registered algorithm of every collective that runs on in-process ranks without shared
/// memory (what the simulator records, as ranks on separate nodes would run): those that say
/// they cannot (`mpi` needs MPI, `shm` shared memory) are left out, the others all in, narrowed
/// by `RINGLET_TEST_ALGORITHMS`. Prints them (seen with `--nocapture`).
fn simulable() -> Vec<(&'static str, &'static str)> {
    let probe = LocalTransport::group(2).remove(0).without_shared_memory();
    let (mut all, mut skipped) = (Vec::new(), Vec::new());
    for collective in COLLECTIVES {
        let registry = registered(collective);
        let names: Vec<&str> = registry.iter().map(|a| a.name()).collect();
        assert_eq!(
            algorithms(collective).unwrap(),
            names,
            "the simulator lists the registry"
        );
        for algorithm in registry {
            let name = algorithm.name();
            match algorithm.unavailable(&probe) {
                Some(_) => skipped.push(format!("{collective} {name}")),
                None if crate::common::selected(name) => all.push((collective, name)),
                None => {}
            }
        }
    }
    assert!(!all.is_empty(), "no algorithm to simulate");
    let listed: Vec<String> = all.iter().map(|(c, a)| format!("{c} {a}")).collect();
    println!(
        "simulator covered: {} (skipped, not without MPI or shared memory: {})",
        listed.join(", "),
        skipped.join(", ")
    );
    all
}

#[test]
fn recorded_traffic_is_the_schedules_real_traffic_for_every_registered_algorithm() {
    let layouts: Vec<Vec<usize>> = vec![
        vec![0; 2],
        vec![0; 3],
        vec![0; 5],
        vec![0; 8],
        vec![0, 0, 1, 1, 2, 2],    // 3 nodes, block
        vec![0, 1, 2, 0, 1, 2, 0], // round-robin, uneven
    ];
    let pairs = simulable();
    assert!(
        pairs.len() >= 12 || crate::common::only().is_some(),
        "{pairs:?}"
    );
    for (collective, algorithm) in pairs {
        for labels in &layouts {
            for len in [0usize, 4, 4 * 13, 40_000] {
                let nodes = Nodes::from_labels(labels);
                let programs = programs(collective, algorithm, &nodes, len, &Tuning::default())
                    .unwrap_or_else(|e| panic!("{collective} {algorithm}: {e}"));
                let recorded: Vec<(u64, u64)> = programs
                    .iter()
                    .map(|p| {
                        p.iter().fold((0, 0), |(m, b), op| match op {
                            Op::Send { bytes, .. } => (m + 1, b + bytes),
                            _ => (m, b),
                        })
                    })
                    .collect();
                let real = measured(collective, algorithm, labels, len);
                assert_eq!(
                    recorded, real,
                    "{collective} {algorithm} {labels:?} {len} B"
                );
            }
        }
    }
}

fn one_node(n: usize) -> Nodes {
    Nodes::single(n)
}

/// A program that receives `bytes` from `from` while it sends `bytes` to `to`, then waits.
fn send_and_receive(from: u32, to: u32, bytes: u64) -> Vec<Op> {
    vec![
        Op::Receive {
            from,
            bytes,
            request: 0,
        },
        Op::Send {
            to,
            bytes,
            request: 1,
        },
        Op::Wait { request: 0 },
        Op::Wait { request: 1 },
    ]
}

const NET: Network = Network {
    intra: Link {
        bandwidth: 10e9,
        latency: 1e-6,
    },
    inter: Link {
        bandwidth: 1e9,
        latency: 10e-6,
    },
    gamma: 0.0,
    overhead: 0.0,
    memory: f64::INFINITY,
    groups: 1,
    global: Link {
        bandwidth: f64::INFINITY,
        latency: 0.0,
    },
    half_duplex: false,
};

#[test]
fn the_ring_sends_two_n_minus_one_over_n_of_the_vector_per_rank() {
    for n in [2usize, 4, 8, 16, 64] {
        let m = 4 * n * 1000;
        let outcome = simulate(
            "allreduce",
            "ring",
            &one_node(n),
            m,
            &Tuning::default(),
            &NET,
        )
        .expect("simulates");
        for &(messages, bytes) in &outcome.sent {
            assert_eq!(messages, 2 * (n as u64 - 1));
            assert_eq!(bytes, (2 * (n - 1) * m / n) as u64);
        }
        // 2(N-1) steps of m/N at the intra-node rate, each after a latency.
        let expected = 2.0 * (n - 1) as f64 * ((m / n) as f64 / 10e9 + 1e-6);
        assert!(
            (outcome.seconds - expected).abs() < 1e-9 * n as f64,
            "N={n}: {} s, expected {expected} s",
            outcome.seconds
        );
    }
}

#[test]
fn one_message_costs_its_latency_and_its_bytes_over_the_bandwidth() {
    let nodes = Nodes::from_labels(&[0, 1]);
    let programs = vec![
        vec![
            Op::Send {
                to: 1,
                bytes: 1_000_000,
                request: 0,
            },
            Op::Wait { request: 0 },
        ],
        vec![
            Op::Receive {
                from: 0,
                bytes: 1_000_000,
                request: 0,
            },
            Op::Wait { request: 0 },
        ],
    ];
    let outcome = run(&programs, &nodes, &NET).expect("runs");
    assert!(
        (outcome.seconds - (1e-3 + 10e-6)).abs() < 1e-12,
        "{}",
        outcome.seconds
    );
    assert_eq!(outcome.link_bytes, vec![[1_000_000, 0], [0, 1_000_000]]);
    assert_eq!(outcome.max_link_bytes(), 1_000_000);
    assert_eq!(outcome.mean_link_bytes(), 500_000.0);
}

#[test]
fn messages_that_share_a_link_take_turns() {
    // Ranks 1 and 2 (nodes 1 and 2) both send to rank 0 (node 0): node 0's link carries both.
    let nodes = Nodes::from_labels(&[0, 1, 2]);
    let bytes = 1_000_000;
    let sender = |request| {
        vec![
            Op::Send {
                to: 0,
                bytes,
                request,
            },
            Op::Wait { request },
        ]
    };
    let programs = vec![
        vec![
            Op::Receive {
                from: 1,
                bytes,
                request: 0,
            },
            Op::Receive {
                from: 2,
                bytes,
                request: 1,
            },
            Op::Wait { request: 0 },
            Op::Wait { request: 1 },
        ],
        sender(0),
        sender(0),
    ];
    let outcome = run(&programs, &nodes, &NET).expect("runs");
    assert!(
        (outcome.seconds - (2e-3 + 10e-6)).abs() < 1e-12,
        "{}",
        outcome.seconds
    );
    // Inside one node they queue at rank 0's port instead, at the node's rate.
    let outcome = run(&programs, &Nodes::single(3), &NET).expect("runs");
    assert!(
        (outcome.seconds - 1e-6 - 2e-4).abs() < 1e-12,
        "{}",
        outcome.seconds
    );
    assert_eq!(outcome.bytes_within, 2 * bytes);
}

#[test]
fn combining_costs_gamma_per_byte_and_a_lost_message_is_an_error() {
    let nodes = Nodes::single(2);
    let net = Network { gamma: 1e-9, ..NET };
    let programs = vec![vec![Op::Combine { bytes: 1000 }], vec![]];
    let outcome = run(&programs, &nodes, &net).expect("runs");
    assert!((outcome.seconds - 1e-6).abs() < 1e-15);
    let stuck = vec![
        vec![
            Op::Receive {
                from: 1,
                bytes: 8,
                request: 0,
            },
            Op::Wait { request: 0 },
        ],
        vec![],
    ];
    let error = run(&stuck, &nodes, &NET).unwrap_err().to_string();
    assert!(error.contains("never finishes"), "{error}");
    let unreceived = vec![
        vec![Op::Send {
            to: 1,
            bytes: 8,
            request: 0,
        }],
        vec![],
    ];
    let error = run(&unreceived, &nodes, &NET).unwrap_err().to_string();
    assert!(error.contains("no rank receives"), "{error}");
}

#[test]
fn two_tier_keeps_traffic_off_the_network_that_the_flat_ring_sends_across() {
    // 8 hosts x 4 ranks, round-robin placement: the flat ring in rank order would cross the
    // network at every step; node-major rings and two_tier cross it about once per node.
    let labels: Vec<usize> = (0..32).map(|r| r % 8).collect();
    let nodes = Nodes::from_labels(&labels);
    let m = 4 << 20;
    let unaware = Tuning {
        node_major: false,
        ..Tuning::default()
    };
    let flat = simulate("allreduce", "ring", &nodes, m, &unaware, &NET).expect("flat");
    let tiered =
        simulate("allreduce", "two_tier", &nodes, m, &Tuning::default(), &NET).expect("two_tier");
    assert!(
        tiered.max_link_bytes() * 3 < flat.max_link_bytes(),
        "{tiered:?} vs {flat:?}"
    );
    assert!(tiered.seconds < flat.seconds);
    // The host-link bound: each node's link carries at least 2(H-1)/H·m each way.
    let bound = 2 * 7 * m as u64 / 8;
    assert!(tiered.max_link_bytes() >= bound - 64);
}

#[test]
fn a_node_s_memory_is_shared_by_its_copies_and_combines() {
    // Two ranks on one node exchange 8 MB each way and combine: with a memory of 10 GB/s the
    // two copies and the two combines (24 MB of traffic each: three bytes per byte) take their
    // turns on it, which the ports alone would not.
    let bytes = 8_000_000u64;
    let exchange = |peer: u32| {
        let mut program = send_and_receive(peer, peer, bytes);
        program.push(Op::Combine { bytes });
        program
    };
    let programs = vec![exchange(1), exchange(0)];
    let fast = run(&programs, &Nodes::single(2), &NET).expect("runs");
    assert!(
        (fast.seconds - (8e-4 + 1e-6)).abs() < 1e-12,
        "{}",
        fast.seconds
    );
    let shared = Network {
        memory: 10e9,
        ..NET
    };
    let bound = run(&programs, &Nodes::single(2), &shared).expect("runs");
    // 2 copies x 24 MB + 2 combines x 24 MB = 96 MB at 10 GB/s.
    assert!((bound.seconds - 9.6e-3).abs() < 1e-6, "{}", bound.seconds);
    let error = run(
        &programs,
        &Nodes::single(2),
        &Network { memory: 0.0, ..NET },
    )
    .unwrap_err();
    assert!(error.to_string().contains("positive"), "{error}");
}

#[test]
fn messages_between_groups_also_take_turns_on_the_global_links() {
    // 4 nodes in 2 groups; nodes 0 and 1 (group 0) each send to a node of group 1 at once:
    // their host links are separate, but group 0's global link (0.5 GB/s) carries both.
    let nodes = Nodes::from_labels(&[0, 1, 2, 3]);
    let bytes = 1_000_000;
    let net = Network {
        groups: 2,
        global: Link {
            bandwidth: 0.5e9,
            latency: 5e-6,
        },
        ..NET
    };
    let programs = vec![
        vec![
            Op::Send {
                to: 2,
                bytes,
                request: 0,
            },
            Op::Wait { request: 0 },
        ],
        vec![
            Op::Send {
                to: 3,
                bytes,
                request: 0,
            },
            Op::Wait { request: 0 },
        ],
        vec![
            Op::Receive {
                from: 0,
                bytes,
                request: 0,
            },
            Op::Wait { request: 0 },
        ],
        vec![
            Op::Receive {
                from: 1,
                bytes,
                request: 0,
            },
            Op::Wait { request: 0 },
        ],
    ];
    let outcome = run(&programs, &nodes, &net).expect("runs");
    // Each at the global rate (2 ms), one after the other: 4 ms, plus both latencies.
    assert!(
        (outcome.seconds - (4e-3 + 15e-6)).abs() < 1e-12,
        "{}",
        outcome.seconds
    );
    assert_eq!(outcome.group_bytes, vec![[2 * bytes, 0], [0, 2 * bytes]]);
    assert_eq!(outcome.max_group_bytes(), 2 * bytes);
    // One group: no global tier, the two messages run side by side on their own links.
    let flat = run(&programs, &nodes, &NET).expect("runs");
    assert!(
        (flat.seconds - (1e-3 + 10e-6)).abs() < 1e-12,
        "{}",
        flat.seconds
    );
    assert_eq!(flat.max_group_bytes(), 0);
}

#[test]
fn a_half_duplex_connection_serializes_an_exchange_but_not_a_ring() {
    // Two nodes of one rank: each sends 1 MB to the other at once. Full duplex, both run at
    // 1 GB/s side by side; half duplex, the second waits for the first on their connection.
    let bytes = 1_000_000;
    let exchange = |peer: u32| send_and_receive(peer, peer, bytes);
    let nodes = Nodes::from_labels(&[0, 1]);
    let half = Network {
        half_duplex: true,
        ..NET
    };
    let programs = vec![exchange(1), exchange(0)];
    let full = run(&programs, &nodes, &NET).expect("runs").seconds;
    let serialized = run(&programs, &nodes, &half).expect("runs").seconds;
    assert!((full - (1e-3 + 10e-6)).abs() < 1e-9, "{full}");
    assert!((serialized - (2e-3 + 10e-6)).abs() < 1e-9, "{serialized}");

    // A ring over 3 nodes sends each way on a different connection: no change.
    let nodes = Nodes::from_labels(&[0, 1, 2]);
    let programs: Vec<_> = (0..3)
        .map(|r| send_and_receive((r + 2) % 3, (r + 1) % 3, bytes))
        .collect();
    let full = run(&programs, &nodes, &NET).expect("runs").seconds;
    let serialized = run(&programs, &nodes, &half).expect("runs").seconds;
    assert_eq!(full, serialized);
}
