//! Converting between element types, with a scale: packing gradients into a compressed fusion
//! buffer (f32 -> f16, times a prescale) and unpacking them (f16 -> f32, divided by the rank
//! count for `avg` and times a postscale, in the same pass).

use super::sixteen::{bf16_to_f32, f32_to_bf16};
use super::{typed, typed_mut, Finish};
use crate::dtype::DType;
use crate::error::{CoreError, Result};
use half::f16;
use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};

/// Elements widened to f32 at a time (a batch), in a buffer on the stack.
const BATCH: usize = 256;

fn is_float(dtype: DType) -> bool {
    !matches!(dtype, DType::I32 | DType::I64)
}

/// `dst = src * scale`, converting `from` elements into `to` elements (rounding to nearest even).
/// Floats convert to any float; integers only copy, and only with `scale == 1`.
pub fn convert(from: DType, src: &[u8], to: DType, dst: &mut [u8], scale: f64) -> Result<()> {
    let finish = Finish {
        divide_by: 1,
        multiply: scale,
    };
    convert_finishing(from, src, to, dst, finish)
}

/// `dst = src / divide_by * multiply`, converting as [`convert`] does (in f32, or f64 from f64
/// to f64); integers divide truncating toward zero and take no factor.
pub fn convert_finishing(
    from: DType,
    src: &[u8],
    to: DType,
    dst: &mut [u8],
    finish: Finish,
) -> Result<()> {
    let (divisor, scale) = (finish.divide_by.max(1), finish.multiply);
    let count = src.len() / from.size();
    if !src.len().is_multiple_of(from.size()) || dst.len() != count * to.size() {
        return Err(CoreError::InvalidArgument(format!(
            "convert: {} bytes of {} do not fill {} bytes of {}",
            src.len(),
            from.name(),
            dst.len(),
            to.name()
        )));
    }
    if !is_float(from) || !is_float(to) {
        if from == to && scale == 1.0 && divisor > 1 {
            dst.copy_from_slice(src);
            return super::finish(to, dst, finish);
        }
        if from != to || scale != 1.0 {
            return Err(CoreError::InvalidArgument(format!(
                "{} cannot be scaled or converted (only floating-point data can)",
                if is_float(from) {
                    to.name()
                } else {
                    from.name()
                }
            )));
        }
        dst.copy_from_slice(src);
        return Ok(());
    }
    if count == 0 {
        return Ok(());
    }
    if from == DType::F64 && to == DType::F64 {
        let (src, dst) = (typed::<f64>(src)?, typed_mut::<f64>(dst)?);
        let divisor = divisor as f64;
        dst.iter_mut()
            .zip(src)
            .for_each(|(d, &s)| *d = s / divisor * scale);
        return Ok(());
    }
    // Everything else goes through f32 batches (f64 sources narrow first: a compressed wire
    // format holds less than f32 anyway, and f64 -> f32 keeps every f32 value exact).
    let mut wide = [0f32; BATCH];
    let (divisor32, scale32) = (divisor as f32, scale as f32);
    for start in (0..count).step_by(BATCH) {
        let n = BATCH.min(count - start);
        let batch = &mut wide[..n];
        load(from, src, start, batch)?;
        if divisor > 1 {
            batch.iter_mut().for_each(|x| *x /= divisor32);
        }
        if scale != 1.0 {
            batch.iter_mut().for_each(|x| *x *= scale32);
        }
        store(to, batch, dst, start)?;
    }
    Ok(())
}

/// `buf *= factor` in place, with the same arithmetic as [`convert`] (f64 in f64, every other
/// float through f32), so scaling in place and scaling while packing give the same bits.
pub fn scale(dtype: DType, buf: &mut [u8], factor: f64) -> Result<()> {
    if factor == 1.0 || buf.is_empty() {
        return Ok(());
    }
    if !is_float(dtype) {
        return Err(CoreError::InvalidArgument(format!(
            "{} data cannot be scaled (only floating-point data can)",
            dtype.name()
        )));
    }
    if dtype == DType::F64 {
        typed_mut::<f64>(buf)?.iter_mut().for_each(|x| *x *= factor);
        return Ok(());
    }
    let count = buf.len() / dtype.size();
    let mut wide = [0f32; BATCH];
    for start in (0..count).step_by(BATCH) {
        let n = BATCH.min(count - start);
        let batch = &mut wide[..n];
        load(dtype, buf, start, batch)?;
        batch.iter_mut().for_each(|x| *x *= factor as f32);
        store(dtype, batch, buf, start)?;
    }
    Ok(())
}

fn load(from: DType, src: &[u8], start: usize, out: &mut [f32]) -> Result<()> {
    let range = start..start + out.len();
    match from {
        DType::F32 => out.copy_from_slice(&typed::<f32>(src)?[range]),
        DType::F64 => out
            .iter_mut()
            .zip(&typed::<f64>(src)?[range])
            .for_each(|(o, &s)| *o = s as f32),
        DType::F16 => typed::<u16>(src)?[range]
            .reinterpret_cast::<f16>()
            .convert_to_f32_slice(out),
        DType::BF16 => out
            .iter_mut()
            .zip(&typed::<u16>(src)?[range])
            .for_each(|(o, &s)| *o = bf16_to_f32(s)),
        DType::I32 | DType::I64 => unreachable_integer()?,
    }
    Ok(())
}

fn store(to: DType, batch: &[f32], dst: &mut [u8], start: usize) -> Result<()> {
    let range = start..start + batch.len();
    match to {
        DType::F32 => typed_mut::<f32>(dst)?[range].copy_from_slice(batch),
        DType::F64 => typed_mut::<f64>(dst)?[range]
            .iter_mut()
            .zip(batch)
            .for_each(|(d, &s)| *d = f64::from(s)),
        DType::F16 => typed_mut::<u16>(dst)?[range]
            .reinterpret_cast_mut::<f16>()
            .convert_from_f32_slice(batch),
        DType::BF16 => typed_mut::<u16>(dst)?[range]
            .iter_mut()
            .zip(batch)
            .for_each(|(d, &s)| *d = f32_to_bf16(s)),
        DType::I32 | DType::I64 => unreachable_integer()?,
    }
    Ok(())
}

fn unreachable_integer() -> Result<()> {
    Err(CoreError::InvalidArgument(
        "internal: integer data reached the float conversion".into(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes<T: bytemuck::Pod>(values: &[T]) -> Vec<u8> {
        bytemuck::cast_slice(values).to_vec()
    }

    #[test]
    fn float32_to_float16_and_back_with_scales() {
        let values: Vec<f32> = (0..1000).map(|i| i as f32 * 0.37 - 100.0).collect();
        let src = bytes(&values);
        let mut wire = vec![0u8; 2000];
        convert(DType::F32, &src, DType::F16, &mut wire, 0.5).expect("to f16");
        let halves: &[u16] = bytemuck::cast_slice(&wire);
        for (h, v) in halves.iter().zip(&values) {
            assert_eq!(*h, f16::from_f32(v * 0.5).to_bits());
        }
        let mut back = vec![0u8; 4000];
        convert(DType::F16, &wire, DType::F32, &mut back, 2.0).expect("to f32");
        let back: &[f32] = bytemuck::cast_slice(&back);
        for (b, v) in back.iter().zip(&values) {
            assert!((b - v).abs() <= v.abs() * 1e-3 + 1e-3, "{b} vs {v}");
        }
    }

    #[test]
    fn bfloat16_matches_the_half_crate() {
        let values: Vec<f32> = (0..777).map(|i| (i as f32 - 300.0) * 1.001).collect();
        let mut wire = vec![0u8; 777 * 2];
        convert(DType::F32, &bytes(&values), DType::BF16, &mut wire, 1.0).expect("to bf16");
        let halves: &[u16] = bytemuck::cast_slice(&wire);
        for (h, v) in halves.iter().zip(&values) {
            assert_eq!(*h, half::bf16::from_f32(*v).to_bits());
        }
    }

    #[test]
    fn integers_copy_but_refuse_scaling_and_conversion() {
        let src = bytes(&[1i32, -2, 3]);
        let mut dst = vec![0u8; 12];
        convert(DType::I32, &src, DType::I32, &mut dst, 1.0).expect("copy");
        assert_eq!(dst, src);
        assert!(convert(DType::I32, &src, DType::I32, &mut dst, 0.5).is_err());
        assert!(convert(DType::I32, &src, DType::F32, &mut dst, 1.0).is_err());
        assert!(
            convert(DType::F32, &src, DType::F16, &mut dst, 1.0).is_err(),
            "sizes"
        );
    }
}
