//! Whether messages between nodes go whole or in pieces: calibration times an exchange both
//! ways with each option and this decides.

use crate::transport::DEFAULT_MAX_MESSAGE_BYTES;

/// The limits calibration times between nodes, the first (whole messages) being the one kept
/// unless another wins. The pieces are below the eager limits of Open MPI's TCP transport
/// (64 KiB, its header included) and of libfabric's tcp;ofi_rxm (16 KiB), so each piece goes
/// without a rendezvous.
pub const OPTIONS: [usize; 3] = [DEFAULT_MAX_MESSAGE_BYTES, 32 << 10, 16 << 10];

/// Pieces replace whole messages only when the exchange takes at most this fraction of the
/// time (a tie keeps whole messages: fewer of them, and zero-copy where the network does it).
pub const GAIN: f64 = 0.9;

/// An exchange both ways at once that takes longer than this times one way: the connections
/// carry one direction at a time.
pub const HALF_DUPLEX_ABOVE: f64 = 1.5;

/// Of the limits timed (`(limit, seconds)`, the first being the one to keep unless another
/// wins), the fastest if it takes at most [`GAIN`] of the first's time, else the first.
pub fn choose_limit(timed: &[(usize, f64)]) -> Option<usize> {
    let &(first, first_seconds) = timed.first()?;
    let &(fastest, seconds) = timed
        .iter()
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .unwrap_or(&(first, first_seconds));
    Some(if seconds < GAIN * first_seconds {
        fastest
    } else {
        first
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_win_only_by_a_clear_margin() {
        let whole = DEFAULT_MAX_MESSAGE_BYTES;
        assert_eq!(
            choose_limit(&[(whole, 1.0), (32 << 10, 0.5), (16 << 10, 0.6)]),
            Some(32 << 10)
        );
        assert_eq!(choose_limit(&[(whole, 1.0), (32 << 10, 0.95)]), Some(whole));
        assert_eq!(choose_limit(&[(4096, 2.0)]), Some(4096));
        assert_eq!(choose_limit(&[]), None);
    }
}
