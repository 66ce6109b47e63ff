//! The transport over an MPI communicator.
//!
//! rsmpi owns initialization and the communicator handle; the hot path calls MPI through
//! `mpi::ffi` because rsmpi's safe requests need a lexical scope (a schedule holds requests
//! across loop iterations) and because rsmpi ignores return codes, while ringlet turns each
//! failed call into an error. Our communicator is a duplicate with `MPI_ERRORS_RETURN`, so a
//! failure comes back here instead of aborting silently or being ignored. Every receive's
//! status is checked: a message of another length than expected is an error, never a silently
//! short buffer.

use super::mpi_call::{check_on, error_string};
use super::mpi_shm::{MpiShared, Unavailable};
use super::nodes::Nodes;
use super::shm::SharedMemory;
use super::waiting::Backoff;
use super::{
    message_pieces, wrong_length, Destination, LibraryCollectives, MessageLimits, Notice, Pending,
    Request, Transport, Watcher,
};
use crate::error::{CoreError, Result};
use mpi::ffi;
use mpi::raw::{AsRaw, FromRaw};
use mpi::topology::SimpleCommunicator;
use smallvec::SmallVec;
use std::ffi::c_int;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

// Also offered here, to code above the transport that calls MPI itself.
pub(crate) use super::mpi_call::check;
pub use super::mpi_call::in_place;

/// Every ringlet data message uses this tag; the communicator is ringlet's own duplicate, so no
/// other traffic can match it.
const TAG: c_int = 0x52_4c; // "RL"
/// Notices (diagnostics), off the data path.
const NOTICE_TAG: c_int = TAG + 1;
/// Probed, never sent: a probe drives MPI's progress.
const PROGRESS_TAG: c_int = TAG + 2;
const NOTICE_BYTES: usize = 16;
/// How long sending a notice may wait for MPI to take it (it is eager, so only a peer whose host
/// cannot be reached makes it wait).
const NOTICE_GRACE: Duration = Duration::from_secs(1);

fn notice_bytes([first, second]: Notice) -> [u8; NOTICE_BYTES] {
    let mut bytes = [0u8; NOTICE_BYTES];
    bytes[..8].copy_from_slice(&first.to_le_bytes());
    bytes[8..].copy_from_slice(&second.to_le_bytes());
    bytes
}

fn notice_from(bytes: [u8; NOTICE_BYTES]) -> Notice {
    let word = |range: std::ops::Range<usize>| {
        let mut word = [0u8; 8];
        word.copy_from_slice(&bytes[range]);
        u64::from_le_bytes(word)
    };
    [word(0..8), word(8..16)]
}

pub struct MpiTransport {
    /// `None` only after MPI was finalized under us; then the handle is leaked, not freed.
    comm: Option<SimpleCommunicator>,
    rank: usize,
    size: usize,
    limits: MessageLimits,
    watcher: Option<Arc<dyn Watcher>>,
    /// The node segment, or why there is none.
    shared: std::result::Result<MpiShared, Unavailable>,
    nodes: Nodes,
}

// SAFETY: an MPI communicator handle may be used from any thread of the process as long as the
// calls are serialized (MPI_THREAD_SERIALIZED) or MPI grants MPI_THREAD_MULTIPLE. The runtime
// keeps the transport behind a mutex, so at most one thread uses it at a time.
unsafe impl Send for MpiTransport {}
// SAFETY: as above; shared references are only handed out under the runtime's mutex.
unsafe impl Sync for MpiTransport {}

/// Which node each rank of `comm` runs on, as the MPI library groups them
/// (`MPI_COMM_TYPE_SHARED`): each rank finds its node's lowest rank, and every rank gathers
/// those. Collective over `comm`.
fn discover_nodes(comm: ffi::MPI_Comm, rank: c_int, size: c_int) -> Result<Nodes> {
    // SAFETY: reading predefined handle constants.
    let (null, shared_type, no_info) = unsafe {
        (
            ffi::RSMPI_COMM_NULL,
            ffi::RSMPI_COMM_TYPE_SHARED,
            ffi::RSMPI_INFO_NULL,
        )
    };
    let mut node = null;
    // SAFETY: `comm` is a live communicator; `node` a live local that the call fills in.
    let split = unsafe { ffi::MPI_Comm_split_type(comm, shared_type, rank, no_info, &mut node) };
    check(split, "MPI_Comm_split_type")?;
    let mut leader: c_int = 0;
    // SAFETY: one int in and out on the node communicator just made; then it is freed
    // (collective over it, as every rank of the node gets here).
    let found = unsafe {
        let code = ffi::MPI_Allreduce(
            (&rank as *const c_int).cast(),
            (&mut leader as *mut c_int).cast(),
            1,
            ffi::RSMPI_INT32_T,
            ffi::RSMPI_MIN,
            node,
        );
        ffi::MPI_Comm_free(&mut node);
        code
    };
    check(found, "MPI_Allreduce")?;
    let mut leaders: Vec<c_int> = vec![0; size.max(0) as usize];
    // SAFETY: one int from each rank into `leaders`, which holds one per rank of `comm`.
    let gathered = unsafe {
        ffi::MPI_Allgather(
            (&leader as *const c_int).cast(),
            1,
            ffi::RSMPI_INT32_T,
            leaders.as_mut_ptr().cast(),
            1,
            ffi::RSMPI_INT32_T,
            comm,
        )
    };
    check(gathered, "MPI_Allgather")?;
    Ok(Nodes::from_labels(&leaders))
}

impl MpiTransport {
    /// Duplicate `parent` (any live intra-communicator, world or a user's) for ringlet's own use.
    ///
    /// # Safety
    /// `parent` must be a valid intra-communicator handle and MPI must be initialized.
    pub unsafe fn duplicate(parent: ffi::MPI_Comm) -> Result<Self> {
        // SAFETY: reading a predefined handle constant.
        let mut dup = unsafe { ffi::RSMPI_COMM_NULL };
        // SAFETY: the caller guarantees `parent` is valid and MPI initialized; `dup` is a live
        // local.
        let code = unsafe { ffi::MPI_Comm_dup(parent, &mut dup) };
        check(code, "MPI_Comm_dup")?;
        // SAFETY: `dup` is the new communicator MPI_Comm_dup just made, held by nothing else.
        unsafe { Self::adopt(dup) }
    }

    /// A new communicator of the ranks that pass `member = true`, ordered as they are here;
    /// `None` on the others. Collective over this communicator: every rank must call it.
    pub fn split(&self, member: bool) -> Result<Option<Self>> {
        let parent = self.raw()?;
        // SAFETY: reading predefined handle constants.
        let (undefined, null) = unsafe { (ffi::RSMPI_UNDEFINED, ffi::RSMPI_COMM_NULL) };
        let color = if member { 0 } else { undefined };
        let mut part = null;
        // SAFETY: `parent` is this transport's live communicator; `part` is a live local.
        let code = unsafe { ffi::MPI_Comm_split(parent, color, self.rank as c_int, &mut part) };
        check(code, "MPI_Comm_split")?;
        if part == null {
            return Ok(None);
        }
        // SAFETY: `part` is the new communicator MPI_Comm_split just made for this rank.
        unsafe { Self::adopt(part) }.map(Some)
    }

    /// Take ownership of `comm`, a communicator nothing else holds: its errors are returned,
    /// and dropping the transport frees it.
    ///
    /// # Safety
    /// `comm` must be a valid intra-communicator handle that nobody else frees.
    unsafe fn adopt(comm: ffi::MPI_Comm) -> Result<Self> {
        // SAFETY: the caller's contract; rsmpi frees it.
        let owned = unsafe { SimpleCommunicator::from_raw(comm) };
        // SAFETY: `comm` is valid (the caller's contract); the handler is a predefined constant.
        let code = unsafe { ffi::MPI_Comm_set_errhandler(comm, ffi::RSMPI_ERRORS_RETURN) };
        check(code, "MPI_Comm_set_errhandler")?;
        let (mut rank, mut size) = (0, 0);
        // SAFETY: `comm` is valid (the caller's contract); `rank` and `size` are live locals.
        let code = unsafe { ffi::MPI_Comm_rank(comm, &mut rank) };
        check(code, "MPI_Comm_rank")?;
        // SAFETY: as above.
        let code = unsafe { ffi::MPI_Comm_size(comm, &mut size) };
        check(code, "MPI_Comm_size")?;
        Ok(MpiTransport {
            comm: Some(owned),
            rank: rank as usize,
            size: size as usize,
            limits: MessageLimits::default(),
            watcher: None,
            shared: Err(Unavailable::Disabled),
            nodes: discover_nodes(comm, rank, size)?,
        })
    }

    /// Set up the node segment if every rank runs on one node (and `enabled`, the same on every
    /// rank); otherwise record why not. Collective over this communicator.
    pub fn attach_shared_memory(&mut self, enabled: bool) -> Result<()> {
        self.shared = MpiShared::attach(self.raw()?, self.rank, self.size, enabled);
        Ok(())
    }

    /// Why this communicator has no shared memory, if it has none.
    pub fn shared_memory_unavailable(&self) -> Option<&Unavailable> {
        self.shared.as_ref().err()
    }

    /// The communicator's handle, for a schedule that calls the library's own collective.
    pub fn raw(&self) -> Result<ffi::MPI_Comm> {
        self.comm
            .as_ref()
            .map(AsRaw::as_raw)
            .ok_or_else(|| CoreError::Communication("the communicator has been released".into()))
    }

    fn peer(&self, peer: usize) -> Result<c_int> {
        if peer < self.size {
            Ok(peer as c_int)
        } else {
            Err(CoreError::InvalidArgument(format!(
                "rank {peer} is outside a communicator of {}",
                self.size
            )))
        }
    }

    /// Start the pieces (address and length each) to or from `peer` as messages of at most the
    /// limit between this rank and `peer`, each begun by `start(address, length, request)` (MPI_Isend or MPI_Irecv).
    /// If one fails, the messages already started are waited for when the returned error drops
    /// them.
    fn post<'a>(
        &'a self,
        what: &'static str,
        peer: c_int,
        pieces: impl Iterator<Item = (*mut u8, usize)>,
        start: impl Fn(*mut u8, usize, &mut ffi::MPI_Request) -> c_int,
    ) -> Result<MpiPending<'a>> {
        let mut pending = MpiPending {
            requests: SmallVec::new(),
            statuses: SmallVec::new(),
            lengths: SmallVec::new(),
            comm: self.raw()?,
            what,
            peer: peer as usize,
            received: None,
            _send_buffer: PhantomData,
        };
        let limit = self.limits.between(&self.nodes, self.rank, pending.peer);
        for (base, len) in pieces {
            for message in message_pieces(len, limit, 1) {
                let mut request = null_request();
                // The message lies inside the piece: `base + start .. base + end`.
                let address = base.wrapping_add(message.start);
                check_on(
                    pending.comm,
                    start(address, message.len(), &mut request),
                    what,
                )?;
                pending.requests.push(request);
                pending.lengths.push(message.len());
            }
        }
        Ok(pending)
    }

    /// Leave the communicator to MPI_Finalize instead of freeing it, so that its context id is
    /// never reused in this process: messages sent to this rank on it that it never received
    /// then stay with it (see the runtime's `shutdown`).
    pub fn retire(mut self) {
        if let Some(comm) = self.comm.take() {
            std::mem::forget(comm);
        }
    }

    /// Free the communicator now (it must happen before MPI_Finalize).
    pub fn release(&mut self) {
        if let Some(comm) = self.comm.take() {
            if mpi::is_finalized() {
                // Freeing after finalize aborts the process; the OS reclaims it instead.
                std::mem::forget(comm);
            }
        }
    }
}

impl Drop for MpiTransport {
    fn drop(&mut self) {
        self.release();
    }
}

fn null_request() -> ffi::MPI_Request {
    // SAFETY: reading a predefined handle constant.
    unsafe { ffi::RSMPI_REQUEST_NULL }
}

/// Requests, statuses and lengths inline: a logical message is usually one or two pieces, and
/// small collectives are many messages, so no heap allocation per message.
struct MpiPending<'a> {
    requests: SmallVec<[ffi::MPI_Request; 2]>,
    statuses: SmallVec<[ffi::MPI_Status; 2]>,
    /// Each request's length in bytes, to check what arrived.
    lengths: SmallVec<[usize; 2]>,
    /// The communicator, to revoke if a process has failed (see `check_on`).
    comm: ffi::MPI_Comm,
    what: &'static str,
    peer: usize,
    /// A receive's destination, handed back once the data is in; `None` for sends.
    received: Option<Destination<'a>>,
    _send_buffer: PhantomData<&'a [u8]>,
}

impl MpiPending<'_> {
    /// One MPI_Testall; `Ok(true)` once every piece is complete and (for a receive) of the
    /// expected length.
    fn test(&mut self) -> Result<bool> {
        if self.requests.is_empty() {
            return Ok(true);
        }
        if self.statuses.len() != self.requests.len() {
            // SAFETY: MPI_Status is plain data; MPI_Testall fills these in.
            let blank: ffi::MPI_Status = unsafe { std::mem::zeroed() };
            self.statuses = SmallVec::from_elem(blank, self.requests.len());
        }
        let mut flag: c_int = 0;
        // SAFETY: every request came from MPI_Isend/MPI_Irecv on a buffer that `'a` keeps alive
        // and that nothing else touches until this wait returns; `statuses` has one slot per
        // request. Completed requests become MPI_REQUEST_NULL, which MPI_Testall accepts again.
        let code = unsafe {
            ffi::MPI_Testall(
                self.requests.len() as c_int,
                self.requests.as_mut_ptr(),
                &mut flag,
                self.statuses.as_mut_ptr(),
            )
        };
        if code == ffi::MPI_SUCCESS as c_int && flag == 0 {
            return Ok(false);
        }
        // Completed requests are MPI_REQUEST_NULL now; after an error some may still be
        // pending (they own their buffers, so `drop` waits for them).
        let null = null_request();
        self.requests.retain(|request| *request != null);
        if code == ffi::MPI_ERR_IN_STATUS as c_int {
            let failed = self.statuses.iter().find(|s| s.MPI_ERROR != 0);
            let code = failed.map_or(code, |s| s.MPI_ERROR);
            if code == ffi::MPI_ERR_TRUNCATE as c_int {
                return Err(CoreError::Communication(format!(
                    "rank {} sent a longer message than expected: the ranks disagree on what \
                     they exchange ({})",
                    self.peer,
                    error_string(code)
                )));
            }
            return check_on(self.comm, code, self.what).map(|_| true);
        }
        check_on(self.comm, code, self.what)?;
        self.requests.clear();
        if self.received.is_some() {
            for (status, &expected) in self.statuses.iter().zip(&self.lengths) {
                let mut count: c_int = 0;
                // SAFETY: `status` was filled in by MPI_Testall for a completed receive.
                let code = unsafe { ffi::MPI_Get_count(status, ffi::RSMPI_UINT8_T, &mut count) };
                check(code, "MPI_Get_count")?;
                if count as usize != expected {
                    return Err(wrong_length(self.peer, expected, count.max(0) as usize));
                }
            }
        }
        Ok(true)
    }
}

impl<'a> Pending<'a> for MpiPending<'a> {
    fn wait_for(&mut self, limit: Duration) -> Result<bool> {
        let mut backoff = Backoff::new();
        loop {
            if self.test()? {
                return Ok(true);
            }
            if backoff.waited() >= limit {
                return Ok(false);
            }
            backoff.pause();
        }
    }

    fn peer(&self) -> usize {
        self.peer
    }

    fn into_destination(mut self: Box<Self>) -> Option<Destination<'a>> {
        self.received.take()
    }

    fn abandon(&mut self) {
        let receiving = self.received.is_some();
        for request in &mut self.requests {
            if receiving {
                // SAFETY: `request` is a live receive; cancelling one that no message matched
                // completes it at once, and waiting then guarantees MPI no longer writes into
                // the destination.
                unsafe {
                    ffi::MPI_Cancel(request);
                    ffi::MPI_Wait(request, ffi::RSMPI_STATUS_IGNORE);
                }
            } else {
                // SAFETY: `request` is a live send to a rank that will never receive it (its
                // wait was given up); freeing it lets MPI drop it, and MPI only ever reads the
                // buffer it was given.
                unsafe { ffi::MPI_Request_free(request) };
            }
        }
        self.requests.clear();
    }
}

impl Drop for MpiPending<'_> {
    /// If posting a later piece failed, or the wait was abandoned after an error, the pieces
    /// already posted still own their buffers: wait for them.
    fn drop(&mut self) {
        while !self.requests.is_empty() {
            if self.test().is_err() {
                break;
            }
        }
    }
}

impl Transport for MpiTransport {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn isend_pieces<'a>(&'a self, pieces: &[&'a [u8]], dest: usize) -> Result<Request<'a>> {
        let (comm, dest) = (self.raw()?, self.peer(dest)?);
        let addresses = pieces.iter().map(|p| (p.as_ptr().cast_mut(), p.len()));
        let pending = self.post("MPI_Isend", dest, addresses, |address, len, request| {
            // SAFETY: the message lies inside a piece that outlives the request (`'a`) and that
            // MPI only reads; its length fits a C int because messages are at most i32::MAX
            // bytes.
            unsafe {
                ffi::MPI_Isend(
                    address.cast_const().cast(),
                    len as c_int,
                    ffi::RSMPI_UINT8_T,
                    dest,
                    TAG,
                    comm,
                    request,
                )
            }
        })?;
        Ok(Request::new(Box::new(pending), self))
    }

    fn irecv_to<'a>(
        &'a self,
        mut destination: Destination<'a>,
        source: usize,
    ) -> Result<Request<'a>> {
        let (comm, source) = (self.raw()?, self.peer(source)?);
        destination.check()?;
        let lengths = destination.lengths();
        let mut addresses: SmallVec<[(*mut u8, usize); 2]> = SmallVec::new();
        for index in 0..lengths.len() {
            let piece = destination
                .piece_mut(index)
                .ok_or_else(|| CoreError::InvalidArgument("internal: no such piece".into()))?;
            addresses.push((piece.as_mut_ptr(), piece.len()));
        }
        let mut pending = self.post(
            "MPI_Irecv",
            source,
            addresses.into_iter(),
            |address, len, request| {
                // SAFETY: as in `isend_pieces`; the pieces are disjoint, so no two receives share
                // bytes. MPI writes through addresses taken from `destination`, which the request
                // holds (and nothing else touches) until every message has arrived.
                unsafe {
                    ffi::MPI_Irecv(
                        address.cast(),
                        len as c_int,
                        ffi::RSMPI_UINT8_T,
                        source,
                        TAG,
                        comm,
                        request,
                    )
                }
            },
        )?;
        pending.received = Some(destination);
        Ok(Request::new(Box::new(pending), self))
    }

    fn message_limits(&self) -> MessageLimits {
        self.limits
    }

    fn set_message_limits(&mut self, limits: MessageLimits) {
        self.limits = limits.clamped();
    }

    fn send_notice(&self, dest: usize, notice: Notice) -> Result<()> {
        let (comm, dest) = (self.raw()?, self.peer(dest)?);
        // Boxed: if the receiver's host cannot be reached and the send does not leave within
        // the grace period, the request is freed and the 16 bytes leaked, as MPI may still read
        // them (a rank that shuts down must not hang on a peer that is gone).
        let bytes: Box<[u8; NOTICE_BYTES]> = Box::new(notice_bytes(notice));
        let mut request = null_request();
        // SAFETY: a 16-byte send from a heap buffer that outlives the request (freed below only
        // once the send completed, else leaked) on a live communicator.
        let code = unsafe {
            ffi::MPI_Isend(
                bytes.as_ptr().cast(),
                NOTICE_BYTES as c_int,
                ffi::RSMPI_UINT8_T,
                dest,
                NOTICE_TAG,
                comm,
                &mut request,
            )
        };
        check_on(comm, code, "MPI_Isend")?;
        let mut backoff = Backoff::new();
        loop {
            let mut flag: c_int = 0;
            // SAFETY: `request` is the live send request made above.
            let code = unsafe { ffi::MPI_Test(&mut request, &mut flag, ffi::RSMPI_STATUS_IGNORE) };
            check_on(comm, code, "MPI_Test")?;
            if flag != 0 {
                return Ok(());
            }
            if backoff.waited() >= NOTICE_GRACE {
                // SAFETY: freeing a live request; MPI completes or drops the send on its own,
                // reading only `bytes`, which is leaked for it.
                unsafe { ffi::MPI_Request_free(&mut request) };
                Box::leak(bytes);
                return Err(CoreError::Communication(format!(
                    "a notice to rank {dest} did not leave within {NOTICE_GRACE:?}"
                )));
            }
            backoff.pause();
        }
    }

    fn take_notices(&self) -> Vec<(usize, Notice)> {
        let mut notices = Vec::new();
        let Ok(comm) = self.raw() else {
            return notices;
        };
        loop {
            let mut flag: c_int = 0;
            // SAFETY: MPI_Status is plain data that MPI_Iprobe fills in.
            let mut status: ffi::MPI_Status = unsafe { std::mem::zeroed() };
            // SAFETY: probing a live communicator; `flag` and `status` are live locals.
            let code = unsafe {
                ffi::MPI_Iprobe(
                    ffi::RSMPI_ANY_SOURCE,
                    NOTICE_TAG,
                    comm,
                    &mut flag,
                    &mut status,
                )
            };
            if code != ffi::MPI_SUCCESS as c_int || flag == 0 {
                return notices;
            }
            let mut bytes = [0u8; NOTICE_BYTES];
            // SAFETY: receiving the notice just probed into a live local buffer of its size.
            let code = unsafe {
                ffi::MPI_Recv(
                    bytes.as_mut_ptr().cast(),
                    NOTICE_BYTES as c_int,
                    ffi::RSMPI_UINT8_T,
                    status.MPI_SOURCE,
                    NOTICE_TAG,
                    comm,
                    ffi::RSMPI_STATUS_IGNORE,
                )
            };
            if code != ffi::MPI_SUCCESS as c_int {
                return notices;
            }
            notices.push((status.MPI_SOURCE as usize, notice_from(bytes)));
        }
    }

    fn watcher(&self) -> Option<&dyn Watcher> {
        self.watcher.as_deref()
    }

    fn set_watcher(&mut self, watcher: Arc<dyn Watcher>) {
        self.watcher = Some(watcher);
    }

    fn abort(&self, code: i32) -> ! {
        abort(code)
    }

    fn library_collectives(&self) -> Option<&dyn LibraryCollectives> {
        Some(self)
    }

    fn progress(&self) {
        if let Ok(comm) = self.raw() {
            probe_progress(comm);
        }
    }

    fn shared(&self) -> Option<&dyn SharedMemory> {
        self.shared.as_ref().ok().map(|s| s as &dyn SharedMemory)
    }

    /// A probe from any source fails once a process of the communicator has died (ULFM), even
    /// when nothing is pending with it: so a wait in shared memory, which posts no message,
    /// learns of it too, and revokes the communicator for the ranks that wait on this one.
    fn failed(&self) -> Result<()> {
        let comm = self.raw()?;
        match check_on(comm, probe_progress(comm), "MPI_Iprobe, while waiting") {
            Err(error @ CoreError::ProcessFailed(_)) => Err(error),
            _ => Ok(()),
        }
    }

    fn nodes(&self) -> &Nodes {
        &self.nodes
    }
}

/// Probe `comm` from any source for a tag nothing sends: it drives MPI's progress, and under
/// ULFM its code says whether a process of `comm` has failed.
fn probe_progress(comm: ffi::MPI_Comm) -> c_int {
    let mut flag: c_int = 0;
    // SAFETY: probing a live communicator (the caller's) for a tag nothing sends; `flag` is a
    // live local.
    unsafe {
        ffi::MPI_Iprobe(
            ffi::RSMPI_ANY_SOURCE,
            PROGRESS_TAG,
            comm,
            &mut flag,
            ffi::RSMPI_STATUS_IGNORE,
        )
    }
}

/// How long MPI_Abort may take before this process ends itself (see `abort`).
const ABORT_GRACE: Duration = Duration::from_secs(3);

/// End every process of the job (MPI_Abort on MPI_COMM_WORLD); this process ends within
/// `ABORT_GRACE` whatever MPI does.
pub fn abort(code: c_int) -> ! {
    // Open MPI's MPI_Abort returns only once its launcher has killed the job, and the launcher
    // waits for the daemon of every host: with one host unreachable (its link down) it never
    // does, and this rank would hang as long as the launcher (issue 25: 141 s, then killed).
    // So a watchdog ends this process itself if MPI_Abort has not within the grace period:
    // the rank's exit without MPI_Finalize is what its local daemon reports, and whatever
    // MPI cannot reach is left to the launcher or the scheduler (README, "Failure behaviour").
    // If the thread cannot be started, MPI_Abort alone is all there is.
    let _ = std::thread::Builder::new()
        .name("ringlet-abort-watchdog".into())
        .spawn(move || {
            std::thread::sleep(ABORT_GRACE);
            // SAFETY: _exit ends the process without running atexit handlers or destructors,
            // which could block in MPI (finalize) as MPI_Abort did; nothing is left half-done
            // that the exit code does not already report.
            unsafe { libc::_exit(code) }
        });
    // SAFETY: MPI_Abort may be called at any time after initialization; it does not return.
    unsafe {
        ffi::MPI_Abort(ffi::RSMPI_COMM_WORLD, code);
    }
    std::process::exit(code)
}
