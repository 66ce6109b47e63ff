//! The network model: the recorded programs of every rank played against links with
//! bandwidth, latency and contention, in simulated time.
//!
//! Each rank's node has one link to the network, which carries that node's traffic in each
//! direction at `inter.bandwidth`; ranks on one node exchange through their own ports at
//! `intra.bandwidth` (one message in and one out at a time per rank). A message reserves its
//! two resources (the sender's side and the receiver's side) first come, first served, from the
//! moment it is posted: it starts when both are free, takes `bytes / bandwidth`, and arrives
//! `latency` later. So messages that share a link queue behind each other, and the link's
//! throughput is shared as a fair link would share it (in turn rather than at once). Each
//! message also costs its sender and its receiver `overhead` seconds of CPU (LogGP's o), and
//! combining costs `gamma` seconds per byte.
//!
//! Optionally the ranks of a node share its memory bandwidth (`memory`, bytes of traffic per
//! second): a message inside the node copies its bytes, which moves three bytes of traffic per
//! byte (the source read, the target's line read for ownership, the target written back), and
//! a combine moves three as well (two operands read, the result written over a line it has
//! just read); each such use of memory takes its turn on the node's memory as a message takes
//! its turn on a link. Large messages on one node are bound by this, not by the cache-resident
//! copy rate `intra.bandwidth` a calibration measures. A copy is what measures `memory`: every
//! rank of a node copying n bytes at once, 3n bytes of traffic each.
//!
//! Optionally each connection between two ranks on different nodes carries one direction at a
//! time (`half_duplex`): a message also takes its turn on the connection, so two ranks that
//! exchange both ways at once get half the rate each, while messages in one direction, or both
//! directions of a ring (different connections), run as before. Open MPI's TCP transport
//! measures so (8 MiB between two hosts: 82 ms one way, 150 ms both ways at once).
//!
//! Optionally the nodes form `groups` of consecutive nodes, each group with one global link to
//! the others (the two-tier direct networks of Jain, Lau & Kale: PERCS, Dragonfly): a message
//! between groups also reserves both groups' global links, runs at the slower of the rates, and
//! pays both latencies.
//!
//! Ranks run their programs in simulated-time order (a discrete-event simulation): a send is
//! timed when it is posted, a receive completes when its message has arrived, a wait blocks
//! its rank until its request completes.

use super::trace::{Op, Program};
use crate::error::{CoreError, Result};
use crate::transport::Nodes;
use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};

/// A multiply-shift hash for the (sender, receiver) keys: the default SipHash guards against
/// adversarial keys, which rank pairs are not, at several times the cost.
#[derive(Default)]
struct PairHasher(u64);

impl Hasher for PairHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u64(&mut self, value: u64) {
        self.0 = (self.0.rotate_left(5) ^ value).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

/// Bytes of memory traffic per byte copied inside a node, and per byte combined.
pub const COPY_TRAFFIC: f64 = 3.0;
pub const COMBINE_TRAFFIC: f64 = 3.0;

type Pairs = HashMap<u64, VecDeque<Queued>, BuildHasherDefault<PairHasher>>;
/// When each connection (an unordered pair of ranks) is next free, for `half_duplex`.
type Connections = HashMap<u64, f64, BuildHasherDefault<PairHasher>>;

fn pair(from: usize, to: usize) -> u64 {
    ((from as u64) << 32) | to as u64
}

/// Bandwidth in bytes per second and latency in seconds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Link {
    pub bandwidth: f64,
    pub latency: f64,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Network {
    /// Between ranks of one node.
    pub intra: Link,
    /// Each node's link to the network.
    pub inter: Link,
    /// Seconds per byte combined.
    pub gamma: f64,
    /// Seconds of CPU per message, at the sender and again at the receiver.
    pub overhead: f64,
    /// Bytes per second each node's memory moves, shared by its ranks (infinite: not modelled).
    pub memory: f64,
    /// Groups of consecutive nodes (Jain, Lau & Kale's two-tier direct networks): a message
    /// between groups also goes through its group's global link and the other's, at `global`.
    /// 1: one group, no such tier.
    pub groups: usize,
    pub global: Link,
    /// A connection between ranks on different nodes carries one direction at a time.
    pub half_duplex: bool,
}

impl Network {
    fn check(&self) -> Result<()> {
        let finite = [
            self.intra.bandwidth,
            self.inter.bandwidth,
            self.intra.latency,
            self.inter.latency,
            self.gamma,
            self.overhead,
            self.global.latency,
        ];
        if !finite.iter().all(|v| v.is_finite() && *v >= 0.0)
            || self.intra.bandwidth <= 0.0
            || self.inter.bandwidth <= 0.0
            || self.memory.is_nan()
            || self.memory <= 0.0
            || self.global.bandwidth.is_nan()
            || self.global.bandwidth <= 0.0
        {
            return Err(CoreError::InvalidArgument(format!(
                "the network needs positive bandwidths and non-negative latencies, gamma and \
                 overhead, got {self:?}"
            )));
        }
        Ok(())
    }
}

/// What the simulation found.
#[derive(Clone, Debug, PartialEq)]
pub struct Outcome {
    /// When the last rank finished.
    pub seconds: f64,
    /// Messages and payload bytes each rank sent.
    pub sent: Vec<(u64, u64)>,
    /// Payload bytes each node's link carried: `[out, in]` per node.
    pub link_bytes: Vec<[u64; 2]>,
    /// Payload bytes that stayed inside a node.
    pub bytes_within: u64,
    /// Payload bytes each group's global link carried: `[out, in]` per group.
    pub group_bytes: Vec<[u64; 2]>,
}

impl Outcome {
    /// The busiest global link's bytes in one direction (0 with one group).
    pub fn max_group_bytes(&self) -> u64 {
        if self.group_bytes.len() <= 1 {
            return 0;
        }
        self.group_bytes
            .iter()
            .flatten()
            .copied()
            .max()
            .unwrap_or(0)
    }

    pub fn messages(&self) -> u64 {
        self.sent.iter().map(|s| s.0).sum()
    }

    pub fn bytes(&self) -> u64 {
        self.sent.iter().map(|s| s.1).sum()
    }

    /// The busiest node link's bytes in one direction.
    pub fn max_link_bytes(&self) -> u64 {
        self.link_bytes.iter().flatten().copied().max().unwrap_or(0)
    }

    /// The mean over every node link and direction.
    pub fn mean_link_bytes(&self) -> f64 {
        let links = self.link_bytes.len() * 2;
        if links == 0 {
            return 0.0;
        }
        self.link_bytes.iter().flatten().sum::<u64>() as f64 / links as f64
    }
}

/// A time in the event queue, earliest first.
#[derive(Clone, Copy, PartialEq)]
struct Due(f64, usize);

impl Eq for Due {}

impl Ord for Due {
    fn cmp(&self, other: &Self) -> Ordering {
        other.0.total_cmp(&self.0).then(other.1.cmp(&self.1))
    }
}

impl PartialOrd for Due {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// One side of a pair's FIFO: messages sent before their receive was posted, or receives
/// posted before their message was sent.
enum Queued {
    Sent { arrival: f64 },
    Posted { rank: usize, request: u32, at: f64 },
}

struct Rank {
    pc: usize,
    clock: f64,
    /// Completion time per request (NaN: not known yet).
    completions: Vec<f64>,
    blocked_on: Option<u32>,
    done: bool,
}

impl Rank {
    fn complete(&mut self, request: u32, at: f64) {
        let index = request as usize;
        if self.completions.len() <= index {
            self.completions.resize(index + 1, f64::NAN);
        }
        self.completions[index] = at;
    }
}

/// Play `programs` (one per rank of `nodes`) on `network`.
pub fn run(programs: &[Program], nodes: &Nodes, network: &Network) -> Result<Outcome> {
    network.check()?;
    let n = programs.len();
    if n != nodes.ranks() {
        return Err(CoreError::InvalidArgument(format!(
            "internal: {n} programs for {} ranks",
            nodes.ranks()
        )));
    }
    // Free-at times: each rank's port out and in, then each node's link out and in.
    let mut port_free = vec![[0.0f64; 2]; n];
    let mut link_free = vec![[0.0f64; 2]; nodes.count()];
    // When each node's memory is next free, and the seconds one byte of memory traffic takes.
    let mut memory_free = vec![0.0f64; nodes.count()];
    let per_byte = 1.0 / network.memory; // 0 when memory is not modelled
                                         // Groups of consecutive nodes, each with one global link (one group: no such tier).
    let groups = network.groups.clamp(1, nodes.count().max(1));
    let per_group = nodes.count().div_ceil(groups).max(1);
    let group_of = |node: usize| node / per_group;
    let mut group_free = vec![[0.0f64; 2]; groups];
    let mut outcome = Outcome {
        seconds: 0.0,
        sent: vec![(0, 0); n],
        link_bytes: vec![[0, 0]; nodes.count()],
        bytes_within: 0,
        group_bytes: vec![[0, 0]; network.groups.clamp(1, nodes.count().max(1))],
    };
    let mut pairs = Pairs::default();
    let mut connection_free = Connections::default();
    let mut ranks: Vec<Rank> = programs
        .iter()
        .map(|program| Rank {
            pc: 0,
            clock: 0.0,
            completions: Vec::with_capacity(requests(program)),
            blocked_on: None,
            done: false,
        })
        .collect();
    let mut due: BinaryHeap<Due> = (0..n).map(|r| Due(0.0, r)).collect();
    let mut finished = 0;

    while let Some(Due(at, r)) = due.pop() {
        if ranks[r].done || ranks[r].blocked_on.is_some() || at < ranks[r].clock {
            continue; // a stale entry
        }
        loop {
            let Some(&op) = programs[r].get(ranks[r].pc) else {
                ranks[r].done = true;
                finished += 1;
                outcome.seconds = outcome.seconds.max(ranks[r].clock);
                break;
            };
            match op {
                Op::Send { to, bytes, request } => {
                    let (to, now) = (to as usize, ranks[r].clock + network.overhead);
                    let (src_node, dst_node) = (nodes.of(r), nodes.of(to));
                    let (injected, latency) = if src_node == dst_node {
                        outcome.bytes_within += bytes;
                        let start = now
                            .max(port_free[r][0])
                            .max(port_free[to][1])
                            .max(memory_free[src_node]);
                        // Source read, target read for ownership, target written.
                        memory_free[src_node] = start + COPY_TRAFFIC * bytes as f64 * per_byte;
                        let done = (start + bytes as f64 / network.intra.bandwidth)
                            .max(memory_free[src_node]);
                        port_free[r][0] = done;
                        port_free[to][1] = done;
                        (done, network.intra.latency)
                    } else {
                        outcome.link_bytes[src_node][0] += bytes;
                        outcome.link_bytes[dst_node][1] += bytes;
                        let mut start = now.max(link_free[src_node][0]).max(link_free[dst_node][1]);
                        // Only with half duplex: the key is looked up for every message.
                        let connection = network.half_duplex.then(|| pair(r.min(to), r.max(to)));
                        if let Some(key) = connection {
                            start = start.max(connection_free.get(&key).copied().unwrap_or(0.0));
                        }
                        let mut rate = network.inter.bandwidth;
                        let mut latency = network.inter.latency;
                        let (src_group, dst_group) = (group_of(src_node), group_of(dst_node));
                        if src_group != dst_group {
                            // Between groups: also through each group's global link.
                            outcome.group_bytes[src_group][0] += bytes;
                            outcome.group_bytes[dst_group][1] += bytes;
                            start = start
                                .max(group_free[src_group][0])
                                .max(group_free[dst_group][1]);
                            rate = rate.min(network.global.bandwidth);
                            latency += network.global.latency;
                        }
                        let done = start + bytes as f64 / rate;
                        link_free[src_node][0] = done;
                        link_free[dst_node][1] = done;
                        if let Some(key) = connection {
                            connection_free.insert(key, done);
                        }
                        if src_group != dst_group {
                            group_free[src_group][0] = done;
                            group_free[dst_group][1] = done;
                        }
                        (done, latency)
                    };
                    let arrival = injected + latency;
                    outcome.sent[r].0 += 1;
                    outcome.sent[r].1 += bytes;
                    ranks[r].clock = now;
                    ranks[r].complete(request, injected);
                    let queue = pairs.entry(pair(r, to)).or_default();
                    match queue.front() {
                        Some(Queued::Posted { .. }) => {
                            if let Some(Queued::Posted { rank, request, at }) = queue.pop_front() {
                                let done = arrival.max(at) + network.overhead;
                                ranks[rank].complete(request, done);
                                if ranks[rank].blocked_on == Some(request) {
                                    ranks[rank].blocked_on = None;
                                    ranks[rank].clock = ranks[rank].clock.max(done);
                                    due.push(Due(ranks[rank].clock, rank));
                                }
                            }
                        }
                        _ => queue.push_back(Queued::Sent { arrival }),
                    }
                }
                Op::Receive {
                    from,
                    bytes: _,
                    request,
                } => {
                    let now = ranks[r].clock;
                    let queue = pairs.entry(pair(from as usize, r)).or_default();
                    match queue.front() {
                        Some(Queued::Sent { .. }) => {
                            if let Some(Queued::Sent { arrival }) = queue.pop_front() {
                                ranks[r].complete(request, arrival.max(now) + network.overhead);
                            }
                        }
                        _ => queue.push_back(Queued::Posted {
                            rank: r,
                            request,
                            at: now,
                        }),
                    }
                }
                Op::Wait { request } => {
                    let known = ranks[r]
                        .completions
                        .get(request as usize)
                        .copied()
                        .filter(|t| !t.is_nan());
                    match known {
                        Some(done) => ranks[r].clock = ranks[r].clock.max(done),
                        None => {
                            ranks[r].blocked_on = Some(request);
                            break; // woken when its message is sent
                        }
                    }
                }
                Op::Combine { bytes } => {
                    // Two operands read, one written: three bytes of memory traffic per byte.
                    let node = nodes.of(r);
                    let start = ranks[r].clock.max(memory_free[node]);
                    let traffic = COMBINE_TRAFFIC * bytes as f64 * per_byte;
                    memory_free[node] = start + traffic;
                    ranks[r].clock = start + (bytes as f64 * network.gamma).max(traffic);
                }
            }
            ranks[r].pc += 1;
            // Let any rank that is behind in time act first (first come, first served).
            if due.peek().is_some_and(|next| next.0 < ranks[r].clock) {
                due.push(Due(ranks[r].clock, r));
                break;
            }
        }
    }
    if finished != n {
        let stuck: Vec<usize> = (0..n).filter(|&r| ranks[r].blocked_on.is_some()).collect();
        return Err(CoreError::InvalidArgument(format!(
            "the schedule never finishes in the model: ranks {stuck:?} wait for messages that \
             are never sent"
        )));
    }
    if pairs
        .values()
        .any(|q| q.iter().any(|e| matches!(e, Queued::Sent { .. })))
    {
        return Err(CoreError::InvalidArgument(
            "the schedule leaves messages that no rank receives".into(),
        ));
    }
    Ok(outcome)
}

/// How many requests `program` makes.
fn requests(program: &Program) -> usize {
    program
        .iter()
        .filter(|op| matches!(op, Op::Send { .. } | Op::Receive { .. }))
        .count()
}
