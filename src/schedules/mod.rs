//! The algorithms: which bytes go to which rank in which step.
//!
//! A schedule knows the element size and calls a [`Reduction`] to combine; it never looks at
//! the dtype itself, never touches Python, and talks only to a [`Transport`]. Next to its code
//! each one declares what the rest of ringlet needs to know about it ([`Algorithm`]): its name,
//! what it can reduce, and its cost in the alpha-beta-gamma model, from which `auto` (src/auto)
//! predicts its time. Nothing else lists algorithms.
//!
//! One folder per collective, one file per algorithm (`allreduce/ring.rs`,
//! `broadcast/binomial.rs`, ...); what algorithms of several collectives share is in `common/`.
//! The folders have no `mod.rs`: this file declares every module, the algorithms through their
//! collective's registry below. Adding one means one new file in its collective's folder plus
//! one line in that registry; `ringlet.ALGORITHMS`, `explain()`, `auto`, the benchmarks, the
//! tests and README's algorithm table take it from there.

/// What algorithms of several collectives share.
mod common {
    pub(crate) mod blocks;
    pub(crate) mod exchange;
    pub(crate) mod fold;
    pub(crate) mod parts;
}

pub use common::parts::{Input, Parts};

use crate::dtype::{names, DType, ReduceOp};
use crate::error::{CoreError, Result};
use crate::kernels::{self, convert, Finish, Order, Scaling};
use crate::transport::view::View;
use crate::transport::{Nodes, Transport};
use std::ops::Range;

/// Declares a collective's folder as a module, each registered algorithm as a module of it (its
/// file, `<folder>/<module>.rs`), and the registry that lists them, in the order `explain` and
/// the benchmarks show them.
macro_rules! registry {
    ($(#[$doc:meta])* $registry:ident: $collective:ident in $folder:ident
        = [$($module:ident::$algorithm:ident,)*]) => {
        pub mod $folder {
            $(pub mod $module;)*
        }
        $(#[$doc])*
        pub static $registry: &[&dyn $collective] = &[$(&$folder::$module::$algorithm),*];
    };
}

registry!(
    /// Allreduce algorithms.
    ALLREDUCE: Allreduce in allreduce = [
        ring::Ring,
        pipelined_ring::PipelinedRing,
        halving_doubling::HalvingDoubling,
        recursive_doubling::RecursiveDoubling,
        shared_memory::Shm,
        two_tier::TwoTier,
        native_mpi::Mpi,
    ]
);

registry!(
    /// Broadcast algorithms.
    BROADCAST: Broadcast in broadcast = [
        binomial::Binomial,
        scatter_allgather::ScatterAllgather,
        two_tier::TwoTierBroadcast,
    ]
);

registry!(
    /// Reduce algorithms (the combination lands on one rank).
    REDUCE: Reduce in reduce = [
        binomial::BinomialReduce,
        k_chain::KChain,
        reduce_scatter_gather::ReduceScatterGather,
        native_mpi::MpiReduce,
    ]
);

registry!(
    /// Allgather algorithms (blocks of any size per rank).
    ALLGATHER: Allgather in allgather = [
        ring::RingAllgather,
        recursive_doubling::DoublingAllgather,
        two_tier::TwoTierAllgather,
    ]
);

registry!(
    /// Reduce-scatter algorithms (blocks of any size per rank).
    REDUCE_SCATTER: ReduceScatter in reduce_scatter = [
        ring::RingReduceScatter,
        recursive_halving::RecursiveHalving,
        priority_halving::PriorityHalving,
    ]
);

registry!(
    /// Alltoall algorithms (blocks of any size per pair of ranks).
    ALLTOALL: Alltoall in alltoall = [
        pairwise::PairwiseAlltoall,
    ]
);

/// The barrier (not chosen by name: one algorithm).
pub mod barrier {
    pub mod dissemination;
}

/// How partial results combine: a dtype and an op, applied by the kernels, and the scaling a
/// schedule folds into its combines when `scaled` (see [`Reduction::scaling`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Reduction {
    pub dtype: DType,
    pub op: ReduceOp,
    /// Each rank's input is multiplied by `pre` where the schedule first reads it.
    pub pre: f64,
    /// The result is divided by `ranks` for `avg`, then multiplied by `post`, where the
    /// schedule combines it for the last time.
    pub post: f64,
    pub ranks: usize,
    /// Whether the schedule applies `pre`, `post` and `avg`'s division (else the caller does).
    pub scaled: bool,
}

impl Reduction {
    /// Combining only: no factors, and `avg` is left undivided.
    pub fn plain(dtype: DType, op: ReduceOp) -> Self {
        Reduction {
            dtype,
            op,
            pre: 1.0,
            post: 1.0,
            ranks: 1,
            scaled: false,
        }
    }

    pub fn elem_size(&self) -> usize {
        self.dtype.size()
    }

    /// The last thing done to each finished element, if anything.
    pub fn finish(&self) -> Option<Finish> {
        let divide_by = if self.op == ReduceOp::Avg {
            self.ranks
        } else {
            1
        };
        (divide_by != 1 || self.post != 1.0).then_some(Finish {
            divide_by,
            multiply: self.post,
        })
    }

    /// The scaling of one combine: `acc_fresh` / `other_fresh` say whether that side is still a
    /// rank's own input (it gets `pre`), `last` whether the combine finishes its elements.
    pub fn scaling(&self, acc_fresh: bool, other_fresh: bool, last: bool) -> Scaling {
        if !self.scaled {
            return Scaling::NONE;
        }
        let factor = |fresh: bool| if fresh { self.pre } else { 1.0 };
        Scaling {
            acc: factor(acc_fresh),
            other: factor(other_fresh),
            finish: if last { self.finish() } else { None },
        }
    }

    /// `acc = acc ⊕ other` with `scaling`.
    pub fn combine(&self, acc: &mut [u8], other: &[u8], scaling: &Scaling) -> Result<()> {
        self.combine_ordered(acc, other, Order::AccFirst, scaling)
    }

    /// `acc = acc ⊕ other` or `acc = other ⊕ acc`, for schedules that must fix the order.
    pub fn combine_ordered(
        &self,
        acc: &mut [u8],
        other: &[u8],
        order: Order,
        scaling: &Scaling,
    ) -> Result<()> {
        kernels::combine_scaled(self.dtype, self.op, acc, other, order, scaling)
    }

    /// [`combine_ordered`](Self::combine_ordered) into the pieces of a range: `other` holds the
    /// range's bytes back to back.
    pub fn combine_into(
        &self,
        acc: &mut [&mut [u8]],
        other: &[u8],
        order: Order,
        scaling: &Scaling,
    ) -> Result<()> {
        let mut offset = 0;
        for piece in acc.iter_mut() {
            let len = piece.len();
            let incoming = other.get(offset..offset + len).ok_or_else(|| {
                CoreError::InvalidArgument("internal: pieces longer than the data".into())
            })?;
            self.combine_ordered(piece, incoming, order, scaling)?;
            offset += len;
        }
        Ok(())
    }
}

/// Settings that change how a schedule cuts its traffic. Every rank must use the same ones:
/// the runtime keeps them per communicator and checks them with every collective.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tuning {
    /// Segment size of the pipelined ring.
    pub segment_bytes: usize,
    /// Rings run in node-major order across nodes ([`node_major`]); off only to measure what
    /// that order gains.
    pub node_major: bool,
}

impl Tuning {
    pub const DEFAULT_SEGMENT_BYTES: usize = 256 * 1024;
}

impl Default for Tuning {
    fn default() -> Self {
        Tuning {
            segment_bytes: Tuning::DEFAULT_SEGMENT_BYTES,
            node_major: true,
        }
    }
}

/// One run's cost on its busiest rank, in the alpha-beta-gamma (Hockney) model:
/// `time = alpha * messages + beta * bytes + gamma * reduced`, with alpha the latency of a
/// message, beta the time per byte sent, gamma the time per byte combined.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Cost {
    /// Messages in sequence (rounds of the schedule).
    pub messages: f64,
    /// Bytes sent on the critical path.
    pub bytes: f64,
    /// Bytes combined by the reduction kernel.
    pub reduced: f64,
}

/// One run's cost when the ranks span several nodes: what stays inside a node (priced with the
/// node's alpha and beta) and what crosses a node's link (the network's), on the busiest rank
/// and the busiest link.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Tiered {
    pub within: Cost,
    /// `bytes`: what the busiest node's link carries in each direction, from all of its ranks
    /// at once; `reduced` is always 0 (reductions happen in `within`).
    pub across: Cost,
}

impl Tiered {
    /// Everything inside one node.
    pub fn within(cost: Cost) -> Self {
        Tiered {
            within: cost,
            across: Cost::default(),
        }
    }

    /// A schedule that ignores where ranks run: any of its messages may cross a link, and every
    /// rank of a node may send over it at once (`senders` of them).
    pub fn unaware(flat: Cost, senders: usize) -> Self {
        Tiered {
            within: Cost {
                reduced: flat.reduced,
                ..Cost::default()
            },
            across: Cost {
                messages: flat.messages,
                bytes: flat.bytes * senders as f64,
                reduced: 0.0,
            },
        }
    }
}

/// Whether an algorithm can reduce a dtype with an op.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Support {
    /// With ringlet's kernels: the same bits as every other algorithm.
    Full,
    /// It runs, but its arithmetic is its own, so its answers may differ from the kernels'
    /// (`auto` never picks it).
    OwnArithmetic(&'static str),
    /// It cannot.
    No(&'static str),
}

/// What every registered algorithm declares next to its code.
pub trait Algorithm: Sync {
    /// The name users pass as `algorithm=`.
    fn name(&self) -> &'static str;

    /// What it does, in one line of markdown: its row of README.md's algorithm table
    /// (generated by `tests/readme.rs`).
    fn description(&self) -> &'static str;

    /// When to choose it, for the same row (a few words).
    fn best_for(&self) -> &'static str;

    /// Whether it can reduce `dtype` with `op` (collectives that move bytes ignore both).
    fn support(&self, _dtype: DType, _op: ReduceOp) -> Support {
        Support::Full
    }

    /// Its cost for `bytes` (the whole message: the vector reduced, broadcast or gathered) on
    /// `ranks` ranks.
    fn cost(&self, ranks: usize, bytes: usize, tuning: &Tuning) -> Cost;

    /// Its cost on the ranks of `nodes` (the busiest rank's messages and bytes inside a node,
    /// and the busiest node link's). By default: on one node the flat cost, on several the
    /// cost of a schedule that does not know where ranks run ([`Tiered::unaware`]).
    fn cost_on(&self, nodes: &Nodes, bytes: usize, tuning: &Tuning) -> Tiered {
        let flat = self.cost(nodes.ranks(), bytes, tuning);
        if nodes.count() <= 1 {
            return Tiered::within(flat);
        }
        Tiered::unaware(flat, nodes.per_node().1)
    }

    /// Whether it applies [`Reduction`]'s scaling in its own combines (else the caller sweeps
    /// the data before and after).
    fn folds_scaling(&self) -> bool {
        false
    }

    /// Whether it copies the vector into memory of its own anyway (so many small arrays cost it
    /// no more than one, and the caller should not pack them first).
    fn packs_itself(&self) -> bool {
        false
    }

    /// Whether its first act on `bytes` over `ranks` ranks is a meeting in shared memory that
    /// can carry the call's consistency check ([`crate::transport::shm::Flags::expect`]),
    /// before it writes anything the caller sees.
    fn checks_at_first_meeting(&self, _ranks: usize, _bytes: usize) -> bool {
        false
    }

    /// Why it cannot run on `transport`, if it cannot (the same answer on every rank).
    fn unavailable(&self, _transport: &dyn Transport) -> Option<String> {
        None
    }
}

pub trait Allreduce: Algorithm {
    /// Reduce `buf` in place across every rank of `transport` (at least 2). On return every
    /// rank holds the same bytes: the combination of all ranks' inputs, scaled as `reduction`
    /// says if the algorithm [folds scaling](Algorithm::folds_scaling).
    fn run(
        &self,
        transport: &dyn Transport,
        buf: &mut Parts,
        reduction: &Reduction,
        tuning: &Tuning,
    ) -> Result<()>;

    /// [`run`](Self::run) out of place: every rank's `input` (only read) reduced into its
    /// `output`, as long, part for part. By default `output` starts as a copy of `input`; a
    /// schedule whose first touch of each byte can read the caller's vector overrides this, so
    /// that no copy precedes the collective (a framework's argument, which it keeps, is reduced
    /// in one pass).
    fn run_from(
        &self,
        transport: &dyn Transport,
        input: &Input,
        output: &mut Parts,
        reduction: &Reduction,
        tuning: &Tuning,
    ) -> Result<()> {
        output.copy_from(0..input.len(), input)?;
        self.run(transport, output, reduction, tuning)
    }
}

pub trait Broadcast: Algorithm {
    /// Copy `root`'s `buf` into every other rank's.
    fn run(&self, transport: &dyn Transport, buf: &mut [u8], root: usize) -> Result<()>;
}

pub trait Reduce: Algorithm {
    /// Combine every rank's `buf` into `root`'s (`root` < the transport's size, checked by
    /// the caller). On return `root`'s `buf` holds the combination of all ranks' inputs; the
    /// other ranks' `buf` is scratch the schedule may have overwritten.
    fn run(
        &self,
        transport: &dyn Transport,
        buf: &mut [u8],
        root: usize,
        reduction: &Reduction,
    ) -> Result<()>;
}

pub trait Allgather: Algorithm {
    /// Rank r starts with `buf[blocks[r]]` filled and ends with every block filled. Blocks are
    /// disjoint, one per rank, of any size.
    fn run(&self, transport: &dyn Transport, buf: &mut [u8], blocks: &[Range<usize>])
        -> Result<()>;
}

pub trait Alltoall: Algorithm {
    /// Rank r sends `send[send_blocks[q]]` to every rank q and receives rank q's block for it
    /// into `recv[recv_blocks[q]]`. Blocks are disjoint, one per rank, of any size (the sizes
    /// of a pair agree: what q sends r is what r expects from q).
    fn run(
        &self,
        transport: &dyn Transport,
        send: &[u8],
        send_blocks: &[Range<usize>],
        recv: &mut [u8],
        recv_blocks: &[Range<usize>],
    ) -> Result<()>;
}

pub trait ReduceScatter: Algorithm {
    /// Afterwards rank r holds in `buf[blocks[r]]` the combination over all ranks of that
    /// block (scaled as `reduction` says if the algorithm folds scaling). Blocks are disjoint,
    /// one per rank, whole elements each.
    fn run(
        &self,
        transport: &dyn Transport,
        buf: &mut [u8],
        blocks: &[Range<usize>],
        reduction: &Reduction,
    ) -> Result<()>;
}

/// The algorithm called `name` in `registry`, or an error listing the accepted names.
pub fn by_name<T: Algorithm + ?Sized>(registry: &[&'static T], name: &str) -> Result<&'static T> {
    registry
        .iter()
        .copied()
        .find(|a| a.name() == name)
        .ok_or_else(|| {
            CoreError::InvalidArgument(format!(
                "unknown algorithm {name:?}; accepted: \"auto\", {}",
                names(registry.iter().map(|a| a.name()))
            ))
        })
}

/// `Err` if `algorithm` cannot reduce `dtype` with `op`, naming the algorithms that can.
pub fn check_support<T: Algorithm + ?Sized>(
    registry: &[&'static T],
    algorithm: &T,
    dtype: DType,
    op: ReduceOp,
) -> Result<()> {
    let Support::No(reason) = algorithm.support(dtype, op) else {
        return Ok(());
    };
    let able = registry
        .iter()
        .filter(|a| !matches!(a.support(dtype, op), Support::No(_)))
        .map(|a| a.name());
    Err(CoreError::InvalidArgument(format!(
        "algorithm {:?} cannot reduce {} with {:?}: {reason}; use \"auto\", {}",
        algorithm.name(),
        dtype.name(),
        op.name(),
        names(able)
    )))
}

/// The ranks of `transport` in node-major order, if that is not already their order: a ring in
/// that order crosses each node's link once per step, wherever the launcher placed the ranks
/// (Patarasuk & Yuan, Lemma 6). `None` when the order is already node-major (one node, or block
/// placement), or `tuning` turns the order off.
pub fn node_major<'t>(transport: &'t dyn Transport, tuning: &Tuning) -> Result<Option<View<'t>>> {
    if !tuning.node_major {
        return Ok(None);
    }
    let order = transport.nodes().node_major_order();
    if order.iter().enumerate().all(|(i, &r)| i == r) {
        return Ok(None);
    }
    View::new(transport, order).map(Some)
}

/// The cost of a schedule that runs in [`node_major`] order: each of its steps crosses a node's
/// link once, the other messages stay inside the nodes, at the same time (unless `tuning` keeps
/// rank order: then it is [`Tiered::unaware`]).
pub fn node_major_cost(flat: Cost, nodes: &Nodes, tuning: &Tuning) -> Tiered {
    if nodes.count() <= 1 {
        return Tiered::within(flat);
    }
    if !tuning.node_major {
        return Tiered::unaware(flat, nodes.per_node().1);
    }
    Tiered {
        within: Cost {
            reduced: flat.reduced,
            ..Cost::default()
        },
        across: Cost {
            reduced: 0.0,
            ..flat
        },
    }
}

/// Each rank's input times `pre`, the result (after `avg`'s division) times `post`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Factors {
    pub pre: f64,
    pub post: f64,
}

impl Factors {
    pub const NONE: Factors = Factors {
        pre: 1.0,
        post: 1.0,
    };
}

/// The whole allreduce of `buf`: check it, run the schedule, and scale: folded into the
/// schedule's combines when it can, else in a sweep before and after.
pub fn allreduce(
    transport: &dyn Transport,
    schedule: &dyn Allreduce,
    buf: &mut Parts,
    dtype: DType,
    op: ReduceOp,
    factors: Factors,
    tuning: &Tuning,
) -> Result<()> {
    for part in buf.parts() {
        check_buffer(part, dtype)?;
    }
    let ranks = transport.size();
    let folded = ranks > 1 && schedule.folds_scaling();
    let reduction = Reduction {
        dtype,
        op,
        pre: factors.pre,
        post: factors.post,
        ranks,
        scaled: folded,
    };
    if !folded && factors.pre != 1.0 {
        for part in buf.parts_mut() {
            convert::scale(dtype, part, factors.pre)?;
        }
    }
    if ranks > 1 {
        schedule.run(transport, buf, &reduction, tuning)?;
    }
    if let (false, Some(finish)) = (folded, reduction.finish()) {
        for part in buf.parts_mut() {
            kernels::finish(dtype, part, finish)?;
        }
    }
    Ok(())
}

/// [`allreduce`] out of place: `input` (only read) reduced into `output`, which must have
/// parts as long and must not overlap it.
#[allow(clippy::too_many_arguments)]
pub fn allreduce_from(
    transport: &dyn Transport,
    schedule: &dyn Allreduce,
    input: &Input,
    output: &mut Parts,
    dtype: DType,
    op: ReduceOp,
    factors: Factors,
    tuning: &Tuning,
) -> Result<()> {
    for part in input.parts() {
        check_buffer(part, dtype)?;
    }
    if !input.matches(output) {
        return Err(CoreError::InvalidArgument(format!(
            "internal: a {}-byte input in {} parts for a {}-byte result in {}",
            input.len(),
            input.parts().len(),
            output.len(),
            output.parts().len()
        )));
    }
    let ranks = transport.size();
    let folded = schedule.folds_scaling();
    if ranks <= 1 || !folded && factors.pre != 1.0 {
        // Nothing to exchange, or a sweep over the input first: from a copy.
        output.copy_from(0..input.len(), input)?;
        return allreduce(transport, schedule, output, dtype, op, factors, tuning);
    }
    for part in output.parts() {
        check_buffer(part, dtype)?;
    }
    let reduction = Reduction {
        dtype,
        op,
        pre: factors.pre,
        post: factors.post,
        ranks,
        scaled: folded,
    };
    schedule.run_from(transport, input, output, &reduction, tuning)?;
    if let (false, Some(finish)) = (folded, reduction.finish()) {
        for part in output.parts_mut() {
            kernels::finish(dtype, part, finish)?;
        }
    }
    Ok(())
}

/// [`allreduce`] of one contiguous buffer, without factors.
pub fn allreduce_one(
    transport: &dyn Transport,
    schedule: &dyn Allreduce,
    buf: &mut [u8],
    dtype: DType,
    op: ReduceOp,
    tuning: &Tuning,
) -> Result<()> {
    let mut parts = Parts::one(buf);
    allreduce(
        transport,
        schedule,
        &mut parts,
        dtype,
        op,
        Factors::NONE,
        tuning,
    )
}

/// A buffer of whole, aligned `dtype` elements.
pub fn check_buffer(buf: &[u8], dtype: DType) -> Result<()> {
    let elem = dtype.size();
    // Element sizes are powers of two: a mask, not a division, on every array of every call.
    debug_assert!(elem.is_power_of_two());
    let misaligned = |n: usize| n & (elem - 1) != 0;
    if misaligned(buf.len()) {
        return Err(CoreError::InvalidArgument(format!(
            "a {} buffer must be a multiple of {elem} bytes, got {}",
            dtype.name(),
            buf.len()
        )));
    }
    // An empty array's data pointer may be anything; there is nothing to align.
    if !buf.is_empty() && misaligned(buf.as_ptr() as usize) {
        return Err(CoreError::InvalidArgument(format!(
            "a {} buffer must be aligned to {elem} bytes",
            dtype.name()
        )));
    }
    Ok(())
}
