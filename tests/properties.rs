//! Property test: every schedule, any rank count from 1 to 64, any element count, dtype and op,
//! over one buffer or several cut at random places, on the in-process transport. Results must
//! be exact on every rank and every message sent must have been received.

mod common;

use _core::dtype::{DType, ReduceOp};
use _core::schedules::halving_doubling::HalvingDoubling;
use _core::schedules::pipelined_ring::PipelinedRing;
use _core::schedules::recursive_doubling::RecursiveDoubling;
use _core::schedules::ring::Ring;
use _core::schedules::{Allreduce, Tuning};
use common::*;
use proptest::prelude::*;

fn schedule(index: usize) -> &'static dyn Allreduce {
    match index {
        0 => &Ring,
        1 => &HalvingDoubling,
        2 => &RecursiveDoubling,
        _ => &PipelinedRing,
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 48,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn any_schedule_any_group_any_count_is_exact(
        ranks in 1usize..=64,
        count in 0usize..3000,
        algorithm in 0usize..4,
        segment_bytes in 1usize..600,
        dtype in prop::sample::select(DType::ALL.to_vec()),
        op in prop::sample::select(ReduceOp::ALL.to_vec()),
        max_message in prop::sample::select(vec![64usize, 1000, usize::MAX / 2]),
        split in any::<u64>(),
    ) {
        let schedule = schedule(algorithm);
        // Half the cases run over separate buffers cut at random places.
        let setup = Setup {
            max_message_bytes: max_message,
            tuning: Tuning {
        segment_bytes,
        ..Tuning::default()
    },
            parts: (split % 2 == 0).then(|| random_parts(count, split)),
            ..Setup::default()
        };
        let per_rank: Vec<Vec<f64>> = (0..ranks)
            .map(|r| (0..count).map(|i| exact_value(r, i, op)).collect())
            .collect();
        let expected = reference(dtype, op, &per_rank);
        let inputs = per_rank.iter().map(|v| encode(dtype, v)).collect();
        for (rank, outcome) in run_with(schedule, inputs, dtype, op, &setup)
            .iter()
            .enumerate()
        {
            prop_assert!(outcome.result == expected, "{} rank {rank} of {ranks}", schedule.name());
            prop_assert_eq!(outcome.unreceived, 0);
        }
    }
}
