//! x86-64 kernels compiled for AVX2 (with FMA and F16C) and for AVX-512.
//!
//! Each level is one `#[target_feature]` entry point into which the portable loops are
//! inlined, so the compiler vectorizes them at that width. float16 and bfloat16 get fused
//! intrinsic loops (widen 8 or 16 values to f32 with F16C or a shift, combine, round back),
//! because portable conversions do not vectorize well. Callers check the CPU first (`Level::is_supported`).

use super::scalar::Arith;
use super::{portable, sixteen, Order, Scaling, Slices};
use crate::dtype::ReduceOp;
use half::f16;
use std::arch::x86_64::*;

/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn combine_avx2(op: ReduceOp, slices: Slices<'_>, order: Order) {
    match slices {
        // SAFETY: the caller guarantees AVX2, FMA and F16C, all that `Avx2` needs.
        Slices::F16(acc, other) => unsafe { sixteen_combine::<Avx2, F16>(op, acc, other, order) },
        // SAFETY: as above.
        Slices::BF16(acc, other) => unsafe { sixteen_combine::<Avx2, BF16>(op, acc, other, order) },
        slices => portable::combine(op, slices, order),
    }
}

/// # Safety
/// The CPU must support AVX-512 F/BW/VL, AVX2, FMA and F16C.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub(super) unsafe fn combine_avx512(op: ReduceOp, slices: Slices<'_>, order: Order) {
    match slices {
        // SAFETY: the caller guarantees AVX-512 F/BW/VL, AVX2, FMA and F16C, all that `Avx512`
        // needs.
        Slices::F16(acc, other) => unsafe { sixteen_combine::<Avx512, F16>(op, acc, other, order) },
        // SAFETY: as above.
        Slices::BF16(acc, other) => unsafe {
            sixteen_combine::<Avx512, BF16>(op, acc, other, order)
        },
        slices => portable::combine(op, slices, order),
    }
}

/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn combine_scaled_avx2(
    op: ReduceOp,
    slices: Slices<'_>,
    order: Order,
    scaling: &Scaling,
) {
    match slices {
        // SAFETY: the caller guarantees AVX2, FMA and F16C, all that `Avx2` needs.
        Slices::F16(acc, other) => unsafe {
            sixteen_scaled::<Avx2, F16>(op, acc, other, order, scaling)
        },
        // SAFETY: as above.
        Slices::BF16(acc, other) => unsafe {
            sixteen_scaled::<Avx2, BF16>(op, acc, other, order, scaling)
        },
        slices => portable::combine_scaled(op, slices, order, scaling),
    }
}

/// # Safety
/// The CPU must support AVX-512 F/BW/VL, AVX2, FMA and F16C.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub(super) unsafe fn combine_scaled_avx512(
    op: ReduceOp,
    slices: Slices<'_>,
    order: Order,
    scaling: &Scaling,
) {
    match slices {
        // SAFETY: the caller guarantees AVX-512 F/BW/VL, AVX2, FMA and F16C, all that `Avx512`
        // needs.
        Slices::F16(acc, other) => unsafe {
            sixteen_scaled::<Avx512, F16>(op, acc, other, order, scaling)
        },
        // SAFETY: as above.
        Slices::BF16(acc, other) => unsafe {
            sixteen_scaled::<Avx512, BF16>(op, acc, other, order, scaling)
        },
        slices => portable::combine_scaled(op, slices, order, scaling),
    }
}

/// A vector of f32 lanes and the operations the f16 loop needs.
///
/// Every method is an `unsafe fn` with one contract, besides what each says of its pointer:
/// the CPU supports the level's instructions (`Avx2`: AVX2, FMA and F16C; `Avx512`: AVX-512
/// F/BW/VL as well), which the entry points' `#[target_feature]` contracts carry down.
trait Lanes {
    const WIDTH: usize;
    type V: Copy;
    /// Load `WIDTH` float16 values and widen them.
    ///
    /// # Safety
    /// The level's instructions (see [`Lanes`]); `src` valid for reading `WIDTH` `u16`s (any
    /// alignment).
    unsafe fn load_f16(src: *const u16) -> Self::V;
    /// Round to float16 (nearest, ties to even) and store `WIDTH` of them.
    ///
    /// # Safety
    /// The level's instructions; `dst` valid for writing `WIDTH` `u16`s (any alignment).
    unsafe fn store_f16(dst: *mut u16, v: Self::V);
    /// Load `WIDTH` bfloat16 values and widen them (a shift: bfloat16 is an f32's top half).
    ///
    /// # Safety
    /// The level's instructions; `src` valid for reading `WIDTH` `u16`s (any alignment).
    unsafe fn load_bf16(src: *const u16) -> Self::V;
    /// Round to bfloat16 (nearest, ties to even; NaN stays NaN) and store `WIDTH` of them.
    ///
    /// # Safety
    /// The level's instructions; `dst` valid for writing `WIDTH` `u16`s (any alignment).
    unsafe fn store_bf16(dst: *mut u16, v: Self::V);
    /// # Safety
    /// The level's instructions.
    unsafe fn add(a: Self::V, b: Self::V) -> Self::V;
    /// # Safety
    /// The level's instructions.
    unsafe fn mul(a: Self::V, b: Self::V) -> Self::V;
    /// `b` if `b < a` or `b` is NaN, else `a`: the scalar kernels' NaN-propagating min.
    ///
    /// # Safety
    /// The level's instructions.
    unsafe fn min(a: Self::V, b: Self::V) -> Self::V;
    /// # Safety
    /// The level's instructions.
    unsafe fn max(a: Self::V, b: Self::V) -> Self::V;
    /// # Safety
    /// The level's instructions.
    unsafe fn div(a: Self::V, b: Self::V) -> Self::V;
    /// # Safety
    /// The level's instructions.
    unsafe fn splat(x: f32) -> Self::V;
}

enum Avx2 {}
enum Avx512 {}

impl Lanes for Avx2 {
    const WIDTH: usize = 8;
    type V = __m256;
    #[inline(always)]
    unsafe fn load_f16(src: *const u16) -> __m256 {
        // SAFETY: the caller guarantees AVX2, FMA and F16C and that `src` holds 8 `u16`s (the
        // trait's contract); the load is unaligned.
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(src.cast())) }
    }
    #[inline(always)]
    unsafe fn store_f16(dst: *mut u16, v: __m256) {
        // SAFETY: the caller guarantees AVX2, FMA and F16C and that `dst` has room for 8 `u16`s
        // (the trait's contract); the store is unaligned.
        unsafe {
            _mm_storeu_si128(dst.cast(), _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v));
        }
    }
    #[inline(always)]
    unsafe fn load_bf16(src: *const u16) -> __m256 {
        // SAFETY: the caller guarantees AVX2, FMA and F16C and that `src` holds 8 `u16`s (the
        // trait's contract); the load is unaligned.
        unsafe {
            let wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(src.cast()));
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(wide))
        }
    }
    #[inline(always)]
    unsafe fn store_bf16(dst: *mut u16, v: __m256) {
        // SAFETY: the caller guarantees AVX2, FMA and F16C and that `dst` has room for 8 `u16`s
        // (the trait's contract); the store is unaligned.
        unsafe {
            let bits = _mm256_castps_si256(v);
            let lsb = _mm256_and_si256(_mm256_srli_epi32::<16>(bits), _mm256_set1_epi32(1));
            let bias = _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF));
            let rounded = _mm256_srli_epi32::<16>(_mm256_add_epi32(bits, bias));
            let quiet_nan = _mm256_or_si256(_mm256_srli_epi32::<16>(bits), _mm256_set1_epi32(0x40));
            let is_nan = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_UNORD_Q>(v, v));
            let halves = _mm256_blendv_epi8(rounded, quiet_nan, is_nan);
            // Every lane is below 0x10000, so unsigned-saturating packing is exact.
            let packed = _mm_packus_epi32(
                _mm256_castsi256_si128(halves),
                _mm256_extracti128_si256::<1>(halves),
            );
            _mm_storeu_si128(dst.cast(), packed);
        }
    }
    #[inline(always)]
    unsafe fn add(a: __m256, b: __m256) -> __m256 {
        // SAFETY: the caller guarantees AVX2, FMA and F16C (the trait's contract).
        unsafe { _mm256_add_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn mul(a: __m256, b: __m256) -> __m256 {
        // SAFETY: the caller guarantees AVX2, FMA and F16C (the trait's contract).
        unsafe { _mm256_mul_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn min(a: __m256, b: __m256) -> __m256 {
        // SAFETY: the caller guarantees AVX2, FMA and F16C (the trait's contract).
        unsafe {
            // min_ps(b, a) is (b < a ? b : a); then take b wherever b is NaN.
            let b_is_nan = _mm256_cmp_ps::<_CMP_UNORD_Q>(b, b);
            _mm256_blendv_ps(_mm256_min_ps(b, a), b, b_is_nan)
        }
    }
    #[inline(always)]
    unsafe fn max(a: __m256, b: __m256) -> __m256 {
        // SAFETY: the caller guarantees AVX2, FMA and F16C (the trait's contract).
        unsafe {
            let b_is_nan = _mm256_cmp_ps::<_CMP_UNORD_Q>(b, b);
            _mm256_blendv_ps(_mm256_max_ps(b, a), b, b_is_nan)
        }
    }
    #[inline(always)]
    unsafe fn div(a: __m256, b: __m256) -> __m256 {
        // SAFETY: the caller guarantees AVX2, FMA and F16C (the trait's contract).
        unsafe { _mm256_div_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn splat(x: f32) -> __m256 {
        // SAFETY: the caller guarantees AVX2, FMA and F16C (the trait's contract).
        unsafe { _mm256_set1_ps(x) }
    }
}

impl Lanes for Avx512 {
    const WIDTH: usize = 16;
    type V = __m512;
    #[inline(always)]
    unsafe fn load_f16(src: *const u16) -> __m512 {
        // SAFETY: the caller guarantees AVX-512 F/BW/VL and that `src` holds 16 `u16`s (the trait's
        // contract); the load is unaligned.
        unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(src.cast())) }
    }
    #[inline(always)]
    unsafe fn store_f16(dst: *mut u16, v: __m512) {
        // SAFETY: the caller guarantees AVX-512 F/BW/VL and that `dst` has room for 16 `u16`s (the
        // trait's contract); the store is unaligned.
        unsafe {
            _mm256_storeu_si256(dst.cast(), _mm512_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v));
        }
    }
    #[inline(always)]
    unsafe fn load_bf16(src: *const u16) -> __m512 {
        // SAFETY: the caller guarantees AVX-512 F/BW/VL and that `src` holds 16 `u16`s (the trait's
        // contract); the load is unaligned.
        unsafe {
            let wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(src.cast()));
            _mm512_castsi512_ps(_mm512_slli_epi32::<16>(wide))
        }
    }
    #[inline(always)]
    unsafe fn store_bf16(dst: *mut u16, v: __m512) {
        // SAFETY: the caller guarantees AVX-512 F/BW/VL and that `dst` has room for 16 `u16`s (the
        // trait's contract); the store is unaligned.
        unsafe {
            let bits = _mm512_castps_si512(v);
            let lsb = _mm512_and_si512(_mm512_srli_epi32::<16>(bits), _mm512_set1_epi32(1));
            let bias = _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF));
            let rounded = _mm512_srli_epi32::<16>(_mm512_add_epi32(bits, bias));
            let quiet_nan = _mm512_or_si512(_mm512_srli_epi32::<16>(bits), _mm512_set1_epi32(0x40));
            let is_nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(v, v);
            let halves = _mm512_mask_blend_epi32(is_nan, rounded, quiet_nan);
            _mm256_storeu_si256(dst.cast(), _mm512_cvtepi32_epi16(halves));
        }
    }
    #[inline(always)]
    unsafe fn add(a: __m512, b: __m512) -> __m512 {
        // SAFETY: the caller guarantees AVX-512 F/BW/VL (the trait's contract).
        unsafe { _mm512_add_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn mul(a: __m512, b: __m512) -> __m512 {
        // SAFETY: the caller guarantees AVX-512 F/BW/VL (the trait's contract).
        unsafe { _mm512_mul_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn min(a: __m512, b: __m512) -> __m512 {
        // SAFETY: the caller guarantees AVX-512 F/BW/VL (the trait's contract).
        unsafe {
            let b_is_nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(b, b);
            _mm512_mask_blend_ps(b_is_nan, _mm512_min_ps(b, a), b)
        }
    }
    #[inline(always)]
    unsafe fn max(a: __m512, b: __m512) -> __m512 {
        // SAFETY: the caller guarantees AVX-512 F/BW/VL (the trait's contract).
        unsafe {
            let b_is_nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(b, b);
            _mm512_mask_blend_ps(b_is_nan, _mm512_max_ps(b, a), b)
        }
    }
    #[inline(always)]
    unsafe fn div(a: __m512, b: __m512) -> __m512 {
        // SAFETY: the caller guarantees AVX-512 F/BW/VL (the trait's contract).
        unsafe { _mm512_div_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn splat(x: f32) -> __m512 {
        // SAFETY: the caller guarantees AVX-512 F/BW/VL (the trait's contract).
        unsafe { _mm512_set1_ps(x) }
    }
}

/// How a 16-bit format moves between memory and f32 lanes, and one value in scalar code.
trait Format {
    /// Load `L::WIDTH` values of this format, widened to f32.
    ///
    /// # Safety
    /// `L`'s instructions (see [`Lanes`]); `src` valid for reading `L::WIDTH` `u16`s.
    unsafe fn load<L: Lanes>(src: *const u16) -> L::V;
    /// Round `v` to this format and store its `L::WIDTH` values.
    ///
    /// # Safety
    /// `L`'s instructions; `dst` valid for writing `L::WIDTH` `u16`s.
    unsafe fn store<L: Lanes>(dst: *mut u16, v: L::V);
    fn widen(bits: u16) -> f32;
    fn narrow(value: f32) -> u16;
}

enum F16 {}
enum BF16 {}

impl Format for F16 {
    #[inline(always)]
    unsafe fn load<L: Lanes>(src: *const u16) -> L::V {
        // SAFETY: `Format::load`'s contract is the one of the `Lanes` method it calls.
        unsafe { L::load_f16(src) }
    }
    #[inline(always)]
    unsafe fn store<L: Lanes>(dst: *mut u16, v: L::V) {
        // SAFETY: `Format::store`'s contract is the one of the `Lanes` method it calls.
        unsafe { L::store_f16(dst, v) }
    }
    fn widen(bits: u16) -> f32 {
        f16::from_bits(bits).to_f32()
    }
    fn narrow(value: f32) -> u16 {
        f16::from_f32(value).to_bits()
    }
}

impl Format for BF16 {
    #[inline(always)]
    unsafe fn load<L: Lanes>(src: *const u16) -> L::V {
        // SAFETY: `Format::load`'s contract is the one of the `Lanes` method it calls.
        unsafe { L::load_bf16(src) }
    }
    #[inline(always)]
    unsafe fn store<L: Lanes>(dst: *mut u16, v: L::V) {
        // SAFETY: `Format::store`'s contract is the one of the `Lanes` method it calls.
        unsafe { L::store_bf16(dst, v) }
    }
    fn widen(bits: u16) -> f32 {
        sixteen::bf16_to_f32(bits)
    }
    fn narrow(value: f32) -> u16 {
        sixteen::f32_to_bf16(value)
    }
}

/// `acc = acc ⊕ other` (or `other ⊕ acc`) for `op`, `L::WIDTH` values at a time.
///
/// # Safety
/// The CPU supports `L`'s instructions (see [`Lanes`]).
#[inline(always)]
unsafe fn sixteen_combine<L: Lanes, F: Format>(
    op: ReduceOp,
    acc: &mut [u16],
    other: &[u16],
    order: Order,
) {
    // SAFETY: the caller guarantees `L`'s instructions, which is all `sixteen_loop` needs, and
    // `L`'s methods are the `vector` it calls.
    unsafe {
        match op {
            ReduceOp::Sum | ReduceOp::Avg => {
                sixteen_loop::<L, F>(acc, other, order, L::add, f32::add)
            }
            ReduceOp::Prod => sixteen_loop::<L, F>(acc, other, order, L::mul, f32::mul),
            ReduceOp::Min => sixteen_loop::<L, F>(acc, other, order, L::min, Arith::min),
            ReduceOp::Max => sixteen_loop::<L, F>(acc, other, order, L::max, Arith::max),
        }
    }
}

/// Widen `WIDTH` values of each side, combine in f32, round once; a scalar tail.
///
/// # Safety
/// The CPU supports `L`'s instructions (see [`Lanes`]), and that is all `vector` needs.
#[inline(always)]
unsafe fn sixteen_loop<L: Lanes, F: Format>(
    acc: &mut [u16],
    other: &[u16],
    order: Order,
    vector: unsafe fn(L::V, L::V) -> L::V,
    scalar: fn(f32, f32) -> f32,
) {
    let n = acc.len().min(other.len());
    let whole = n - n % L::WIDTH;
    let (a_ptr, b_ptr) = (acc.as_mut_ptr(), other.as_ptr());
    let mut i = 0;
    while i < whole {
        // SAFETY: i + WIDTH ≤ whole ≤ n, the length of both slices at least, so both pointers
        // are valid for `WIDTH` values, and `a_ptr` for writing (`acc` is borrowed mutably, and
        // not otherwise touched until the loop ends); the caller guarantees `L`'s instructions,
        // for the loads, the stores and `vector`.
        unsafe {
            let (a, b) = (F::load::<L>(a_ptr.add(i)), F::load::<L>(b_ptr.add(i)));
            let r = match order {
                Order::AccFirst => vector(a, b),
                Order::OtherFirst => vector(b, a),
            };
            F::store::<L>(a_ptr.add(i), r);
        }
        i += L::WIDTH;
    }
    for (a, &b) in acc[whole..n].iter_mut().zip(&other[whole..n]) {
        let (x, y) = (F::widen(*a), F::widen(b));
        *a = F::narrow(match order {
            Order::AccFirst => scalar(x, y),
            Order::OtherFirst => scalar(y, x),
        });
    }
}

/// [`sixteen_combine`] with the factors and the finish of [`Scaling`].
///
/// # Safety
/// The CPU supports `L`'s instructions (see [`Lanes`]).
#[inline(always)]
unsafe fn sixteen_scaled<L: Lanes, F: Format>(
    op: ReduceOp,
    acc: &mut [u16],
    other: &[u16],
    order: Order,
    scaling: &Scaling,
) {
    // SAFETY: the caller guarantees `L`'s instructions, which is all `sixteen_scaled_loop`
    // needs, and `L`'s methods are the `vector` it calls.
    unsafe {
        match op {
            ReduceOp::Sum | ReduceOp::Avg => {
                sixteen_scaled_loop::<L, F>(acc, other, order, scaling, L::add, f32::add)
            }
            ReduceOp::Prod => {
                sixteen_scaled_loop::<L, F>(acc, other, order, scaling, L::mul, f32::mul)
            }
            ReduceOp::Min => {
                sixteen_scaled_loop::<L, F>(acc, other, order, scaling, L::min, Arith::min)
            }
            ReduceOp::Max => {
                sixteen_scaled_loop::<L, F>(acc, other, order, scaling, L::max, Arith::max)
            }
        }
    }
}

/// [`sixteen_loop`] with the factors and the finish of [`Scaling`], in the order the scalar
/// kernels apply them: `(a·fa ⊕ b·fb) / divide_by · multiply` in f32, rounded once.
///
/// # Safety
/// The CPU supports `L`'s instructions (see [`Lanes`]), and that is all `vector` needs.
#[inline(always)]
unsafe fn sixteen_scaled_loop<L: Lanes, F: Format>(
    acc: &mut [u16],
    other: &[u16],
    order: Order,
    scaling: &Scaling,
    vector: unsafe fn(L::V, L::V) -> L::V,
    scalar: fn(f32, f32) -> f32,
) {
    let (fa, fb) = (scaling.acc as f32, scaling.other as f32);
    let (divisor, multiply) = scaling
        .finish
        .map_or((1.0, 1.0), |f| (f.divide_by as f32, f.multiply as f32));
    let finishing = scaling.finish.is_some();
    // SAFETY: the caller guarantees `L`'s instructions.
    let (va, vb, vd, vm) = unsafe {
        (
            L::splat(fa),
            L::splat(fb),
            L::splat(divisor),
            L::splat(multiply),
        )
    };
    let n = acc.len().min(other.len());
    let whole = n - n % L::WIDTH;
    let (a_ptr, b_ptr) = (acc.as_mut_ptr(), other.as_ptr());
    let mut i = 0;
    while i < whole {
        // SAFETY: as in `sixteen_loop`: i + WIDTH ≤ whole ≤ n, the length of both slices at
        // least, so both pointers are valid for `WIDTH` values, `a_ptr` for writing (`acc` is
        // not otherwise touched until the loop ends); the caller guarantees `L`'s instructions.
        unsafe {
            let a = L::mul(F::load::<L>(a_ptr.add(i)), va);
            let b = L::mul(F::load::<L>(b_ptr.add(i)), vb);
            let mut r = match order {
                Order::AccFirst => vector(a, b),
                Order::OtherFirst => vector(b, a),
            };
            if finishing {
                r = L::mul(L::div(r, vd), vm);
            }
            F::store::<L>(a_ptr.add(i), r);
        }
        i += L::WIDTH;
    }
    for (a, &b) in acc[whole..n].iter_mut().zip(&other[whole..n]) {
        let (x, y) = (F::widen(*a) * fa, F::widen(b) * fb);
        let mut r = match order {
            Order::AccFirst => scalar(x, y),
            Order::OtherFirst => scalar(y, x),
        };
        if finishing {
            r = r / divisor * multiply;
        }
        *a = F::narrow(r);
    }
}
