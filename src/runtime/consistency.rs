//! Before each collective the ranks agree on what they are about to do. One small allreduce
//! of (sequence number, digest of the call) and their negations, combined with max, answers
//! "do all ranks agree?" (they do iff every maximum equals minus the maximum of the negation);
//! where the ranks share memory, each posts its pair at the flags and reads the others' instead,
//! which costs one meeting and no message;
//! only when they do not, an allgather of everyone's description names who passed what, and
//! every rank raises the same `MismatchError` before any data moves.
//!
//! Ranks that have joined (`join`) disagree with every call but another join. When the
//! others all pass the same sum or avg allreduce, the joined ranks learn how to take part in it
//! from its [`Role::Replay`], and the call goes ahead; any other call raises on the others.

use crate::dtype::{DType, ReduceOp};
use crate::error::{CoreError, Result};
use crate::schedules::allreduce::recursive_doubling::RecursiveDoubling;
use crate::schedules::allreduce::ring;
use crate::schedules::{self, Parts, Tuning};
use crate::transport::shm::SharedMemory;
use crate::transport::Transport;

/// How a rank takes part in a call, besides its description.
pub enum Role {
    /// A call that joined ranks cannot take part in.
    Plain,
    /// A call that joined ranks can replay from these bytes ([`super::replay::Replay`]).
    Replay(Vec<u8>),
    /// This rank has joined.
    Joined,
}

impl Role {
    fn bytes(&self) -> Vec<u8> {
        match self {
            Role::Plain => vec![0],
            Role::Replay(replay) => std::iter::once(1).chain(replay.iter().copied()).collect(),
            Role::Joined => vec![2],
        }
    }
}

/// What a call's check found, when it went ahead.
#[derive(Debug, PartialEq)]
pub enum Agreement {
    /// Every rank passed the same call.
    Same,
    /// Some ranks have joined and the others passed the same replayable call: on the joined
    /// ranks, its replay; on the others, nothing to do but run it.
    WithJoined(Vec<u8>),
    /// On a joined rank: the others passed a call it cannot take part in (they raise).
    Idle,
}

/// This rank's side of a call's description: its thread, its text, and its [`Role`].
pub struct Description {
    pub thread: u64,
    pub text: String,
    pub role: Role,
}

/// Agree on collective number `seq` with this rank's `digest` of it; on disagreement
/// `Err(Mismatch)` on every rank, naming what each rank passed, unless the disagreement is
/// only ranks that have joined (see the module's text). `describe` runs only on disagreement.
pub fn agree(
    transport: &dyn Transport,
    seq: u64,
    digest: u64,
    describe: impl FnOnce() -> Description,
) -> Result<Agreement> {
    if transport.size() == 1 {
        return Ok(Agreement::Same);
    }
    let agreed = match transport.shared() {
        Some(shared) => agree_in_shared_memory(transport, shared, seq, digest)?,
        None => agree_by_message(transport, seq, digest)?,
    };
    if agreed {
        return Ok(Agreement::Same);
    }
    settle(transport, describe)
}

/// After a check found that the ranks' calls differ (every rank found it): work out how, with
/// everyone's description. `Err(Mismatch)` on every rank, naming what each passed, unless the
/// difference is only ranks that have joined. Collective.
pub fn settle(
    transport: &dyn Transport,
    describe: impl FnOnce() -> Description,
) -> Result<Agreement> {
    let mine = describe();
    let all = gather_descriptions(transport, mine.thread, &mine.text)?;
    let roles = gather_blobs(transport, &mine.role.bytes())?;
    let joined: Vec<usize> = (0..all.len()).filter(|&r| roles[r] == [2]).collect();
    let active: Vec<usize> = (0..all.len()).filter(|&r| roles[r] != [2]).collect();
    let mismatch = || {
        let text = disagreement(&all);
        if joined.is_empty() {
            return text;
        }
        let has = if joined.len() == 1 { "has" } else { "have" };
        format!(
            "{} {has} joined: until every rank has, the others can only make sum and avg \
             allreduces; {text}",
            rank_list(&joined)
        )
    };
    let replayable = active.first().and_then(|&first| {
        let same = active
            .iter()
            .all(|&r| all[r] == all[first] && roles[r] == roles[first]);
        (same && roles[first].first() == Some(&1)).then(|| roles[first][1..].to_vec())
    });
    match (
        joined.is_empty(),
        replayable,
        matches!(mine.role, Role::Joined),
    ) {
        (true, _, _) => Err(CoreError::Mismatch(mismatch())),
        (false, Some(replay), true) => Ok(Agreement::WithJoined(replay)),
        (false, Some(_), false) => Ok(Agreement::WithJoined(Vec::new())),
        // Every rank joined, but from different threads: a mismatch like any other.
        (false, None, true) if active.is_empty() => Err(CoreError::Mismatch(mismatch())),
        (false, None, true) => Ok(Agreement::Idle),
        (false, None, false) => Err(CoreError::Mismatch(mismatch())),
    }
}

/// Whether every rank passed (`seq`, `digest`): one allreduce of 32 bytes (max of the values
/// and of their negations).
fn agree_by_message(transport: &dyn Transport, seq: u64, digest: u64) -> Result<bool> {
    let mine = [seq as i64, digest as i64];
    let mut extremes = [
        mine[0],
        mine[1],
        mine[0].wrapping_neg(),
        mine[1].wrapping_neg(),
    ];
    schedules::allreduce_one(
        transport,
        &RecursiveDoubling,
        bytemuck::cast_slice_mut(&mut extremes),
        DType::I64,
        ReduceOp::Max,
        &Tuning::default(),
    )?;
    Ok((0..2).all(|i| extremes[i] == extremes[2 + i].wrapping_neg()))
}

/// The same in shared memory: each rank posts its (`seq`, `digest`) with a step, then reads
/// everyone's. One meeting at the flags, no message.
fn agree_in_shared_memory(
    transport: &dyn Transport,
    shared: &dyn SharedMemory,
    seq: u64,
    digest: u64,
) -> Result<bool> {
    let flags = shared.flags();
    let step = flags.sync(transport, [seq, digest, 0, 0])?;
    Ok((0..transport.size()).all(|r| flags.words(r, step)[..2] == [seq, digest]))
}

/// Every rank's `bytes`, in rank order. Collective.
pub(crate) fn gather_blobs(transport: &dyn Transport, bytes: &[u8]) -> Result<Vec<Vec<u8>>> {
    let (n, rank) = (transport.size(), transport.rank());
    let mut lengths = vec![0u64; n];
    lengths[rank] = bytes.len() as u64;
    let length_blocks: Vec<_> = (0..n).map(|r| 8 * r..8 * (r + 1)).collect();
    ring::allgather(
        transport,
        &mut Parts::one(bytemuck::cast_slice_mut(&mut lengths)),
        &length_blocks,
    )?;
    let mut blocks = Vec::with_capacity(n);
    let mut start = 0;
    for &len in &lengths {
        blocks.push(start..start + len as usize);
        start += len as usize;
    }
    let mut all = vec![0u8; start];
    all[blocks[rank].clone()].copy_from_slice(bytes);
    ring::allgather(transport, &mut Parts::one(&mut all), &blocks)?;
    Ok(blocks
        .into_iter()
        .map(|block| all[block].to_vec())
        .collect())
}

/// Every rank's (thread, description), in rank order. Collective.
pub fn gather_descriptions(
    transport: &dyn Transport,
    thread: u64,
    text: &str,
) -> Result<Vec<(u64, String)>> {
    let threads = gather_blobs(transport, &thread.to_le_bytes())?;
    let texts = gather_blobs(transport, text.as_bytes())?;
    Ok(threads
        .into_iter()
        .zip(texts)
        .map(|(thread, text)| {
            let key = thread.try_into().map_or(0, u64::from_le_bytes);
            (key, String::from_utf8_lossy(&text).into_owned())
        })
        .collect())
}

/// Everyone's description, grouped: "rank 0 passed ...; ranks 1-3 passed ...".
fn disagreement(all: &[(u64, String)]) -> String {
    let mut groups: Vec<(&(u64, String), Vec<usize>)> = Vec::new();
    for (rank, entry) in all.iter().enumerate() {
        match groups.iter_mut().find(|(e, _)| *e == entry) {
            Some((_, ranks)) => ranks.push(rank),
            None => groups.push((entry, vec![rank])),
        }
    }
    let threads_differ = all.iter().any(|(t, _)| *t != all[0].0);
    let parts: Vec<String> = groups
        .iter()
        .map(|((thread, text), ranks)| {
            let from = if threads_differ {
                format!(" from the thread keyed {thread:#x}")
            } else {
                String::new()
            };
            format!("{} passed {text}{from}", rank_list(ranks))
        })
        .collect();
    format!(
        "ranks disagree on the collective they are in: {}. Every rank must make the same \
         calls in the same order (from one thread, or threads that call in the same order)",
        parts.join("; ")
    )
}

/// "rank 3", "ranks 0-2,5".
pub fn rank_list(ranks: &[usize]) -> String {
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
