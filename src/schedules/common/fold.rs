//! MPICH's fold of N ranks onto the largest power of two p' ≤ N, which the recursive halving
//! and doubling schedules of several collectives share: with r = N - p', each even rank below
//! 2r hands its data to the odd rank above it and sits out the power-of-two core.

/// The largest power of two not above `n` (n ≥ 1).
pub(crate) fn largest_power_of_two(n: usize) -> usize {
    1 << (usize::BITS - 1 - n.leading_zeros())
}

/// log2 of the largest power of two not above `n`.
pub(crate) fn log2_floor(n: usize) -> usize {
    (usize::BITS - 1 - n.max(1).leading_zeros()) as usize
}

/// Where a rank stands in the folded group.
pub(crate) enum Role {
    /// Even rank below 2r: hands its data to `partner` and waits for the result.
    Folded { partner: usize },
    /// Takes part in the power-of-two core as `core_rank`; `absorbs` the folded rank, if any.
    Core {
        core_rank: usize,
        absorbs: Option<usize>,
    },
}

impl Role {
    pub(crate) fn of(rank: usize, size: usize) -> Role {
        let remainder = size - largest_power_of_two(size);
        if rank < 2 * remainder {
            if rank.is_multiple_of(2) {
                Role::Folded { partner: rank + 1 }
            } else {
                Role::Core {
                    core_rank: rank / 2,
                    absorbs: Some(rank - 1),
                }
            }
        } else {
            Role::Core {
                core_rank: rank - remainder,
                absorbs: None,
            }
        }
    }
}

/// The real rank of core rank `core_rank` in a group of `size`.
pub(crate) fn real_rank(core_rank: usize, size: usize) -> usize {
    let remainder = size - largest_power_of_two(size);
    if core_rank < remainder {
        2 * core_rank + 1
    } else {
        core_rank + remainder
    }
}
