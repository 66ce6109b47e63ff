//! Reduction kernel throughput per SIMD level: `cargo bench --bench kernels`.
//!
//! Prints GB/s of accumulator bytes combined (acc += other), in cache (64 KiB) and out of it
//! (16 MiB), median of repeated runs.

use _core::dtype::{DType, ReduceOp};
use _core::kernels::{combine_at, Level, Order};
use std::time::Instant;

fn median_seconds(mut run: impl FnMut()) -> f64 {
    let mut times: Vec<f64> = (0..15)
        .map(|_| {
            let start = Instant::now();
            run();
            start.elapsed().as_secs_f64()
        })
        .collect();
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

fn main() {
    println!(
        "{:>8} {:>9} {:>6} {:>10} {:>10}",
        "level", "dtype", "op", "64KiB GB/s", "16MiB GB/s"
    );
    for level in Level::ALL.into_iter().filter(|l| l.is_supported()) {
        for dtype in [DType::F32, DType::F64, DType::F16, DType::BF16, DType::I32] {
            for op in [ReduceOp::Sum, ReduceOp::Max] {
                let mut rates = Vec::new();
                for bytes in [64 << 10, 16 << 20] {
                    // Written, finite data: untouched zero pages would make masked stores fault.
                    let mut acc = vec![0x3C00_3C00_3C00_3C00u64; bytes / 8];
                    let other = vec![0x3C00_3C00_3C00_3C00u64; bytes / 8];
                    let repeats = (64 << 20) / bytes;
                    let seconds = median_seconds(|| {
                        for _ in 0..repeats {
                            let acc = bytemuck::cast_slice_mut::<u64, u8>(&mut acc);
                            let other = bytemuck::cast_slice::<u64, u8>(&other);
                            combine_at(level, dtype, op, acc, other, Order::AccFirst)
                                .expect("supported level");
                        }
                    });
                    rates.push((bytes * repeats) as f64 / seconds / 1e9);
                }
                println!(
                    "{:>8} {:>9} {:>6} {:>10.1} {:>10.1}",
                    level.name(),
                    dtype.name(),
                    op.name(),
                    rates[0],
                    rates[1]
                );
            }
        }
    }
}
