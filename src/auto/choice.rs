//! The candidates for `auto` on a communicator, and the cheapest of them under the model.

use super::model::{Parameters, Prediction};
use crate::dtype::{DType, ReduceOp};
use crate::schedules::{Algorithm, Support, Tuning};
use crate::transport::{Nodes, Transport};

/// The algorithm `auto` runs where the model is not asked: on one rank (every algorithm is a
/// no-op there), and for an algorithm the environment names that cannot take the call.
pub const FALLBACK: &str = "ring";

/// The registered algorithms `auto` may run on `transport`'s ranks: those that can run there
/// and, when they combine (`reducing`), combine with ringlet's own arithmetic, so that `auto`
/// never changes an answer (not "mpi" for 16-bit floats, which MPI lacks, nor for min/max on
/// floats, where MPI treats NaN otherwise).
pub fn candidates<T: Algorithm + ?Sized>(
    registry: &[&'static T],
    transport: &dyn Transport,
    reducing: Option<(DType, ReduceOp)>,
) -> Vec<&'static T> {
    registry
        .iter()
        .copied()
        .filter(|a| reducing.is_none_or(|(d, o)| a.support(d, o) == Support::Full))
        .filter(|a| a.unavailable(transport).is_none())
        .collect()
}

/// What a choice needs besides the algorithms: the parameters, the communicator's settings,
/// and whether calibration's corrections apply (they were measured for allreduce only).
#[derive(Clone, Copy)]
pub struct Pricing<'a> {
    pub parameters: &'a Parameters,
    pub tuning: &'a Tuning,
    pub corrected: bool,
}

/// Each of `options` with its predicted time for `bytes` on ranks placed on `nodes`, in their
/// order.
pub fn priced<T: Algorithm + ?Sized>(
    options: &[&'static T],
    nodes: &Nodes,
    pricing: Pricing<'_>,
    bytes: usize,
    dtype: Option<DType>,
) -> Vec<(&'static T, Prediction)> {
    options
        .iter()
        .map(|&a| {
            let prediction = pricing.parameters.predict(
                a,
                nodes,
                bytes,
                pricing.tuning,
                dtype,
                pricing.corrected,
            );
            (a, prediction)
        })
        .collect()
}

/// The first of `priced` with the lowest predicted time (ties go to the first registered).
pub fn cheapest<T: ?Sized>(priced: &[(&'static T, Prediction)]) -> Option<&'static T> {
    let mut best: Option<(f64, &'static T)> = None;
    for &(algorithm, prediction) in priced {
        if best.is_none_or(|(seconds, _)| prediction.seconds < seconds) {
            best = Some((prediction.seconds, algorithm));
        }
    }
    best.map(|(_, algorithm)| algorithm)
}

/// The candidate the model prices lowest for `bytes` on `transport`'s ranks. Every rank holds
/// the same parameters, nodes and settings, so every rank chooses alike.
pub fn choose_cheapest<T: Algorithm + ?Sized>(
    registry: &[&'static T],
    transport: &dyn Transport,
    pricing: Pricing<'_>,
    bytes: usize,
    reducing: Option<(DType, ReduceOp)>,
) -> Option<&'static T> {
    let options = candidates(registry, transport, reducing);
    cheapest(&priced(
        &options,
        transport.nodes(),
        pricing,
        bytes,
        reducing.map(|r| r.0),
    ))
}
