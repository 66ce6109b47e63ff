//! `mpi`: the MPI library's own MPI_Allreduce, so the selector and the benchmarks can weigh
//! ringlet's schedules against it. Only on the MPI transport, and only for what MPI can reduce
//! the way ringlet does.

use super::{halving_doubling::HalvingDoubling, recursive_doubling::RecursiveDoubling};
use super::{Algorithm, Allreduce, Cost, Parts, Reduction, Support, Tuning};
use crate::dtype::{DType, ReduceOp};
use crate::error::{CoreError, Result};
use crate::transport::mpi::{check, in_place, MpiTransport};
use crate::transport::{message_pieces, Transport};
use mpi::ffi;
use std::ffi::c_int;

pub struct Mpi;

/// Below this many bytes MPI libraries run recursive doubling, above it Rabenseifner's
/// algorithm (Open MPI's fixed rules for fewer than 8 ranks; MPICH switches at 2 KiB). The
/// selector's calibration corrects the model for what the library really does.
const SHORT_MESSAGE_BYTES: usize = 8 << 10;

impl Algorithm for Mpi {
    fn name(&self) -> &'static str {
        "mpi"
    }

    fn description(&self) -> &'static str {
        "the MPI library's own `MPI_Allreduce` (not for 16-bit floats)"
    }

    fn best_for(&self) -> &'static str {
        "comparison"
    }

    fn unavailable(&self, transport: &dyn Transport) -> Option<String> {
        library(transport, self.name()).err().map(|e| e.to_string())
    }

    fn support(&self, dtype: DType, op: ReduceOp) -> Support {
        support(dtype, op)
    }

    fn cost(&self, ranks: usize, bytes: usize, tuning: &Tuning) -> Cost {
        if bytes < SHORT_MESSAGE_BYTES {
            RecursiveDoubling.cost(ranks, bytes, tuning)
        } else {
            HalvingDoubling.cost(ranks, bytes, tuning)
        }
    }
}

impl Allreduce for Mpi {
    fn run(
        &self,
        transport: &dyn Transport,
        buf: &mut Parts,
        reduction: &Reduction,
        _tuning: &Tuning,
    ) -> Result<()> {
        let mpi = library(transport, self.name())?;
        let (datatype, mpi_op) = handles(reduction.dtype, reduction.op, self.name())?;
        let dtype = reduction.dtype;
        let comm = mpi.raw()?;
        let elem = dtype.size();
        // One MPI_Allreduce per part: MPI's own algorithm cannot span separate buffers.
        for part in buf.parts_mut() {
            if part.is_empty() {
                // Nothing to reduce; an empty slice's dangling pointer can equal MPI_IN_PLACE.
                continue;
            }
            for piece in message_pieces(part.len(), mpi.message_limits().any, elem) {
                let count = (piece.len() / elem) as c_int;
                // SAFETY: in-place allreduce on `count` elements inside `part`, which is live
                // and exclusively borrowed for the call.
                let code = unsafe {
                    ffi::MPI_Allreduce(
                        in_place(),
                        part[piece].as_mut_ptr().cast(),
                        count,
                        datatype,
                        mpi_op,
                        comm,
                    )
                };
                check(code, "MPI_Allreduce")?;
            }
        }
        Ok(())
    }
}

/// What MPI's own reductions can do the way ringlet's kernels do.
pub(super) fn support(dtype: DType, op: ReduceOp) -> Support {
    match (dtype, op.combining()) {
        (DType::F16 | DType::BF16, _) => Support::No("MPI has no 16-bit float type"),
        (DType::F32 | DType::F64, ReduceOp::Min | ReduceOp::Max) => Support::OwnArithmetic(
            "MPI_MIN and MPI_MAX do not propagate NaN the way ringlet's kernels do",
        ),
        _ => Support::Full,
    }
}

/// The MPI transport under `transport`, for algorithm `name`, which calls the library.
pub(super) fn library<'t>(transport: &'t dyn Transport, name: &str) -> Result<&'t MpiTransport> {
    transport
        .as_any()
        .downcast_ref::<MpiTransport>()
        .ok_or_else(|| {
            CoreError::InvalidArgument(format!(
                "algorithm {name:?} needs an MPI communicator, not this transport"
            ))
        })
}

/// MPI's datatype and op for `dtype` and `op` (avg sums; the caller divides).
pub(super) fn handles(
    dtype: DType,
    op: ReduceOp,
    name: &str,
) -> Result<(ffi::MPI_Datatype, ffi::MPI_Op)> {
    // SAFETY: reading MPI's predefined handles, which are constants after initialization.
    unsafe {
        let datatype = match dtype {
            DType::F32 => ffi::RSMPI_FLOAT,
            DType::F64 => ffi::RSMPI_DOUBLE,
            DType::I32 => ffi::RSMPI_INT32_T,
            DType::I64 => ffi::RSMPI_INT64_T,
            DType::F16 | DType::BF16 => {
                return Err(CoreError::InvalidArgument(format!(
                    "algorithm {name:?} cannot reduce {}",
                    dtype.name()
                )))
            }
        };
        let mpi_op = match op.combining() {
            ReduceOp::Sum | ReduceOp::Avg => ffi::RSMPI_SUM,
            ReduceOp::Prod => ffi::RSMPI_PROD,
            ReduceOp::Min => ffi::RSMPI_MIN,
            ReduceOp::Max => ffi::RSMPI_MAX,
        };
        Ok((datatype, mpi_op))
    }
}
