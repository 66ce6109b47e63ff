//! `shm`: allreduce through memory that every rank of one node maps, as DeepSpeed's and vLLM's
//! CPU allreduce and MPICH's release_gather do. No message moves; ranks copy and reduce each
//! other's memory, and meet at cache-line flags ([`crate::transport::shm`]).
//!
//! - **One-shot** (at most [`ONE_SHOT_MAX`] bytes): each rank copies its vector into its staging
//!   area, posts one step, and then reduces every rank's copy into its own vector. One meeting
//!   per call; the areas alternate by step parity, so the next call never overwrites what a
//!   slower rank still reads (to post two steps later a rank must have seen that rank's next).
//! - **Two-shot** (larger): the vector goes in segments of [`SEGMENT_BYTES`], each cut into one
//!   slice per rank. For each segment a rank copies it in, meets the others, then copies out the
//!   previous segment's reduced slices while reducing its own slice of this segment, in place. The
//!   staging area is a ring of three segment slots, so memory stays bounded and cache-resident
//!   whatever the size. A vector that already lives in shared memory (a `ringlet.empty` array)
//!   is not copied in: the others reduce it where it is, and only the results are copied out.
//!
//! Every element is reduced in rank order, `x0 ⊕ x1 ⊕ ... ⊕ x(N-1)`, whichever rank reduces
//! it, so every rank ends with the same bits; 16-bit floats are accumulated in f32 across all
//! ranks and rounded once.

use crate::schedules::common::blocks::Blocks;
use crate::schedules::{Algorithm, Allreduce, Cost, Input, Parts, Reduction, Tuning};
use crate::dtype::DType;
use crate::error::{CoreError, Result};
use crate::kernels::{self, convert, Order};
use crate::scratch::Scratch;
use crate::transport::shm::{SharedMemory, AREA_BYTES, WORDS};
use crate::transport::Transport;

pub struct Shm;

/// Vectors up to this size take the one-shot path on 2 ranks (two of them fit a staging area).
pub const ONE_SHOT_MAX: usize = 64 << 10;

/// The largest one-shot vector on `ranks` ranks: 64 KiB·(2/N)³. Each rank reads N vectors in
/// the one-shot, against about two in the two-shot, so the one-shot pays only while a meeting
/// costs more than the extra reading; the cube keeps the switch below the point where the
/// model's time would drop (it never decreases with size, see tests/python/test_selector.py).
pub fn one_shot_max(ranks: usize) -> usize {
    let n = ranks.max(2);
    ONE_SHOT_MAX * 8 / (n * n * n)
}
/// The two-shot path's segment (three slots fit a staging area).
pub const SEGMENT_BYTES: usize = 1 << 20;
const SLOTS: usize = 3;
const _: () = assert!(2 * ONE_SHOT_MAX <= AREA_BYTES && SLOTS * SEGMENT_BYTES <= AREA_BYTES);

/// The mean part size from which a fused run folds into each part where it is, rather than
/// into scratch and then copied out: a fold costs a call, a copy a pass.
const FOLD_EACH_PART_FROM: usize = 512;

/// Elements combined per pass of the fold (an f32 batch of this many stays in L1).
const FOLD_ELEMENTS: usize = 2048;

/// A published location: the vector is in the staging area, or in a shared array.
const STAGED: u64 = 0;
const IN_ARRAY: u64 = 1;

/// The cost of a meeting at the flags, in alphas (a cache line crossing cores, not a message).
const MEETING: f64 = 0.25;

impl Algorithm for Shm {
    fn name(&self) -> &'static str {
        "shm"
    }

    fn description(&self) -> &'static str {
        "through the node's shared memory, no messages (one-shot or two-shot, above); only where every rank shares one node"
    }

    fn best_for(&self) -> &'static str {
        "small messages on one node; arrays from `ringlet.empty`"
    }

    fn cost(&self, ranks: usize, bytes: usize, _tuning: &Tuning) -> Cost {
        let (n, m) = (ranks as f64, bytes as f64);
        if bytes <= one_shot_max(ranks) {
            return Cost {
                messages: MEETING,
                bytes: m,
                reduced: n * m,
            };
        }
        let segments = bytes.div_ceil(SEGMENT_BYTES) as f64;
        Cost {
            messages: MEETING * (segments + 2.0),
            bytes: m + (n - 1.0) / n * m,
            reduced: m,
        }
    }

    fn packs_itself(&self) -> bool {
        true
    }

    fn folds_scaling(&self) -> bool {
        true
    }

    fn checks_at_first_meeting(&self, ranks: usize, bytes: usize) -> bool {
        bytes > 0 && bytes <= one_shot_max(ranks)
    }

    fn unavailable(&self, transport: &dyn Transport) -> Option<String> {
        // One rank has nothing to reduce: it runs anywhere.
        (transport.size() > 1 && transport.shared().is_none()).then(|| {
            "it needs every rank on one node, with shared memory (see ringlet.shared_memory())"
                .to_string()
        })
    }
}

impl Allreduce for Shm {
    fn run(
        &self,
        transport: &dyn Transport,
        buf: &mut Parts,
        reduction: &Reduction,
        _tuning: &Tuning,
    ) -> Result<()> {
        self.reduce(transport, buf, None, reduction)
    }

    /// Out of place, the caller's input is staged (and its own slice read) where it is, and
    /// the result written once: no copy first. A result in a shared array is reduced in place
    /// there (the others read it directly), from a copy of the input.
    fn run_from(
        &self,
        transport: &dyn Transport,
        input: &Input,
        output: &mut Parts,
        reduction: &Reduction,
        _tuning: &Tuning,
    ) -> Result<()> {
        let two_shot_in_array = output.len() > one_shot_max(transport.size())
            && match (transport.shared(), output.parts()) {
                (Some(shared), [only]) => shared.locate(only.as_ptr(), only.len()).is_some(),
                _ => false,
            };
        if two_shot_in_array {
            output.copy_from(0..input.len(), input)?;
            return self.reduce(transport, output, None, reduction);
        }
        self.reduce(transport, output, Some(input), reduction)
    }
}

impl Shm {
    /// The one-shot or the two-shot path by size; this rank's vector is read from `input`
    /// where given (`buf` then starts unwritten).
    fn reduce(
        &self,
        transport: &dyn Transport,
        buf: &mut Parts,
        input: Option<&Input>,
        reduction: &Reduction,
    ) -> Result<()> {
        if input.is_some_and(|input| !input.matches(buf)) {
            return Err(CoreError::InvalidArgument(
                "internal: a shared-memory allreduce's input and result differ in parts".into(),
            ));
        }
        let shared = transport.shared().ok_or_else(|| {
            CoreError::InvalidArgument(format!(
                "algorithm \"shm\" is not available here: {}",
                self.unavailable(transport).unwrap_or_default()
            ))
        })?;
        if buf.is_empty() {
            return Ok(());
        }
        if buf.len() <= one_shot_max(transport.size()) {
            one_shot(transport, shared, buf, input, reduction)
        } else {
            two_shot(transport, shared, buf, input, reduction)
        }
    }
}

/// The one-shot path: each rank stages its vector, and every rank folds all of them. With
/// `input` (out of place, parts as `buf`'s), this rank's vector is read there and `buf` only
/// written.
fn one_shot(
    transport: &dyn Transport,
    shared: &dyn SharedMemory,
    buf: &mut Parts,
    input: Option<&Input>,
    reduction: &Reduction,
) -> Result<()> {
    let flags = shared.flags();
    let ranks = flags.ranks();
    let len = buf.len();
    let half = (flags.next_step() % 2) as usize * (AREA_BYTES / 2);
    let slot = |rank: usize| shared.area(rank).wrapping_add(half) as *const u8;
    let staging = shared.area(flags.rank()).wrapping_add(half);
    // SAFETY: this rank's half-area is its own until it posts (the others finished reading it
    // two steps ago), and `len` fits it.
    unsafe { gather(input.map_or(Vector::Result(buf), Vector::Input), 0, staging, len)? };
    // The call's check, if the runtime left it to this meeting: nothing is written before it.
    flags.sync_checked(transport)?;
    let mut sources: smallvec::SmallVec<[*const u8; 8]> = (0..ranks).map(slot).collect();
    let mine = flags.rank();
    let parts = buf.parts().len();
    if parts > 1 && len / parts < FOLD_EACH_PART_FROM {
        // A fused run of small arrays: one fold into scratch, then a copy to each, costs less
        // than a fold per array (the vector is at most a staging half, in cache). The scratch
        // starts as this rank's vector and stands for it in the fold, which then combines the
        // others into it where it is (at N=2 one pass, no accumulator).
        let mut reduced = Scratch::new(len);
        let reduced = reduced.bytes(len)?;
        // SAFETY: this rank's half-area holds its `len` bytes; `reduced` is ours.
        unsafe { std::ptr::copy_nonoverlapping(sources[mine], reduced.as_mut_ptr(), len) };
        sources[mine] = reduced.as_ptr();
        // SAFETY: every rank's half-area holds its `len` bytes, posted before the step just
        // met, and nobody writes them until after this rank's next post; `reduced` is ours.
        unsafe { fold(reduction, &sources, &[reduced.as_mut_ptr()], len)? };
        // SAFETY: `reduced` holds `len` bytes nothing else writes.
        return unsafe { scatter(reduced.as_ptr(), buf, 0, len) };
    }
    // Each part still holds what this rank staged (or the input does): it stands for this
    // rank's piece, and the fold combines the others' pieces into it where it is.
    let mut offset = 0;
    for (index, part) in buf.parts_mut().iter_mut().enumerate() {
        let own = match input {
            Some(input) => input.parts()[index].as_ptr(),
            None => part.as_ptr(),
        };
        let pieces: smallvec::SmallVec<[*const u8; 8]> = (0..ranks)
            .map(|rank| {
                if rank == mine {
                    own
                } else {
                    sources[rank].wrapping_add(offset)
                }
            })
            .collect();
        // SAFETY: as above, for the part's bytes of every rank's half-area; the part is
        // private.
        unsafe { fold(reduction, &pieces, &[part.as_mut_ptr()], part.len())? };
        offset += part.len();
    }
    Ok(())
}

/// Where a rank's vector lies for the two-shot path.
#[derive(Clone, Copy)]
enum Source {
    /// In its staging area, one segment per slot.
    Staged(*mut u8),
    /// At this address in a shared array, whole.
    InArray(*mut u8),
}

impl Source {
    /// The start of segment `segment` (which starts at byte `start` of the vector).
    fn segment(self, segment: usize, start: usize) -> *mut u8 {
        match self {
            Source::Staged(area) => area.wrapping_add((segment % SLOTS) * SEGMENT_BYTES),
            Source::InArray(base) => base.wrapping_add(start),
        }
    }
}

/// How this rank's own vector takes part in the two-shot path.
#[derive(Clone, Copy, PartialEq)]
enum Own {
    /// It lives in a shared array: reduced in place, nothing copied in.
    InArray,
    /// One private buffer: only the others' slices are copied in, this rank reads its own slice
    /// where it is, and writes its reduced slice both there and to its area for the others.
    Private(*mut u8),
    /// Several private buffers: every segment is copied in whole, and copied out whole.
    Pieces,
}

/// The two-shot path: a reduce-scatter through the staging areas (or shared arrays), then an
/// allgather, a segment at a time. With `input` (out of place, parts as `buf`'s, which are
/// private), this rank's vector is staged from it (and, one part, its own slice read there),
/// and `buf` only written.
fn two_shot(
    transport: &dyn Transport,
    shared: &dyn SharedMemory,
    buf: &mut Parts,
    input: Option<&Input>,
    reduction: &Reduction,
) -> Result<()> {
    let flags = shared.flags();
    let (rank, ranks) = (flags.rank(), flags.ranks());
    let len = buf.len();
    let elem = reduction.elem_size();
    let in_array = match buf.parts() {
        [only] => shared.locate(only.as_ptr(), len),
        _ => None,
    };
    let own = match (in_array, buf.parts_mut()) {
        (Some(_), _) => Own::InArray,
        (None, [only]) => Own::Private(only.as_mut_ptr()),
        _ => Own::Pieces,
    };
    if input.is_some() && own == Own::InArray {
        return Err(CoreError::InvalidArgument(
            "internal: an out-of-place shared-memory allreduce needs a private result".into(),
        ));
    }
    // This rank's own slices are read where the input is, when it is one buffer.
    let own_input = input.and_then(|input| input.single());
    let words = match in_array {
        Some((id, offset)) => [IN_ARRAY, id, offset as u64, 0],
        None => [STAGED; WORDS],
    };
    // Meet first: the others may still read this rank's area from a one-shot call.
    let step = flags.sync(transport, words)?;
    let mut sources = Vec::with_capacity(ranks);
    for r in 0..ranks {
        sources.push(match flags.words(r, step) {
            [IN_ARRAY, id, offset, _] => {
                let (base, size) = shared.part(id, r).ok_or_else(|| {
                    CoreError::Communication(format!("internal: rank {r}'s shared array {id}"))
                })?;
                if offset as usize + len > size {
                    return Err(CoreError::Communication(format!(
                        "internal: rank {r}'s vector overruns its shared array"
                    )));
                }
                Source::InArray(base.wrapping_add(offset as usize))
            }
            _ => Source::Staged(shared.area(r)),
        });
    }
    let mine = sources[rank];
    let segments = len.div_ceil(SEGMENT_BYTES);
    let segment_range = |c: usize| c * SEGMENT_BYTES..((c + 1) * SEGMENT_BYTES).min(len);
    let slices = |c: usize| Blocks::new(segment_range(c).len() / elem, ranks, elem);
    for c in 0..=segments {
        if c < segments && own != Own::InArray {
            let range = segment_range(c);
            let slot = mine.segment(c, range.start);
            // The others need every slice of this segment but this rank's own, unless this rank
            // must reduce in its area (several buffers).
            let skip = match own {
                Own::Private(_) => slices(c).block(rank),
                _ => 0..0,
            };
            for part in [0..skip.start, skip.end..range.len()] {
                let (start, to) = (range.start + part.start, slot.wrapping_add(part.start));
                let vector = input.map_or(Vector::Result(buf), Vector::Input);
                // SAFETY: slot c % 3 of this rank's area is its own: the others read it last
                // for segment c - 3, before their post that this rank waited for at segment
                // c - 1.
                unsafe { gather(vector, start, to, part.len())? };
            }
        }
        flags.sync(transport, [0; WORDS])?;
        if c >= 1 {
            let range = segment_range(c - 1);
            for (r, source) in sources.iter().enumerate() {
                if r == rank && own != Own::Pieces {
                    continue; // reduced where it is already
                }
                let slice = slices(c - 1).block(r);
                let from = source.segment(c - 1, range.start).wrapping_add(slice.start);
                // SAFETY: rank r reduced this slice before the step just met and writes it
                // no more; the destination is this rank's own.
                unsafe { scatter(from, buf, range.start + slice.start, slice.len())? };
            }
        }
        if c < segments {
            let range = segment_range(c);
            let slice = slices(c).block(rank);
            let at = |source: Source| {
                source.segment(c, range.start).wrapping_add(slice.start) as *const u8
            };
            let mut inputs: Vec<*const u8> = sources.iter().map(|&s| at(s)).collect();
            let in_area = mine.segment(c, range.start).wrapping_add(slice.start);
            let outputs = match own {
                Own::Private(base) => {
                    let here = base.wrapping_add(range.start + slice.start);
                    inputs[rank] = match own_input {
                        Some(input) => input[range.start + slice.start..].as_ptr(),
                        None => here,
                    };
                    vec![here, in_area]
                }
                _ => vec![in_area],
            };
            // SAFETY: every rank's segment c is in place (posted before the step just met); this
            // rank alone reads and writes slice `rank` of it (and of its own buffer) until the
            // next step.
            unsafe { fold(reduction, &inputs, &outputs, slice.len())? };
        }
    }
    // Nobody may read this rank's memory once it returns (its array is the caller's again).
    flags.sync(transport, [0; WORDS])?;
    Ok(())
}

/// Where this rank's vector is read: the result itself (in place), or the input.
#[derive(Clone, Copy)]
enum Vector<'v, 'r, 'i> {
    Result(&'v Parts<'r>),
    Input(&'v Input<'i>),
}

/// Copy bytes `start .. start + len` of this rank's vector into `to`.
///
/// # Safety
/// `to` must be valid for `len` bytes that nothing else touches meanwhile.
unsafe fn gather(vector: Vector, start: usize, to: *mut u8, len: usize) -> Result<()> {
    // SAFETY: the caller's contract for `to`.
    let to = unsafe { std::slice::from_raw_parts_mut(to, len) };
    match vector {
        Vector::Result(buf) => buf.read_into(start..start + len, to),
        Vector::Input(input) => input.read_into(start..start + len, to),
    }
}

/// Copy `len` bytes from `from` into bytes `start .. start + len` of the vector.
///
/// # Safety
/// `from` must be valid for `len` bytes that nothing writes meanwhile.
unsafe fn scatter(from: *const u8, buf: &mut Parts, start: usize, len: usize) -> Result<()> {
    // SAFETY: the caller's contract for `from`.
    let from = unsafe { std::slice::from_raw_parts(from, len) };
    buf.write_from(start..start + len, from)
}

/// Every output `= sources[0] ⊕ sources[1] ⊕ ... ` over `len` bytes, in that order, a block at
/// a time (so an output may be one of the sources: each block is read whole before it is
/// written).
///
/// # Safety
/// Every source must be valid for `len` bytes that nobody writes meanwhile, except the outputs,
/// each valid for `len` bytes that only this call touches.
unsafe fn fold(
    reduction: &Reduction,
    sources: &[*const u8],
    outputs: &[*mut u8],
    len: usize,
) -> Result<()> {
    let dtype = reduction.dtype;
    let op = reduction.op;
    let sixteen = matches!(dtype, DType::F16 | DType::BF16);
    let acc_type = if sixteen { DType::F32 } else { dtype };
    // Two inputs, the first output one of them, no widening: combine into it where it is (the
    // order kept by `Order`), then copy to the other outputs; no accumulator pass.
    let in_place = match (sixteen, sources, outputs.first()) {
        (false, [a, b], Some(&out)) if std::ptr::eq(out, *a) => Some((*b, Order::AccFirst)),
        (false, [a, b], Some(&out)) if std::ptr::eq(out, *b) => Some((*a, Order::OtherFirst)),
        _ => None,
    };
    // A short vector needs only its own length of scratch, and one combined in place none: a
    // small call (or a fused run's small array) then neither allocates nor clears a batch.
    let batch = FOLD_ELEMENTS.min(len / dtype.size()).max(1);
    let block = batch * dtype.size();
    let scratch_bytes = if in_place.is_some() {
        0
    } else {
        2 * batch * acc_type.size()
    };
    let mut scratch = Scratch::new(scratch_bytes);
    let scratch = scratch.bytes(scratch_bytes)?;
    let (acc, widened) = scratch.split_at_mut(scratch_bytes / 2);
    // The scaling goes into the combines (pre where an input is first read, avg's division
    // and post into the last), not into sweeps of the whole vector before and after: a sweep
    // of 36 MiB cost 1.8 ms at N=2, half the allreduce.
    let last_of_two = reduction.scaling(true, true, true);
    let scaling = |i: usize| reduction.scaling(i == 1, true, i + 1 == sources.len());
    let lone = sources.len() == 1 && reduction.scaled;
    let mut done = 0;
    while done < len {
        let n = block.min(len - done);
        if let (Some((other, order)), Some(&out)) = (in_place, outputs.first()) {
            // SAFETY: the caller's contract: `other` is readable and unwritten; `out` is this
            // call's alone, and no other slice of it is alive.
            let (input, target) = unsafe {
                (
                    std::slice::from_raw_parts(other.add(done), n),
                    std::slice::from_raw_parts_mut(out.add(done), n),
                )
            };
            kernels::combine_scaled(dtype, op, target, input, order, &last_of_two)?;
            for &copy in &outputs[1..] {
                // SAFETY: the caller's contract: another output, `n` writable bytes.
                unsafe { std::ptr::copy_nonoverlapping(out.add(done), copy.add(done), n) };
            }
            done += n;
            continue;
        }
        let acc_len = n / dtype.size() * acc_type.size();
        let acc = &mut acc[..acc_len];
        for (i, &source) in sources.iter().enumerate() {
            // SAFETY: the caller's contract: `n` readable bytes at `source + done`, unwritten
            // while this block is folded (`out`'s block is written only after the loop).
            let input = unsafe { std::slice::from_raw_parts(source.add(done), n) };
            match (i, sixteen) {
                (0, false) => acc.copy_from_slice(input),
                (0, true) => convert::convert(dtype, input, DType::F32, acc, 1.0)?,
                (_, false) => {
                    kernels::combine_scaled(dtype, op, acc, input, Order::AccFirst, &scaling(i))?
                }
                (_, true) => {
                    let widened = &mut widened[..acc_len];
                    convert::convert(dtype, input, DType::F32, widened, 1.0)?;
                    let scaling = scaling(i);
                    kernels::combine_scaled(DType::F32, op, acc, widened, Order::AccFirst, &scaling)?;
                }
            }
        }
        if lone {
            // Nothing to combine with (not reached: the runtime folds only over two or more
            // ranks), so the factors apply on their own.
            convert::scale(acc_type, acc, reduction.pre)?;
            if let Some(finish) = reduction.finish() {
                kernels::finish(acc_type, acc, finish)?;
            }
        }
        for &out in outputs {
            // SAFETY: the caller's contract: `n` writable bytes at `out + done`, and no slice
            // of them is alive (the inputs above are dropped).
            let target = unsafe { std::slice::from_raw_parts_mut(out.add(done), n) };
            if sixteen {
                convert::convert(DType::F32, acc, dtype, target, 1.0)?;
            } else {
                target.copy_from_slice(acc);
            }
        }
        done += n;
    }
    Ok(())
}
