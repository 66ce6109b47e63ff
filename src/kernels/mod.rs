//! Element-wise reductions on byte buffers, one per (dtype, op).
//!
//! The schedules move bytes; these functions give the bytes a type. Buffers must be aligned to
//! the element size (NumPy arrays and the schedules' scratch always are) and a whole number of
//! elements long; anything else is an `InvalidArgument` error, never a panic.

mod native;
mod sixteen;

use crate::dtype::{DType, ReduceOp};
use crate::error::{CoreError, Result};
use bytemuck::Pod;

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

/// `acc[i] = acc[i] ⊕ other[i]` (or `other[i] ⊕ acc[i]`) for every element.
pub fn combine(
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
    if acc.is_empty() {
        return Ok(()); // an empty slice's pointer need not be aligned
    }
    let op = op.combining();
    match dtype {
        DType::F32 => native::combine::<f32>(op, typed_mut(acc)?, typed(other)?, order),
        DType::F64 => native::combine::<f64>(op, typed_mut(acc)?, typed(other)?, order),
        DType::I32 => native::combine::<i32>(op, typed_mut(acc)?, typed(other)?, order),
        DType::I64 => native::combine::<i64>(op, typed_mut(acc)?, typed(other)?, order),
        DType::F16 => sixteen::combine::<sixteen::F16>(op, typed_mut(acc)?, typed(other)?, order),
        DType::BF16 => sixteen::combine::<sixteen::BF16>(op, typed_mut(acc)?, typed(other)?, order),
    }
    Ok(())
}

/// `buf[i] /= ranks`, the second half of `avg`. Integers truncate toward zero, as C does.
pub fn divide(dtype: DType, buf: &mut [u8], ranks: usize) -> Result<()> {
    if ranks == 0 {
        return Err(CoreError::InvalidArgument("divide by zero ranks".into()));
    }
    if buf.is_empty() {
        return Ok(());
    }
    match dtype {
        DType::F32 => native::divide::<f32>(typed_mut(buf)?, ranks),
        DType::F64 => native::divide::<f64>(typed_mut(buf)?, ranks),
        DType::I32 => native::divide::<i32>(typed_mut(buf)?, ranks),
        DType::I64 => native::divide::<i64>(typed_mut(buf)?, ranks),
        DType::F16 => sixteen::divide::<sixteen::F16>(typed_mut(buf)?, ranks),
        DType::BF16 => sixteen::divide::<sixteen::BF16>(typed_mut(buf)?, ranks),
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
