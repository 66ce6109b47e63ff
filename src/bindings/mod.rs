//! `ringlet._core`: thin pyo3 wrappers. Parse arguments, release the GIL, call the core, map
//! errors. No algorithm lives here.

use crate::consistency::{Call, Kind};
use crate::dtype::{DType, ReduceOp};
use crate::error::CoreError;
use crate::runtime::{self, Parent};
use crate::schedules;
use crate::transport::Transport;
use crate::{auto, fusion, probe, worker};
use numpy::npyffi::flags::{NPY_ARRAY_ALIGNED, NPY_ARRAY_C_CONTIGUOUS, NPY_ARRAY_WRITEABLE};
use numpy::{PyArrayDescr, PyArrayDescrMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::create_exception;
use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyString;
use std::ops::Range;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex};

create_exception!(
    ringlet._core,
    RingletError,
    PyRuntimeError,
    "A collective failed: MPI reported an error, or ringlet is not usable in this process."
);

create_exception!(
    ringlet._core,
    MismatchError,
    RingletError,
    "Ranks disagree on the collective they are in (shape, dtype, op, algorithm or order)."
);

impl From<CoreError> for PyErr {
    fn from(error: CoreError) -> PyErr {
        match error {
            CoreError::InvalidArgument(msg) => PyValueError::new_err(msg),
            CoreError::UnsupportedDtype(msg) => PyTypeError::new_err(msg),
            CoreError::Communication(msg) => RingletError::new_err(msg),
            CoreError::Mismatch(msg) => MismatchError::new_err(msg),
        }
    }
}

/// Run `f` without the GIL and turn a panic into `RingletError`: no Rust panic reaches Python.
fn detached<T: Send>(
    py: Python<'_>,
    f: impl FnOnce() -> Result<T, CoreError> + Send,
) -> PyResult<T> {
    match py.detach(|| catch_unwind(AssertUnwindSafe(f))) {
        Ok(result) => result.map_err(PyErr::from),
        Err(panic) => {
            let reason = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            Err(RingletError::new_err(format!(
                "internal error in ringlet's core: {reason}"
            )))
        }
    }
}

/// Initialize MPI if needed and duplicate `comm_fortran_handle` (from mpi4py's `Comm.py2f()`)
/// or MPI_COMM_WORLD for ringlet. Returns (ringlet initialized MPI, granted thread level).
#[pyfunction]
#[pyo3(signature = (comm_fortran_handle=None))]
fn init(py: Python<'_>, comm_fortran_handle: Option<i64>) -> PyResult<(bool, &'static str)> {
    let parent = comm_fortran_handle.map_or(Parent::World, Parent::Fortran);
    let info = detached(py, || runtime::init(parent))?;
    Ok((info.owns_mpi, info.thread_level))
}

#[pyfunction]
fn is_initialized() -> bool {
    runtime::is_initialized()
}

#[pyfunction]
fn shutdown(py: Python<'_>) -> PyResult<()> {
    detached(py, || {
        runtime::shutdown();
        Ok(())
    })
}

/// Free ringlet's communicator and finalize MPI if ringlet initialized it. Registered with
/// `atexit`; returns whether MPI_Finalize ran.
#[pyfunction]
fn finalize(py: Python<'_>) -> PyResult<bool> {
    detached(py, || Ok(runtime::finalize()))
}

#[pyfunction]
fn rank(py: Python<'_>) -> PyResult<usize> {
    detached(py, || {
        runtime::with_transport(|t| Ok(crate::transport::Transport::rank(t)))
    })
}

#[pyfunction]
fn size(py: Python<'_>) -> PyResult<usize> {
    detached(py, || {
        runtime::with_transport(|t| Ok(crate::transport::Transport::size(t)))
    })
}

#[pyfunction]
fn barrier(py: Python<'_>) -> PyResult<()> {
    detached(py, || runtime::with_transport(|t| t.barrier()))
}

#[pyfunction]
fn mpi_library_version(py: Python<'_>) -> PyResult<String> {
    detached(py, runtime::library_version)
}

/// Split messages above this many bytes (default 2^31 - 1, MPI's count limit).
#[pyfunction]
fn set_max_message_bytes(py: Python<'_>, limit: usize) -> PyResult<()> {
    detached(py, || {
        runtime::with_transport(|t| {
            t.set_max_message_bytes(limit);
            Ok(())
        })
    })
}

#[pyfunction]
fn max_message_bytes(py: Python<'_>) -> PyResult<usize> {
    detached(py, || {
        runtime::with_transport(|t| Ok(t.max_message_bytes()))
    })
}

/// The bytes of a C-contiguous, aligned, writeable NumPy array, or `None` if it is not one.
///
/// # Safety
/// The slice aliases the array's memory: the caller keeps `array` alive while using it, and
/// the array must not be resized or written by anyone else meanwhile (the documented contract
/// of every ringlet call, as of MPI's own buffers).
unsafe fn writable_bytes<'a>(array: &Bound<'_, PyUntypedArray>) -> Option<&'a mut [u8]> {
    let required = NPY_ARRAY_C_CONTIGUOUS | NPY_ARRAY_ALIGNED | NPY_ARRAY_WRITEABLE;
    let fields = &(*array.as_array_ptr()).fields;
    if fields.flags & required != required {
        return None;
    }
    let nbytes = array.len() * array.dtype().itemsize();
    if nbytes == 0 {
        return Some(&mut []);
    }
    Some(std::slice::from_raw_parts_mut(
        fields.data.cast::<u8>(),
        nbytes,
    ))
}

/// Dtype objects the Python layer has vetted, so the fast path can recognize them by identity
/// (bfloat16 has no fixed NumPy type number).
static KNOWN_DTYPES: Mutex<Vec<(Py<PyArrayDescr>, DType)>> = Mutex::new(Vec::new());

fn known_dtype(descr: &Bound<'_, PyArrayDescr>) -> Option<DType> {
    let known = KNOWN_DTYPES.lock().unwrap_or_else(|e| e.into_inner());
    known
        .iter()
        .find(|(d, _)| d.as_ptr() == descr.as_ptr())
        .map(|(_, dtype)| *dtype)
}

/// Tell the fast path that `descr` (a native-byte-order dtype object) holds `name` elements.
#[pyfunction]
fn register_dtype(descr: Bound<'_, PyArrayDescr>, name: &str) -> PyResult<()> {
    let dtype = DType::from_name(name)?;
    if descr.itemsize() != dtype.size() || !descr.is_native_byteorder().unwrap_or(true) {
        return Err(PyValueError::new_err(format!(
            "{descr} cannot hold {name} elements"
        )));
    }
    let mut known = KNOWN_DTYPES.lock().unwrap_or_else(|e| e.into_inner());
    if !known.iter().any(|(d, _)| d.as_ptr() == descr.as_ptr()) {
        known.push((descr.unbind(), dtype));
    }
    Ok(())
}

fn run_allreduce(
    py: Python<'_>,
    bytes: &mut [u8],
    dtype: DType,
    op: ReduceOp,
    schedule: &'static dyn schedules::Schedule,
) -> PyResult<()> {
    let thread = runtime::caller_thread();
    detached(py, || {
        runtime::allreduce(schedule, bytes, dtype, op, thread)
    })
}

/// The common call without a detour through Python: `x` a NumPy array of a registered dtype,
/// `out` None or `x` itself (C-contiguous, aligned, writeable), ringlet initialized, and for
/// "auto" a decision table installed. Returns the result, or None to let the Python layer take
/// the call (it validates everything and explains what is wrong).
#[pyfunction]
fn allreduce_fast<'py>(
    py: Python<'py>,
    x: &Bound<'py, PyAny>,
    op: &Bound<'py, PyAny>,
    out: Option<&Bound<'py, PyAny>>,
    algorithm: &Bound<'py, PyAny>,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    let (Ok(array), Ok(op), Ok(algorithm)) = (
        x.cast::<PyUntypedArray>(),
        op.cast::<PyString>(),
        algorithm.cast::<PyString>(),
    ) else {
        return Ok(None);
    };
    let (op, algorithm) = (op.to_str()?, algorithm.to_str()?);
    let (Some(dtype), Ok(op)) = (known_dtype(&array.dtype()), ReduceOp::from_name(op)) else {
        return Ok(None);
    };
    let in_place = match out {
        None => false,
        Some(out) if out.is(x) => true,
        Some(_) => return Ok(None),
    };
    if !runtime::is_initialized() {
        return Ok(None);
    }
    let nbytes = array.len() * dtype.size();
    let schedule = if algorithm == "auto" {
        match auto::choose(dtype, op, nbytes) {
            Some(schedule) => schedule,
            None => return Ok(None),
        }
    } else {
        match schedules::by_name(algorithm) {
            Ok(schedule) => schedule,
            Err(_) => return Ok(None),
        }
    };
    let target = if in_place {
        array.clone()
    } else {
        x.call_method0("copy")?.cast_into::<PyUntypedArray>()?
    };
    // SAFETY: `target` stays alive (and owned by this call or the caller) until we return.
    let Some(bytes) = (unsafe { writable_bytes(&target) }) else {
        return Ok(None);
    };
    run_allreduce(py, bytes, dtype, op, schedule)?;
    Ok(Some(target.into_any()))
}

/// Allreduce a C-contiguous, aligned, writeable array in place; `dtype` names its elements.
#[pyfunction]
fn allreduce(
    py: Python<'_>,
    array: &Bound<'_, PyUntypedArray>,
    dtype: &str,
    op: &str,
    algorithm: &str,
) -> PyResult<()> {
    let dtype = DType::from_name(dtype)?;
    let op = ReduceOp::from_name(op)?;
    let schedule = schedules::by_name(algorithm)?;
    if array.dtype().itemsize() != dtype.size() {
        return Err(PyValueError::new_err(format!(
            "the array's elements are {} bytes, not a {}'s {}",
            array.dtype().itemsize(),
            dtype.name(),
            dtype.size()
        )));
    }
    // SAFETY: `array` is borrowed from the caller for the whole call.
    let bytes = unsafe { writable_bytes(array) }.ok_or_else(|| {
        PyValueError::new_err("allreduce needs a C-contiguous, aligned, writeable array")
    })?;
    run_allreduce(py, bytes, dtype, op, schedule)
}

fn contiguous<'a>(array: &Bound<'_, PyUntypedArray>, what: &str) -> PyResult<&'a mut [u8]> {
    // SAFETY: callers keep `array` alive (borrowed for the call, or held by the queued job).
    unsafe { writable_bytes(array) }.ok_or_else(|| {
        PyValueError::new_err(format!(
            "{what} needs a C-contiguous, aligned, writeable array"
        ))
    })
}

/// Broadcast a C-contiguous, aligned, writeable array from `root`, in place.
#[pyfunction]
fn broadcast(py: Python<'_>, array: &Bound<'_, PyUntypedArray>, root: usize) -> PyResult<()> {
    let bytes = contiguous(array, "broadcast")?;
    let call = byte_call(Kind::Broadcast, bytes.len(), root);
    detached(py, || {
        worker::run_in_order(|| {
            runtime::with_transport(|t| {
                runtime::agree(t, call)?;
                schedules::broadcast::broadcast(t, bytes, root)
            })
        })
    })
}

/// A broadcast or allgather of `bytes`, for the consistency check.
fn byte_call(kind: Kind, bytes: usize, root: usize) -> Call {
    Call {
        kind,
        dtype: None,
        op: None,
        count: bytes as u64,
        algorithm: "-",
        root: root as u64,
        thread: runtime::caller_thread(),
    }
}

/// Byte ranges of consecutive blocks of the given lengths, which must fill `total`.
fn block_ranges(lengths: &[usize], total: usize, ranks: usize) -> PyResult<Vec<Range<usize>>> {
    if lengths.len() != ranks || lengths.iter().sum::<usize>() != total {
        return Err(PyValueError::new_err(format!(
            "expected one block per rank ({ranks}) adding up to {total} bytes, got {lengths:?}"
        )));
    }
    let mut start = 0;
    Ok(lengths
        .iter()
        .map(|len| {
            start += len;
            start - len..start
        })
        .collect())
}

/// Allgather in place: `array` holds every rank's block back to back (`block_bytes` each) and
/// this rank's block is already filled. Blocks may differ in size.
#[pyfunction]
fn allgather_into(
    py: Python<'_>,
    array: &Bound<'_, PyUntypedArray>,
    block_bytes: Vec<usize>,
) -> PyResult<()> {
    let bytes = contiguous(array, "allgather")?;
    let ranks = size(py)?;
    let blocks = block_ranges(&block_bytes, bytes.len(), ranks)?;
    let call = byte_call(Kind::Allgather, bytes.len(), 0);
    detached(py, || {
        worker::run_in_order(|| {
            runtime::with_transport(|t| {
                runtime::agree(t, call)?;
                schedules::ring::allgather(t, bytes, &blocks)
            })
        })
    })
}

/// Reduce-scatter in place: afterwards this rank's block (of `block_bytes`) holds the
/// reduction of that block over all ranks; `avg` divides it by the number of ranks.
#[pyfunction]
fn reduce_scatter(
    py: Python<'_>,
    array: &Bound<'_, PyUntypedArray>,
    dtype: &str,
    op: &str,
    block_bytes: Vec<usize>,
) -> PyResult<()> {
    let (dtype, op) = (DType::from_name(dtype)?, ReduceOp::from_name(op)?);
    let bytes = contiguous(array, "reducescatter")?;
    let ranks = size(py)?;
    let blocks = block_ranges(&block_bytes, bytes.len(), ranks)?;
    if blocks.iter().any(|b| b.len() % dtype.size() != 0) {
        return Err(PyValueError::new_err("blocks must hold whole elements"));
    }
    let reduction = schedules::Reduction { dtype, op };
    let call = Call {
        kind: Kind::ReduceScatter,
        dtype: Some(dtype),
        op: Some(op),
        count: (bytes.len() / dtype.size()) as u64,
        algorithm: "ring",
        root: 0,
        thread: runtime::caller_thread(),
    };
    detached(py, || {
        worker::run_in_order(|| {
            runtime::with_transport(|t| {
                runtime::agree(t, call)?;
                schedules::ring::reduce_scatter(t, bytes, &blocks, &reduction)?;
                let own = &mut bytes[blocks[t.rank()].clone()];
                if op == ReduceOp::Avg {
                    crate::kernels::divide(dtype, own, ranks)?;
                }
                Ok(())
            })
        })
    })
}

/// A queued collective. `done()` polls; `wait()` blocks (without the GIL) and returns the
/// output object, or raises the collective's error. The job itself holds the arrays, so they
/// stay alive until it has run even if this handle is dropped.
#[pyclass(frozen, module = "ringlet._core")]
struct Handle {
    completion: Arc<worker::Completion>,
    output: Py<PyAny>,
}

#[pymethods]
impl Handle {
    fn done(&self) -> bool {
        self.completion.is_done()
    }

    fn wait(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let completion = self.completion.clone();
        detached(py, move || completion.wait())?;
        Ok(self.output.clone_ref(py))
    }
}

fn submit(
    keepalive: Vec<Py<PyAny>>,
    output: Py<PyAny>,
    work: impl FnOnce() -> Result<(), CoreError> + Send + 'static,
) -> PyResult<Handle> {
    let completion = worker::submit(Box::new(move || {
        let outcome = runtime::with_transport(|_| Ok(())).and_then(|_| work());
        drop(keepalive); // released once the collective no longer touches the arrays
        outcome
    }))?;
    Ok(Handle { completion, output })
}

/// Raw parts of a buffer that a queued job will rebuild into a slice.
struct RawBuffer {
    address: usize,
    len: usize,
}

impl RawBuffer {
    fn of(bytes: &mut [u8]) -> Self {
        RawBuffer {
            address: bytes.as_mut_ptr() as usize,
            len: bytes.len(),
        }
    }

    /// # Safety
    /// The array it came from must be alive and untouched by anyone else, and no other slice
    /// over the same bytes may exist, for as long as the result is used.
    unsafe fn slice<'a>(&self) -> &'a mut [u8] {
        if self.len == 0 {
            return &mut [];
        }
        std::slice::from_raw_parts_mut(self.address as *mut u8, self.len)
    }
}

fn check_disjoint(buffers: &[RawBuffer]) -> PyResult<()> {
    let mut spans: Vec<(usize, usize)> = buffers
        .iter()
        .filter(|b| b.len > 0)
        .map(|b| (b.address, b.address + b.len))
        .collect();
    spans.sort_unstable();
    if spans.windows(2).any(|w| w[1].0 < w[0].1) {
        return Err(PyValueError::new_err(
            "the arrays overlap in memory; each must be a separate buffer",
        ));
    }
    Ok(())
}

/// Queue an allreduce of every array in `arrays` (one dtype), fused into buffers of at most
/// `fusion_bytes`, optionally compressed to `wire_dtype`, scaled by `prescale`/`postscale`.
/// `algorithm` "auto" needs the decision table installed. Returns a Handle whose `wait()`
/// returns `output`.
#[pyfunction]
#[pyo3(signature = (arrays, dtype, wire_dtype, op, algorithm, prescale, postscale, fusion_bytes, output))]
#[allow(clippy::too_many_arguments)]
fn allreduce_group_async(
    arrays: Vec<Bound<'_, PyUntypedArray>>,
    dtype: &str,
    wire_dtype: &str,
    op: &str,
    algorithm: &str,
    prescale: f64,
    postscale: f64,
    fusion_bytes: usize,
    output: Py<PyAny>,
) -> PyResult<Handle> {
    let dtype = DType::from_name(dtype)?;
    let algorithm = match algorithm {
        "auto" => fusion::Algorithm::Auto,
        name => fusion::Algorithm::Fixed(schedules::by_name(name)?),
    };
    let group = fusion::Group {
        dtype,
        wire: DType::from_name(wire_dtype)?,
        op: ReduceOp::from_name(op)?,
        algorithm,
        prescale,
        postscale,
        fusion_bytes,
        thread: runtime::caller_thread(),
    };
    let mut buffers = Vec::with_capacity(arrays.len());
    for array in &arrays {
        if array.dtype().itemsize() != dtype.size() {
            return Err(PyValueError::new_err(format!(
                "every array must hold {} elements",
                dtype.name()
            )));
        }
        buffers.push(RawBuffer::of(contiguous(array, "allreduce")?));
    }
    check_disjoint(&buffers)?;
    let keepalive = arrays.into_iter().map(|a| a.into_any().unbind()).collect();
    submit(keepalive, output, move || {
        // SAFETY: `keepalive` holds every array until this job ends, the buffers are disjoint
        // (checked above), and the caller may not touch them before the handle completes.
        let mut slices: Vec<&mut [u8]> = buffers.iter().map(|b| unsafe { b.slice() }).collect();
        runtime::with_transport(|t| {
            fusion::allreduce_group(t, &mut slices, &group, &mut |call| runtime::agree(t, call))
        })
    })
}

/// Queue a broadcast of `array` from `root`; the handle's `wait()` returns `output`.
#[pyfunction]
fn broadcast_async(
    array: &Bound<'_, PyUntypedArray>,
    root: usize,
    output: Py<PyAny>,
) -> PyResult<Handle> {
    let buffer = RawBuffer::of(contiguous(array, "broadcast")?);
    let call = byte_call(Kind::Broadcast, buffer.len, root);
    let keepalive = vec![array.clone().into_any().unbind()];
    submit(keepalive, output, move || {
        // SAFETY: as in `allreduce_group_async`, for one array.
        let bytes = unsafe { buffer.slice() };
        runtime::with_transport(|t| {
            runtime::agree(t, call)?;
            schedules::broadcast::broadcast(t, bytes, root)
        })
    })
}

/// Install the "auto" decision table: (dtype, largest bytes, algorithm) ranges.
#[pyfunction]
fn set_auto_table(entries: Vec<(String, u64, String)>) -> PyResult<()> {
    Ok(auto::install(&entries)?)
}

#[pyfunction]
fn clear_auto_table() {
    auto::clear();
}

/// What the installed table picks for `nbytes` of `dtype` under `op`, or None without a table.
#[pyfunction]
fn auto_choice(dtype: &str, op: &str, nbytes: usize) -> PyResult<Option<&'static str>> {
    let (dtype, op) = (DType::from_name(dtype)?, ReduceOp::from_name(op)?);
    Ok(auto::choose(dtype, op, nbytes).map(|s| s.name()))
}

/// This rank's median seconds to exchange `nbytes` with rank ^ 1. Collective.
#[pyfunction]
fn measure_sendrecv(py: Python<'_>, nbytes: usize, repeats: usize) -> PyResult<f64> {
    detached(py, || {
        runtime::with_transport(|t| probe::sendrecv_seconds(t, nbytes, repeats))
    })
}

/// Median seconds to sum `nbytes` of `dtype` into an accumulator, in cache. Local.
#[pyfunction]
fn measure_combine(py: Python<'_>, dtype: &str, nbytes: usize, repeats: usize) -> PyResult<f64> {
    let dtype = DType::from_name(dtype)?;
    detached(py, || probe::combine_seconds(dtype, nbytes, repeats))
}

/// Segment size of the pipelined ring; every rank must use the same value.
#[pyfunction]
fn set_segment_bytes(bytes: usize) {
    schedules::pipelined_ring::set_segment_bytes(bytes);
}

#[pyfunction]
fn segment_bytes() -> usize {
    schedules::pipelined_ring::segment_bytes()
}

/// The SIMD level the reduction kernels run at: "generic", "avx2" or "avx512".
#[pyfunction]
fn kernel_level() -> &'static str {
    crate::kernels::Level::active().name()
}

/// Per algorithm: (calls, bytes, seconds) of this process's allreduces since the last reset.
#[pyfunction]
fn stats() -> Vec<(&'static str, u64, u64, f64)> {
    crate::stats::snapshot()
        .into_iter()
        .map(|(name, u)| (name, u.calls, u.bytes, u.seconds))
        .collect()
}

#[pyfunction]
fn reset_stats() {
    crate::stats::reset();
}

#[pyfunction]
fn set_stats_enabled(enabled: bool) {
    crate::stats::set_enabled(enabled);
}

/// Key this thread's collectives by `key` (a hash of the Python thread's name) in the
/// consistency check, so that two threads' calls never pair up across ranks unnoticed.
#[pyfunction]
fn set_thread_key(key: u64) {
    runtime::set_caller_thread(key);
}

/// End every process of the job now (MPI_Abort on MPI_COMM_WORLD), e.g. after an unhandled
/// exception on one rank, which would otherwise leave the others waiting forever.
#[pyfunction]
fn abort(code: i32) {
    crate::transport::mpi::abort(code)
}

#[pyfunction]
fn algorithms() -> Vec<&'static str> {
    schedules::SCHEDULES.iter().map(|s| s.name()).collect()
}

#[pyfunction]
fn dtypes() -> Vec<&'static str> {
    DType::ALL.iter().map(|d| d.name()).collect()
}

#[pyfunction]
fn ops() -> Vec<&'static str> {
    ReduceOp::ALL.iter().map(|op| op.name()).collect()
}

#[pymodule(gil_used = true)]
mod _core {
    #[pymodule_export]
    use super::{
        abort, allgather_into, allreduce_group_async, broadcast_async, reduce_scatter,
        set_thread_key, Handle, MismatchError,
    };
    #[pymodule_export]
    use super::{
        algorithms, allreduce, barrier, dtypes, finalize, init, is_initialized, kernel_level,
        max_message_bytes, mpi_library_version, ops, rank, segment_bytes, set_max_message_bytes,
        set_segment_bytes, shutdown, size, RingletError,
    };
    #[pymodule_export]
    use super::{
        allreduce_fast, auto_choice, broadcast, clear_auto_table, measure_combine,
        measure_sendrecv, register_dtype, reset_stats, set_auto_table, set_stats_enabled, stats,
    };
}
