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
use crate::dtype::{DType, ReduceOp};
use crate::error::{CoreError, Result};
use mpi::ffi;
use mpi::raw::{AsRaw, FromRaw};
use mpi::topology::SimpleCommunicator;
use std::ffi::{c_int, c_void};
use std::marker::PhantomData;
use std::sync::atomic::{AtomicUsize, Ordering};

extern "C" {
    fn ringlet_mpi_in_place() -> *mut c_void;
}

/// Every ringlet message uses this tag; the communicator is ringlet's own duplicate, so no
/// other traffic can match it.
const TAG: c_int = 0x52_4c; // "RL"

pub struct MpiTransport {
    /// `None` only after MPI was finalized under us; then the handle is leaked, not freed.
    comm: Option<SimpleCommunicator>,
    rank: usize,
    size: usize,
    max_message_bytes: AtomicUsize,
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
        })
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
    /// A receive's buffer, handed back once the data is in; `None` for sends.
    received: Option<&'a mut [u8]>,
    _send_buffer: PhantomData<&'a [u8]>,
}

impl MpiPending<'_> {
    fn wait_all(&mut self) -> Result<()> {
        if self.requests.is_empty() {
            return Ok(());
        }
        // SAFETY: every request came from MPI_Isend/MPI_Irecv on a buffer that `'a` keeps
        // alive and that nothing else touches until this wait returns.
        let code = unsafe {
            ffi::MPI_Waitall(
                self.requests.len() as c_int,
                self.requests.as_mut_ptr(),
                ffi::RSMPI_STATUSES_IGNORE,
            )
        };
        self.requests.clear();
        check(code, self.what)
    }
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
        let mut pending = MpiPending {
            requests: Vec::with_capacity(1),
            what: "MPI_Isend",
            received: None,
            _send_buffer: PhantomData,
        };
        for piece in message_pieces(data.len(), self.max_message_bytes(), 1) {
            let mut request = null_request();
            // SAFETY: the piece lies inside `data`, which outlives the request (`'a`); its length
            // fits a C int because pieces are at most i32::MAX bytes.
            let code = unsafe {
                ffi::MPI_Isend(
                    data[piece.clone()].as_ptr().cast(),
                    piece.len() as c_int,
                    ffi::RSMPI_UINT8_T,
                    dest,
                    TAG,
                    comm,
                    &mut request,
                )
            };
            check(code, "MPI_Isend")?;
            pending.requests.push(request);
        }
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
        let mut pending = MpiPending {
            requests: Vec::with_capacity(1),
            what: "MPI_Irecv",
            received: None,
            _send_buffer: PhantomData,
        };
        let base = data.as_mut_ptr();
        for piece in message_pieces(len, self.max_message_bytes(), 1) {
            let mut request = null_request();
            // SAFETY: as in `isend`; the pieces are disjoint, so no two receives share bytes.
            // MPI writes through `base`, derived from `data`, which the request holds and hands
            // back only after MPI_Waitall.
            let code = unsafe {
                ffi::MPI_Irecv(
                    base.add(piece.start).cast(),
                    piece.len() as c_int,
                    ffi::RSMPI_UINT8_T,
                    source,
                    TAG,
                    comm,
                    &mut request,
                )
            };
            check(code, "MPI_Irecv")?;
            pending.requests.push(request);
        }
        pending.received = Some(data);
        Ok(Request::new(Box::new(pending)))
    }

    fn sendrecv(&self, send: &[u8], dest: usize, recv: &mut [u8], source: usize) -> Result<()> {
        let limit = self.max_message_bytes();
        if send.len() > limit || recv.len() > limit {
            let receiving = self.irecv(recv, source)?;
            let sending = self.isend(send, dest)?;
            let received = receiving.wait();
            return received.and(sending.wait());
        }
        let (comm, dest, source) = (self.raw()?, self.peer(dest)?, self.peer(source)?);
        // SAFETY: both buffers are live for the call and their lengths fit a C int (checked
        // against the limit above, which is at most i32::MAX).
        let code = unsafe {
            ffi::MPI_Sendrecv(
                send.as_ptr().cast(),
                send.len() as c_int,
                ffi::RSMPI_UINT8_T,
                dest,
                TAG,
                recv.as_mut_ptr().cast(),
                recv.len() as c_int,
                ffi::RSMPI_UINT8_T,
                source,
                TAG,
                comm,
                ffi::RSMPI_STATUS_IGNORE,
            )
        };
        check(code, "MPI_Sendrecv")
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
