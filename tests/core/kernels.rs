//! Every SIMD level of every kernel against a scalar reference written here, element by
//! element, with the `half` crate's own conversions. Levels the CPU lacks cannot run; the test
//! prints which ran, and `generic` always does.

use _core::dtype::{DType, ReduceOp};
use _core::kernels::{combine_scaled_at, Finish, Level, Order, Scaling};
use half::{bf16, f16};

fn lcg(seed: u64) -> impl FnMut() -> u64 {
    let mut state = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    move || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        state >> 11
    }
}

/// Values that stress the kernels: ordinary numbers, signed zeros, infinities, NaN, subnormals
/// (for the 16-bit types) and overflow when multiplied.
fn special_f32(i: usize, random: u64) -> f32 {
    match i % 17 {
        0 => f32::NAN,
        1 => f32::INFINITY,
        2 => f32::NEG_INFINITY,
        3 => -0.0,
        4 => 0.0,
        5 => 6.0e-8,  // a float16 subnormal
        6 => 65000.0, // near float16's max: products overflow
        7 => 1.0e38,  // near float32's max
        _ => ((random % 2_000_001) as f32 - 1_000_000.0) / 997.0,
    }
}

/// The reference semantics: IEEE sum and product; min and max take `b` when it wins or is NaN.
#[allow(clippy::eq_op)] // `b != b` is the NaN test that works for f32 and f64 alike
fn scalar_float<T>(op: ReduceOp, a: T, b: T) -> T
where
    T: Copy + PartialOrd + std::ops::Add<Output = T> + std::ops::Mul<Output = T>,
{
    match op {
        ReduceOp::Sum | ReduceOp::Avg => a + b,
        ReduceOp::Prod => a * b,
        ReduceOp::Min if b < a || b != b => b,
        ReduceOp::Max if b > a || b != b => b,
        ReduceOp::Min | ReduceOp::Max => a,
    }
}

fn scalar_i64(op: ReduceOp, a: i64, b: i64, bits: u32) -> i64 {
    let r = match op {
        ReduceOp::Sum | ReduceOp::Avg => a.wrapping_add(b),
        ReduceOp::Prod => a.wrapping_mul(b),
        ReduceOp::Min => a.min(b),
        ReduceOp::Max => a.max(b),
    };
    if bits == 32 {
        r as i32 as i64
    } else {
        r
    }
}

/// `finish(op(a·fa, b·fb))` in the type's arithmetic (16-bit floats in f32).
fn scaled<T>(op: ReduceOp, order: Order, a: T, b: T, s: &Scaling, to: impl Fn(f64) -> T) -> T
where
    T: Copy
        + PartialOrd
        + std::ops::Add<Output = T>
        + std::ops::Mul<Output = T>
        + std::ops::Div<Output = T>,
{
    let (a, b) = (a * to(s.acc), b * to(s.other));
    let (l, r) = ordered(order, a, b);
    let result = scalar_float(op, l, r);
    match s.finish {
        Some(f) => result / to(f.divide_by as f64) * to(f.multiply),
        None => result,
    }
}

/// (acc, other) as bytes, and the expected bytes, for `n` elements.
fn case(
    dtype: DType,
    op: ReduceOp,
    order: Order,
    n: usize,
    seed: u64,
    s: &Scaling,
) -> (Vec<u8>, Vec<u8>, Vec<u8>) {
    let mut random = lcg(seed);
    let (mut acc, mut other, mut expected) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..n {
        let (x, y) = (special_f32(i, random()), special_f32(i / 3 + 5, random()));
        match dtype {
            DType::F32 => {
                acc.extend(x.to_ne_bytes());
                other.extend(y.to_ne_bytes());
                expected.extend(scaled(op, order, x, y, s, |v| v as f32).to_ne_bytes());
            }
            DType::F64 => {
                let (x, y) = (f64::from(x) * 1.0001, f64::from(y));
                acc.extend(x.to_ne_bytes());
                other.extend(y.to_ne_bytes());
                expected.extend(scaled(op, order, x, y, s, |v| v).to_ne_bytes());
            }
            DType::F16 => {
                let (x, y) = (f16::from_f32(x), f16::from_f32(y));
                let result = scaled(op, order, x.to_f32(), y.to_f32(), s, |v| v as f32);
                acc.extend(x.to_bits().to_ne_bytes());
                other.extend(y.to_bits().to_ne_bytes());
                expected.extend(f16::from_f32(result).to_bits().to_ne_bytes());
            }
            DType::BF16 => {
                let (x, y) = (bf16::from_f32(x), bf16::from_f32(y));
                let result = scaled(op, order, x.to_f32(), y.to_f32(), s, |v| v as f32);
                acc.extend(x.to_bits().to_ne_bytes());
                other.extend(y.to_bits().to_ne_bytes());
                expected.extend(bf16::from_f32(result).to_bits().to_ne_bytes());
            }
            DType::I32 | DType::I64 => {
                let bits = if dtype == DType::I32 { 32 } else { 64 };
                let (x, y) = (random() as i64, (random() as i64) >> (i % 40));
                let (x, y) = if bits == 32 {
                    (x as i32 as i64, y as i32 as i64)
                } else {
                    (x, y)
                };
                let (l, r) = ordered(order, x, y);
                let mut result = scalar_i64(op, l, r, bits);
                if let Some(f) = s.finish {
                    result = if bits == 32 {
                        (result as i32).wrapping_div(f.divide_by as i32) as i64
                    } else {
                        result.wrapping_div(f.divide_by as i64)
                    };
                }
                if bits == 32 {
                    acc.extend((x as i32).to_ne_bytes());
                    other.extend((y as i32).to_ne_bytes());
                    expected.extend((result as i32).to_ne_bytes());
                } else {
                    acc.extend(x.to_ne_bytes());
                    other.extend(y.to_ne_bytes());
                    expected.extend(result.to_ne_bytes());
                }
            }
        }
    }
    (acc, other, expected)
}

fn ordered<T>(order: Order, a: T, b: T) -> (T, T) {
    match order {
        Order::AccFirst => (a, b),
        Order::OtherFirst => (b, a),
    }
}

fn is_nan(dtype: DType, bytes: &[u8]) -> bool {
    match dtype {
        DType::F32 => f32::from_ne_bytes(bytes.try_into().expect("4 bytes")).is_nan(),
        DType::F64 => f64::from_ne_bytes(bytes.try_into().expect("8 bytes")).is_nan(),
        DType::F16 => f16::from_bits(u16::from_ne_bytes(bytes.try_into().expect("2"))).is_nan(),
        DType::BF16 => bf16::from_bits(u16::from_ne_bytes(bytes.try_into().expect("2"))).is_nan(),
        DType::I32 | DType::I64 => false,
    }
}

/// An 8-aligned copy, as NumPy and the scratch buffers provide.
fn aligned(bytes: &[u8]) -> Vec<u64> {
    let mut words = vec![0u64; bytes.len().div_ceil(8)];
    bytemuck::cast_slice_mut::<u64, u8>(&mut words)[..bytes.len()].copy_from_slice(bytes);
    words
}

#[test]
fn every_supported_level_matches_the_scalar_reference() {
    let levels: Vec<Level> = Level::ALL
        .into_iter()
        .filter(|l| l.is_supported())
        .collect();
    println!(
        "kernel levels checked on this CPU: {levels:?} (active: {:?})",
        Level::active()
    );
    assert!(levels.contains(&Level::Generic));
    for level in levels {
        for dtype in DType::ALL {
            for op in [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Min, ReduceOp::Max] {
                for order in [Order::AccFirst, Order::OtherFirst] {
                    for scaling in scalings(dtype) {
                        for (n, seed) in (0..70).chain([255, 256, 257, 1000, 4099]).zip(1..) {
                            let (acc, other, expected) = case(dtype, op, order, n, seed, &scaling);
                            let len = acc.len();
                            let mut acc_words = aligned(&acc);
                            let other_words = aligned(&other);
                            let acc_bytes =
                                &mut bytemuck::cast_slice_mut::<u64, u8>(&mut acc_words)[..len];
                            let other_bytes = &bytemuck::cast_slice::<u64, u8>(&other_words)[..len];
                            combine_scaled_at(
                                level,
                                dtype,
                                op,
                                acc_bytes,
                                other_bytes,
                                order,
                                &scaling,
                            )
                            .unwrap_or_else(|e| panic!("{level:?} {dtype:?}: {e}"));
                            let size = dtype.size();
                            for (i, (got, want)) in acc_bytes
                                .chunks(size)
                                .zip(expected.chunks(size))
                                .enumerate()
                            {
                                let both_nan = is_nan(dtype, got) && is_nan(dtype, want);
                                assert!(
                                got == want || both_nan,
                                "{level:?} {dtype:?} {op:?} {order:?} {scaling:?} n={n} element {i}: {got:?} != {want:?}"
                            );
                            }
                        }
                    }
                }
            }
        }
    }
}

/// No scaling; a prescale on one side; factors on both and a finish; only `avg`'s division
/// (all integers take).
fn scalings(dtype: DType) -> Vec<Scaling> {
    let divide = Scaling {
        finish: Some(Finish {
            divide_by: 3,
            multiply: 1.0,
        }),
        ..Scaling::NONE
    };
    if matches!(dtype, DType::I32 | DType::I64) {
        return vec![Scaling::NONE, divide];
    }
    vec![
        Scaling::NONE,
        Scaling {
            acc: 0.37,
            ..Scaling::NONE
        },
        Scaling {
            acc: 2.5,
            other: 0.1,
            finish: Some(Finish {
                divide_by: 7,
                multiply: 1.75,
            }),
        },
        divide,
    ]
}
