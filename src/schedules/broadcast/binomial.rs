//! Broadcast from `root` along a binomial tree: ⌈log2 N⌉ rounds, each rank receives once from
//! its parent and sends to its children.

use crate::schedules::{Algorithm, Broadcast, Cost, Tuning};
use crate::error::{CoreError, Result};
use crate::transport::Transport;

pub struct Binomial;

impl Algorithm for Binomial {
    fn name(&self) -> &'static str {
        "binomial"
    }

    fn description(&self) -> &'static str {
        "the root's vector down a binomial tree: ⌈log2 N⌉ rounds, each rank receives it once from its parent and sends it to its children"
    }

    fn best_for(&self) -> &'static str {
        "short messages"
    }

    fn cost(&self, ranks: usize, bytes: usize, _tuning: &Tuning) -> Cost {
        // The root sends the whole vector once per round, ⌈log2 N⌉ rounds.
        let rounds = ranks.max(1).next_power_of_two().trailing_zeros() as f64;
        Cost {
            messages: rounds,
            bytes: rounds * bytes as f64,
            reduced: 0.0,
        }
    }
}

impl Broadcast for Binomial {
    fn run(&self, transport: &dyn Transport, buf: &mut [u8], root: usize) -> Result<()> {
        broadcast(transport, buf, root)
    }
}

pub fn broadcast(transport: &dyn Transport, buf: &mut [u8], root: usize) -> Result<()> {
    let (n, rank) = (transport.size(), transport.rank());
    if root >= n {
        return Err(CoreError::InvalidArgument(format!(
            "root {root} is outside a group of {n} ranks"
        )));
    }
    // Ranks relative to the root, so the root is 0 of the tree.
    let relative = (rank + n - root) % n;
    let real = |r: usize| (r + root) % n;
    let mut mask = 1;
    while mask < n {
        if relative & mask != 0 {
            transport.irecv(buf, real(relative - mask))?.wait()?;
            break;
        }
        mask <<= 1;
    }
    // Children: relative + m for every power of two m below the bit this rank received on.
    mask >>= 1;
    while mask > 0 {
        if relative + mask < n {
            transport.isend(buf, real(relative + mask))?.wait()?;
        }
        mask >>= 1;
    }
    Ok(())
}
