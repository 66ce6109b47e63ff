//! Before each collective the ranks agree on what they are about to do: the collective's
//! sequence number, kind, dtype, op, element count, algorithm, root and calling thread. One
//! small allreduce (max of every field and of its negation) answers "do all ranks agree?"; only
//! when they do not, an allgather of everyone's fingerprint names who passed what, and every
//! rank raises the same `MismatchError` before any data moves. `RINGLET_CHECK=0` skips it.

use crate::dtype::{DType, ReduceOp};
use crate::error::{CoreError, Result};
use crate::schedules::{self, recursive_doubling::RecursiveDoubling, ring};
use crate::transport::Transport;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Allreduce,
    Broadcast,
    Allgather,
    ReduceScatter,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Allreduce => "allreduce",
            Kind::Broadcast => "broadcast",
            Kind::Allgather => "allgather",
            Kind::ReduceScatter => "reducescatter",
        }
    }
}

/// What one rank is about to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Call {
    pub kind: Kind,
    /// `None` for byte collectives (broadcast, allgather).
    pub dtype: Option<DType>,
    pub op: Option<ReduceOp>,
    /// Elements (bytes for byte collectives).
    pub count: u64,
    pub algorithm: &'static str,
    pub root: u64,
    /// Which of the process's threads calls (numbered in order of first use): two threads
    /// interleaving collectives differently on two ranks would otherwise pair up the wrong calls.
    pub thread: u64,
}

const FIELDS: usize = 8;

fn code<T: PartialEq>(all: &[T], value: Option<T>) -> i64 {
    value
        .and_then(|v| all.iter().position(|a| *a == v))
        .map_or(-1, |i| i as i64)
}

fn algorithm_code(name: &str) -> i64 {
    schedules::SCHEDULES
        .iter()
        .position(|s| s.name() == name)
        .map_or(-1, |i| i as i64)
}

impl Call {
    fn fingerprint(&self, seq: u64) -> [i64; FIELDS] {
        [
            seq as i64,
            self.kind as i64,
            code(&DType::ALL, self.dtype),
            code(&ReduceOp::ALL, self.op),
            self.count as i64,
            algorithm_code(self.algorithm),
            self.root as i64,
            self.thread as i64,
        ]
    }

    /// "allreduce #17 of float32[1000] sum (ring)".
    pub fn describe_as(&self, seq: u64) -> String {
        Call::describe(&self.fingerprint(seq))
    }

    fn describe(fields: &[i64]) -> String {
        let dtype = usize::try_from(fields[2])
            .ok()
            .and_then(|i| DType::ALL.get(i));
        let op = usize::try_from(fields[3])
            .ok()
            .and_then(|i| ReduceOp::ALL.get(i));
        let algorithm = usize::try_from(fields[5])
            .ok()
            .and_then(|i| schedules::SCHEDULES.get(i))
            .map_or("-", |s| s.name());
        let kind = [
            Kind::Allreduce,
            Kind::Broadcast,
            Kind::Allgather,
            Kind::ReduceScatter,
        ]
        .get(fields[1] as usize)
        .map_or("?", |k| k.name());
        let shape = match dtype {
            Some(d) => format!("{}[{}]", d.name(), fields[4]),
            None => format!("{} bytes", fields[4]),
        };
        let mut text = format!("{kind} #{} of {shape}", fields[0]);
        if let Some(op) = op {
            text += &format!(" {}", op.name());
        }
        if algorithm != "-" {
            text += &format!(" ({algorithm})");
        }
        if fields[1] == Kind::Broadcast as i64 {
            text += &format!(" from root {}", fields[6]);
        }
        text
    }
}

/// Agree on `call` as collective number `seq`; `Err(Mismatch)` on every rank if any differs.
pub fn agree(transport: &dyn Transport, seq: u64, call: &Call) -> Result<()> {
    if transport.size() == 1 {
        return Ok(());
    }
    let mine = call.fingerprint(seq);
    // max(x) and max(-x) = -min(x) in one allreduce: all equal iff max == min everywhere.
    let mut extremes = [0i64; 2 * FIELDS];
    for (i, v) in mine.iter().enumerate() {
        extremes[i] = *v;
        extremes[FIELDS + i] = v.wrapping_neg();
    }
    let bytes = bytemuck::cast_slice_mut::<i64, u8>(&mut extremes);
    schedules::allreduce(
        transport,
        &RecursiveDoubling,
        bytes,
        DType::I64,
        ReduceOp::Max,
    )?;
    let agreed = (0..FIELDS).all(|i| extremes[i] == extremes[FIELDS + i].wrapping_neg());
    if agreed {
        return Ok(());
    }
    Err(CoreError::Mismatch(disagreement(transport, &mine)?))
}

/// Everyone's fingerprint, grouped: "rank 0 passed ..., ranks 1-3 passed ...".
fn disagreement(transport: &dyn Transport, mine: &[i64; FIELDS]) -> Result<String> {
    let n = transport.size();
    let mut all = vec![0i64; n * FIELDS];
    all[transport.rank() * FIELDS..][..FIELDS].copy_from_slice(mine);
    let blocks: Vec<_> = (0..n)
        .map(|r| r * FIELDS * 8..(r + 1) * FIELDS * 8)
        .collect();
    ring::allgather(transport, bytemuck::cast_slice_mut(&mut all), &blocks)?;
    let mut groups: Vec<(&[i64], Vec<usize>)> = Vec::new();
    for (rank, fields) in all.chunks(FIELDS).enumerate() {
        match groups.iter_mut().find(|(f, _)| *f == fields) {
            Some((_, ranks)) => ranks.push(rank),
            None => groups.push((fields, vec![rank])),
        }
    }
    let threads_differ = groups.iter().any(|(f, _)| f[7] != groups[0].0[7]);
    let parts: Vec<String> = groups
        .iter()
        .map(|(fields, ranks)| {
            let thread = if threads_differ {
                format!(" from the thread keyed {:#x}", fields[7])
            } else {
                String::new()
            };
            format!(
                "{} passed {}{thread}",
                rank_list(ranks),
                Call::describe(fields)
            )
        })
        .collect();
    Ok(format!(
        "ranks disagree on the collective they are in: {}. Every rank must make the same \
         calls in the same order (from one thread, or threads that call in the same order)",
        parts.join("; ")
    ))
}

fn rank_list(ranks: &[usize]) -> String {
    let mut spans: Vec<(usize, usize)> = Vec::new();
    for &r in ranks {
        match spans.last_mut() {
            Some((_, end)) if *end + 1 == r => *end = r,
            _ => spans.push((r, r)),
        }
    }
    let text: Vec<String> = spans
        .iter()
        .map(|&(a, b)| {
            if a == b {
                a.to_string()
            } else {
                format!("{a}-{b}")
            }
        })
        .collect();
    format!(
        "{} {}",
        if ranks.len() == 1 { "rank" } else { "ranks" },
        text.join(",")
    )
}
