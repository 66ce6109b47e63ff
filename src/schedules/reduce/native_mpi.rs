//! `mpi`: the MPI library's own MPI_Reduce, to weigh ringlet's reduce algorithms against.
//! Only on the MPI transport, and only for what MPI can reduce the way ringlet does.

use super::{binomial::BinomialReduce, reduce_scatter_gather::ReduceScatterGather};
use crate::schedules::allreduce::native_mpi::{library, library_reduction, support};
use crate::schedules::{Algorithm, Cost, Reduce, Reduction, Support, Tuning};
use crate::dtype::{DType, ReduceOp};
use crate::error::Result;
use crate::transport::Transport;

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
        let library = library(transport, self.name())?;
        let (element, op) = library_reduction(reduction.dtype, reduction.op, self.name())?;
        library.reduce(buf, root, element, op)
    }
}
