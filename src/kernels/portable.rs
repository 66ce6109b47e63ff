//! The kernels in plain Rust: correct on any CPU, and inlined into the x86 entry points so the
//! same loops vectorize at AVX2 or AVX-512 width there.

use super::{scalar, sixteen, Order, Scaling, Slices};
use crate::dtype::ReduceOp;

#[inline(always)]
pub(super) fn combine(op: ReduceOp, slices: Slices<'_>, order: Order) {
    match slices {
        Slices::F32(acc, other) => scalar::combine(op, acc, other, order),
        Slices::F64(acc, other) => scalar::combine(op, acc, other, order),
        Slices::I32(acc, other) => scalar::combine(op, acc, other, order),
        Slices::I64(acc, other) => scalar::combine(op, acc, other, order),
        Slices::F16(acc, other) => sixteen::f16_combine(op, acc, other, order),
        Slices::BF16(acc, other) => sixteen::bf16_combine(op, acc, other, order),
    }
}

#[inline(always)]
pub(super) fn combine_scaled(op: ReduceOp, slices: Slices<'_>, order: Order, scaling: &Scaling) {
    match slices {
        Slices::F32(acc, other) => scalar::combine_scaled(op, acc, other, order, scaling),
        Slices::F64(acc, other) => scalar::combine_scaled(op, acc, other, order, scaling),
        Slices::I32(acc, other) => scalar::combine_scaled(op, acc, other, order, scaling),
        Slices::I64(acc, other) => scalar::combine_scaled(op, acc, other, order, scaling),
        Slices::F16(acc, other) => sixteen::f16_combine_scaled(op, acc, other, order, scaling),
        Slices::BF16(acc, other) => sixteen::bf16_combine_scaled(op, acc, other, order, scaling),
    }
}
