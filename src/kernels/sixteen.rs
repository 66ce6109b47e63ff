//! float16 and bfloat16, portable: widen to f32, combine, round once back to 16 bits.
//!
//! bfloat16 is the top half of an f32, so widening is a shift and narrowing a round-to-nearest-
//! even on integers: plain loops the compiler vectorizes at whatever level the caller is
//! compiled for. float16 needs real conversions; here they go through `half` in batches (which
//! uses F16C when the CPU has it); `x86.rs` has the fused intrinsic loops.

use super::scalar::{self, Arith};
use super::{Finish, Order, Scaling};
use crate::dtype::ReduceOp;
use half::f16;
use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};

/// Elements widened to f32 at a time (a batch), in a buffer on the stack.
const BATCH: usize = 256;

#[inline(always)]
pub(super) fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits(u32::from(bits) << 16)
}

/// Round to nearest, ties to even; NaN stays NaN (quieted), as `half` and `ml_dtypes` do.
#[inline(always)]
pub(super) fn f32_to_bf16(value: f32) -> u16 {
    let bits = value.to_bits();
    let rounded = bits.wrapping_add(0x7FFF + ((bits >> 16) & 1)) >> 16;
    let quiet_nan = (bits >> 16) | 0x0040;
    let is_nan = (bits & 0x7FFF_FFFF) > 0x7F80_0000;
    (if is_nan { quiet_nan } else { rounded }) as u16
}

#[inline(always)]
fn bf16_apply(acc: &mut [u16], other: &[u16], order: Order, f: impl Fn(f32, f32) -> f32) {
    let combine = |a: u16, b: u16| {
        let (a, b) = (bf16_to_f32(a), bf16_to_f32(b));
        f32_to_bf16(match order {
            Order::AccFirst => f(a, b),
            Order::OtherFirst => f(b, a),
        })
    };
    acc.iter_mut()
        .zip(other)
        .for_each(|(a, &b)| *a = combine(*a, b));
}

#[inline(always)]
pub(super) fn bf16_combine(op: ReduceOp, acc: &mut [u16], other: &[u16], order: Order) {
    match op {
        ReduceOp::Sum | ReduceOp::Avg => bf16_apply(acc, other, order, f32::add),
        ReduceOp::Prod => bf16_apply(acc, other, order, f32::mul),
        ReduceOp::Min => bf16_apply(acc, other, order, Arith::min),
        ReduceOp::Max => bf16_apply(acc, other, order, Arith::max),
    }
}

/// [`super::scalar::combine_scaled`] for bfloat16: in f32, rounded once.
#[inline(always)]
pub(super) fn bf16_combine_scaled(
    op: ReduceOp,
    acc: &mut [u16],
    other: &[u16],
    order: Order,
    scaling: &Scaling,
) {
    let mut wide_acc = [0f32; BATCH];
    let mut wide_other = [0f32; BATCH];
    for (acc, other) in acc.chunks_mut(BATCH).zip(other.chunks(BATCH)) {
        let n = acc.len();
        acc.iter()
            .zip(&mut wide_acc)
            .for_each(|(&a, w)| *w = bf16_to_f32(a));
        other
            .iter()
            .zip(&mut wide_other)
            .for_each(|(&b, w)| *w = bf16_to_f32(b));
        scalar::combine_scaled::<f32>(op, &mut wide_acc[..n], &wide_other[..n], order, scaling);
        acc.iter_mut()
            .zip(&wide_acc)
            .for_each(|(a, &w)| *a = f32_to_bf16(w));
    }
}

#[inline(always)]
pub(super) fn bf16_finish(buf: &mut [u16], finish: Finish) {
    buf.iter_mut().for_each(|x| {
        let value = bf16_to_f32(*x)
            .div_count(finish.divide_by)
            .times(finish.multiply);
        *x = f32_to_bf16(value);
    });
}

pub(super) fn f16_combine(op: ReduceOp, acc: &mut [u16], other: &[u16], order: Order) {
    let mut wide_acc = [0f32; BATCH];
    let mut wide_other = [0f32; BATCH];
    for (acc, other) in acc.chunks_mut(BATCH).zip(other.chunks(BATCH)) {
        let n = acc.len();
        acc.reinterpret_cast::<f16>()
            .convert_to_f32_slice(&mut wide_acc[..n]);
        other
            .reinterpret_cast::<f16>()
            .convert_to_f32_slice(&mut wide_other[..n]);
        scalar::combine::<f32>(op, &mut wide_acc[..n], &wide_other[..n], order);
        acc.reinterpret_cast_mut::<f16>()
            .convert_from_f32_slice(&wide_acc[..n]);
    }
}

/// [`super::scalar::combine_scaled`] for float16: in f32, rounded once.
pub(super) fn f16_combine_scaled(
    op: ReduceOp,
    acc: &mut [u16],
    other: &[u16],
    order: Order,
    scaling: &Scaling,
) {
    let mut wide_acc = [0f32; BATCH];
    let mut wide_other = [0f32; BATCH];
    for (acc, other) in acc.chunks_mut(BATCH).zip(other.chunks(BATCH)) {
        let n = acc.len();
        acc.reinterpret_cast::<f16>()
            .convert_to_f32_slice(&mut wide_acc[..n]);
        other
            .reinterpret_cast::<f16>()
            .convert_to_f32_slice(&mut wide_other[..n]);
        scalar::combine_scaled::<f32>(op, &mut wide_acc[..n], &wide_other[..n], order, scaling);
        acc.reinterpret_cast_mut::<f16>()
            .convert_from_f32_slice(&wide_acc[..n]);
    }
}

pub(super) fn f16_finish(buf: &mut [u16], finish: Finish) {
    let mut wide = [0f32; BATCH];
    for batch in buf.chunks_mut(BATCH) {
        let n = batch.len();
        batch
            .reinterpret_cast::<f16>()
            .convert_to_f32_slice(&mut wide[..n]);
        scalar::finish(&mut wide[..n], finish);
        batch
            .reinterpret_cast_mut::<f16>()
            .convert_from_f32_slice(&wide[..n]);
    }
}
