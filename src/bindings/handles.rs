//! Queued collectives and their handles. The queued job holds the arrays it works on, so they
//! stay alive until it has run, even if the handle is dropped.

use super::buffers::{
    bytes_array, contiguous, element_type, known_dtype, readable_bytes, writable_elements,
};
use super::errors::detached;
use crate::runtime::broadcast::broadcast_async as queue_broadcast;
use crate::runtime::buffer::Buffer;
use crate::runtime::grouped_allreduce::{
    self, allreduce_buffers, allreduce_group_async as queue_group, Buffers, Dims, Group, Inputs,
    Shapes, Targets,
};
use crate::runtime::process::{self, SetId};
use crate::runtime::{allgather, reduce_scatter, Completion, DType, Queued, ReduceOp};
use numpy::{npyffi, PyArrayDescrMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyList;
use std::sync::Arc;

/// A queued collective. `done()` polls; `wait()` blocks (without the GIL) and raises the
/// collective's error, if any.
#[pyclass(frozen, subclass, module = "ringlet._core")]
pub struct Handle {
    completion: Arc<Completion>,
}

#[pymethods]
impl Handle {
    fn done(&self) -> bool {
        self.completion.is_done()
    }

    fn wait(&self, py: Python<'_>) -> PyResult<()> {
        let completion = self.completion.clone();
        detached(py, move || completion.wait())
    }

    /// Once done: (seconds it waited in the queue, seconds it ran); None before.
    fn timing(&self) -> Option<(f64, f64)> {
        self.completion
            .timing()
            .map(|(queued, ran)| (queued.as_secs_f64(), ran.as_secs_f64()))
    }
}

/// The bytes a queued collective produced (8-byte aligned storage, its length in bytes, and
/// rows per rank where they vary), taken once.
type Produced = (Vec<u64>, usize, Vec<usize>);
type Take = Box<dyn Fn() -> Option<Produced> + Send + Sync>;

/// A queued collective that produces a new array: a [`Handle`] whose `result()`, after
/// `wait()`, returns (its bytes as a uint8 array, rows from each rank).
#[pyclass(frozen, extends = Handle, module = "ringlet._core")]
pub struct ArrayHandle {
    take: Take,
}

#[pymethods]
impl ArrayHandle {
    /// After `wait()`: (the bytes as a uint8 array, rows from each rank); once only.
    fn result<'py>(&self, py: Python<'py>) -> PyResult<(Bound<'py, PyAny>, Vec<usize>)> {
        let (storage, bytes, counts) = (self.take)().ok_or_else(|| {
            pyo3::exceptions::PyValueError::new_err(
                "no result: the collective has not finished, failed, or its result was taken",
            )
        })?;
        Ok((bytes_array(py, storage, bytes)?, counts))
    }
}

fn array_handle<T: Send + 'static>(
    py: Python<'_>,
    queued: Queued<T>,
    produced: impl Fn(T) -> Produced + Send + Sync + 'static,
) -> PyResult<Py<ArrayHandle>> {
    let slot = queued.result;
    let take: Take = Box::new(move || {
        let value = slot.lock().unwrap_or_else(|e| e.into_inner()).take();
        value.map(&produced)
    });
    let handle = Handle {
        completion: queued.completion,
    };
    Py::new(
        py,
        PyClassInitializer::from(handle).add_subclass(ArrayHandle { take }),
    )
}

/// Queue an allgather of the C-contiguous `array` (of NumPy dtype `dtype`).
#[pyfunction]
#[pyo3(signature = (array, dtype, algorithm, process_set = 0))]
pub fn allgather_async(
    array: &Bound<'_, PyUntypedArray>,
    dtype: &str,
    algorithm: &str,
    process_set: SetId,
) -> PyResult<Py<ArrayHandle>> {
    // SAFETY: the array goes to the job below, which keeps it alive until it has run.
    let input = Buffer::of_readable(unsafe { readable_bytes(array, "allgather")? });
    let (shape, itemsize) = (array.shape().to_vec(), array.dtype().itemsize());
    let keepalive = Box::new(array.clone().into_any().unbind());
    // SAFETY: `keepalive` holds the array until the job ends, and the caller may not write it
    // before the handle completes (the documented contract of the async calls).
    let queued = unsafe {
        allgather::allgather_async(
            input,
            dtype.to_string(),
            itemsize,
            shape,
            algorithm.to_string(),
            process_set,
            keepalive,
        )?
    };
    array_handle(array.py(), queued, |g| (g.storage, g.bytes, g.counts))
}

/// Queue a reduce-scatter of the C-contiguous `array`: this rank's block, `counts` rows each.
#[pyfunction]
#[pyo3(signature = (array, dtype, op, counts, algorithm, process_set = 0))]
pub fn reduce_scatter_async(
    array: &Bound<'_, PyUntypedArray>,
    dtype: &str,
    op: &str,
    counts: Vec<usize>,
    algorithm: &str,
    process_set: SetId,
) -> PyResult<Py<ArrayHandle>> {
    let (dtype, op) = (element_type(array, dtype)?, ReduceOp::from_name(op)?);
    // SAFETY: as in `allgather_async`.
    let input = Buffer::of_readable(unsafe { readable_bytes(array, "reduce_scatter")? });
    let shape = array.shape().to_vec();
    let keepalive = Box::new(array.clone().into_any().unbind());
    // SAFETY: as in `allgather_async`.
    let queued = unsafe {
        reduce_scatter::reduce_scatter_async(
            input,
            dtype,
            op,
            shape,
            counts,
            algorithm.to_string(),
            process_set,
            keepalive,
        )?
    };
    array_handle(array.py(), queued, |b| (b.storage, b.bytes, Vec::new()))
}

/// Allreduce `arrays` (all of `dtype`) in place, or into `out` (one array per array, of its
/// shape and dtype; an entry that is the array itself is reduced in place), now (after any
/// queued work): fused into runs of at most `fusion_bytes`, sent as `wire_dtype`, scaled by
/// `prescale` and `postscale`; a run of arrays averaging fewer than `pack_below` bytes is
/// packed into one buffer (None: where the cost model says packing pays).
#[pyfunction]
#[pyo3(signature = (
    arrays, dtype, wire_dtype, op, algorithm, prescale, postscale, fusion_bytes,
    pack_below=None, process_set = 0, out = None
))]
#[allow(clippy::too_many_arguments)]
pub fn allreduce_group(
    py: Python<'_>,
    arrays: Vec<Bound<'_, PyUntypedArray>>,
    dtype: &str,
    wire_dtype: &str,
    op: &str,
    algorithm: &str,
    prescale: f64,
    postscale: f64,
    fusion_bytes: usize,
    pack_below: Option<usize>,
    process_set: SetId,
    out: Option<Vec<Bound<'_, PyUntypedArray>>>,
) -> PyResult<()> {
    let settings = GroupSettings {
        dtype,
        wire_dtype,
        op,
        algorithm,
        prescale,
        postscale,
        fusion_bytes,
        pack_below,
        process_set,
    };
    let (targets, group) = settings.group(&arrays, out.as_deref())?;
    detached(py, || {
        // SAFETY: `arrays` and `out` hold every array until we return, and the caller may not
        // touch them meanwhile (it waits here; the arrays are its own).
        unsafe { allreduce_buffers(&targets, &group) }
    })
}

/// The common grouped allreduce without a detour through Python: `arrays` a list of
/// C-contiguous, aligned, writeable NumPy arrays of one registered dtype (or, with `out`, a
/// list of as many such arrays, `arrays` then only read and only aligned and C-contiguous),
/// `op` a known op, the algorithm "auto" with the cost model installed, no compression or
/// scaling, ringlet initialized, the fusion threshold valid. Returns True once it has run,
/// False to let the Python layer take the call (it validates everything and explains what is
/// wrong).
#[pyfunction]
#[pyo3(signature = (arrays, op, fusion_threshold = None, process_set = 0, out = None))]
pub fn allreduce_group_fast(
    py: Python<'_>,
    arrays: &Bound<'_, PyAny>,
    op: &str,
    fusion_threshold: Option<i64>,
    process_set: SetId,
    out: Option<&Bound<'_, PyAny>>,
) -> PyResult<bool> {
    let (Ok(arrays), Ok(op), Ok(fusion_bytes)) = (
        arrays.cast::<PyList>(),
        ReduceOp::from_name(op),
        grouped_allreduce::fusion_threshold(fusion_threshold),
    ) else {
        return Ok(false);
    };
    let out = match out.map(|out| out.cast::<PyList>()) {
        None => None,
        Some(Ok(out)) if out.len() == arrays.len() => Some(out),
        Some(_) => return Ok(false),
    };
    // The dtype, and the descriptor object it was last found by: a group's arrays share one,
    // and comparing pointers saves a lookup per array.
    let mut known: Option<(*mut npyffi::PyArray_Descr, DType)> = None;
    let mut buffers = Buffers::with_capacity(arrays.len());
    let mut inputs = Inputs::with_capacity(if out.is_some() { arrays.len() } else { 0 });
    let mut shapes = Shapes::with_capacity(arrays.len());
    for (index, item) in arrays.iter().enumerate() {
        let Ok(array) = item.cast::<PyUntypedArray>() else {
            return Ok(false);
        };
        // The array written: the result given for this one, if any.
        let result = match out.map(|out| out.get_item(index)) {
            None => None,
            Some(Ok(given)) if given.is(&item) => {
                inputs.push(None);
                None
            }
            Some(Ok(given)) => match given.cast_into::<PyUntypedArray>() {
                Ok(given) if given.shape() == array.shape() => Some(given),
                _ => return Ok(false),
            },
            Some(Err(_)) => return Ok(false),
        };
        // SAFETY: `array` is a live NumPy array, so its object header can be read.
        let descr = unsafe { (*array.as_array_ptr()).fields.descr };
        let dtype = match known {
            Some((seen, dtype)) if seen == descr => dtype,
            _ => {
                let Some(this) = known_dtype(&array.dtype()) else {
                    return Ok(false);
                };
                if known.is_some_and(|(_, d)| d != this) {
                    return Ok(false); // one stream per dtype: the Python layer splits them
                }
                known = Some((descr, this));
                this
            }
        };
        let written = match &result {
            Some(given) => {
                // SAFETY: `arrays` holds every array until we return; this one is only read.
                let Ok(input) = (unsafe { readable_bytes(array, "allreduce") }) else {
                    return Ok(false);
                };
                if known_dtype(&given.dtype()) != Some(dtype) {
                    return Ok(false);
                }
                inputs.push(Some(Buffer::of_readable(input)));
                given
            }
            None => array,
        };
        // SAFETY: `arrays` and `out` hold every array until we return.
        let Some(bytes) = (unsafe { writable_elements(written, dtype.size()) }) else {
            return Ok(false);
        };
        buffers.push(Buffer::of(bytes));
        shapes.push(Dims::from_slice(array.shape()));
    }
    let Some((_, dtype)) = known else {
        return Ok(true); // nothing to reduce, as the Python layer would find
    };
    if !crate::runtime::allreduce::ready("auto", dtype, op)
        || !process::is_initialized()
        || !process::caller_named()
    {
        return Ok(false);
    }
    let group = Group {
        dtype,
        wire: dtype,
        op,
        algorithm: "auto".into(),
        prescale: 1.0,
        postscale: 1.0,
        fusion_bytes,
        pack_below: None,
        shapes,
        thread: process::caller_for("allreduce")?,
        set: process_set,
    };
    let targets = Targets {
        results: buffers,
        inputs,
    };
    detached(py, || {
        // SAFETY: `arrays` and `out` hold every array until we return, and the caller may not
        // touch them meanwhile (it waits here).
        unsafe { allreduce_buffers(&targets, &group) }
    })?;
    Ok(true)
}

/// The fusion buffer size in bytes: `value` if given, else `RINGLET_FUSION_THRESHOLD`, else
/// the default (64 MiB).
#[pyfunction]
#[pyo3(signature = (value = None))]
pub fn fusion_threshold_bytes(value: Option<i64>) -> PyResult<usize> {
    Ok(grouped_allreduce::fusion_threshold(value)?)
}

/// The fusion buffer size when neither the caller nor `RINGLET_FUSION_THRESHOLD` sets one.
#[pyfunction]
pub fn default_fusion_threshold() -> usize {
    grouped_allreduce::DEFAULT_FUSION_THRESHOLD
}

/// Queue an allreduce of `arrays` (into `out` if given), as [`allreduce_group`] runs it.
#[pyfunction]
#[pyo3(signature = (
    arrays, dtype, wire_dtype, op, algorithm, prescale, postscale, fusion_bytes,
    pack_below=None, process_set = 0, out = None
))]
#[allow(clippy::too_many_arguments)]
pub fn allreduce_group_async(
    arrays: Vec<Bound<'_, PyUntypedArray>>,
    dtype: &str,
    wire_dtype: &str,
    op: &str,
    algorithm: &str,
    prescale: f64,
    postscale: f64,
    fusion_bytes: usize,
    pack_below: Option<usize>,
    process_set: SetId,
    out: Option<Vec<Bound<'_, PyUntypedArray>>>,
) -> PyResult<Handle> {
    let settings = GroupSettings {
        dtype,
        wire_dtype,
        op,
        algorithm,
        prescale,
        postscale,
        fusion_bytes,
        pack_below,
        process_set,
    };
    let (targets, group) = settings.group(&arrays, out.as_deref())?;
    let keepalive: Vec<Py<PyAny>> = arrays
        .into_iter()
        .chain(out.into_iter().flatten())
        .map(|a| a.into_any().unbind())
        .collect();
    // SAFETY: `keepalive` holds every array until the job ends, and the caller may not touch
    // them before the handle completes (the documented contract of the async calls).
    let completion = unsafe { queue_group(targets, group, Box::new(keepalive))? };
    Ok(Handle { completion })
}

/// A grouped allreduce's arguments, as Python passes them.
struct GroupSettings<'a> {
    dtype: &'a str,
    wire_dtype: &'a str,
    op: &'a str,
    algorithm: &'a str,
    prescale: f64,
    postscale: f64,
    fusion_bytes: usize,
    pack_below: Option<usize>,
    process_set: SetId,
}

impl GroupSettings<'_> {
    /// Where the arrays are reduced (in place, or into `out`), and the group the core runs.
    fn group(
        &self,
        arrays: &[Bound<'_, PyUntypedArray>],
        out: Option<&[Bound<'_, PyUntypedArray>]>,
    ) -> PyResult<(Targets, Group)> {
        let mut targets = Targets::in_place(Buffers::with_capacity(arrays.len()));
        let mut shapes = Shapes::with_capacity(arrays.len());
        if let Some(out) = out {
            if out.len() != arrays.len() {
                return Err(PyValueError::new_err(format!(
                    "out has {} arrays for {} arrays to reduce; it needs one result per array",
                    out.len(),
                    arrays.len()
                )));
            }
        }
        for (index, array) in arrays.iter().enumerate() {
            element_type(array, self.dtype)?;
            let result = match out.map(|out| &out[index]) {
                Some(result) if !result.is(array) => {
                    element_type(result, self.dtype)?;
                    if result.shape() != array.shape()
                        || known_dtype(&result.dtype()) != known_dtype(&array.dtype())
                    {
                        return Err(PyValueError::new_err(format!(
                            "out[{index}] is a {:?} array of {}, but the array it receives is \
                             {:?} of {}: a result must have its array's shape and dtype",
                            result.shape(),
                            result.dtype(),
                            array.shape(),
                            array.dtype()
                        )));
                    }
                    // SAFETY: the caller keeps the arrays alive for as long as it uses the
                    // buffers; this one is only read.
                    let input = unsafe { readable_bytes(array, "an out-of-place allreduce")? };
                    targets.inputs.push(Some(Buffer::of_readable(input)));
                    result
                }
                given => {
                    if given.is_some() {
                        targets.inputs.push(None);
                    }
                    array
                }
            };
            // SAFETY: as above.
            let bytes = unsafe { contiguous(result, "allreduce")? };
            targets.results.push(Buffer::of(bytes));
            shapes.push(Dims::from_slice(array.shape()));
        }
        let group = Group {
            dtype: DType::from_name(self.dtype)?,
            wire: DType::from_name(self.wire_dtype)?,
            op: ReduceOp::from_name(self.op)?,
            algorithm: self.algorithm.to_string().into(),
            prescale: self.prescale,
            postscale: self.postscale,
            fusion_bytes: self.fusion_bytes,
            pack_below: self.pack_below,
            shapes,
            thread: process::caller_for("allreduce")?,
            set: self.process_set,
        };
        Ok((targets, group))
    }
}

/// Queue an in-place broadcast of `array` (of NumPy dtype `dtype`) from `root`.
#[pyfunction]
#[pyo3(signature = (array, dtype, root, algorithm, process_set = 0))]
pub fn broadcast_async(
    array: &Bound<'_, PyUntypedArray>,
    dtype: &str,
    root: usize,
    algorithm: &str,
    process_set: SetId,
) -> PyResult<Handle> {
    // SAFETY: as in `allreduce_group_async`, for one array.
    let buffer = Buffer::of(unsafe { contiguous(array, "broadcast")? });
    let shape = array.shape().to_vec();
    let keepalive = Box::new(array.clone().into_any().unbind());
    // SAFETY: as in `allreduce_group_async`.
    let completion = unsafe {
        queue_broadcast(
            buffer,
            dtype.to_string(),
            shape,
            root,
            algorithm.to_string(),
            process_set,
            keepalive,
        )?
    };
    Ok(Handle { completion })
}
