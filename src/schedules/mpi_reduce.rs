//! `mpi`: the MPI library's own MPI_Reduce, to weigh ringlet's reduce algorithms against.
//! Only on the MPI transport, and only for what MPI can reduce the way ringlet does.

use super::mpi::{handles, library, support};
use super::{
    binomial_reduce::BinomialReduce, reduce_scatter_gather::ReduceScatterGather, Algorithm,
    Cost, Reduce, Reduction, Support, Tuning,
};
use crate::dtype::{DType, ReduceOp};
use crate::error::Result;
use crate::transport::mpi::{check, in_place};
use crate::transport::{message_pieces, Transport};
use mpi::ffi;
use std::ffi::c_int;

pub struct MpiReduce;

/// Below this the libraries reduce along a binomial tree, above it in segments or by
/// reduce-scatter and gather (Open MPI's fixed rules switch around here for few ranks).
const SHORT_MESSAGE_BYTES: usize = 8 << 10;

impl Algorithm for MpiReduce {
    fn name(&self) -> &'static str {
        "mpi"
    }

    fn description(&self) -> &'static str {
        "the MPI library's own `MPI_Reduce` (not for 16-bit floats)"
    }

    fn best_for(&self) -> &'static str {
        "comparison"
    }

    fn support(&self, dtype: DType, op: ReduceOp) -> Support {
        support(dtype, op)
    }

    fn cost(&self, ranks: usize, bytes: usize, tuning: &Tuning) -> Cost {
        if bytes < SHORT_MESSAGE_BYTES {
            BinomialReduce.cost(ranks, bytes, tuning)
        } else {
            ReduceScatterGather.cost(ranks, bytes, tuning)
        }
    }

    fn unavailable(&self, transport: &dyn Transport) -> Option<String> {
        library(transport, self.name()).err().map(|e| e.to_string())
    }
}

impl Reduce for MpiReduce {
    fn run(
        &self,
        transport: &dyn Transport,
        buf: &mut [u8],
        root: usize,
        reduction: &Reduction,
    ) -> Result<()> {
        let mpi = library(transport, self.name())?;
        let (datatype, op) = handles(reduction.dtype, reduction.op, self.name())?;
        let comm = mpi.raw()?;
        let elem = reduction.elem_size();
        let at_root = transport.rank() == root;
        for piece in message_pieces(buf.len(), mpi.message_limits().any, elem) {
            if piece.is_empty() {
                continue; // every rank skips alike: the length is the same everywhere
            }
            let count = (piece.len() / elem) as c_int;
            let data = buf[piece].as_mut_ptr();
            // SAFETY: `count` elements of `buf`, live and exclusively borrowed for the call; the
            // root reduces in place, the others only send theirs (the receive buffer is
            // ignored off the root).
            let code = unsafe {
                if at_root {
                    ffi::MPI_Reduce(in_place(), data.cast(), count, datatype, op, root as c_int, comm)
                } else {
                    ffi::MPI_Reduce(data.cast(), std::ptr::null_mut(), count, datatype, op, root as c_int, comm)
                }
            };
            check(code, "MPI_Reduce")?;
        }
        Ok(())
    }
}
