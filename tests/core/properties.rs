//! Property test: every schedule, any rank count from 1 to 64, any element count, dtype and op,
//! over one buffer or several cut at random places, on the in-process transport. Results must
//! be exact on every rank and every message sent must have been received.
//!
//! Every case runs every registered allreduce that can run in process (narrowed by
//! `RINGLET_TEST_ALGORITHMS=name,...`), so a newly registered schedule is tested with no edit
//! here.

use crate::common::*;
use _core::dtype::{DType, ReduceOp};
use _core::schedules::Tuning;
use _core::transport::waiting::set_wait_policy;
use proptest::prelude::*;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// The cases run, and the algorithms they ran (every case the same ones).
static CASES: AtomicUsize = AtomicUsize::new(0);
static RAN: Mutex<Vec<&'static str>> = Mutex::new(Vec::new());

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 48,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    // Run by the test below, which then checks what it covered.
    fn any_schedule_any_group_any_count_is_exact(
        ranks in 1usize..=64,
        count in 0usize..3000,
        segment_bytes in 1usize..600,
        dtype in prop::sample::select(DType::ALL.to_vec()),
        op in prop::sample::select(ReduceOp::ALL.to_vec()),
        max_message in prop::sample::select(vec![64usize, 1000, usize::MAX / 2]),
        split in any::<u64>(),
    ) {
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
        let inputs: Vec<Vec<u8>> = per_rank.iter().map(|v| encode(dtype, v)).collect();
        // Threads outnumber cores: ranks waiting in shared memory yield at once.
        set_wait_policy(Duration::ZERO, Duration::ZERO);
        let mut ran = Vec::new();
        for schedule in allreduce_under_test() {
            for (rank, outcome) in run_with(schedule, inputs.clone(), dtype, op, &setup)
                .iter()
                .enumerate()
            {
                prop_assert!(outcome.result == expected, "{} rank {rank} of {ranks}", schedule.name());
                prop_assert_eq!(outcome.unreceived, 0);
            }
            ran.push(schedule.name());
        }
        let mut first = RAN.lock().unwrap();
        if CASES.fetch_add(1, Ordering::Relaxed) == 0 {
            *first = ran;
        } else {
            prop_assert_eq!(&*first, &ran);
        }
    }
}

#[test]
fn any_schedule_any_group_any_count_is_exact_and_every_schedule_runs() {
    any_schedule_any_group_any_count_is_exact();
    assert!(
        CASES.load(Ordering::Relaxed) >= 48,
        "the property ran no cases"
    );
    assert_covered("property", &RAN.lock().unwrap());
}
