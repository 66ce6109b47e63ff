//! The transport over an MPI communicator.
//!
//! rsmpi owns initialization and the communicator handle; the hot path calls MPI through
//! `mpi::ffi` because rsmpi's safe requests need a lexical scope (a schedule holds requests
//! across loop iterations) and because rsmpi ignores return codes, while ringlet turns each
//! failed call into an error. Our communicator is a duplicate with `MPI_ERRORS_RETURN`, so a
//! failure comes back here instead of aborting silently or being ignored.

use super::{
    check_receive_length, message_pieces, Pending, Request, Transport, DEFAULT_MAX_MESSAGE_BYTES,
};
use crate::consistency::Call;
use crate::dtype::{DType, ReduceOp};
use crate::error::{CoreError, Result};
use mpi::ffi;
use mpi::raw::{AsRaw, FromRaw};
use mpi::topology::SimpleCommunicator;
use std::ffi::{c_int, c_void};
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

extern "C" {
    fn ringlet_mpi_in_place() -> *mut c_void;
}

/// Every ringlet message uses this tag; the communicator is ringlet's own duplicate, so no
/// other traffic can match it.
const TAG: c_int = 0x52_4c; // "RL"
/// Stall reports to rank 0 ("I have been waiting in collective #k"), off the data path.
const STALL_TAG: c_int = TAG + 1;

/// What to do when a wait takes long: warn after `warning`, end the job after `timeout`.
#[derive(Clone, Copy, Debug, Default)]
pub struct StallPolicy {
    pub warning: Option<Duration>,
    pub timeout: Option<Duration>,
}

pub struct MpiTransport {
    /// `None` only after MPI was finalized under us; then the handle is leaked, not freed.
    comm: Option<SimpleCommunicator>,
    rank: usize,
    size: usize,
    max_message_bytes: AtomicUsize,
    /// Collectives started on this communicator (the consistency check's sequence number).
    sequence: AtomicU64,
    /// The collective in progress, for stall messages.
    current: Mutex<Option<(u64, Call)>>,
    /// On rank 0: the last collective each rank reported being stuck in.
    stall_reports: Mutex<Vec<Option<u64>>>,
    pub stall: StallPolicy,
}

// SAFETY: an MPI communicator handle may be used from any thread of the process as long as the
// calls are serialized (MPI_THREAD_SERIALIZED) or MPI grants MPI_THREAD_MULTIPLE. The runtime
// keeps the transport behind a mutex, so at most one thread uses it at a time.
unsafe impl Send for MpiTransport {}
// SAFETY: as above; shared references are only handed out under the runtime's mutex.
unsafe impl Sync for MpiTransport {}

pub(crate) fn check(code: c_int, what: &str) -> Result<()> {
    if code == ffi::MPI_SUCCESS as c_int {
        return Ok(());
    }
    let mut text = vec![0u8; ffi::MPI_MAX_ERROR_STRING as usize + 1];
    let mut len: c_int = 0;
    // SAFETY: `text` holds MPI_MAX_ERROR_STRING bytes, as MPI_Error_string requires.
    let described = unsafe { ffi::MPI_Error_string(code, text.as_mut_ptr().cast(), &mut len) };
    let reason = if described == ffi::MPI_SUCCESS as c_int {
        String::from_utf8_lossy(&text[..len.max(0) as usize]).into_owned()
    } else {
        format!("MPI error code {code}")
    };
    Err(CoreError::Communication(format!("{what} failed: {reason}")))
}

impl MpiTransport {
    /// Duplicate `parent` (any live intra-communicator, world or a user's) for ringlet's own use.
    ///
    /// # Safety
    /// `parent` must be a valid intra-communicator handle and MPI must be initialized.
    pub unsafe fn duplicate(parent: ffi::MPI_Comm) -> Result<Self> {
        let mut dup = ffi::RSMPI_COMM_NULL;
        check(ffi::MPI_Comm_dup(parent, &mut dup), "MPI_Comm_dup")?;
        // SAFETY: `dup` is a new intra-communicator that nothing else holds; rsmpi frees it.
        let comm = SimpleCommunicator::from_raw(dup);
        check(
            ffi::MPI_Comm_set_errhandler(dup, ffi::RSMPI_ERRORS_RETURN),
            "MPI_Comm_set_errhandler",
        )?;
        let (mut rank, mut size) = (0, 0);
        check(ffi::MPI_Comm_rank(dup, &mut rank), "MPI_Comm_rank")?;
        check(ffi::MPI_Comm_size(dup, &mut size), "MPI_Comm_size")?;
        Ok(MpiTransport {
            comm: Some(comm),
            rank: rank as usize,
            size: size as usize,
            max_message_bytes: AtomicUsize::new(DEFAULT_MAX_MESSAGE_BYTES),
            sequence: AtomicU64::new(0),
            current: Mutex::new(None),
            stall_reports: Mutex::new(vec![None; size as usize]),
            stall: StallPolicy::default(),
        })
    }

    /// Number the next collective and remember it for stall messages.
    pub fn begin(&self, call: Call) -> u64 {
        let seq = self.sequence.fetch_add(1, Ordering::Relaxed);
        *self.current.lock().unwrap_or_else(|e| e.into_inner()) = Some((seq, call));
        seq
    }

    fn current_seq(&self) -> Option<u64> {
        self.current
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .map(|(seq, _)| seq)
    }

    /// Tell rank 0 that this rank has waited past the warning in collective `seq`. A tiny
    /// eager message; failures are ignored (this is diagnostics).
    fn report_stall(&self, seq: u64) {
        let Ok(comm) = self.raw() else { return };
        let bytes = seq.to_le_bytes();
        // SAFETY: an 8-byte send from a live local buffer on a live communicator.
        unsafe {
            ffi::MPI_Send(
                bytes.as_ptr().cast(),
                8,
                ffi::RSMPI_UINT8_T,
                0,
                STALL_TAG,
                comm,
            );
        }
    }

    /// On rank 0: take in the stall reports that have arrived.
    fn collect_stall_reports(&self) {
        let Ok(comm) = self.raw() else { return };
        let mut reports = self.stall_reports.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            let mut flag: c_int = 0;
            // SAFETY: MPI_Status is plain data that MPI_Iprobe fills in.
            let mut status: ffi::MPI_Status = unsafe { std::mem::zeroed() };
            // SAFETY: probing a live communicator; `flag` and `status` are live locals.
            let code = unsafe {
                ffi::MPI_Iprobe(
                    ffi::RSMPI_ANY_SOURCE,
                    STALL_TAG,
                    comm,
                    &mut flag,
                    &mut status,
                )
            };
            if code != ffi::MPI_SUCCESS as c_int || flag == 0 {
                return;
            }
            let mut bytes = [0u8; 8];
            let source = status.MPI_SOURCE;
            // SAFETY: receiving the 8-byte report just probed into a live local buffer.
            let code = unsafe {
                ffi::MPI_Recv(
                    bytes.as_mut_ptr().cast(),
                    8,
                    ffi::RSMPI_UINT8_T,
                    source,
                    STALL_TAG,
                    comm,
                    ffi::RSMPI_STATUS_IGNORE,
                )
            };
            if code != ffi::MPI_SUCCESS as c_int {
                return;
            }
            if let Some(slot) = reports.get_mut(source as usize) {
                *slot = Some(u64::from_le_bytes(bytes));
            }
        }
    }

    /// On rank 0: the ranks that have not reported waiting in collective `seq` (rank 0 itself
    /// is waiting), i.e. the ranks that have not joined it.
    fn missing_from(&self, seq: u64) -> Vec<usize> {
        let reports = self.stall_reports.lock().unwrap_or_else(|e| e.into_inner());
        (1..self.size)
            .filter(|&r| reports[r] != Some(seq))
            .collect()
    }

    fn describe_current(&self) -> String {
        match *self.current.lock().unwrap_or_else(|e| e.into_inner()) {
            Some((seq, call)) => call.describe_as(seq),
            None => "a collective".into(),
        }
    }

    fn raw(&self) -> Result<ffi::MPI_Comm> {
        self.comm
            .as_ref()
            .map(AsRaw::as_raw)
            .ok_or_else(|| CoreError::Communication("the communicator has been released".into()))
    }

    /// Split messages (and native allreduce calls) above this many bytes; tests lower it to
    /// exercise the path that arrays of more than 2^31 elements take.
    pub fn set_max_message_bytes(&self, limit: usize) {
        let limit = limit.clamp(8, DEFAULT_MAX_MESSAGE_BYTES);
        self.max_message_bytes.store(limit, Ordering::Relaxed);
    }

    pub fn max_message_bytes(&self) -> usize {
        self.max_message_bytes.load(Ordering::Relaxed)
    }

    pub fn barrier(&self) -> Result<()> {
        // SAFETY: a live communicator handle.
        check(unsafe { ffi::MPI_Barrier(self.raw()?) }, "MPI_Barrier")
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

    /// Start `len` bytes to or from `peer` as messages of at most the split limit, each begun by
    /// `start(piece, request)` (MPI_Isend or MPI_Irecv). If one fails, the pieces already
    /// started are waited for when the returned error drops them.
    fn post<'a>(
        &'a self,
        what: &'static str,
        peer: c_int,
        len: usize,
        start: impl Fn(std::ops::Range<usize>, &mut ffi::MPI_Request) -> c_int,
    ) -> Result<MpiPending<'a>> {
        let mut pending = MpiPending {
            requests: Vec::with_capacity(1),
            what,
            transport: self,
            peer: peer as usize,
            received: None,
            _send_buffer: PhantomData,
        };
        for piece in message_pieces(len, self.max_message_bytes(), 1) {
            let mut request = null_request();
            check(start(piece, &mut request), what)?;
            pending.requests.push(request);
        }
        Ok(pending)
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

struct MpiPending<'a> {
    requests: Vec<ffi::MPI_Request>,
    what: &'static str,
    transport: &'a MpiTransport,
    peer: usize,
    /// A receive's buffer, handed back once the data is in; `None` for sends.
    received: Option<&'a mut [u8]>,
    _send_buffer: PhantomData<&'a [u8]>,
}

impl MpiPending<'_> {
    /// Poll until every request completes, watching the clock: a stalled peer gets a warning
    /// after `RINGLET_STALL_WARNING` seconds, and ends the job after `RINGLET_TIMEOUT`.
    fn wait_all(&mut self) -> Result<()> {
        if self.requests.is_empty() {
            return Ok(());
        }
        let started = Instant::now();
        let policy = self.transport.stall;
        let transport = self.transport;
        let mut warned = false;
        let mut summarized = false;
        loop {
            let mut flag: c_int = 0;
            // SAFETY: every request came from MPI_Isend/MPI_Irecv on a buffer that `'a` keeps
            // alive and that nothing else touches until this wait returns; completed requests
            // become MPI_REQUEST_NULL, which MPI_Testall accepts again.
            let code = unsafe {
                ffi::MPI_Testall(
                    self.requests.len() as c_int,
                    self.requests.as_mut_ptr(),
                    &mut flag,
                    ffi::RSMPI_STATUSES_IGNORE,
                )
            };
            if code != ffi::MPI_SUCCESS as c_int || flag != 0 {
                self.requests.clear();
                return check(code, self.what);
            }
            let waited = started.elapsed();
            if let Some(limit) = policy.warning.filter(|limit| !warned && waited >= *limit) {
                eprintln!(
                    "ringlet: rank {} has waited {:.0} s in {} for rank {}, which has not \
                     joined it (or is itself waiting); RINGLET_STALL_WARNING={}",
                    self.transport.rank,
                    waited.as_secs_f64(),
                    self.transport.describe_current(),
                    self.peer,
                    limit.as_secs_f64()
                );
                warned = true;
                if let (Some(seq), true) = (transport.current_seq(), transport.rank != 0) {
                    transport.report_stall(seq);
                }
            }
            // Rank 0 gathers the reports and, half a warning period later, names the ranks
            // from which it heard nothing: they have not joined (Horovod's stall inspector).
            if let (Some(limit), 0, false) = (policy.warning, transport.rank, summarized) {
                if waited >= limit {
                    transport.collect_stall_reports();
                }
                if let Some(seq) = transport.current_seq().filter(|_| waited >= limit * 3 / 2) {
                    let missing = transport.missing_from(seq);
                    if !missing.is_empty() {
                        eprintln!(
                            "ringlet: {} has waited {:.0} s: rank(s) {} have not joined it \
                             (every other rank reports waiting)",
                            transport.describe_current(),
                            waited.as_secs_f64(),
                            missing
                                .iter()
                                .map(|r| r.to_string())
                                .collect::<Vec<_>>()
                                .join(", ")
                        );
                    }
                    summarized = true;
                }
            }
            if let Some(limit) = policy.timeout.filter(|limit| waited >= *limit) {
                eprintln!(
                    "ringlet: rank {} gives up after {:.0} s in {} waiting for rank {} \
                     (RINGLET_TIMEOUT={}): ending the job",
                    self.transport.rank,
                    waited.as_secs_f64(),
                    self.transport.describe_current(),
                    self.peer,
                    limit.as_secs_f64()
                );
                abort(1);
            }
            if waited > Duration::from_millis(1) {
                std::thread::yield_now(); // long waits share the core (oversubscribed runs)
            }
        }
    }
}

/// End every process of the job (MPI_Abort on MPI_COMM_WORLD).
pub fn abort(code: c_int) -> ! {
    // SAFETY: MPI_Abort may be called at any time after initialization; it does not return.
    unsafe {
        ffi::MPI_Abort(ffi::RSMPI_COMM_WORLD, code);
    }
    std::process::exit(code)
}

impl<'a> Pending<'a> for MpiPending<'a> {
    fn wait(mut self: Box<Self>) -> Result<Option<&'a mut [u8]>> {
        self.wait_all()?;
        Ok(self.received.take())
    }
}

impl Drop for MpiPending<'_> {
    /// If posting a later piece failed, the pieces already posted still own their buffers.
    fn drop(&mut self) {
        let _ = self.wait_all();
    }
}

impl Transport for MpiTransport {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn isend<'a>(&'a self, data: &'a [u8], dest: usize) -> Result<Request<'a>> {
        let (comm, dest) = (self.raw()?, self.peer(dest)?);
        let pending = self.post("MPI_Isend", dest, data.len(), |piece, request| {
            // SAFETY: the piece lies inside `data`, which outlives the request (`'a`); its length
            // fits a C int because pieces are at most i32::MAX bytes.
            unsafe {
                ffi::MPI_Isend(
                    data[piece.clone()].as_ptr().cast(),
                    piece.len() as c_int,
                    ffi::RSMPI_UINT8_T,
                    dest,
                    TAG,
                    comm,
                    request,
                )
            }
        })?;
        Ok(Request::new(Box::new(pending)))
    }

    fn irecv_into<'a>(
        &'a self,
        data: &'a mut [u8],
        len: usize,
        source: usize,
    ) -> Result<Request<'a>> {
        let (comm, source) = (self.raw()?, self.peer(source)?);
        check_receive_length(len, data.len())?;
        let base = data.as_mut_ptr();
        let mut pending = self.post("MPI_Irecv", source, len, |piece, request| {
            // SAFETY: as in `isend`; the pieces are disjoint, so no two receives share bytes.
            // MPI writes through `base`, derived from `data`, which the request holds and hands
            // back only after every piece has completed.
            unsafe {
                ffi::MPI_Irecv(
                    base.add(piece.start).cast(),
                    piece.len() as c_int,
                    ffi::RSMPI_UINT8_T,
                    source,
                    TAG,
                    comm,
                    request,
                )
            }
        })?;
        pending.received = Some(data);
        Ok(Request::new(Box::new(pending)))
    }

    fn native_allreduce(&self, buf: &mut [u8], dtype: DType, op: ReduceOp) -> Result<()> {
        // SAFETY: reading MPI's predefined handles, which are constants after initialization.
        let (datatype, mpi_op) = unsafe {
            let datatype = match dtype {
                DType::F32 => ffi::RSMPI_FLOAT,
                DType::F64 => ffi::RSMPI_DOUBLE,
                DType::I32 => ffi::RSMPI_INT32_T,
                DType::I64 => ffi::RSMPI_INT64_T,
                DType::F16 | DType::BF16 => {
                    return Err(CoreError::InvalidArgument(format!(
                        "algorithm \"mpi\" cannot reduce {}: MPI has no 16-bit float type; use \
                         \"auto\", \"ring\", \"halving_doubling\" or \"recursive_doubling\"",
                        dtype.name()
                    )))
                }
            };
            let mpi_op = match op.combining() {
                ReduceOp::Sum | ReduceOp::Avg => ffi::RSMPI_SUM,
                ReduceOp::Prod => ffi::RSMPI_PROD,
                ReduceOp::Min => ffi::RSMPI_MIN,
                ReduceOp::Max => ffi::RSMPI_MAX,
            };
            (datatype, mpi_op)
        };
        let comm = self.raw()?;
        if buf.is_empty() {
            // Nothing to reduce; an empty slice's dangling pointer can even equal MPI_IN_PLACE.
            return Ok(());
        }
        let elem = dtype.size();
        for piece in message_pieces(buf.len(), self.max_message_bytes(), elem) {
            let count = (piece.len() / elem) as c_int;
            // SAFETY: in-place allreduce on `count` elements inside `buf`, which is live and
            // exclusively borrowed for the call.
            let code = unsafe {
                ffi::MPI_Allreduce(
                    ringlet_mpi_in_place(),
                    buf[piece].as_mut_ptr().cast(),
                    count,
                    datatype,
                    mpi_op,
                    comm,
                )
            };
            check(code, "MPI_Allreduce")?;
        }
        Ok(())
    }
}
