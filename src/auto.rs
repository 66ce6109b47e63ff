//! The decision table behind `algorithm="auto"`.
//!
//! The Python selector works out, from its cost model and calibration, which algorithm wins
//! in each size range for each dtype, and installs the result here, so that a call decides with
//! a binary search instead of a trip through Python. An empty table means "ask Python".

use crate::dtype::DType;
use crate::error::{CoreError, Result};
use crate::schedules::{self, Schedule};
use std::sync::RwLock;

/// Per dtype: (largest message in bytes, algorithm), sorted by size; the last entry covers
/// every larger message.
type Table = Vec<(DType, Vec<(u64, &'static dyn Schedule)>)>;

static TABLE: RwLock<Table> = RwLock::new(Vec::new());

/// Replace the table. `entries` are (dtype, largest bytes, algorithm name).
pub fn install(entries: &[(String, u64, String)]) -> Result<()> {
    let mut table: Table = Vec::new();
    for (dtype, upper, algorithm) in entries {
        let dtype = DType::from_name(dtype)?;
        let schedule = schedules::by_name(algorithm)?;
        match table.iter_mut().find(|(d, _)| *d == dtype) {
            Some((_, ranges)) => ranges.push((*upper, schedule)),
            None => table.push((dtype, vec![(*upper, schedule)])),
        }
    }
    for (dtype, ranges) in table.iter_mut() {
        ranges.sort_by_key(|(upper, _)| *upper);
        if ranges.iter().any(|(_, s)| s.name() == "mpi")
            && matches!(dtype, DType::F16 | DType::BF16)
        {
            return Err(CoreError::InvalidArgument(format!(
                "the auto table cannot send {} to \"mpi\"",
                dtype.name()
            )));
        }
    }
    *TABLE.write().unwrap_or_else(|e| e.into_inner()) = table;
    Ok(())
}

pub fn clear() {
    TABLE.write().unwrap_or_else(|e| e.into_inner()).clear();
}

/// The algorithm for `nbytes` of `dtype`, or `None` if no table is installed for it.
pub fn choose(dtype: DType, nbytes: usize) -> Option<&'static dyn Schedule> {
    let table = TABLE.read().unwrap_or_else(|e| e.into_inner());
    let (_, ranges) = table.iter().find(|(d, _)| *d == dtype)?;
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
        let name = |bytes| choose(DType::F32, bytes).map(|s| s.name());
        assert_eq!(name(0), Some("recursive_doubling"));
        assert_eq!(name(1024), Some("recursive_doubling"));
        assert_eq!(name(1025), Some("halving_doubling"));
        assert_eq!(name(1 << 30), Some("pipelined_ring"));
        assert!(choose(DType::F64, 8).is_none(), "no table for float64");
        assert!(install(&[("float16".into(), 8, "mpi".into())]).is_err());
        assert!(install(&[("float32".into(), 8, "tree".into())]).is_err());
        clear();
        assert!(choose(DType::F32, 8).is_none());
    }
}
