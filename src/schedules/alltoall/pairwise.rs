//! Alltoall by pairwise exchange: in step k (1..N) rank r sends its block for rank r+k and
//! receives rank r-k's block for it, so every step is one sendrecv and no rank ever waits on
//! two peers. Blocks may differ in size per pair (alltoallv). Each rank sends all its blocks
//! but its own once: the lower bound for alltoall, in N-1 messages.

use crate::schedules::{Algorithm, Alltoall, Cost, Tuning};
use crate::error::Result;
use crate::transport::Transport;
use std::ops::Range;

pub struct PairwiseAlltoall;

impl Algorithm for PairwiseAlltoall {
    fn name(&self) -> &'static str {
        "pairwise"
    }

    fn description(&self) -> &'static str {
        "N-1 steps, in step k each rank sends its block for rank r+k and receives rank r-k's; each byte sent once, the lower bound"
    }

    fn best_for(&self) -> &'static str {
        "any size (the only alltoall)"
    }

    fn cost(&self, ranks: usize, bytes: usize, _tuning: &Tuning) -> Cost {
        let (n, m) = (ranks as f64, bytes as f64);
        Cost {
            messages: n - 1.0,
            bytes: (n - 1.0) / n * m,
            reduced: 0.0,
        }
    }
}

impl Alltoall for PairwiseAlltoall {
    fn run(
        &self,
        transport: &dyn Transport,
        send: &[u8],
        send_blocks: &[Range<usize>],
        recv: &mut [u8],
        recv_blocks: &[Range<usize>],
    ) -> Result<()> {
        let (n, me) = (transport.size(), transport.rank());
        recv[recv_blocks[me].clone()].copy_from_slice(&send[send_blocks[me].clone()]);
        for step in 1..n {
            let to = (me + step) % n;
            let from = (me + n - step) % n;
            transport.sendrecv(
                &send[send_blocks[to].clone()],
                to,
                &mut recv[recv_blocks[from].clone()],
                from,
            )?;
        }
        Ok(())
    }
}
