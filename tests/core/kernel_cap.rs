//! `RINGLET_KERNELS` caps the SIMD level: above the cap, a level is refused, not run, whatever
//! the CPU supports. Its own test binary, because the level is decided once per process.

use _core::dtype::{DType, ReduceOp};
use _core::kernels::{combine, combine_at, Level, Order};

#[test]
fn a_capped_level_is_refused_and_the_active_level_stays_below_the_cap() {
    // Before any kernel runs: the cap is read once.
    std::env::set_var("RINGLET_KERNELS", "generic");
    assert_eq!(Level::ceiling(), Level::Generic);
    assert_eq!(Level::active(), Level::Generic);
    for level in [Level::Avx2, Level::Avx512] {
        let mut acc = [0u8; 8];
        let result = combine_at(
            level,
            DType::F32,
            ReduceOp::Sum,
            &mut acc,
            &[0u8; 8],
            Order::AccFirst,
        );
        let error = result
            .expect_err("a level above the cap must not run")
            .to_string();
        assert!(error.contains("not available"), "{level:?}: {error}");
    }
    let (mut acc, other) = ([1.5f32, 2.0], [0.25f32, -4.0]);
    combine(
        DType::F32,
        ReduceOp::Sum,
        bytemuck::cast_slice_mut(&mut acc),
        bytemuck::cast_slice(&other),
        Order::AccFirst,
    )
    .expect("generic runs");
    assert_eq!(acc, [1.75, -2.0]);
    std::env::set_var("RINGLET_KERNELS", "avx9000");
    let error = Level::ceiling_from_env()
        .expect_err("an unknown level")
        .to_string();
    assert!(
        error.contains("accepted: \"generic\", \"avx2\", \"avx512\""),
        "{error}"
    );
}
