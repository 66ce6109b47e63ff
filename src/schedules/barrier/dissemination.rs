//! A barrier for the transport: the dissemination algorithm (Hensgen, Finkel & Manber, "Two
//! algorithms for barrier synchronization"). In round k every rank sends an empty message to
//! rank + 2^k and receives one from rank - 2^k; after ⌈log2 N⌉ rounds every rank has heard,
//! through some chain, from every other, so none leaves before all have arrived.

use crate::error::Result;
use crate::transport::Transport;

pub fn barrier(transport: &dyn Transport) -> Result<()> {
    let (n, rank) = (transport.size(), transport.rank());
    let mut distance = 1;
    while distance < n {
        let (to, from) = ((rank + distance) % n, (rank + n - distance) % n);
        transport.sendrecv(&[], to, &mut [], from)?;
        distance <<= 1;
    }
    Ok(())
}
