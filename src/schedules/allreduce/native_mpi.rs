//! `mpi`: the MPI library's own MPI_Allreduce, so `auto` and the benchmarks can weigh
//! ringlet's schedules against it. Only on the MPI transport, and only for what MPI can reduce
//! the way ringlet does.

use super::{halving_doubling::HalvingDoubling, recursive_doubling::RecursiveDoubling};
use crate::schedules::{Algorithm, Allreduce, Cost, Input, Parts, Reduction, Support, Tuning};
use crate::dtype::{DType, ReduceOp};
use crate::error::{CoreError, Result};
use crate::transport::{LibraryCollectives, LibraryElement, LibraryOp, Transport};

pub struct Mpi;

/// Below this many bytes MPI libraries run recursive doubling, above it Rabenseifner's
/// algorithm (Open MPI's fixed rules for fewer than 8 ranks; MPICH switches at 2 KiB). The
/// calibration corrects the model for what the library really does.
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
        let library = library(transport, self.name())?;
        let (element, op) = library_reduction(reduction.dtype, reduction.op, self.name())?;
        // One MPI_Allreduce per part: MPI's own algorithm cannot span separate buffers.
        for part in buf.parts_mut() {
            library.allreduce(part, element, op)?;
        }
        Ok(())
    }

    /// MPI's own allreduce out of place (a send buffer apart from the receive buffer), one
    /// per part.
    fn run_from(
        &self,
        transport: &dyn Transport,
        input: &Input,
        output: &mut Parts,
        reduction: &Reduction,
        _tuning: &Tuning,
    ) -> Result<()> {
        let library = library(transport, self.name())?;
        let (element, op) = library_reduction(reduction.dtype, reduction.op, self.name())?;
        for (from, to) in input.parts().iter().zip(output.parts_mut()) {
            library.allreduce_from(from, to, element, op)?;
        }
        Ok(())
    }
}

/// What MPI's own reductions can do the way ringlet's kernels do.
pub(crate) fn support(dtype: DType, op: ReduceOp) -> Support {
    match (dtype, op.combining()) {
        (DType::F16 | DType::BF16, _) => Support::No("MPI has no 16-bit float type"),
        (DType::F32 | DType::F64, ReduceOp::Min | ReduceOp::Max) => Support::OwnArithmetic(
            "MPI_MIN and MPI_MAX do not propagate NaN the way ringlet's kernels do",
        ),
        _ => Support::Full,
    }
}

/// The MPI library's collectives on `transport`, for algorithm `name`, which calls them.
pub(crate) fn library<'t>(
    transport: &'t dyn Transport,
    name: &str,
) -> Result<&'t dyn LibraryCollectives> {
    transport.library_collectives().ok_or_else(|| {
        CoreError::InvalidArgument(format!(
            "algorithm {name:?} needs an MPI communicator, not this transport"
        ))
    })
}

/// The library's element type and op for `dtype` and `op` (avg sums; the caller divides).
pub(crate) fn library_reduction(
    dtype: DType,
    op: ReduceOp,
    name: &str,
) -> Result<(LibraryElement, LibraryOp)> {
    let element = match dtype {
        DType::F32 => LibraryElement::F32,
        DType::F64 => LibraryElement::F64,
        DType::I32 => LibraryElement::I32,
        DType::I64 => LibraryElement::I64,
        DType::F16 | DType::BF16 => {
            return Err(CoreError::InvalidArgument(format!(
                "algorithm {name:?} cannot reduce {}",
                dtype.name()
            )))
        }
    };
    let op = match op.combining() {
        ReduceOp::Sum | ReduceOp::Avg => LibraryOp::Sum,
        ReduceOp::Prod => LibraryOp::Prod,
        ReduceOp::Min => LibraryOp::Min,
        ReduceOp::Max => LibraryOp::Max,
    };
    Ok((element, op))
}

#[cfg(test)]
mod tests {
    use crate::schedules::reduce::native_mpi::MpiReduce;
    use super::*;
    use crate::transport::local::LocalTransport;
    use crate::transport::view::View;

    #[test]
    fn without_the_library_the_mpi_algorithms_say_why_they_cannot_run() {
        let group = LocalTransport::group(2);
        let view = View::new(&group[0], vec![0, 1]).expect("view");
        for transport in [&group[0] as &dyn Transport, &view] {
            for why in [Mpi.unavailable(transport), MpiReduce.unavailable(transport)] {
                let why = why.expect("unavailable");
                assert!(why.contains("needs an MPI communicator"), "{why}");
            }
        }
    }

    #[test]
    fn what_mpi_can_combine_maps_onto_the_library_and_16_bit_floats_do_not() {
        let mapped = library_reduction(DType::I64, ReduceOp::Avg, "mpi").expect("i64");
        assert_eq!(mapped, (LibraryElement::I64, LibraryOp::Sum));
        let mapped = library_reduction(DType::F32, ReduceOp::Min, "mpi").expect("f32");
        assert_eq!(mapped, (LibraryElement::F32, LibraryOp::Min));
        for dtype in [DType::F16, DType::BF16] {
            assert!(library_reduction(dtype, ReduceOp::Sum, "mpi").is_err());
            assert_eq!(
                support(dtype, ReduceOp::Sum),
                Support::No("MPI has no 16-bit float type")
            );
        }
    }
}
