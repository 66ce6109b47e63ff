//! Shared helpers for the schedule tests: run a group of ranks as threads, build inputs whose
//! reductions are exact in every dtype, and compute the reference independently of the core.

use _core::dtype::{DType, ReduceOp};
use _core::schedules::{self, Algorithm, Allreduce, Factors, Input, Parts, Tuning, ALLREDUCE};
use _core::scratch;
use _core::transport::local::LocalTransport;
use _core::transport::{MessageLimits, Transport, DEFAULT_MAX_MESSAGE_BYTES};

/// The rank counts a walk over rank counts takes, by `RINGLET_TEST_WALK`: unset, all of `all`
/// (make test-all, and a plain `cargo test`); `quick` (make check and make test), those up to 5
/// (one rank, a pair, the folds of 3 and 5, two levels).
pub fn walked_rank_counts(all: &[usize]) -> Vec<usize> {
    let keep: fn(usize) -> bool = match std::env::var("RINGLET_TEST_WALK").as_deref() {
        Ok("quick") => |n| n <= 5,
        Ok(other) if !other.is_empty() => {
            panic!("RINGLET_TEST_WALK={other:?}: expected quick (or unset: all)")
        }
        _ => |_| true,
    };
    all.iter().copied().filter(|&n| keep(n)).collect()
}

/// The names in `RINGLET_TEST_ALGORITHMS` (comma-separated), to which the tests that walk a
/// registry narrow themselves (`RINGLET_TEST_ALGORITHMS=direct cargo test --test core schedules::`);
/// `None`: every algorithm. A name no registry holds is an error, so a typo cannot pass.
pub fn only() -> Option<Vec<String>> {
    let names: Vec<String> = std::env::var("RINGLET_TEST_ALGORITHMS")
        .ok()?
        .split(',')
        .map(|n| n.trim().to_string())
        .filter(|n| !n.is_empty())
        .collect();
    let known = |name: &str| {
        ALLREDUCE.iter().any(|a| a.name() == name)
            || schedules::BROADCAST.iter().any(|a| a.name() == name)
            || schedules::REDUCE.iter().any(|a| a.name() == name)
            || schedules::ALLGATHER.iter().any(|a| a.name() == name)
            || schedules::REDUCE_SCATTER.iter().any(|a| a.name() == name)
            || schedules::ALLTOALL.iter().any(|a| a.name() == name)
    };
    for name in &names {
        assert!(
            known(name),
            "RINGLET_TEST_ALGORITHMS: no algorithm is called {name:?}"
        );
    }
    assert!(
        !names.is_empty(),
        "RINGLET_TEST_ALGORITHMS names no algorithm"
    );
    Some(names)
}

/// Whether `name` is among [`only`]'s (every name when it is unset).
pub fn selected(name: &str) -> bool {
    only().is_none_or(|names| names.iter().any(|n| n == name))
}

/// Why `algorithm` cannot run on in-process ranks, if it cannot (asked of a group of two on one
/// node, with shared memory: `mpi` needs an MPI communicator).
pub fn unavailable_in_process<T: Algorithm + ?Sized>(algorithm: &T) -> Option<String> {
    let probe = LocalTransport::group(2).remove(0);
    algorithm.unavailable(&probe)
}

/// The registered allreduce algorithms the tests that walk ALLREDUCE run: every one that can
/// run on in-process ranks, narrowed by [`only`].
pub fn allreduce_under_test() -> Vec<&'static dyn Allreduce> {
    ALLREDUCE
        .iter()
        .copied()
        .filter(|a| unavailable_in_process(*a).is_none() && selected(a.name()))
        .collect()
}

/// Asserts that `test` ran exactly the allreduce algorithms it should, `ran` (in the order it
/// ran them): every registered one, but those that say they cannot run in process, narrowed by
/// [`only`]; never none. Prints them (seen with `--nocapture`).
pub fn assert_covered(test: &str, ran: &[&str]) {
    let mut expected = Vec::new();
    let mut skipped = Vec::new();
    for algorithm in ALLREDUCE {
        match unavailable_in_process(*algorithm) {
            Some(why) => skipped.push(format!("{} ({why})", algorithm.name())),
            None if selected(algorithm.name()) => expected.push(algorithm.name()),
            None => {}
        }
    }
    assert!(
        !expected.is_empty(),
        "{test}: no allreduce algorithm to run"
    );
    assert_eq!(
        ran, expected,
        "{test}: the allreduce algorithms run are not every one that runs in process"
    );
    println!(
        "{test} covered allreduce: {} (skipped, not in process: {})",
        ran.join(", "),
        if skipped.is_empty() {
            "none".to_string()
        } else {
            skipped.join("; ")
        }
    );
}

/// What one rank saw of a run.
pub struct RankOutcome {
    pub result: Vec<u8>,
    pub bytes_sent: usize,
    pub messages_sent: usize,
    pub largest_message: usize,
    pub peak_scratch: usize,
    pub unreceived: usize,
    /// Bytes sent to ranks on other nodes.
    pub bytes_across: usize,
    /// The longest wire message to a rank on another node.
    pub largest_across: usize,
}

/// How a run is set up beyond the inputs.
#[derive(Clone, Debug)]
pub struct Setup {
    pub max_message_bytes: usize,
    /// The longest message between nodes (only with `nodes`).
    pub across_message_bytes: usize,
    pub tuning: Tuning,
    /// The vector as separate buffers of these many elements each (the same on every rank);
    /// `None`: one contiguous buffer.
    pub parts: Option<Vec<usize>>,
    pub factors: Factors,
    /// Rank r runs on node `nodes[r]`; `None`: every rank on one node.
    pub nodes: Option<Vec<usize>>,
    /// Reduce out of place ([`schedules::allreduce_from`]) into a result filled with junk
    /// first (in parts as the input's), and assert the input is unchanged.
    pub out_of_place: bool,
}

impl Default for Setup {
    fn default() -> Self {
        Setup {
            max_message_bytes: DEFAULT_MAX_MESSAGE_BYTES,
            across_message_bytes: DEFAULT_MAX_MESSAGE_BYTES,
            tuning: Tuning::default(),
            parts: None,
            factors: Factors::NONE,
            nodes: None,
            out_of_place: false,
        }
    }
}

/// Run `schedule` on `inputs[r]` at rank r, each rank in its own thread, default tuning.
pub fn run_group(
    schedule: &dyn Allreduce,
    inputs: Vec<Vec<u8>>,
    dtype: DType,
    op: ReduceOp,
    max_message_bytes: usize,
) -> Vec<RankOutcome> {
    let setup = Setup {
        max_message_bytes,
        ..Setup::default()
    };
    run_with(schedule, inputs, dtype, op, &setup)
}

/// [`run_group`] with the given tuning.
pub fn run_group_tuned(
    schedule: &dyn Allreduce,
    inputs: Vec<Vec<u8>>,
    dtype: DType,
    op: ReduceOp,
    max_message_bytes: usize,
    tuning: Tuning,
) -> Vec<RankOutcome> {
    let setup = Setup {
        max_message_bytes,
        tuning,
        ..Setup::default()
    };
    run_with(schedule, inputs, dtype, op, &setup)
}

/// Run `schedule` over `inputs` as `setup` says (the whole allreduce: scaling included).
pub fn run_with(
    schedule: &dyn Allreduce,
    inputs: Vec<Vec<u8>>,
    dtype: DType,
    op: ReduceOp,
    setup: &Setup,
) -> Vec<RankOutcome> {
    let transports: Vec<LocalTransport> = match &setup.nodes {
        None => LocalTransport::group_with_limit(inputs.len(), setup.max_message_bytes),
        Some(nodes) => {
            assert_eq!(nodes.len(), inputs.len(), "one node per rank");
            LocalTransport::cluster(nodes)
                .into_iter()
                .map(|mut t| {
                    t.set_message_limits(MessageLimits {
                        any: setup.max_message_bytes,
                        across: setup.across_message_bytes,
                    });
                    t
                })
                .collect()
        }
    };
    let outcomes: Vec<(Vec<u8>, LocalTransport, usize)> = std::thread::scope(|scope| {
        let handles: Vec<_> = transports
            .into_iter()
            .zip(inputs)
            .map(|(transport, input)| {
                scope.spawn(move || {
                    let count = input.len() / dtype.size();
                    let lengths = setup.parts.clone().unwrap_or_else(|| vec![count]);
                    assert_eq!(
                        lengths.iter().sum::<usize>(),
                        count,
                        "parts cover the vector"
                    );
                    let mut buffers: Vec<AlignedBytes> = Vec::new();
                    let mut offset = 0;
                    for len in &lengths {
                        let bytes = len * dtype.size();
                        buffers.push(aligned_copy(&input[offset..offset + bytes]));
                        offset += bytes;
                    }
                    if setup.out_of_place {
                        let mut outputs: Vec<AlignedBytes> = buffers
                            .iter()
                            .map(|b| aligned_copy(&vec![0xA5; b.as_slice().len()]))
                            .collect();
                        scratch::reset_peak();
                        let given = Input::new(buffers.iter().map(|b| b.as_slice()));
                        let mut parts = Parts::new(outputs.iter_mut().map(|b| b.as_mut_slice()));
                        let result = schedules::allreduce_from(
                            &transport,
                            schedule,
                            &given,
                            &mut parts,
                            dtype,
                            op,
                            setup.factors,
                            &setup.tuning,
                        );
                        drop(parts);
                        if let Err(e) = result {
                            panic!("rank {} failed: {e}", transport.rank());
                        }
                        let unchanged: Vec<u8> =
                            buffers.iter().flat_map(|b| b.as_slice().to_vec()).collect();
                        assert!(
                            unchanged == input,
                            "{}: rank {} changed its input",
                            schedule.name(),
                            transport.rank()
                        );
                        let result = outputs.iter().flat_map(|b| b.as_slice().to_vec()).collect();
                        return (result, transport, scratch::peak_bytes());
                    }
                    scratch::reset_peak();
                    let mut parts = Parts::new(buffers.iter_mut().map(|b| b.as_mut_slice()));
                    let result = schedules::allreduce(
                        &transport,
                        schedule,
                        &mut parts,
                        dtype,
                        op,
                        setup.factors,
                        &setup.tuning,
                    );
                    if let Err(e) = result {
                        panic!("rank {} failed: {e}", transport.rank());
                    }
                    let peak = scratch::peak_bytes();
                    drop(parts);
                    let result: Vec<u8> =
                        buffers.iter().flat_map(|b| b.as_slice().to_vec()).collect();
                    (result, transport, peak)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a rank panicked"))
            .collect()
    });
    // Count leftovers only after every rank finished sending.
    outcomes
        .into_iter()
        .map(|(result, transport, peak_scratch)| RankOutcome {
            result,
            bytes_sent: transport.bytes_sent(),
            messages_sent: transport.messages_sent(),
            largest_message: transport.largest_message(),
            peak_scratch,
            unreceived: transport.unreceived_messages(),
            bytes_across: transport.bytes_across(),
            largest_across: transport.largest_across(),
        })
        .collect()
}

/// Random part lengths (some empty) adding up to `count`, the same for a given seed.
pub fn random_parts(count: usize, seed: u64) -> Vec<usize> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut parts = Vec::new();
    let mut left = count;
    while left > 0 {
        let len = match next() % 5 {
            0 => 0,
            1 => 1,
            _ => (next() as usize % (count / 3 + 2)).min(left),
        };
        parts.push(len);
        left -= len;
    }
    parts.push(0);
    parts
}

/// A byte buffer aligned to 8 (what NumPy guarantees for these dtypes).
pub struct AlignedBytes {
    words: Vec<u64>,
    len: usize,
}

impl AlignedBytes {
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut bytemuck::cast_slice_mut::<u64, u8>(&mut self.words)[..self.len]
    }
    pub fn as_slice(&self) -> &[u8] {
        &bytemuck::cast_slice::<u64, u8>(&self.words)[..self.len]
    }
}

pub fn aligned_copy(bytes: &[u8]) -> AlignedBytes {
    let mut out = AlignedBytes {
        words: vec![0; bytes.len().div_ceil(8)],
        len: bytes.len(),
    };
    out.as_mut_slice().copy_from_slice(bytes);
    out
}

/// Every rank's [`exact_value`]s for `count` elements under `op`.
pub fn exact_inputs(ranks: usize, count: usize, op: ReduceOp) -> Vec<Vec<f64>> {
    (0..ranks)
        .map(|r| (0..count).map(|i| exact_value(r, i, op)).collect())
        .collect()
}

/// Small integers, so that every reduction of up to 64 ranks is exact in every dtype: values
/// in [-2, 4], so partial sums stay within ±256 (bfloat16's exact range); products at most 2^3.
pub fn exact_value(rank: usize, index: usize, op: ReduceOp) -> f64 {
    match op {
        ReduceOp::Prod => {
            if (rank * 7 + index).is_multiple_of(11) && rank < 3 {
                2.0
            } else {
                1.0
            }
        }
        _ => ((rank * 5 + index * 3) % 5) as f64 + if rank % 3 == 1 { -2.0 } else { 0.0 },
    }
}

pub fn encode(dtype: DType, values: &[f64]) -> Vec<u8> {
    let mut out = Vec::with_capacity(values.len() * dtype.size());
    for &v in values {
        match dtype {
            DType::F32 => out.extend_from_slice(&(v as f32).to_ne_bytes()),
            DType::F64 => out.extend_from_slice(&v.to_ne_bytes()),
            DType::F16 => out.extend_from_slice(&half::f16::from_f64(v).to_bits().to_ne_bytes()),
            DType::BF16 => out.extend_from_slice(&half::bf16::from_f64(v).to_bits().to_ne_bytes()),
            DType::I32 => out.extend_from_slice(&(v as i32).to_ne_bytes()),
            DType::I64 => out.extend_from_slice(&(v as i64).to_ne_bytes()),
        }
    }
    out
}

/// The reduction of exact inputs, computed in f64 and converted once.
pub fn reference(dtype: DType, op: ReduceOp, per_rank: &[Vec<f64>]) -> Vec<u8> {
    let n = per_rank.len();
    let count = per_rank.first().map_or(0, Vec::len);
    let values: Vec<f64> = (0..count)
        .map(|i| {
            let column = per_rank.iter().map(|r| r[i]);
            match op {
                ReduceOp::Sum => column.sum(),
                ReduceOp::Avg => {
                    let sum: f64 = column.sum();
                    match dtype {
                        // avg divides in the dtype (16-bit floats in f32), like NumPy's sum / n.
                        DType::F32 | DType::F16 | DType::BF16 => f64::from(sum as f32 / n as f32),
                        DType::F64 => sum / n as f64,
                        DType::I32 | DType::I64 => (sum as i64 / n as i64) as f64,
                    }
                }
                ReduceOp::Prod => column.product(),
                ReduceOp::Min => column.fold(f64::INFINITY, f64::min),
                ReduceOp::Max => column.fold(f64::NEG_INFINITY, f64::max),
            }
        })
        .collect();
    encode(dtype, &values)
}

/// [`reference`] of inputs scaled by `pre`, the result times `post`: exact when the factors are
/// powers of two and the inputs small integers.
pub fn reference_scaled(
    dtype: DType,
    op: ReduceOp,
    per_rank: &[Vec<f64>],
    pre: f64,
    post: f64,
) -> Vec<u8> {
    let scaled: Vec<Vec<f64>> = per_rank
        .iter()
        .map(|r| r.iter().map(|x| x * pre).collect())
        .collect();
    let unscaled = reference(dtype, op, &scaled);
    let values = decode(dtype, &unscaled);
    encode(dtype, &values.iter().map(|v| v * post).collect::<Vec<_>>())
}

pub fn decode(dtype: DType, bytes: &[u8]) -> Vec<f64> {
    bytes
        .chunks(dtype.size())
        .map(|c| match dtype {
            DType::F32 => f64::from(f32::from_ne_bytes([c[0], c[1], c[2], c[3]])),
            DType::F64 => f64::from_ne_bytes(c.try_into().expect("8 bytes")),
            DType::F16 => half::f16::from_bits(u16::from_ne_bytes([c[0], c[1]])).to_f64(),
            DType::BF16 => half::bf16::from_bits(u16::from_ne_bytes([c[0], c[1]])).to_f64(),
            DType::I32 => f64::from(i32::from_ne_bytes([c[0], c[1], c[2], c[3]])),
            DType::I64 => i64::from_ne_bytes(c.try_into().expect("8 bytes")) as f64,
        })
        .collect()
}

/// A deterministic pseudo-random stream in [-1, 1) (xorshift): sums of it round, so the order
/// of a reduction shows in its bits.
pub fn noise(seed: u64, count: usize) -> Vec<f64> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..count)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
        })
        .collect()
}
