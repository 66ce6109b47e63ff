//! Element-wise reductions on byte buffers, one per (dtype, op), at the best SIMD level the CPU
//! has.
//!
//! The schedules move bytes; these functions give the bytes a type. Buffers must be aligned to
//! the element size (NumPy arrays and the schedules' scratch always are) and a whole number of
//! elements long; anything else is an `InvalidArgument` error, never a panic.
//!
//! Levels: `generic` (any CPU; baseline x86-64 is SSE2), `avx2` (AVX2 + FMA + F16C) and
//! `avx512` (AVX-512 F/BW/VL). The level is picked once from the CPU (runtime detection, so one
//! wheel runs everywhere); `RINGLET_KERNELS=generic|avx2|avx512` caps it. Every level gives the
//! same bits: one rounding per combine, IEEE arithmetic in f32 or wider.

pub mod convert;
mod portable;
mod scalar;
mod sixteen;
#[cfg(target_arch = "x86_64")]
mod x86;

use crate::dtype::{DType, ReduceOp};
use crate::error::{CoreError, Result};
use bytemuck::Pod;
use std::cell::Cell;
use std::sync::OnceLock;

thread_local! {
    /// While `Some`, combines on this thread only add their bytes here ([`counting`]).
    static COUNTING: Cell<Option<u64>> = const { Cell::new(None) };
}

/// Run `work` with this thread's combines counted instead of computed: the simulator runs the
/// schedules for the messages they send, not for their sums. Returns what `work` returned and
/// the bytes it would have combined.
pub fn counting<R>(work: impl FnOnce() -> R) -> (R, u64) {
    let outer = COUNTING.with(|c| c.replace(Some(0)));
    let result = work();
    let counted = COUNTING.with(|c| c.replace(outer)).unwrap_or(0);
    (result, counted)
}

/// The bytes combined so far inside [`counting`] on this thread (0 outside it).
pub fn counted_bytes() -> u64 {
    COUNTING.with(|c| c.get().unwrap_or(0))
}

/// Inside [`counting`]: add `bytes` and say so (the caller then skips the arithmetic).
fn counted(bytes: usize) -> bool {
    COUNTING.with(|c| match c.get() {
        Some(total) => {
            c.set(Some(total + bytes as u64));
            true
        }
        None => false,
    })
}

/// Which operand stands on the left of the combine.
///
/// Sum, prod, min and max are commutative for every value but NaN payloads; schedules in which
/// two ranks combine the same pair of partial results (recursive doubling) put the lower rank's
/// data first so that even those bits agree on every rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Order {
    /// `acc = acc ⊕ other`
    AccFirst,
    /// `acc = other ⊕ acc`
    OtherFirst,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Generic,
    Avx2,
    Avx512,
}

impl Level {
    pub const ALL: [Level; 3] = [Level::Generic, Level::Avx2, Level::Avx512];

    pub fn name(self) -> &'static str {
        match self {
            Level::Generic => "generic",
            Level::Avx2 => "avx2",
            Level::Avx512 => "avx512",
        }
    }

    /// Whether this CPU can run the level.
    pub fn is_supported(self) -> bool {
        match self {
            Level::Generic => true,
            #[cfg(target_arch = "x86_64")]
            Level::Avx2 => {
                is_x86_feature_detected!("avx2")
                    && is_x86_feature_detected!("fma")
                    && is_x86_feature_detected!("f16c")
            }
            #[cfg(target_arch = "x86_64")]
            Level::Avx512 => {
                Level::Avx2.is_supported()
                    && is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx512bw")
                    && is_x86_feature_detected!("avx512vl")
            }
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }

    /// The highest level `RINGLET_KERNELS` allows (all of them when it is unset), or an error
    /// naming the accepted values.
    pub fn ceiling_from_env() -> Result<Level> {
        match std::env::var("RINGLET_KERNELS") {
            Err(_) => Ok(Level::Avx512),
            Ok(name) => Level::ALL
                .into_iter()
                .find(|l| l.name() == name)
                .ok_or_else(|| {
                    CoreError::InvalidArgument(format!(
                        "RINGLET_KERNELS={name:?} is not a kernel level; accepted: {}",
                        crate::dtype::names(Level::ALL.iter().map(|l| l.name()))
                    ))
                }),
        }
    }

    /// The highest level this process may use, decided once (an unknown `RINGLET_KERNELS`
    /// caps nothing here; `ringlet.init` reports it).
    pub fn ceiling() -> Level {
        static CEILING: OnceLock<Level> = OnceLock::new();
        *CEILING.get_or_init(|| Level::ceiling_from_env().unwrap_or(Level::Avx512))
    }

    /// The CPU supports it and `RINGLET_KERNELS` allows it.
    pub fn is_available(self) -> bool {
        self <= Level::ceiling() && self.is_supported()
    }

    /// The best available level.
    pub fn active() -> Level {
        static ACTIVE: OnceLock<Level> = OnceLock::new();
        *ACTIVE.get_or_init(|| {
            Level::ALL
                .into_iter()
                .filter(|l| l.is_available())
                .max()
                .unwrap_or(Level::Generic)
        })
    }
}

/// Scaling folded into a combine: `acc = finish(acc·acc ⊕ other·other)` with the two factors,
/// where `finish(x) = x / divide_by · multiply`. Floats compute in their own precision (16-bit
/// floats in f32, rounded to 16 bits once, at the end); integers take no factors (they must
/// be 1) and divide truncating toward zero. This is how a schedule folds `avg`'s division and
/// the pre- and postscale factors into the reduction instead of sweeping the data again.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Scaling {
    pub acc: f64,
    pub other: f64,
    pub finish: Option<Finish>,
}

/// The last thing done to a finished element: `x / divide_by · multiply`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Finish {
    pub divide_by: usize,
    pub multiply: f64,
}

impl Scaling {
    pub const NONE: Scaling = Scaling {
        acc: 1.0,
        other: 1.0,
        finish: None,
    };
}

/// A pair of equally long typed views: the accumulator and the incoming data.
pub(crate) enum Slices<'a> {
    F32(&'a mut [f32], &'a [f32]),
    F64(&'a mut [f64], &'a [f64]),
    I32(&'a mut [i32], &'a [i32]),
    I64(&'a mut [i64], &'a [i64]),
    /// float16 bits.
    F16(&'a mut [u16], &'a [u16]),
    /// bfloat16 bits.
    BF16(&'a mut [u16], &'a [u16]),
}

impl<'a> Slices<'a> {
    fn new(dtype: DType, acc: &'a mut [u8], other: &'a [u8]) -> Result<Self> {
        Ok(match dtype {
            DType::F32 => Slices::F32(typed_mut(acc)?, typed(other)?),
            DType::F64 => Slices::F64(typed_mut(acc)?, typed(other)?),
            DType::I32 => Slices::I32(typed_mut(acc)?, typed(other)?),
            DType::I64 => Slices::I64(typed_mut(acc)?, typed(other)?),
            DType::F16 => Slices::F16(typed_mut(acc)?, typed(other)?),
            DType::BF16 => Slices::BF16(typed_mut(acc)?, typed(other)?),
        })
    }
}

/// `acc[i] = acc[i] ⊕ other[i]` (or `other[i] ⊕ acc[i]`) for every element.
pub fn combine(
    dtype: DType,
    op: ReduceOp,
    acc: &mut [u8],
    other: &[u8],
    order: Order,
) -> Result<()> {
    combine_at(Level::active(), dtype, op, acc, other, order)
}

/// [`combine`] at a given level (tests check every level against `generic`).
pub fn combine_at(
    level: Level,
    dtype: DType,
    op: ReduceOp,
    acc: &mut [u8],
    other: &[u8],
    order: Order,
) -> Result<()> {
    if acc.len() != other.len() {
        return Err(CoreError::InvalidArgument(format!(
            "combine: buffers differ in length ({} and {} bytes)",
            acc.len(),
            other.len()
        )));
    }
    if !level.is_available() {
        let why = if level.is_supported() {
            format!("RINGLET_KERNELS={} caps them", Level::ceiling().name())
        } else {
            "this CPU does not support them".to_string()
        };
        return Err(CoreError::InvalidArgument(format!(
            "the {} kernels are not available: {why}",
            level.name()
        )));
    }
    if acc.is_empty() || counted(acc.len()) {
        return Ok(()); // an empty slice's pointer need not be aligned
    }
    let slices = Slices::new(dtype, acc, other)?;
    let op = op.combining();
    match level {
        Level::Generic => portable::combine(op, slices, order),
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `is_available` (so `is_supported`) confirmed AVX2, FMA and F16C above.
        Level::Avx2 => unsafe { x86::combine_avx2(op, slices, order) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `is_available` (so `is_supported`) confirmed AVX-512 F/BW/VL, AVX2, FMA and F16C above.
        Level::Avx512 => unsafe { x86::combine_avx512(op, slices, order) },
        #[cfg(not(target_arch = "x86_64"))]
        _ => portable::combine(op, slices, order),
    }
    Ok(())
}

/// `acc[i] = finish(acc[i]·a ⊕ other[i]·b)` for every element, at the best level (see
/// [`Scaling`]).
pub fn combine_scaled(
    dtype: DType,
    op: ReduceOp,
    acc: &mut [u8],
    other: &[u8],
    order: Order,
    scaling: &Scaling,
) -> Result<()> {
    combine_scaled_at(Level::active(), dtype, op, acc, other, order, scaling)
}

/// [`combine_scaled`] at a given level (tests check every level against `generic`).
pub fn combine_scaled_at(
    level: Level,
    dtype: DType,
    op: ReduceOp,
    acc: &mut [u8],
    other: &[u8],
    order: Order,
    scaling: &Scaling,
) -> Result<()> {
    if *scaling == Scaling::NONE {
        return combine_at(level, dtype, op, acc, other, order);
    }
    check_scaling(dtype, scaling)?;
    if acc.len() != other.len() {
        return Err(CoreError::InvalidArgument(format!(
            "combine: buffers differ in length ({} and {} bytes)",
            acc.len(),
            other.len()
        )));
    }
    if !level.is_available() {
        return combine_at(level, dtype, op, acc, other, order); // reports why
    }
    if acc.is_empty() || counted(acc.len()) {
        return Ok(());
    }
    let slices = Slices::new(dtype, acc, other)?;
    let op = op.combining();
    match level {
        Level::Generic => portable::combine_scaled(op, slices, order, scaling),
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `is_available` (so `is_supported`) confirmed AVX2, FMA and F16C above.
        Level::Avx2 => unsafe { x86::combine_scaled_avx2(op, slices, order, scaling) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `is_available` (so `is_supported`) confirmed AVX-512 F/BW/VL, AVX2, FMA, F16C.
        Level::Avx512 => unsafe { x86::combine_scaled_avx512(op, slices, order, scaling) },
        #[cfg(not(target_arch = "x86_64"))]
        _ => portable::combine_scaled(op, slices, order, scaling),
    }
    Ok(())
}

/// Integers have no factors: only `avg`'s truncating division.
fn check_scaling(dtype: DType, scaling: &Scaling) -> Result<()> {
    let multiply = scaling.finish.map_or(1.0, |f| f.multiply);
    if !dtype.is_float() && (scaling.acc != 1.0 || scaling.other != 1.0 || multiply != 1.0) {
        return Err(CoreError::InvalidArgument(format!(
            "{} data cannot be scaled (only floating-point data can)",
            dtype.name()
        )));
    }
    if scaling.finish.is_some_and(|f| f.divide_by == 0) {
        return Err(CoreError::InvalidArgument("divide by zero ranks".into()));
    }
    Ok(())
}

/// `buf[i] = buf[i] / divide_by · multiply` in place: `avg`'s division and the postscale, for
/// an algorithm that cannot fold them into its reduction (or a group of one rank).
pub fn finish(dtype: DType, buf: &mut [u8], finish: Finish) -> Result<()> {
    check_scaling(
        dtype,
        &Scaling {
            finish: Some(finish),
            ..Scaling::NONE
        },
    )?;
    if buf.is_empty() || (finish.divide_by == 1 && finish.multiply == 1.0) {
        return Ok(());
    }
    match dtype {
        DType::F32 => scalar::finish::<f32>(typed_mut(buf)?, finish),
        DType::F64 => scalar::finish::<f64>(typed_mut(buf)?, finish),
        DType::I32 => scalar::finish::<i32>(typed_mut(buf)?, finish),
        DType::I64 => scalar::finish::<i64>(typed_mut(buf)?, finish),
        DType::F16 => sixteen::f16_finish(typed_mut(buf)?, finish),
        DType::BF16 => sixteen::bf16_finish(typed_mut(buf)?, finish),
    }
    Ok(())
}

fn typed_mut<T: Pod>(bytes: &mut [u8]) -> Result<&mut [T]> {
    let len = bytes.len();
    bytemuck::try_cast_slice_mut(bytes).map_err(|e| layout_error::<T>(len, e))
}

fn typed<T: Pod>(bytes: &[u8]) -> Result<&[T]> {
    bytemuck::try_cast_slice(bytes).map_err(|e| layout_error::<T>(bytes.len(), e))
}

fn layout_error<T>(len: usize, e: bytemuck::PodCastError) -> CoreError {
    CoreError::InvalidArgument(format!(
        "a buffer of {len} bytes cannot be read as {}-byte elements ({e:?}): it must be aligned \
         and a whole number of elements long",
        std::mem::size_of::<T>()
    ))
}
