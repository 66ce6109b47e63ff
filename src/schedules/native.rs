//! `mpi`: the MPI library's own MPI_Allreduce, so the selector and the benchmarks can weigh
//! ringlet's schedules against it. Only for the dtypes MPI knows (not float16 or bfloat16).

use super::{Reduction, Schedule};
use crate::error::Result;
use crate::transport::Transport;

pub struct Native;

impl Schedule for Native {
    fn name(&self) -> &'static str {
        "mpi"
    }

    fn run(&self, transport: &dyn Transport, buf: &mut [u8], reduction: &Reduction) -> Result<()> {
        transport.native_allreduce(buf, reduction.dtype, reduction.op)
    }
}
