//! What one rank is about to do, in the form the consistency check compares and the error
//! messages describe: "allreduce #17 of float32[4, 6] sum (ring)".

use super::replay::Replay;
use crate::dtype::{DType, ReduceOp};
use crate::error::{CoreError, Result};
use smallvec::SmallVec;

/// An array's shape, inline up to four dimensions: a group allocates nothing per array.
pub type Dims = SmallVec<[usize; 4]>;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Allreduce,
    Broadcast,
    Allgather,
    ReduceScatter,
    Alltoall,
    Barrier,
    Reduce,
    /// A rank with no more collectives to make (`join`).
    Join,
    /// An array in shared memory (`ringlet.empty`).
    Allocate,
}

impl Kind {
    pub const ALL: [Kind; 9] = [
        Kind::Allreduce,
        Kind::Broadcast,
        Kind::Allgather,
        Kind::ReduceScatter,
        Kind::Alltoall,
        Kind::Barrier,
        Kind::Join,
        Kind::Allocate,
        Kind::Reduce,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Kind::Allreduce => "allreduce",
            Kind::Broadcast => "broadcast",
            Kind::Allgather => "allgather",
            Kind::ReduceScatter => "reduce_scatter",
            Kind::Alltoall => "alltoall",
            Kind::Barrier => "barrier",
            Kind::Join => "join",
            Kind::Allocate => "allocate",
            Kind::Reduce => "reduce",
        }
    }

    pub fn from_name(name: &str) -> Result<Kind> {
        Kind::ALL
            .into_iter()
            .find(|k| k.name() == name)
            .ok_or_else(|| {
                CoreError::InvalidArgument(format!(
                    "unknown collective {name:?}; accepted: {}",
                    crate::dtype::names(Kind::ALL.iter().map(|k| k.name()))
                ))
            })
    }
}

/// The elements a call moves: a dtype the kernels reduce, or any NumPy dtype (moved as bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Element<'a> {
    Typed(DType),
    Named(&'a str),
}

impl Element<'_> {
    pub fn name(&self) -> &str {
        match self {
            Element::Typed(dtype) => dtype.name(),
            Element::Named(name) => name,
        }
    }
}

/// The shapes every rank must agree on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape<'a> {
    None,
    /// One array.
    Array(&'a [usize]),
    /// One array whose first dimension may differ between ranks (allgather, alltoall).
    Rows(&'a [usize]),
    /// Several arrays in one collective (a fused group).
    Arrays(&'a [Dims]),
}

/// One rank's collective call.
#[derive(Clone, Copy, Debug)]
pub struct Call<'a> {
    pub kind: Kind,
    pub element: Element<'a>,
    pub op: Option<ReduceOp>,
    pub shape: Shape<'a>,
    /// The algorithm's name ("-" where there is no choice).
    pub algorithm: &'static str,
    pub root: Option<usize>,
    /// Rows per rank (reduce-scatter), empty otherwise.
    pub counts: &'a [usize],
    /// Which of a fused group's buffers this is, of how many.
    pub part: Option<(usize, usize)>,
    /// Which of the process's threads calls: two threads interleaving collectives differently
    /// on two ranks would otherwise pair up the wrong calls.
    pub thread: u64,
    /// How a joined rank can take part in this call, if it can (sum and avg allreduces).
    pub replay: Option<&'a Replay>,
}

impl<'a> Call<'a> {
    /// A call with only a kind; fill in the rest with struct update syntax.
    pub fn new(kind: Kind, thread: u64) -> Self {
        Call {
            kind,
            element: Element::Named("-"),
            op: None,
            shape: Shape::None,
            algorithm: "-",
            root: None,
            counts: &[],
            part: None,
            thread,
            replay: None,
        }
    }

    /// The elements in this rank's part of the call.
    pub fn element_count(&self) -> u64 {
        let product = |dims: &[usize]| dims.iter().product::<usize>() as u64;
        match self.shape {
            Shape::None => 0,
            Shape::Array(dims) | Shape::Rows(dims) => product(dims),
            Shape::Arrays(arrays) => arrays.iter().map(|dims| product(dims)).sum(),
        }
    }

    /// A 64-bit digest of everything the ranks must agree on; `refused` calls all digest alike
    /// (whatever was wrong), so ranks that all refuse a call agree and raise their own errors.
    pub fn digest(&self, refused: bool, settings: &[u64]) -> u64 {
        let mut d = Digest::default();
        d.word(self.kind as u64);
        d.word(self.thread);
        if refused {
            d.word(u64::MAX);
            return d.finish();
        }
        d.text(self.element.name());
        d.word(self.op.map_or(u64::MAX, |op| op as u64));
        match self.shape {
            Shape::None => d.word(0),
            Shape::Array(dims) => d.dims(1, dims),
            Shape::Rows(dims) => d.dims(2, dims.get(1..).unwrap_or(&[])),
            Shape::Arrays(arrays) => {
                d.word(3);
                d.word(arrays.len() as u64);
                arrays.iter().for_each(|dims| d.dims(4, dims));
            }
        }
        d.text(self.algorithm);
        d.word(self.root.map_or(u64::MAX, |r| r as u64));
        d.dims(5, self.counts);
        let (index, parts) = self.part.unwrap_or((0, 0));
        d.dims(6, &[index, parts]);
        settings.iter().for_each(|&s| d.word(s));
        d.finish()
    }

    /// "allreduce #17 of float32[4, 6] sum (ring)"; `refused` adds why this rank refused it.
    pub fn describe(&self, seq: u64, refused: Option<&str>) -> String {
        let kind = self.kind.name();
        if let Some(reason) = refused {
            return format!("{kind} #{seq}, which it refused: {reason}");
        }
        let dtype = self.element.name();
        let mut text = match self.shape {
            Shape::None => format!("{kind} #{seq}"),
            Shape::Array(dims) | Shape::Rows(dims) => {
                format!("{kind} #{seq} of {dtype}{}", dims_text(dims))
            }
            Shape::Arrays(arrays) => {
                let shapes: Vec<String> = arrays.iter().map(|d| dims_text(d)).collect();
                format!(
                    "{kind} #{seq} of {} {dtype} array{} {} fused",
                    arrays.len(),
                    if arrays.len() == 1 { "" } else { "s" },
                    abbreviate(&shapes)
                )
            }
        };
        if let Some((index, parts)) = self.part.filter(|(_, parts)| *parts > 1) {
            text += &format!(" (buffer {} of {parts})", index + 1);
        }
        if let Some(op) = self.op {
            text += &format!(" {}", op.name());
        }
        if !self.counts.is_empty() {
            text += &format!(" into rows {}", dims_text(self.counts));
        }
        if let Some(root) = self.root {
            text += &format!(" from root {root}");
        }
        if self.algorithm != "-" {
            text += &format!(" ({})", self.algorithm);
        }
        text
    }
}

/// "[4, 6]".
fn dims_text(dims: &[usize]) -> String {
    let parts: Vec<String> = dims.iter().map(usize::to_string).collect();
    format!("[{}]", parts.join(", "))
}

/// The first and last few of a long list.
fn abbreviate(items: &[String]) -> String {
    const SHOWN: usize = 4;
    if items.len() <= 2 * SHOWN {
        return items.join(", ");
    }
    format!(
        "{}, ... ({} more), {}",
        items[..SHOWN].join(", "),
        items.len() - 2 * SHOWN,
        items[items.len() - SHOWN..].join(", ")
    )
}

/// What the stall inspector says a waiting rank is in: owned, and cheap to make for every call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Label {
    pub seq: u64,
    kind: Kind,
    dtype: Option<DType>,
    elements: u64,
    op: Option<ReduceOp>,
    algorithm: &'static str,
    root: Option<usize>,
}

impl Label {
    pub fn of(call: &Call, seq: u64) -> Self {
        Label {
            seq,
            kind: call.kind,
            dtype: match call.element {
                Element::Typed(dtype) => Some(dtype),
                Element::Named(_) => None,
            },
            elements: call.element_count(),
            op: call.op,
            algorithm: call.algorithm,
            root: call.root,
        }
    }
}

impl std::fmt::Display for Label {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} #{}", self.kind.name(), self.seq)?;
        match self.dtype {
            Some(dtype) => write!(f, " of {}[{}]", dtype.name(), self.elements)?,
            None if self.kind != Kind::Barrier => write!(f, " of {} elements", self.elements)?,
            None => {}
        }
        if let Some(op) = self.op {
            write!(f, " {}", op.name())?;
        }
        if let Some(root) = self.root {
            write!(f, " from root {root}")?;
        }
        if self.algorithm != "-" {
            write!(f, " ({})", self.algorithm)?;
        }
        Ok(())
    }
}

/// A 64-bit hash with a fixed definition (every rank, every build computes the same). Each word
/// goes through a bijection of the state (xor, odd multiply, xorshift), so two inputs of the same
/// length that differ in one word never collide; splitmix64's finalizer mixes the result.
struct Digest(u64);

impl Default for Digest {
    fn default() -> Self {
        Digest(0x5249_4e47_4c45_5421) // "RINGLET!"
    }
}

impl Digest {
    fn word(&mut self, value: u64) {
        let z = (self.0 ^ value).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        self.0 = z ^ (z >> 29);
    }

    fn text(&mut self, text: &str) {
        self.word(text.len() as u64);
        for chunk in text.as_bytes().chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.word(u64::from_le_bytes(word));
        }
    }

    fn dims(&mut self, tag: u64, dims: &[usize]) {
        self.word(tag);
        self.word(dims.len() as u64);
        dims.iter().for_each(|&d| self.word(d as u64));
    }

    fn finish(&self) -> u64 {
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call<'a>(dims: &'a [usize]) -> Call<'a> {
        Call {
            element: Element::Typed(DType::F32),
            op: Some(ReduceOp::Sum),
            shape: Shape::Array(dims),
            algorithm: "ring",
            ..Call::new(Kind::Allreduce, 0)
        }
    }

    #[test]
    fn the_digest_sees_shape_dtype_op_algorithm_root_counts_thread_and_settings() {
        let base = call(&[4, 6]).digest(false, &[1, 2]);
        assert_eq!(base, call(&[4, 6]).digest(false, &[1, 2]));
        assert_ne!(base, call(&[4, 2, 3]).digest(false, &[1, 2]));
        assert_ne!(base, call(&[24]).digest(false, &[1, 2]));
        assert_ne!(base, call(&[4, 6]).digest(false, &[1, 3]));
        let variants = [
            Call {
                element: Element::Typed(DType::F64),
                ..call(&[4, 6])
            },
            Call {
                op: Some(ReduceOp::Max),
                ..call(&[4, 6])
            },
            Call {
                algorithm: "halving_doubling",
                ..call(&[4, 6])
            },
            Call {
                root: Some(1),
                ..call(&[4, 6])
            },
            Call {
                counts: &[1, 3],
                ..call(&[4, 6])
            },
            Call {
                thread: 7,
                ..call(&[4, 6])
            },
            Call {
                part: Some((1, 2)),
                ..call(&[4, 6])
            },
            Call {
                kind: Kind::Broadcast,
                ..call(&[4, 6])
            },
        ];
        for variant in variants {
            assert_ne!(base, variant.digest(false, &[1, 2]), "{variant:?}");
        }
    }

    #[test]
    fn allgather_rows_may_differ_and_refused_calls_digest_alike() {
        let rows = |dims| Call {
            shape: Shape::Rows(dims),
            ..call(&[])
        };
        assert_eq!(
            rows(&[3, 6]).digest(false, &[]),
            rows(&[5, 6]).digest(false, &[])
        );
        assert_ne!(
            rows(&[3, 6]).digest(false, &[]),
            rows(&[3, 5]).digest(false, &[])
        );
        assert_eq!(call(&[1]).digest(true, &[]), call(&[2]).digest(true, &[9]));
        assert_ne!(call(&[1]).digest(true, &[]), call(&[1]).digest(false, &[]));
    }

    #[test]
    fn descriptions_name_what_was_passed() {
        assert_eq!(
            call(&[4, 6]).describe(17, None),
            "allreduce #17 of float32[4, 6] sum (ring)"
        );
        assert_eq!(
            call(&[4]).describe(3, Some("unknown op")),
            "allreduce #3, which it refused: unknown op"
        );
        let shapes = [Dims::from_slice(&[10]), Dims::from_slice(&[4, 6])];
        let group = Call {
            shape: Shape::Arrays(&shapes),
            ..call(&[])
        };
        assert_eq!(
            group.describe(2, None),
            "allreduce #2 of 2 float32 arrays [10], [4, 6] fused sum (ring)"
        );
        assert_eq!(
            Label::of(&call(&[4, 6]), 17).to_string(),
            "allreduce #17 of float32[24] sum (ring)"
        );
    }
}
