//! Memory that every rank of a transport maps, when all of its ranks run on one node: the
//! shared-memory tier. Like the rest of the transport it knows no collective; it offers three
//! things a schedule builds on.
//!
//! - **Flags.** Each rank owns one cache line holding a counter that only it increments (a
//!   *step*), and one line of words it publishes with each step. A rank posts a step with
//!   release ordering after its writes; a rank that has seen every rank reach a step (acquire)
//!   sees everything they wrote before it. The words come in two copies, by the step's parity:
//!   a rank can be at most one step ahead of a rank that still reads the words of the step
//!   before, because to post two steps ahead it must first have seen that rank's next step.
//! - **Staging areas.** Each rank has a fixed area that the others can read, which a schedule
//!   copies its data into.
//! - **Shared arrays.** Memory that a user's arrays live in (`ringlet.empty`), each array a
//!   part of every rank's; a schedule finds where a peer's array lies and reads it in place.
//!
//! Two implementations: [`LocalShared`] for ranks as threads (the tests), and the MPI one
//! (`mpi_shm.rs`), over `MPI_Win_allocate_shared` windows of the node's communicator.

use super::waiting::{wait_policy, Backoff};
use crate::error::{CoreError, Result};
use std::any::Any;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

/// Words published with each step.
pub const WORDS: usize = 4;
/// Bytes of one rank's flags: a counter line and a words line.
pub const FLAG_BYTES: usize = std::mem::size_of::<FlagBlock>();
/// Each rank's staging area: enough for the `shm` allreduce's segment slots (see
/// `schedules::allreduce::shared_memory`).
pub const AREA_BYTES: usize = 4 << 20;

/// What a rank waiting in shared memory needs of the transport beside it (every transport is
/// one): to let its library move queued messages, and to report a long wait to its watcher.
/// Shared memory names no transport type, so that the transport's trait may name this tier.
pub trait Waiter {
    /// Let queued messages move while this rank polls (MPI progresses only inside its calls).
    fn progress_while_waiting(&self);

    /// The wait for `peer` has lasted `waited`; `flags` starts at 0 for each wait. An error
    /// ends the wait with that error.
    fn report_wait(&self, peer: usize, waited: Duration, flags: &mut u8) -> Result<()>;
}

/// One rank's flags, two cache lines: readers of the counter never share a line with the
/// words the owner writes next.
#[repr(C, align(64))]
pub struct FlagBlock {
    counter: AtomicU64,
    _counter_line: [u64; 7],
    words: [[AtomicU64; WORDS]; 2],
}

/// The flags of every rank of a group, and this rank's view of them.
pub struct Flags {
    blocks: *const FlagBlock,
    ranks: usize,
    rank: usize,
    /// The last step this rank posted.
    step: AtomicU64,
    /// A call's (sequence, digest) to post with the next step and compare there (see
    /// [`Flags::expect`]).
    expected: [AtomicU64; 2],
    /// Whether `expected` holds a pair to post (atomics, not a lock: every small call posts).
    has_expected: AtomicBool,
    /// In-process groups give up on a rank that never comes (a test must not hang); MPI ranks
    /// wait, watched by the stall inspector.
    give_up_after: Option<Duration>,
}

// SAFETY: `blocks` points at `ranks` FlagBlocks that stay mapped while the owner of this
// `Flags` lives; every access to them is atomic.
unsafe impl Send for Flags {}
// SAFETY: as above; shared references only do atomic loads and stores.
unsafe impl Sync for Flags {}

/// Polls between two calls into the transport's progress (a peer may be waiting for a message
/// this rank's library has queued, and MPI moves it only inside a call).
const PROGRESS_EVERY: u32 = 32;

/// Polls before a wait starts its clock (about a microsecond of `pause`s).
const EAGER_POLLS: u32 = 32;

/// How often a long wait tells the transport's watcher (as transport waits do).
const WATCH_PERIOD: Duration = Duration::from_millis(50);

impl Flags {
    /// # Safety
    /// `blocks` must point at `ranks` zero-initialized (or earlier used, consistently)
    /// `FlagBlock`s that stay mapped as long as the returned value lives, shared by exactly the
    /// ranks of the group, each of which posts only its own block.
    pub unsafe fn new(
        blocks: *const FlagBlock,
        ranks: usize,
        rank: usize,
        give_up_after: Option<Duration>,
    ) -> Self {
        // SAFETY: the caller's contract: this rank's block is live.
        let step = unsafe { (*blocks.add(rank)).counter.load(Ordering::Acquire) };
        Flags {
            blocks,
            ranks,
            rank,
            step: AtomicU64::new(step),
            expected: [AtomicU64::new(0), AtomicU64::new(0)],
            has_expected: AtomicBool::new(false),
            give_up_after,
        }
    }

    fn block(&self, rank: usize) -> &FlagBlock {
        // SAFETY: `rank < ranks` at every caller; the blocks stay mapped while `self` lives.
        unsafe { &*self.blocks.add(rank) }
    }

    pub fn ranks(&self) -> usize {
        self.ranks
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The step this rank posts next.
    pub fn next_step(&self) -> u64 {
        self.step.load(Ordering::Relaxed) + 1
    }

    /// Publish `words` and post this rank's next step (after everything it wrote before).
    pub fn post(&self, words: [u64; WORDS]) -> u64 {
        let step = self.step.load(Ordering::Relaxed) + 1;
        let block = self.block(self.rank);
        for (slot, value) in block.words[(step % 2) as usize].iter().zip(words) {
            slot.store(value, Ordering::Relaxed);
        }
        block.counter.store(step, Ordering::Release);
        self.step.store(step, Ordering::Relaxed);
        step
    }

    /// Wait until every rank has posted `step`. Polls with the transport's backoff and tells
    /// its watcher about long waits, as a transport wait does.
    pub fn wait_all(&self, waiter: &dyn Waiter, step: u64) -> Result<()> {
        for peer in (0..self.ranks).filter(|&r| r != self.rank) {
            self.wait_for(waiter, peer, step)?;
        }
        Ok(())
    }

    fn wait_for(&self, waiter: &dyn Waiter, peer: usize, step: u64) -> Result<()> {
        let counter = &self.block(peer).counter;
        if counter.load(Ordering::Acquire) >= step {
            return Ok(());
        }
        // Most waits end within a microsecond (the peer is on its way): poll without reading
        // the clock first, which would double the time to notice it. Not where waits must
        // yield (threads that outnumber the cores, or no spinning asked for).
        if self.give_up_after.is_none() && !wait_policy().0.is_zero() {
            for _ in 0..EAGER_POLLS {
                std::hint::spin_loop();
                if counter.load(Ordering::Acquire) >= step {
                    return Ok(());
                }
            }
        }
        let started = Instant::now();
        // In-process ranks are threads that may outnumber the cores: never spin there.
        let mut backoff = match self.give_up_after {
            Some(_) => Backoff::yielding(),
            None => Backoff::new(),
        };
        let (mut reported, mut watch_flags) = (Duration::ZERO, 0u8);
        let mut polls = 0u32;
        while counter.load(Ordering::Acquire) < step {
            backoff.pause();
            polls = polls.wrapping_add(1);
            if polls.is_multiple_of(PROGRESS_EVERY) {
                waiter.progress_while_waiting();
            }
            let waited = started.elapsed();
            if waited >= reported + WATCH_PERIOD {
                reported = waited;
                waiter.report_wait(peer, waited, &mut watch_flags)?;
                if self.give_up_after.is_some_and(|limit| waited >= limit) {
                    return Err(CoreError::Communication(format!(
                        "rank {peer} did not reach step {step} in shared memory within {waited:?}"
                    )));
                }
            }
        }
        Ok(())
    }

    /// Post `words`, then wait for every rank to post the same step; returns the step.
    pub fn sync(&self, waiter: &dyn Waiter, words: [u64; WORDS]) -> Result<u64> {
        let step = self.post(words);
        self.wait_all(waiter, step)?;
        Ok(step)
    }

    /// Post `pair` (a call's sequence number and digest) with the next step that
    /// [`sync_checked`](Self::sync_checked) makes, so that the ranks compare their calls at a
    /// meeting they have anyway.
    pub fn expect(&self, pair: [u64; 2]) {
        // One thread makes a communicator's calls at a time: the flag only publishes the pair.
        for (slot, value) in self.expected.iter().zip(pair) {
            slot.store(value, Ordering::Relaxed);
        }
        self.has_expected.store(true, Ordering::Release);
    }

    /// [`sync`](Self::sync), carrying the pair given to [`expect`](Self::expect) if there is
    /// one; `Err(Unsettled)` if any rank posted another pair (every rank then sees it).
    pub fn sync_checked(&self, waiter: &dyn Waiter) -> Result<u64> {
        let expected = self.has_expected.swap(false, Ordering::Acquire).then(|| {
            self.expected
                .each_ref()
                .map(|slot| slot.load(Ordering::Relaxed))
        });
        let words = match expected {
            Some([seq, digest]) => [seq, digest, 0, 0],
            None => [0; WORDS],
        };
        let step = self.sync(waiter, words)?;
        match expected {
            Some(pair) if (0..self.ranks).any(|r| self.words(r, step)[..2] != pair) => {
                Err(CoreError::Unsettled)
            }
            _ => Ok(step),
        }
    }

    /// The words `rank` posted with `step` (valid once every rank has reached it, until the
    /// reader posts its next step).
    pub fn words(&self, rank: usize, step: u64) -> [u64; WORDS] {
        let slots = &self.block(rank).words[(step % 2) as usize];
        std::array::from_fn(|i| slots[i].load(Ordering::Relaxed))
    }
}

/// An array in shared memory: this rank's part of a shared allocation. The memory stays mapped
/// while the value lives (and after the transport is gone: freeing is collective, so it happens
/// only at a later allocation, for arrays every rank has dropped).
pub struct SharedArray {
    pub id: u64,
    ptr: *mut u8,
    len: usize,
    _alive: Arc<dyn Any + Send + Sync>,
}

// SAFETY: the pointer is into a mapping that `_alive` keeps; the bytes are plain memory, and
// who writes them when is the owner's business (NumPy's, in Python).
unsafe impl Send for SharedArray {}
// SAFETY: as above.
unsafe impl Sync for SharedArray {}

impl SharedArray {
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Each rank's (address, length) of one shared array, and this rank's liveness token.
type Entry = (Vec<(usize, usize)>, Weak<dyn Any + Send + Sync>);

/// Where every rank's part of each shared array lies, and which arrays this rank still holds.
#[derive(Default)]
pub struct ArrayTable {
    next_id: u64,
    arrays: BTreeMap<u64, Entry>,
    /// This rank's part of each array, by address: (start) -> (end, id), for lookups by
    /// address in log time (a benchmark may hold thousands of arrays).
    mine: BTreeMap<usize, (usize, u64)>,
}

impl ArrayTable {
    /// A fresh id (the same on every rank: allocations are collective and in order).
    pub fn next_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    /// Record array `id`: `parts[r]` is rank r's (address, length); `alive` is this rank's
    /// token, which the returned array holds.
    pub fn insert(
        &mut self,
        id: u64,
        rank: usize,
        parts: Vec<(usize, usize)>,
        alive: Arc<dyn Any + Send + Sync>,
    ) -> Result<SharedArray> {
        let (ptr, len) = *parts
            .get(rank)
            .ok_or_else(|| CoreError::InvalidArgument("internal: no part for this rank".into()))?;
        self.arrays.insert(id, (parts, Arc::downgrade(&alive)));
        self.mine.insert(ptr, (ptr + len, id));
        Ok(SharedArray {
            id,
            ptr: ptr as *mut u8,
            len,
            _alive: alive,
        })
    }

    /// The array (id, offset) holding `ptr .. ptr + len` on this rank, if one does and this
    /// rank still holds it.
    pub fn locate(&self, ptr: *const u8, len: usize) -> Option<(u64, usize)> {
        let address = ptr as usize;
        let (&base, &(end, id)) = self.mine.range(..=address).next_back()?;
        let alive = self.arrays.get(&id)?.1.strong_count() > 0;
        (address + len <= end && alive).then_some((id, address - base))
    }

    /// Rank `rank`'s (address, length) of array `id`.
    pub fn part(&self, id: u64, rank: usize) -> Option<(usize, usize)> {
        self.arrays.get(&id)?.0.get(rank).copied()
    }

    /// The arrays this rank no longer holds.
    pub fn dropped(&self) -> Vec<u64> {
        let dead = self
            .arrays
            .iter()
            .filter(|(_, (_, a))| a.strong_count() == 0);
        dead.map(|(&id, _)| id).collect()
    }

    pub fn forget(&mut self, id: u64, rank: usize) {
        if let Some((parts, _)) = self.arrays.remove(&id) {
            if let Some(&(base, _)) = parts.get(rank) {
                self.mine.remove(&base);
            }
        }
    }
}

/// What a schedule needs from shared memory.
pub trait SharedMemory: Sync {
    fn flags(&self) -> &Flags;

    /// The start of `rank`'s staging area ([`AREA_BYTES`] long).
    fn area(&self, rank: usize) -> *mut u8;

    /// The shared array (id, offset) that holds `ptr .. ptr + len` on this rank, if any.
    fn locate(&self, ptr: *const u8, len: usize) -> Option<(u64, usize)>;

    /// Where `rank`'s part of shared array `id` lies: (address, length).
    fn part(&self, id: u64, rank: usize) -> Option<(*mut u8, usize)>;

    /// A new shared array of `bytes` per rank, zeroed, each rank's part first touched by its
    /// owner. Collective: every rank of the group calls it with the same size, in order.
    fn allocate(&self, waiter: &dyn Waiter, bytes: usize) -> Result<SharedArray>;

    /// The arrays this rank no longer holds (candidates for freeing).
    fn dropped(&self) -> Vec<u64>;

    /// Free arrays that every rank has dropped. Collective, with the same ids everywhere.
    fn free(&self, ids: &[u64]) -> Result<()>;
}

/// An 8-byte-aligned, zeroed heap buffer whose address never changes.
struct Heap(Box<[u64]>);

impl Heap {
    fn zeroed(bytes: usize) -> Self {
        Heap(vec![0u64; bytes.div_ceil(8).max(1)].into_boxed_slice())
    }

    fn ptr(&self) -> *mut u8 {
        self.0.as_ptr() as *mut u8
    }
}

/// Shared memory for ranks that are threads of one process: plain heap memory they all see.
pub struct LocalShared {
    flags: Flags,
    group: Arc<LocalGroup>,
}

struct LocalGroup {
    flags: Box<[FlagBlock]>,
    /// Made at first use: most in-process groups (every schedule test) never touch them.
    areas: std::sync::OnceLock<Vec<Heap>>,
    ranks: usize,
    /// (array id, rank) -> that rank's part, kept until the group goes (freeing is a no-op).
    parts: Mutex<BTreeMap<(u64, usize), Arc<Heap>>>,
    tables: Vec<Mutex<ArrayTable>>,
}

impl LocalShared {
    /// One per rank of a group of `ranks` threads.
    pub fn group(ranks: usize) -> Vec<LocalShared> {
        let blank = || FlagBlock {
            counter: AtomicU64::new(0),
            _counter_line: [0; 7],
            words: Default::default(),
        };
        let group = Arc::new(LocalGroup {
            flags: (0..ranks).map(|_| blank()).collect(),
            areas: std::sync::OnceLock::new(),
            ranks,
            parts: Mutex::new(BTreeMap::new()),
            tables: (0..ranks).map(|_| Mutex::default()).collect(),
        });
        (0..ranks)
            .map(|rank| LocalShared {
                // SAFETY: the group keeps the blocks (zeroed above) alive as long as `self`,
                // and each rank posts only its own.
                flags: unsafe {
                    Flags::new(
                        group.flags.as_ptr(),
                        ranks,
                        rank,
                        Some(Duration::from_secs(60)),
                    )
                },
                group: group.clone(),
            })
            .collect()
    }

    fn table(&self) -> std::sync::MutexGuard<'_, ArrayTable> {
        self.group.tables[self.flags.rank]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }
}

impl SharedMemory for LocalShared {
    fn flags(&self) -> &Flags {
        &self.flags
    }

    fn area(&self, rank: usize) -> *mut u8 {
        let ranks = self.group.ranks;
        let areas = self
            .group
            .areas
            .get_or_init(|| (0..ranks).map(|_| Heap::zeroed(AREA_BYTES)).collect());
        areas[rank].ptr()
    }

    fn locate(&self, ptr: *const u8, len: usize) -> Option<(u64, usize)> {
        self.table().locate(ptr, len)
    }

    fn part(&self, id: u64, rank: usize) -> Option<(*mut u8, usize)> {
        let (address, len) = self.table().part(id, rank)?;
        Some((address as *mut u8, len))
    }

    fn allocate(&self, waiter: &dyn Waiter, bytes: usize) -> Result<SharedArray> {
        let (rank, ranks) = (self.flags.rank, self.flags.ranks);
        let id = self.table().next_id();
        let mine = Arc::new(Heap::zeroed(bytes));
        self.group
            .parts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert((id, rank), mine.clone());
        self.flags.sync(waiter, [0; WORDS])?;
        let parts: Vec<(usize, usize)> = {
            let all = self.group.parts.lock().unwrap_or_else(|e| e.into_inner());
            (0..ranks)
                .map(|r| all.get(&(id, r)).map(|h| (h.ptr() as usize, bytes)))
                .collect::<Option<_>>()
                .ok_or_else(|| {
                    CoreError::Communication("internal: a rank's part is missing".into())
                })?
        };
        let alive: Arc<dyn Any + Send + Sync> = Arc::new(mine);
        self.table().insert(id, rank, parts, alive)
    }

    fn dropped(&self) -> Vec<u64> {
        self.table().dropped()
    }

    fn free(&self, ids: &[u64]) -> Result<()> {
        let mut table = self.table();
        ids.iter().for_each(|&id| table.forget(id, self.flags.rank));
        Ok(())
    }
}

/// Free bytes in the file system at `path`, if it can be asked.
pub fn free_bytes(path: &str) -> Option<u64> {
    let path = std::ffi::CString::new(path).ok()?;
    // SAFETY: statvfs is plain data that the call fills in.
    let mut stats: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a NUL-terminated path and a live struct to fill.
    let code = unsafe { libc::statvfs(path.as_ptr(), &mut stats) };
    (code == 0).then(|| stats.f_bavail as u64 * stats.f_frsize as u64)
}
