//! What a rank that has joined needs to take part in the others' allreduce: the schedule, the
//! elements and op on the wire, the factors, and the pieces. The others attach it to every sum
//! or avg allreduce they describe; the consistency check carries it as bytes.

use crate::dtype::{DType, ReduceOp};
use crate::error::{CoreError, Result};
use crate::schedules::{self, Factors, ALLREDUCE};
use smallvec::SmallVec;

/// The pieces' lengths, inline for a bucket of up to 16 arrays (built on every call).
pub type Lengths = SmallVec<[usize; 16]>;

/// How a joined rank takes part in an allreduce: the schedule, the elements and op on the wire,
/// the factors folded into it, and the pieces (one message each) the others send.
#[derive(Clone, Debug, PartialEq)]
pub struct Replay {
    pub algorithm: &'static str,
    pub dtype: DType,
    pub op: ReduceOp,
    pub factors: Factors,
    pub pieces: Lengths,
}

impl Replay {
    /// The replay of an allreduce, if a joined rank can take part in it: zeros change a sum,
    /// and so an average, by nothing; min, max and prod have no such element for every dtype.
    pub fn of(
        algorithm: &'static str,
        dtype: DType,
        op: ReduceOp,
        factors: Factors,
        pieces: Lengths,
    ) -> Option<Replay> {
        matches!(op, ReduceOp::Sum | ReduceOp::Avg).then_some(Replay {
            algorithm,
            dtype,
            op,
            factors,
            pieces,
        })
    }

    pub fn encode(&self) -> Vec<u8> {
        let index = |found: Option<usize>| found.unwrap_or(usize::MAX) as u64;
        let mut words = vec![
            index(DType::ALL.iter().position(|&d| d == self.dtype)),
            index(ReduceOp::ALL.iter().position(|&o| o == self.op)),
            self.factors.pre.to_bits(),
            self.factors.post.to_bits(),
            self.pieces.len() as u64,
        ];
        words.extend(self.pieces.iter().map(|&p| p as u64));
        let mut bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        bytes.extend_from_slice(self.algorithm.as_bytes());
        bytes
    }

    pub fn decode(bytes: &[u8]) -> Result<Replay> {
        let broken = || CoreError::Communication("internal: a malformed join replay".into());
        let word = |i: usize| -> Result<u64> {
            let chunk = bytes.get(8 * i..8 * i + 8).ok_or_else(broken)?;
            Ok(u64::from_le_bytes(chunk.try_into().map_err(|_| broken())?))
        };
        let dtype = *DType::ALL.get(word(0)? as usize).ok_or_else(broken)?;
        let op = *ReduceOp::ALL.get(word(1)? as usize).ok_or_else(broken)?;
        let factors = Factors {
            pre: f64::from_bits(word(2)?),
            post: f64::from_bits(word(3)?),
        };
        let count = word(4)? as usize;
        let pieces = (0..count)
            .map(|i| word(5 + i).map(|p| p as usize))
            .collect::<Result<Lengths>>()?;
        let name = std::str::from_utf8(bytes.get(8 * (5 + count)..).ok_or_else(broken)?)
            .map_err(|_| broken())?;
        let algorithm = schedules::by_name(ALLREDUCE, name)?.name();
        Ok(Replay {
            algorithm,
            dtype,
            op,
            factors,
            pieces,
        })
    }
}
