//! Shared memory for an MPI transport whose ranks all run on one node: windows from
//! `MPI_Win_allocate_shared` on the node's communicator (`MPI_Comm_split_type` with
//! `MPI_COMM_TYPE_SHARED`, asked of the communicator itself, never of environment variables).
//!
//! Each window is allocated with `alloc_shared_noncontig`, so each rank's part starts on its
//! own pages, and each rank zeroes its own part first: its pages are placed by their owner.
//! Before any allocation the ranks agree that the node has room for it, so a full `/dev/shm`
//! (a container's 64 MiB) is an error or a fallback, never a SIGBUS.
//!
//! Windows are never freed when a transport goes away: `MPI_Win_free` is collective, and an
//! array a user still holds must stay mapped. Arrays that every rank has dropped are freed
//! collectively at the next allocation; the rest go with MPI_Finalize.

use super::mpi_call::check;
use super::shm::{
    free_bytes, ArrayTable, FlagBlock, Flags, SharedArray, SharedMemory, Waiter, AREA_BYTES,
    FLAG_BYTES,
};
use crate::error::{CoreError, Result};
use mpi::ffi;
use std::any::Any;
use std::collections::BTreeMap;
use std::ffi::{c_int, c_void};
use std::sync::{Arc, Mutex};

/// Where MPI libraries keep shared segments on Linux (Open MPI's osc/sm and vader, MPICH's
/// nemesis): the file system whose free space decides whether an allocation fits.
const SHM_DIR: &str = "/dev/shm";

/// Every part of a window starts on a cache line (MPI libraries align to 8 bytes only).
const ALIGN: usize = 64;

/// Why a transport has no shared memory, when it has none.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Unavailable {
    /// One rank: nothing to share.
    OneRank,
    /// The ranks span several nodes.
    SeveralNodes(usize),
    /// Turned off with `RINGLET_SHM=0`.
    Disabled,
    /// It could not be had (the reason is worth a warning).
    Failed(String),
}

impl std::fmt::Display for Unavailable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unavailable::OneRank => write!(f, "one rank: nothing to share"),
            Unavailable::SeveralNodes(nodes) => {
                write!(f, "the ranks run on {nodes} nodes, not one")
            }
            Unavailable::Disabled => write!(f, "turned off by RINGLET_SHM=0"),
            Unavailable::Failed(why) => write!(f, "{why}"),
        }
    }
}

/// The node segment of one communicator.
pub struct MpiShared {
    node: ffi::MPI_Comm,
    flags: Flags,
    areas: Vec<*mut u8>,
    table: Mutex<ArrayTable>,
    windows: Mutex<BTreeMap<u64, ffi::MPI_Win>>,
}

// SAFETY: the raw handles and addresses are used only under the runtime's serialization of MPI
// calls (one thread at a time uses a transport); the memory they point at stays mapped.
unsafe impl Send for MpiShared {}
// SAFETY: as above.
unsafe impl Sync for MpiShared {}

/// A window's memory: (window, each rank's (address, length)).
type Window = (ffi::MPI_Win, Vec<(usize, usize)>);

/// Allocate a window of `bytes` per rank on `node` (`ranks` ranks, this one `rank`), zero this
/// rank's part, and find every rank's part. Collective over `node`.
/// With `own_pages`, each rank's part starts on its own pages (`alloc_shared_noncontig`);
/// without, the parts are consecutive.
fn allocate_window(
    node: ffi::MPI_Comm,
    ranks: usize,
    rank: usize,
    bytes: usize,
    own_pages: bool,
) -> Result<Window> {
    // SAFETY: reading a predefined handle constant.
    let mut info = unsafe { ffi::RSMPI_INFO_NULL };
    // SAFETY: MPI_Info_create fills in a live local handle.
    let created = unsafe { ffi::MPI_Info_create(&mut info) };
    check(created, "MPI_Info_create")?;
    let (key, value) = (
        c"alloc_shared_noncontig",
        if own_pages { c"true" } else { c"false" },
    );
    // SAFETY: `info` was just created; key and value are NUL-terminated.
    let set = unsafe { ffi::MPI_Info_set(info, key.as_ptr(), value.as_ptr()) };
    let mut base: *mut c_void = std::ptr::null_mut();
    // SAFETY: reading a predefined handle constant.
    let mut window = unsafe { ffi::RSMPI_WIN_NULL };
    let allocated = check(set, "MPI_Info_set").and_then(|()| {
        // SAFETY: `node` is a live communicator; `base` and `window` are live locals that the
        // call fills in.
        let code = unsafe {
            ffi::MPI_Win_allocate_shared(
                (bytes + ALIGN) as ffi::MPI_Aint,
                1,
                info,
                node,
                (&mut base as *mut *mut c_void).cast(),
                &mut window,
            )
        };
        check(code, "MPI_Win_allocate_shared")
    });
    // SAFETY: freeing the info object created above.
    unsafe { ffi::MPI_Info_free(&mut info) };
    allocated?;
    let mut parts = Vec::with_capacity(ranks);
    for r in 0..ranks {
        let (mut size, mut unit, mut address): (ffi::MPI_Aint, c_int, *mut c_void) =
            (0, 0, std::ptr::null_mut());
        // SAFETY: `window` is the shared window just allocated; the outputs are live locals.
        // (Each part was asked with `ALIGN` bytes to spare, so that it can start on a line.)
        let code = unsafe {
            ffi::MPI_Win_shared_query(
                window,
                r as c_int,
                &mut size,
                &mut unit,
                (&mut address as *mut *mut c_void).cast(),
            )
        };
        check(code, "MPI_Win_shared_query")?;
        let (address, size) = (address as usize, size.max(0) as usize);
        let skip = address.next_multiple_of(ALIGN) - address;
        parts.push((address + skip, size.saturating_sub(skip)));
    }
    if let Some(&(address, len)) = parts.get(rank).filter(|(_, len)| *len > 0) {
        // SAFETY: this rank's own part of the window: `len` mapped bytes that nobody else
        // touches before the next synchronization.
        unsafe { std::ptr::write_bytes(address as *mut u8, 0, len) };
    }
    Ok((window, parts))
}

/// Whether every rank of `node` passes `ok` (one MPI_Allreduce with MPI_MIN).
fn all_agree(node: ffi::MPI_Comm, ok: bool) -> Result<bool> {
    let (mine, mut all): (c_int, c_int) = (ok as c_int, 0);
    // SAFETY: one int in and out, on a live communicator.
    let code = unsafe {
        ffi::MPI_Allreduce(
            (&mine as *const c_int).cast(),
            (&mut all as *mut c_int).cast(),
            1,
            ffi::RSMPI_INT32_T,
            ffi::RSMPI_MIN,
            node,
        )
    };
    check(code, "MPI_Allreduce")?;
    Ok(all == 1)
}

/// `Err` unless the shared-memory file system has room for `bytes` more on every rank's view
/// (with a margin for what the MPI library itself keeps there).
fn check_room(node: ffi::MPI_Comm, bytes: usize) -> Result<()> {
    let free = free_bytes(SHM_DIR);
    let fits = free.is_none_or(|free| (bytes as u64).saturating_mul(5) / 4 + (8 << 20) <= free);
    if all_agree(node, fits)? {
        return Ok(());
    }
    Err(CoreError::Communication(format!(
        "not enough shared memory: {bytes} bytes are needed on this node and {SHM_DIR} has \
         {} free (a container's default is 64 MiB; docker run --shm-size raises it)",
        free.map_or("too little".into(), |f| format!("{f} bytes"))
    )))
}

impl MpiShared {
    /// The node segment of `comm` (rank `rank` of `ranks`), or why there is none (the same
    /// answer on every rank). Collective over `comm`.
    pub fn attach(
        comm: ffi::MPI_Comm,
        rank: usize,
        ranks: usize,
        enabled: bool,
    ) -> std::result::Result<MpiShared, Unavailable> {
        let failed = |e: CoreError| Unavailable::Failed(e.to_string());
        if ranks == 1 {
            return Err(Unavailable::OneRank);
        }
        if !all_agree(comm, enabled).map_err(failed)? {
            return Err(Unavailable::Disabled);
        }
        Self::attach_node(comm, rank, ranks)
    }

    fn attach_node(
        comm: ffi::MPI_Comm,
        rank: usize,
        ranks: usize,
    ) -> std::result::Result<MpiShared, Unavailable> {
        let failed = |e: CoreError| Unavailable::Failed(e.to_string());
        // SAFETY: reading predefined handle constants.
        let (null, shared_type, no_info) = unsafe {
            (
                ffi::RSMPI_COMM_NULL,
                ffi::RSMPI_COMM_TYPE_SHARED,
                ffi::RSMPI_INFO_NULL,
            )
        };
        let mut node = null;
        // SAFETY: `comm` is the transport's live communicator; `node` a live local.
        let code = unsafe {
            ffi::MPI_Comm_split_type(comm, shared_type, rank as c_int, no_info, &mut node)
        };
        check(code, "MPI_Comm_split_type").map_err(failed)?;
        let mut node_ranks: c_int = 0;
        // SAFETY: `node` was just created; `node_ranks` is a live local.
        let code = unsafe { ffi::MPI_Comm_size(node, &mut node_ranks) };
        check(code, "MPI_Comm_size").map_err(failed)?;
        let together = all_agree(comm, node_ranks as usize == ranks).map_err(failed)?;
        if !together {
            let mut nodes_seen = 0.0f64;
            let mine = 1.0 / node_ranks.max(1) as f64;
            // SAFETY: one double in and out, on a live communicator: the sum over ranks of
            // 1/(ranks on my node) counts the nodes.
            let code = unsafe {
                ffi::MPI_Allreduce(
                    (&mine as *const f64).cast(),
                    (&mut nodes_seen as *mut f64).cast(),
                    1,
                    ffi::RSMPI_DOUBLE,
                    ffi::RSMPI_SUM,
                    comm,
                )
            };
            check(code, "MPI_Allreduce").map_err(failed)?;
            // SAFETY: freeing the communicator created above (collective over it).
            unsafe { ffi::MPI_Comm_free(&mut node) };
            return Err(Unavailable::SeveralNodes(nodes_seen.round() as usize));
        }
        let room = check_room(node, ranks * (FLAG_BYTES + AREA_BYTES));
        let windows = room.and_then(|()| {
            // Rank 0 holds every rank's flags, so that they sit at one stride.
            let flag_bytes = if rank == 0 { ranks * FLAG_BYTES } else { 0 };
            let flags = allocate_window(node, ranks, rank, flag_bytes, false);
            let areas = allocate_window(node, ranks, rank, AREA_BYTES, true);
            let ok = flags.is_ok() && areas.is_ok();
            if !all_agree(node, ok)? {
                let why = flags.and(areas).err().map_or_else(
                    || "another rank could not allocate it".to_string(),
                    |e| e.to_string(),
                );
                return Err(CoreError::Communication(format!(
                    "the node's shared segment could not be allocated: {why}"
                )));
            }
            Ok((flags?, areas?))
        });
        let ((_, flag_parts), (_, area_parts)) = match windows {
            Ok(windows) => windows,
            Err(error) => {
                // SAFETY: freeing the communicator created above (collective over it).
                unsafe { ffi::MPI_Comm_free(&mut node) };
                return Err(failed(error));
            }
        };
        // Every rank zeroed its flags before any rank posts a step.
        // SAFETY: a barrier on the live node communicator.
        check(unsafe { ffi::MPI_Barrier(node) }, "MPI_Barrier").map_err(failed)?;
        let (first, len) = flag_parts[0];
        if len < ranks * FLAG_BYTES || first % std::mem::align_of::<FlagBlock>() != 0 {
            return Err(Unavailable::Failed(format!(
                "the MPI library gave {len} bytes at {first:#x} for {ranks} ranks' flags"
            )));
        }
        // SAFETY: `ranks` consecutive, aligned blocks that rank 0 zeroed (checked above), mapped
        // until MPI is finalized (the window is never freed before), each posted by its owner.
        let flags = unsafe { Flags::new(first as *const FlagBlock, ranks, rank, None) };
        Ok(MpiShared {
            node,
            flags,
            areas: area_parts.iter().map(|&(a, _)| a as *mut u8).collect(),
            table: Mutex::new(ArrayTable::default()),
            windows: Mutex::new(BTreeMap::new()),
        })
    }

    fn table(&self) -> std::sync::MutexGuard<'_, ArrayTable> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl SharedMemory for MpiShared {
    fn flags(&self) -> &Flags {
        &self.flags
    }

    fn area(&self, rank: usize) -> *mut u8 {
        self.areas[rank]
    }

    fn locate(&self, ptr: *const u8, len: usize) -> Option<(u64, usize)> {
        self.table().locate(ptr, len)
    }

    fn part(&self, id: u64, rank: usize) -> Option<(*mut u8, usize)> {
        let (address, len) = self.table().part(id, rank)?;
        Some((address as *mut u8, len))
    }

    fn allocate(&self, _waiter: &dyn Waiter, bytes: usize) -> Result<SharedArray> {
        let (rank, ranks) = (self.flags.rank(), self.flags.ranks());
        check_room(self.node, bytes * ranks)?;
        let allocated = allocate_window(self.node, ranks, rank, bytes, true);
        if !all_agree(self.node, allocated.is_ok())? {
            return Err(allocated.err().unwrap_or_else(|| {
                CoreError::Communication("another rank could not allocate shared memory".into())
            }));
        }
        let (window, parts) = allocated?;
        // MPI may round a part up (to pages); each array is the size asked.
        let parts = parts
            .into_iter()
            .map(|(a, len)| (a, len.min(bytes)))
            .collect();
        let mut table = self.table();
        let id = table.next_id();
        self.windows
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, window);
        let alive: Arc<dyn Any + Send + Sync> = Arc::new(id);
        table.insert(id, rank, parts, alive)
    }

    fn dropped(&self) -> Vec<u64> {
        self.table().dropped()
    }

    fn free(&self, ids: &[u64]) -> Result<()> {
        let mut windows = self.windows.lock().unwrap_or_else(|e| e.into_inner());
        for &id in ids {
            self.table().forget(id, self.flags.rank());
            if let Some(mut window) = windows.remove(&id) {
                // SAFETY: a window every rank has dropped its array of, freed by every rank in
                // the same order (the ids are agreed).
                check(unsafe { ffi::MPI_Win_free(&mut window) }, "MPI_Win_free")?;
            }
        }
        Ok(())
    }
}
