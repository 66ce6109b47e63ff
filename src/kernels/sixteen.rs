//! float16 and bfloat16: widen to f32, combine, round once back to 16 bits.
//!
//! Blocks of `BLOCK` elements are widened into stack arrays so that the conversions and the f32
//! loop vectorize (half's slice conversions use F16C when the CPU has it).

use super::native::Arith;
use super::Order;
use crate::dtype::ReduceOp;
use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};
use half::{bf16, f16};

const BLOCK: usize = 256;

pub(super) trait Sixteen {
    fn widen(src: &[u16], dst: &mut [f32]);
    fn narrow(src: &[f32], dst: &mut [u16]);
}

pub(super) enum F16 {}
pub(super) enum BF16 {}

// The kernels take the raw bits as u16 so that the byte casts stay in bytemuck's safe API.
type Bits = u16;

impl Sixteen for F16 {
    fn widen(src: &[u16], dst: &mut [f32]) {
        src.reinterpret_cast::<f16>().convert_to_f32_slice(dst);
    }
    fn narrow(src: &[f32], dst: &mut [u16]) {
        dst.reinterpret_cast_mut::<f16>()
            .convert_from_f32_slice(src);
    }
}

impl Sixteen for BF16 {
    fn widen(src: &[u16], dst: &mut [f32]) {
        src.reinterpret_cast::<bf16>().convert_to_f32_slice(dst);
    }
    fn narrow(src: &[f32], dst: &mut [u16]) {
        dst.reinterpret_cast_mut::<bf16>()
            .convert_from_f32_slice(src);
    }
}

pub(super) fn combine<S: Sixteen>(op: ReduceOp, acc: &mut [Bits], other: &[Bits], order: Order) {
    let mut wide_acc = [0f32; BLOCK];
    let mut wide_other = [0f32; BLOCK];
    for (acc, other) in acc.chunks_mut(BLOCK).zip(other.chunks(BLOCK)) {
        let n = acc.len();
        S::widen(acc, &mut wide_acc[..n]);
        S::widen(other, &mut wide_other[..n]);
        super::native::combine::<f32>(op, &mut wide_acc[..n], &wide_other[..n], order);
        S::narrow(&wide_acc[..n], acc);
    }
}

pub(super) fn divide<S: Sixteen>(buf: &mut [Bits], count: usize) {
    let mut wide = [0f32; BLOCK];
    for block in buf.chunks_mut(BLOCK) {
        let n = block.len();
        S::widen(block, &mut wide[..n]);
        wide[..n].iter_mut().for_each(|x| *x = x.div_count(count));
        S::narrow(&wide[..n], block);
    }
}
