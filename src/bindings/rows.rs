//! The records that cross to Python: frozen classes with named, read-only fields, never
//! positional tuples (a field added or moved would silently shift every unpacking caller).
//! Each is plain data, built by one function of the module and compared by value.

use pyo3::prelude::*;

/// This rank's place in a process set.
#[pyclass(frozen, get_all, eq, module = "ringlet._core")]
#[derive(Clone, PartialEq)]
pub struct Group {
    pub rank: usize,
    pub size: usize,
    /// Each rank's host, by rank.
    pub hosts: Vec<String>,
}

/// A process set and its ranks (in ringlet's communicator).
#[pyclass(frozen, get_all, eq, module = "ringlet._core")]
#[derive(Clone, PartialEq)]
pub struct ProcessSetRanks {
    pub id: u32,
    pub ranks: Vec<usize>,
}

/// One element type the kernels reduce.
#[pyclass(frozen, get_all, eq, module = "ringlet._core")]
#[derive(Clone, PartialEq)]
pub struct DTypeInfo {
    pub name: String,
    pub itemsize: usize,
    pub is_float: bool,
}

/// One element type the XLA handlers take, by NumPy name.
#[pyclass(frozen, get_all, eq, module = "ringlet._core")]
#[derive(Clone, PartialEq)]
pub struct XlaDType {
    pub name: String,
    /// Whether ringlet reduces it (every listed type can be moved).
    pub reducible: bool,
}

/// Whether the ranks of a process set share the node's memory.
#[pyclass(frozen, get_all, eq, module = "ringlet._core")]
#[derive(Clone, PartialEq)]
pub struct SharedMemoryStatus {
    pub available: bool,
    /// Why not ("" when available).
    pub reason: String,
    /// Whether the reason deserves a warning (not when the ranks simply span nodes).
    pub worth_warning: bool,
}

/// An algorithm's cost model for one call: inside a node on the busiest rank, and over the
/// busiest node's link.
#[pyclass(frozen, get_all, eq, module = "ringlet._core")]
#[derive(Clone, PartialEq)]
pub struct AlgorithmCost {
    pub within_messages: f64,
    pub within_bytes: f64,
    pub within_reduced: f64,
    pub across_messages: f64,
    pub across_bytes: f64,
}

/// One candidate of an explained `auto` choice.
#[pyclass(frozen, get_all, eq, module = "ringlet._core")]
#[derive(Clone, PartialEq)]
pub struct Candidate {
    pub algorithm: String,
    /// The cost model's seconds.
    pub model_seconds: f64,
    /// Measured over modelled seconds (1.0 until calibration measured it).
    pub correction: f64,
    pub predicted_seconds: f64,
    /// The simulator's seconds, when asked for and simulated.
    pub simulated_seconds: Option<f64>,
}

/// What `auto` runs for a call, what that rests on, and every candidate.
#[pyclass(frozen, get_all, eq, module = "ringlet._core")]
#[derive(Clone, PartialEq)]
pub struct Explanation {
    pub choice: String,
    /// "one rank" | "table" | "environment" | "model".
    pub basis: String,
    pub candidates: Vec<Candidate>,
}

/// What `auto` learned online for one range of message sizes it has played.
#[pyclass(frozen, get_all, eq, module = "ringlet._core")]
#[derive(Clone, PartialEq)]
pub struct AutoRefinement {
    pub dtype: String,
    pub op: String,
    pub range_index: usize,
    /// The range's largest message, in bytes.
    pub upper_bytes: u64,
    /// The algorithm it runs now.
    pub algorithm: String,
    pub calls: u64,
    /// Tries of the runner-up.
    pub tries: u64,
    pub switches: u64,
}

/// One algorithm's allreduces in this process since the last reset.
#[pyclass(frozen, get_all, eq, module = "ringlet._core")]
#[derive(Clone, PartialEq)]
pub struct AlgorithmStats {
    pub algorithm: String,
    pub calls: u64,
    pub bytes: u64,
    pub seconds: f64,
}

/// One simulated collective. Pairs are (messages, bytes) per rank in `sent`, and (out, in)
/// bytes per node's link in `link_bytes` and per group's global link in `group_bytes`.
#[pyclass(frozen, get_all, eq, module = "ringlet._core")]
#[derive(Clone, PartialEq)]
pub struct Simulated {
    pub seconds: f64,
    pub sent: Vec<(u64, u64)>,
    pub link_bytes: Vec<(u64, u64)>,
    pub bytes_within: u64,
    pub group_bytes: Vec<(u64, u64)>,
}

/// The simulator's network as the model's parameters price it: links as (bandwidth in bytes
/// per second, latency in seconds).
#[pyclass(frozen, get_all, eq, module = "ringlet._core")]
#[derive(Clone, PartialEq)]
pub struct SimulatedNetwork {
    pub intra: (f64, f64),
    pub inter: (f64, f64),
    pub gamma: f64,
    /// A connection between nodes carries one direction at a time.
    pub half_duplex: bool,
}
