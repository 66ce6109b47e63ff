//! Which of a collective's registered algorithms a call runs: the one it names, or for "auto"
//! one that every rank picks alike.

use super::call::Kind;
use super::communicator::Communicator;
use crate::dtype::{DType, ReduceOp};
use crate::error::{CoreError, Result};
use crate::schedules::{self, Algorithm};

/// The algorithm `name` names in `registry`; "auto" is the first registered (for alltoall,
/// whose sizes differ between ranks, so that the ranks could not agree on a priced choice).
pub(super) fn first_or_named<T: Algorithm + ?Sized>(
    registry: &[&'static T],
    name: &str,
) -> Result<&'static T> {
    match (name, registry.first()) {
        ("auto", Some(first)) => Ok(*first),
        _ => schedules::by_name(registry, name),
    }
}

/// The algorithm `name` names in `registry`, or for "auto" the one the cost model prices
/// lowest for `bytes` on `comm`'s ranks ([`crate::auto::choose_cheapest`]; the same on every
/// rank). `reducing`: the dtype and op it combines, if it combines.
pub(super) fn cheapest_or_named<T: Algorithm + ?Sized>(
    registry: &[&'static T],
    name: &str,
    comm: &Communicator,
    bytes: usize,
    reducing: Option<(DType, ReduceOp)>,
) -> Result<&'static T> {
    if name != "auto" {
        return schedules::by_name(registry, name);
    }
    let tuning = comm.settings().tuning;
    let parameters = crate::auto::model::current();
    let pricing = crate::auto::Pricing {
        parameters: &parameters,
        tuning: &tuning,
        corrected: false,
    };
    crate::auto::choose_cheapest(registry, comm.transport(), pricing, bytes, reducing).ok_or_else(
        || {
            CoreError::InvalidArgument(match reducing {
                Some((dtype, op)) => format!(
                    "no algorithm can combine {} with {:?} here",
                    dtype.name(),
                    op.name()
                ),
                None => "no algorithm can run here".into(),
            })
        },
    )
}

/// The registered algorithms of a collective ("allreduce", "broadcast", "allgather",
/// "reduce_scatter").
pub(crate) fn registry(collective: &str) -> Result<Vec<&'static dyn Algorithm>> {
    Ok(match Kind::from_name(collective)? {
        Kind::Allreduce => schedules::ALLREDUCE.iter().map(|&a| a as _).collect(),
        Kind::Broadcast => schedules::BROADCAST.iter().map(|&a| a as _).collect(),
        Kind::Allgather => schedules::ALLGATHER.iter().map(|&a| a as _).collect(),
        Kind::ReduceScatter => schedules::REDUCE_SCATTER.iter().map(|&a| a as _).collect(),
        Kind::Alltoall => schedules::ALLTOALL.iter().map(|&a| a as _).collect(),
        Kind::Reduce => schedules::REDUCE.iter().map(|&a| a as _).collect(),
        Kind::Barrier | Kind::Join | Kind::Allocate => {
            return Err(CoreError::InvalidArgument(format!(
                "{collective} has no algorithms to choose from"
            )))
        }
    })
}
