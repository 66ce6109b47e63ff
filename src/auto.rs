//! The decision table behind `algorithm="auto"` for allreduce.
//!
//! The Python selector works out, from its cost model and calibration, which algorithm wins
//! in each size range for each dtype and op, and installs the result here, so that a call
//! decides with a binary search instead of a trip through Python. An empty table means "ask
//! Python".

use crate::dtype::{DType, ReduceOp};
use crate::error::{CoreError, Result};
use crate::schedules::{self, Allreduce, Support, ALLREDUCE};
use std::sync::RwLock;

/// Per (dtype, op): (largest message in bytes, algorithm), sorted by size; the last entry
/// covers every larger message.
type Table = Vec<((DType, ReduceOp), Vec<(u64, &'static dyn Allreduce)>)>;

static TABLE: RwLock<Table> = RwLock::new(Vec::new());

/// Replace the table. `entries` are (dtype, op, largest bytes, algorithm name). An algorithm
/// must reduce its dtype and op with ringlet's own arithmetic, so `auto` never changes an
/// answer.
pub fn install(entries: &[(String, String, u64, String)]) -> Result<()> {
    let mut table: Table = Vec::new();
    for (dtype, op, upper, algorithm) in entries {
        let key = (DType::from_name(dtype)?, ReduceOp::from_name(op)?);
        let schedule = schedules::find(ALLREDUCE, algorithm)?;
        match schedule.support(key.0, key.1) {
            Support::Full => {}
            Support::No(reason) | Support::OwnArithmetic(reason) => {
                return Err(CoreError::InvalidArgument(format!(
                    "the auto table cannot send {dtype} {op} to {algorithm:?}: {reason}"
                )))
            }
        }
        match table.iter_mut().find(|(k, _)| *k == key) {
            Some((_, ranges)) => ranges.push((*upper, schedule)),
            None => table.push((key, vec![(*upper, schedule)])),
        }
    }
    for (_, ranges) in table.iter_mut() {
        ranges.sort_by_key(|(upper, _)| *upper);
    }
    *TABLE.write().unwrap_or_else(|e| e.into_inner()) = table;
    Ok(())
}

pub fn clear() {
    TABLE.write().unwrap_or_else(|e| e.into_inner()).clear();
}

/// The algorithm for `nbytes` of `dtype` under `op`, or `None` if no table is installed for it.
pub fn choose(dtype: DType, op: ReduceOp, nbytes: usize) -> Option<&'static dyn Allreduce> {
    let table = TABLE.read().unwrap_or_else(|e| e.into_inner());
    let (_, ranges) = table.iter().find(|(k, _)| *k == (dtype, op))?;
    let index = ranges.partition_point(|(upper, _)| *upper < nbytes as u64);
    ranges
        .get(index)
        .or_else(|| ranges.last())
        .map(|(_, schedule)| *schedule)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(dtype: &str, op: &str, upper: u64, name: &str) -> (String, String, u64, String) {
        (dtype.into(), op.into(), upper, name.into())
    }

    #[test]
    fn ranges_pick_the_first_upper_bound_at_or_above_the_size() {
        install(&[
            entry("float32", "sum", 1024, "recursive_doubling"),
            entry("float32", "sum", 1 << 20, "halving_doubling"),
            entry("float32", "sum", u64::MAX, "pipelined_ring"),
        ])
        .expect("valid table");
        let name = |bytes| choose(DType::F32, ReduceOp::Sum, bytes).map(|s| s.name());
        assert_eq!(name(0), Some("recursive_doubling"));
        assert_eq!(name(1024), Some("recursive_doubling"));
        assert_eq!(name(1025), Some("halving_doubling"));
        assert_eq!(name(1 << 30), Some("pipelined_ring"));
        assert!(
            choose(DType::F64, ReduceOp::Sum, 8).is_none(),
            "no float64 table"
        );
        assert!(
            choose(DType::F32, ReduceOp::Max, 8).is_none(),
            "no max table"
        );
        install(&[entry("float32", "min", 8, "ring")]).expect("valid");
        assert_eq!(
            choose(DType::F32, ReduceOp::Min, 1).map(|s| s.name()),
            Some("ring")
        );
        assert!(install(&[entry("float32", "mean", 8, "ring")]).is_err());
        assert!(
            install(&[entry("float16", "sum", 8, "mpi")]).is_err(),
            "MPI has no float16"
        );
        assert!(
            install(&[entry("float32", "max", 8, "mpi")]).is_err(),
            "NaN semantics differ"
        );
        assert!(install(&[entry("int32", "max", 8, "mpi")]).is_ok());
        assert!(install(&[entry("float32", "sum", 8, "tree")]).is_err());
        clear();
        assert!(choose(DType::F32, ReduceOp::Min, 8).is_none());
    }
}
