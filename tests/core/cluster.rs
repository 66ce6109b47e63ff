//! The schedules on ranks spread over nodes (in-process ranks told their node): exact and
//! bit-identical results for every placement, including uneven nodes, and the traffic each
//! node's link carries.

use crate::common::*;
use _core::dtype::{DType, ReduceOp};
use _core::schedules::allreduce::ring::Ring;
use _core::schedules::allreduce::two_tier::TwoTier;
use _core::schedules::{Algorithm, Allreduce, Tuning, ALLREDUCE};
use _core::transport::local::LocalTransport;
use _core::transport::{Nodes, Placement, Transport};

/// Node of each rank: block, round-robin, uneven and one rank per node.
const LAYOUTS: [&[usize]; 10] = [
    &[0, 1],
    &[0, 0, 1, 1],
    &[0, 1, 0, 1],
    &[0, 0, 0, 1],
    &[1, 0, 0, 0],
    &[0, 1, 1, 2, 2, 2],
    &[0, 1, 2, 0, 1, 2, 0, 1, 2],
    &[0, 0, 1, 1, 2, 2, 3, 3],
    &[0, 1, 2, 3, 0, 1, 2, 3],
    &[2, 0, 1, 0, 2, 2, 1],
];

/// The algorithms that run on in-process ranks spread over nodes ("shm" needs one node, "mpi"
/// an MPI communicator: the MPI cluster tests cover it).
fn node_algorithms(layout: &[usize]) -> Vec<&'static dyn Allreduce> {
    let probe = LocalTransport::cluster(layout).remove(0);
    let usable: Vec<&'static dyn Allreduce> = ALLREDUCE
        .iter()
        .copied()
        .filter(|a| a.name() != "mpi" && a.unavailable(&probe).is_none())
        .collect();
    assert!(usable.iter().any(|a| a.name() == "two_tier"));
    assert!(usable.iter().any(|a| a.name() == "ring"));
    usable
}

fn run_on(
    schedule: &dyn Allreduce,
    layout: &[usize],
    per_rank: &[Vec<f64>],
    dtype: DType,
    op: ReduceOp,
) -> Vec<RankOutcome> {
    let setup = Setup {
        nodes: Some(layout.to_vec()),
        tuning: Tuning {
            segment_bytes: 64, // many segments: the pipelined ring's paths all run
            ..Tuning::default()
        },
        ..Setup::default()
    };
    let inputs = per_rank.iter().map(|v| encode(dtype, v)).collect();
    run_with(schedule, inputs, dtype, op, &setup)
}

#[test]
fn every_algorithm_is_exact_on_every_layout() {
    for layout in LAYOUTS {
        let n = layout.len();
        for schedule in node_algorithms(layout) {
            for count in [0, 1, n - 1, n + 1, 3 * n + 1, 1000] {
                for dtype in DType::ALL {
                    for op in ReduceOp::ALL {
                        let per_rank = exact_inputs(n, count, op);
                        let expected = reference(dtype, op, &per_rank);
                        for (rank, outcome) in run_on(schedule, layout, &per_rank, dtype, op)
                            .iter()
                            .enumerate()
                        {
                            assert!(
                                outcome.result == expected,
                                "{} on {layout:?}, {count} {} {}: rank {rank} is wrong",
                                schedule.name(),
                                dtype.name(),
                                op.name()
                            );
                            assert_eq!(outcome.unreceived, 0, "{}", schedule.name());
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn inexact_results_are_bit_identical_on_every_rank() {
    for layout in LAYOUTS {
        let n = layout.len();
        for schedule in node_algorithms(layout) {
            for (dtype, op) in [
                (DType::F32, ReduceOp::Sum),
                (DType::BF16, ReduceOp::Avg),
                (DType::F64, ReduceOp::Prod),
            ] {
                let per_rank: Vec<Vec<f64>> = (0..n).map(|r| noise(r as u64 + 7, 1031)).collect();
                let outcomes = run_on(schedule, layout, &per_rank, dtype, op);
                for (rank, outcome) in outcomes.iter().enumerate() {
                    assert!(
                        outcome.result == outcomes[0].result,
                        "{} on {layout:?} {}: rank {rank} differs from rank 0",
                        schedule.name(),
                        dtype.name()
                    );
                }
                if (dtype, op) == (DType::F32, ReduceOp::Sum) {
                    let got: &[f32] = bytemuck::cast_slice(&outcomes[0].result);
                    for (i, g) in got.iter().enumerate() {
                        let truth: f64 = per_rank.iter().map(|v| v[i] as f32 as f64).sum();
                        assert!((*g as f64 - truth).abs() < 1e-4, "{}", schedule.name());
                    }
                }
            }
        }
    }
}

/// Bytes each node's ranks send to other nodes, per node.
fn across_per_node(outcomes: &[RankOutcome], layout: &[usize]) -> Vec<usize> {
    let nodes = Nodes::from_labels(layout);
    (0..nodes.count())
        .map(|node| {
            nodes
                .members(node)
                .iter()
                .map(|&r| outcomes[r].bytes_across)
                .sum()
        })
        .collect()
}

#[test]
fn each_node_link_carries_what_the_cost_model_says() {
    let count = 8 * 4 * 1024; // float32, divisible by every rank and share count below
    let m = count * 4;
    for layout in [
        &[0, 0, 1, 1, 2, 2, 3, 3][..],
        &[0, 1, 2, 3, 0, 1, 2, 3],
        &[0, 1, 0, 1],
    ] {
        let nodes = Nodes::from_labels(layout);
        let (h, n) = (nodes.count(), layout.len());
        let per_rank: Vec<Vec<f64>> = (0..n).map(|r| vec![r as f64; count]).collect();
        for schedule in [&Ring as &dyn Allreduce, &TwoTier] {
            let outcomes = run_on(schedule, layout, &per_rank, DType::F32, ReduceOp::Sum);
            let links = across_per_node(&outcomes, layout);
            let model = schedule.cost_on(&nodes, m, &Tuning::default()).across.bytes;
            for (node, &bytes) in links.iter().enumerate() {
                assert_eq!(
                    bytes as f64,
                    model,
                    "{} on {layout:?}: node {node}'s link",
                    schedule.name()
                );
            }
        }
        // The ring, in node-major order, crosses each link once per step: 2(N-1)/N·m; the two
        // tiers send only the node's result across: 2(H-1)/H·m, the bound.
        let ring = Ring.cost_on(&nodes, m, &Tuning::default()).across.bytes;
        let two = TwoTier.cost_on(&nodes, m, &Tuning::default()).across.bytes;
        assert_eq!(ring, 2.0 * (n - 1) as f64 / n as f64 * m as f64);
        assert_eq!(two, 2.0 * (h - 1) as f64 / h as f64 * m as f64);
    }
}

#[test]
fn the_ring_crosses_each_link_as_often_in_any_placement() {
    let count = 4096;
    let per_rank: Vec<Vec<f64>> = (0..8).map(|r| vec![r as f64; count]).collect();
    let block = run_on(
        &Ring,
        &[0, 0, 1, 1, 2, 2, 3, 3],
        &per_rank,
        DType::F32,
        ReduceOp::Sum,
    );
    let round_robin = run_on(
        &Ring,
        &[0, 1, 2, 3, 0, 1, 2, 3],
        &per_rank,
        DType::F32,
        ReduceOp::Sum,
    );
    let block_links = across_per_node(&block, &[0, 0, 1, 1, 2, 2, 3, 3]);
    let rr_links = across_per_node(&round_robin, &[0, 1, 2, 3, 0, 1, 2, 3]);
    assert_eq!(block_links, rr_links);
    // In rank order every one of a round-robin ring's steps crosses, on both ranks of a node:
    // twice the traffic on each link, as the cost of a schedule unaware of nodes says.
    let rank_order = Tuning {
        node_major: false,
        ..Tuning::default()
    };
    let layout = [0, 1, 2, 3, 0, 1, 2, 3];
    let setup = Setup {
        nodes: Some(layout.to_vec()),
        tuning: rank_order,
        ..Setup::default()
    };
    let inputs = per_rank.iter().map(|v| encode(DType::F32, v)).collect();
    let flat = run_with(&Ring, inputs, DType::F32, ReduceOp::Sum, &setup);
    let flat_links = across_per_node(&flat, &layout);
    let nodes = Nodes::from_labels(&layout);
    for (&flat, &ordered) in flat_links.iter().zip(&rr_links) {
        assert_eq!(flat, 2 * ordered);
        assert_eq!(
            flat as f64,
            Ring.cost_on(&nodes, count * 4, &rank_order).across.bytes
        );
    }
    let sum = encode(DType::F32, &vec![28.0; count]); // 0 + 1 + ... + 7
    assert!(flat.iter().chain(&round_robin).all(|o| o.result == sum));
}

#[test]
fn transports_know_their_nodes() {
    let group = LocalTransport::cluster(&["b", "a", "b", "a"]);
    let nodes = group[2].nodes();
    assert_eq!(nodes.labels(), &[0, 1, 0, 1]);
    assert_eq!(nodes.placement(), Placement::RoundRobin);
    assert_eq!(nodes.local_index(2), 1);
    assert!(group[0].shared().is_none(), "no shared memory across nodes");
    assert!(LocalTransport::group(2)[0].shared().is_some());
}

#[test]
fn factors_are_applied_once_on_every_layout_and_across_separate_buffers() {
    use _core::schedules::Factors;
    let factors = Factors {
        pre: 2.0,
        post: 0.5,
    };
    for layout in LAYOUTS {
        let n = layout.len();
        for schedule in node_algorithms(layout) {
            for count in [0, 1, 37, 1000] {
                for dtype in [DType::F32, DType::F64, DType::BF16] {
                    for op in [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max] {
                        let per_rank = exact_inputs(n, count, op);
                        let expected =
                            reference_scaled(dtype, op, &per_rank, factors.pre, factors.post);
                        let setup = Setup {
                            nodes: Some(layout.to_vec()),
                            factors,
                            parts: Some(random_parts(count, 11)),
                            ..Setup::default()
                        };
                        let inputs = per_rank.iter().map(|v| encode(dtype, v)).collect();
                        for (rank, outcome) in run_with(schedule, inputs, dtype, op, &setup)
                            .iter()
                            .enumerate()
                        {
                            assert!(
                                outcome.result == expected,
                                "{} on {layout:?}, {count} {} {}: rank {rank}",
                                schedule.name(),
                                dtype.name(),
                                op.name()
                            );
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn messages_between_nodes_go_in_pieces_of_the_across_limit_only() {
    // 20 bytes: not a multiple of any element size, so pieces also cut through elements, which
    // the receiver must put back together.
    const ACROSS: usize = 20;
    for layout in [&[0usize, 0, 1, 1][..], &[0, 1, 0, 1], &[0, 1, 1, 2, 2, 2]] {
        let n = layout.len();
        for schedule in node_algorithms(layout) {
            let (dtype, op) = (DType::F64, ReduceOp::Sum);
            let per_rank = exact_inputs(n, 1000, op);
            let expected = reference(dtype, op, &per_rank);
            let setup = Setup {
                nodes: Some(layout.to_vec()),
                across_message_bytes: ACROSS,
                ..Setup::default()
            };
            let inputs = per_rank.iter().map(|v| encode(dtype, v)).collect();
            let outcomes = run_with(schedule, inputs, dtype, op, &setup);
            let name = schedule.name();
            for (rank, outcome) in outcomes.iter().enumerate() {
                assert!(
                    outcome.result == expected,
                    "{name} on {layout:?}: rank {rank}"
                );
                assert!(
                    outcome.largest_across <= ACROSS,
                    "{name} on {layout:?}: rank {rank} sent {} bytes at once between nodes",
                    outcome.largest_across
                );
            }
            assert!(
                outcomes.iter().any(|o| o.bytes_across > 0),
                "{name} on {layout:?} sends nothing between nodes"
            );
            // Inside a node the messages stay whole (8000 bytes cut in n or fewer blocks).
            let largest = outcomes.iter().map(|o| o.largest_message).max();
            assert!(
                largest > Some(ACROSS),
                "{name} on {layout:?}: at most {largest:?}"
            );
        }
    }
}
