//! The decision table behind `algorithm="auto"`.
//!
//! The Python selector works out, from its cost model and calibration, which algorithm wins
//! in each size range for each dtype, and installs the result here, so that a call decides with
//! a binary search instead of a trip through Python. An empty table means "ask Python".

use crate::dtype::{DType, ReduceOp};
use crate::error::{CoreError, Result};
use crate::schedules::{self, Schedule};
use std::sync::RwLock;

/// Tables are kept per dtype and per op family: min and max on floats have their own, because
/// MPI's MPI_MIN/MPI_MAX do not propagate NaN the way ringlet's kernels do, so "mpi" may not
/// stand in for them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Key {
    dtype: DType,
    min_max: bool,
}

impl Key {
    /// "float32" or "float32:minmax".
    fn parse(text: &str) -> Result<Key> {
        let (dtype, family) = text.split_once(':').unwrap_or((text, ""));
        let min_max = match family {
            "" => false,
            "minmax" => true,
            other => {
                return Err(CoreError::InvalidArgument(format!(
                    "unknown op family {other:?} in the auto table (accepted: \"minmax\")"
                )))
            }
        };
        Ok(Key {
            dtype: DType::from_name(dtype)?,
            min_max,
        })
    }
}

/// Per key: (largest message in bytes, algorithm), sorted by size; the last entry covers
/// every larger message.
type Table = Vec<(Key, Vec<(u64, &'static dyn Schedule)>)>;

static TABLE: RwLock<Table> = RwLock::new(Vec::new());

/// Replace the table. `entries` are (key, largest bytes, algorithm name), the key a dtype name
/// optionally followed by ":minmax".
pub fn install(entries: &[(String, u64, String)]) -> Result<()> {
    let mut table: Table = Vec::new();
    for (key, upper, algorithm) in entries {
        let key = Key::parse(key)?;
        let schedule = schedules::by_name(algorithm)?;
        match table.iter_mut().find(|(k, _)| *k == key) {
            Some((_, ranges)) => ranges.push((*upper, schedule)),
            None => table.push((key, vec![(*upper, schedule)])),
        }
    }
    for (key, ranges) in table.iter_mut() {
        ranges.sort_by_key(|(upper, _)| *upper);
        if ranges.iter().any(|(_, s)| s.name() == "mpi")
            && matches!(key.dtype, DType::F16 | DType::BF16)
        {
            return Err(CoreError::InvalidArgument(format!(
                "the auto table cannot send {} to \"mpi\"",
                key.dtype.name()
            )));
        }
    }
    *TABLE.write().unwrap_or_else(|e| e.into_inner()) = table;
    Ok(())
}

pub fn clear() {
    TABLE.write().unwrap_or_else(|e| e.into_inner()).clear();
}

/// The algorithm for `nbytes` of `dtype` under `op`, or `None` if no table is installed for it.
pub fn choose(dtype: DType, op: ReduceOp, nbytes: usize) -> Option<&'static dyn Schedule> {
    let key = Key {
        dtype,
        min_max: matches!(op, ReduceOp::Min | ReduceOp::Max),
    };
    let table = TABLE.read().unwrap_or_else(|e| e.into_inner());
    let (_, ranges) = table.iter().find(|(k, _)| *k == key)?;
    let index = ranges.partition_point(|(upper, _)| *upper < nbytes as u64);
    ranges
        .get(index)
        .or_else(|| ranges.last())
        .map(|(_, schedule)| *schedule)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_pick_the_first_upper_bound_at_or_above_the_size() {
        install(&[
            ("float32".into(), 1024, "recursive_doubling".into()),
            ("float32".into(), 1 << 20, "halving_doubling".into()),
            ("float32".into(), u64::MAX, "pipelined_ring".into()),
        ])
        .expect("valid table");
        let name = |bytes| choose(DType::F32, ReduceOp::Sum, bytes).map(|s| s.name());
        assert_eq!(name(0), Some("recursive_doubling"));
        assert_eq!(name(1024), Some("recursive_doubling"));
        assert_eq!(name(1025), Some("halving_doubling"));
        assert_eq!(name(1 << 30), Some("pipelined_ring"));
        assert!(
            choose(DType::F64, ReduceOp::Sum, 8).is_none(),
            "no table for float64"
        );
        assert!(
            choose(DType::F32, ReduceOp::Max, 8).is_none(),
            "no min/max table"
        );
        install(&[("float32:minmax".into(), 8, "ring".into())]).expect("valid");
        assert_eq!(
            choose(DType::F32, ReduceOp::Min, 1).map(|s| s.name()),
            Some("ring")
        );
        assert!(install(&[("float32:mean".into(), 8, "ring".into())]).is_err());
        assert!(install(&[("float16".into(), 8, "mpi".into())]).is_err());
        assert!(install(&[("float32".into(), 8, "tree".into())]).is_err());
        clear();
        assert!(choose(DType::F32, ReduceOp::Min, 8).is_none());
    }
}
