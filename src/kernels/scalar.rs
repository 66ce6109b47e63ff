//! Kernels for the types the CPU computes on directly: f32, f64, i32, i64.
//!
//! Plain zipped loops with branch-free bodies, so that the compiler vectorizes them.

use super::{Finish, Order, Scaling};
use crate::dtype::ReduceOp;

pub(super) trait Arith: Copy {
    fn add(self, other: Self) -> Self;
    fn mul(self, other: Self) -> Self;
    /// NaN-propagating for floats, like `numpy.minimum`.
    fn min(self, other: Self) -> Self;
    fn max(self, other: Self) -> Self;
    fn div_count(self, count: usize) -> Self;
    /// `self * factor` in the type's precision; integers take no factor (callers check that
    /// it is 1).
    fn times(self, factor: f64) -> Self;
}

macro_rules! float_arith {
    ($t:ty) => {
        impl Arith for $t {
            #[inline(always)]
            fn add(self, other: Self) -> Self {
                self + other
            }
            #[inline(always)]
            fn mul(self, other: Self) -> Self {
                self * other
            }
            #[inline(always)]
            #[allow(clippy::eq_op)]
            fn min(self, other: Self) -> Self {
                // `other != other` is true only for NaN: a NaN on either side wins.
                if other < self || other != other {
                    other
                } else {
                    self
                }
            }
            #[inline(always)]
            #[allow(clippy::eq_op)]
            fn max(self, other: Self) -> Self {
                if other > self || other != other {
                    other
                } else {
                    self
                }
            }
            #[inline(always)]
            fn div_count(self, count: usize) -> Self {
                self / count as $t
            }
            #[inline(always)]
            fn times(self, factor: f64) -> Self {
                self * factor as $t
            }
        }
    };
}

macro_rules! int_arith {
    ($t:ty) => {
        impl Arith for $t {
            #[inline(always)]
            fn add(self, other: Self) -> Self {
                self.wrapping_add(other)
            }
            #[inline(always)]
            fn mul(self, other: Self) -> Self {
                self.wrapping_mul(other)
            }
            #[inline(always)]
            fn min(self, other: Self) -> Self {
                Ord::min(self, other)
            }
            #[inline(always)]
            fn max(self, other: Self) -> Self {
                Ord::max(self, other)
            }
            #[inline(always)]
            fn div_count(self, count: usize) -> Self {
                // A rank count beyond the type's range leaves every average at 0 (or -0 wrap):
                // |sum| < count then, so truncating division gives 0.
                match <$t>::try_from(count) {
                    Ok(n) => self.wrapping_div(n),
                    Err(_) => 0,
                }
            }
            #[inline(always)]
            fn times(self, _factor: f64) -> Self {
                self
            }
        }
    };
}

float_arith!(f32);
float_arith!(f64);
int_arith!(i32);
int_arith!(i64);

#[inline(always)]
fn apply<T: Arith>(acc: &mut [T], other: &[T], order: Order, f: impl Fn(T, T) -> T) {
    match order {
        Order::AccFirst => acc.iter_mut().zip(other).for_each(|(a, &b)| *a = f(*a, b)),
        Order::OtherFirst => acc.iter_mut().zip(other).for_each(|(a, &b)| *a = f(b, *a)),
    }
}

#[inline(always)]
pub(super) fn combine<T: Arith>(op: ReduceOp, acc: &mut [T], other: &[T], order: Order) {
    match op {
        ReduceOp::Sum | ReduceOp::Avg => apply(acc, other, order, T::add),
        ReduceOp::Prod => apply(acc, other, order, T::mul),
        ReduceOp::Min => apply(acc, other, order, T::min),
        ReduceOp::Max => apply(acc, other, order, T::max),
    }
}

/// `acc = finish(acc·fa ⊕ other·fb)` (see [`super::Scaling`]): the same operations in the same
/// order at every SIMD level, so every level gives the same bits.
#[inline(always)]
pub(super) fn combine_scaled<T: Arith>(
    op: ReduceOp,
    acc: &mut [T],
    other: &[T],
    order: Order,
    scaling: &Scaling,
) {
    match op {
        ReduceOp::Sum | ReduceOp::Avg => scaled_apply(acc, other, order, scaling, T::add),
        ReduceOp::Prod => scaled_apply(acc, other, order, scaling, T::mul),
        ReduceOp::Min => scaled_apply(acc, other, order, scaling, T::min),
        ReduceOp::Max => scaled_apply(acc, other, order, scaling, T::max),
    }
}

#[inline(always)]
fn scaled_apply<T: Arith>(
    acc: &mut [T],
    other: &[T],
    order: Order,
    scaling: &Scaling,
    f: impl Fn(T, T) -> T,
) {
    let (fa, fb) = (scaling.acc, scaling.other);
    let op = |a: T, b: T| {
        let (a, b) = (a.times(fa), b.times(fb));
        match order {
            Order::AccFirst => f(a, b),
            Order::OtherFirst => f(b, a),
        }
    };
    match scaling.finish {
        None => acc.iter_mut().zip(other).for_each(|(a, &b)| *a = op(*a, b)),
        Some(Finish {
            divide_by,
            multiply,
        }) => acc
            .iter_mut()
            .zip(other)
            .for_each(|(a, &b)| *a = op(*a, b).div_count(divide_by).times(multiply)),
    }
}

/// `buf = buf / divide_by · multiply`, the finish on its own.
#[inline(always)]
pub(super) fn finish<T: Arith>(buf: &mut [T], finish: Finish) {
    buf.iter_mut()
        .for_each(|x| *x = x.div_count(finish.divide_by).times(finish.multiply));
}
