//! Before each collective the ranks agree on what they are about to do. One small allreduce
//! of (sequence number, digest of the call) and their negations, combined with max, answers
//! "do all ranks agree?" (they do iff every maximum equals minus the maximum of the negation);
//! only when they do not, an allgather of everyone's description names who passed what, and
//! every rank raises the same `MismatchError` before any data moves.

use crate::dtype::{DType, ReduceOp};
use crate::error::{CoreError, Result};
use crate::schedules::recursive_doubling::RecursiveDoubling;
use crate::schedules::{self, ring, Parts, Tuning};
use crate::transport::Transport;

/// Agree on collective number `seq` with this rank's `digest` of it; on disagreement
/// `Err(Mismatch)` on every rank, naming what each rank passed. `describe` gives this rank's
/// calling thread and its description of the call (it runs only on disagreement).
pub fn agree(
    transport: &dyn Transport,
    seq: u64,
    digest: u64,
    describe: impl FnOnce() -> (u64, String),
) -> Result<()> {
    if transport.size() == 1 {
        return Ok(());
    }
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
    let agreed = (0..2).all(|i| extremes[i] == extremes[2 + i].wrapping_neg());
    if agreed {
        return Ok(());
    }
    let (thread, text) = describe();
    Err(CoreError::Mismatch(disagreement(transport, thread, &text)?))
}

/// Every rank's (thread, description), in rank order. Collective.
pub fn gather_descriptions(
    transport: &dyn Transport,
    thread: u64,
    text: &str,
) -> Result<Vec<(u64, String)>> {
    let (n, rank) = (transport.size(), transport.rank());
    // Lengths first, then the texts, each rank's block in its place.
    let mut header = vec![0u64; 2 * n];
    header[2 * rank] = thread;
    header[2 * rank + 1] = text.len() as u64;
    let header_blocks: Vec<_> = (0..n).map(|r| 16 * r..16 * (r + 1)).collect();
    let mut header_parts = Parts::one(bytemuck::cast_slice_mut(&mut header));
    ring::allgather(transport, &mut header_parts, &header_blocks)?;
    let lengths: Vec<usize> = (0..n).map(|r| header[2 * r + 1] as usize).collect();
    let mut blocks = Vec::with_capacity(n);
    let mut start = 0;
    for len in &lengths {
        blocks.push(start..start + len);
        start += len;
    }
    let mut texts = vec![0u8; start];
    texts[blocks[rank].clone()].copy_from_slice(text.as_bytes());
    ring::allgather(transport, &mut Parts::one(&mut texts), &blocks)?;
    Ok(blocks
        .iter()
        .enumerate()
        .map(|(r, block)| {
            let text = String::from_utf8_lossy(&texts[block.clone()]).into_owned();
            (header[2 * r], text)
        })
        .collect())
}

/// Everyone's description, grouped: "rank 0 passed ...; ranks 1-3 passed ...".
fn disagreement(transport: &dyn Transport, thread: u64, text: &str) -> Result<String> {
    let all = gather_descriptions(transport, thread, text)?;
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
    Ok(format!(
        "ranks disagree on the collective they are in: {}. Every rank must make the same \
         calls in the same order (from one thread, or threads that call in the same order)",
        parts.join("; ")
    ))
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
