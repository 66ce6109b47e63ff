//! `ringlet._core`: thin pyo3 wrappers. Convert Python objects to the core's buffers and
//! back, release the GIL, call the runtime, map errors. No collective logic lives here.

mod buffers;
mod doorbell;
mod errors;
mod handles;
mod rows;
mod xla;

use crate::runtime::broadcast::Array;
use crate::runtime::process::{self, Parent, SetId};
use crate::runtime::reduce::Data;
use crate::runtime::selection::{self, Basis};
use crate::runtime::{self, DType, Link, Network, ReduceOp, Tiered};
use buffers::{bytes_array, contiguous, element_type, known_dtype, readable_bytes, writable_bytes};
use errors::detached;
use numpy::{PyArrayDescrMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString};
use rows::{
    AlgorithmCost, AlgorithmStats, AutoRefinement, Candidate, DTypeInfo, Explanation, Group,
    ProcessSetRanks, SharedMemoryStatus, Simulated, SimulatedNetwork,
};
use std::time::Duration;

/// Initialize MPI if needed and duplicate `comm_fortran_handle` (from mpi4py's `Comm.py2f()`)
/// or MPI_COMM_WORLD for ringlet. Returns (ringlet initialized MPI, granted thread level).
#[pyfunction]
#[pyo3(signature = (comm_fortran_handle=None))]
fn init(py: Python<'_>, comm_fortran_handle: Option<i64>) -> PyResult<(bool, &'static str)> {
    let parent = comm_fortran_handle.map_or(Parent::World, Parent::Fortran);
    let info = detached(py, || process::init(parent))?;
    Ok((info.owns_mpi, info.thread_level))
}

#[pyfunction]
fn is_initialized() -> bool {
    process::is_initialized()
}

#[pyfunction]
fn shutdown(py: Python<'_>) -> PyResult<()> {
    detached(py, || {
        runtime::shutdown();
        Ok(())
    })
}

/// Free ringlet's communicator and finalize MPI if ringlet initialized it; returns whether
/// MPI_Finalize ran.
#[pyfunction]
fn finalize(py: Python<'_>) -> PyResult<bool> {
    detached(py, || Ok(runtime::finalize()))
}

/// This rank's place in `process_set` (0: ringlet's communicator).
#[pyfunction]
#[pyo3(signature = (process_set = 0))]
fn group(py: Python<'_>, process_set: SetId) -> PyResult<Group> {
    let (rank, size, hosts) = detached(py, || runtime::group(process_set))?;
    Ok(Group { rank, size, hosts })
}

#[pyfunction]
#[pyo3(signature = (process_set = 0))]
fn barrier(py: Python<'_>, process_set: SetId) -> PyResult<()> {
    detached(py, || runtime::barrier(process_set))
}

/// Take part in the others' sum and avg allreduces with zeros until every rank of
/// `process_set` has called it; returns the rank that called it last.
#[pyfunction]
#[pyo3(signature = (process_set = 0))]
fn join(py: Python<'_>, process_set: SetId) -> PyResult<usize> {
    detached(py, || runtime::join::join(process_set))
}

/// Add a process set of `ranks` (sorted, distinct) and return its id. Collective over
/// ringlet's communicator, with the same ranks everywhere.
#[pyfunction]
fn add_process_set(py: Python<'_>, ranks: Vec<usize>) -> PyResult<SetId> {
    detached(py, || runtime::add_process_set(&ranks))
}

/// Free a process set's communicator (local); False if there is no such set.
///
/// This and the other questions that take the runtime's lock let go of the GIL while they wait
/// for it: a collective holds the lock while it runs, and it may be waiting for another
/// Python thread of this process.
#[pyfunction]
fn remove_process_set(py: Python<'_>, process_set: SetId) -> PyResult<bool> {
    detached(py, || Ok(process::remove_process_set(process_set)))
}

/// Every process set and its ranks, the world's (id 0) first.
#[pyfunction]
fn process_sets(py: Python<'_>) -> PyResult<Vec<ProcessSetRanks>> {
    let sets = detached(py, process::process_sets)?;
    Ok(sets
        .into_iter()
        .map(|(id, ranks)| ProcessSetRanks { id, ranks })
        .collect())
}

/// (the MPI library's own description, the MPI ringlet was compiled against).
#[pyfunction]
fn mpi_library(py: Python<'_>) -> PyResult<(String, String)> {
    let running = detached(py, runtime::mpi_library::library_version)?;
    Ok((running, runtime::mpi_library::built_with()))
}

/// The communicator's settings; the keyword arguments change them first (the Python layer has
/// checked their types). `across_message_bytes_auto`: back to calibration's choice between
/// nodes.
#[pyfunction]
#[pyo3(signature = (
    segment_bytes=None,
    max_message_bytes=None,
    node_major_rings=None,
    across_message_bytes=None,
    across_message_bytes_auto=false,
))]
fn settings<'py>(
    py: Python<'py>,
    segment_bytes: Option<usize>,
    max_message_bytes: Option<usize>,
    node_major_rings: Option<bool>,
    across_message_bytes: Option<usize>,
    across_message_bytes_auto: bool,
) -> PyResult<Bound<'py, PyDict>> {
    // Some(None): back to calibration's choice; Some(Some(n)): the user's limit.
    let across = match (across_message_bytes, across_message_bytes_auto) {
        (_, true) => Some(None),
        (limit, false) => limit.map(Some),
    };
    let unchanged = segment_bytes.is_none()
        && max_message_bytes.is_none()
        && node_major_rings.is_none()
        && across.is_none();
    let (settings, checked) = detached(py, || {
        let settings = if unchanged {
            // A read need not wait for the queued collectives.
            runtime::settings()?
        } else {
            runtime::update_settings(|s| {
                s.tuning.segment_bytes = segment_bytes.unwrap_or(s.tuning.segment_bytes);
                s.max_message_bytes = max_message_bytes.unwrap_or(s.max_message_bytes);
                s.tuning.node_major = node_major_rings.unwrap_or(s.tuning.node_major);
                s.across_message_bytes = across.unwrap_or(s.across_message_bytes);
            })?
        };
        Ok((settings, runtime::is_checked()?))
    })?;
    settings_dict(py, &settings, checked)
}

/// The settings as `ringlet.settings()` returns them, with whether calls are `checked` (not a
/// setting one can change there, but what a layer that relies on the check must know).
fn settings_dict<'py>(
    py: Python<'py>,
    settings: &runtime::Settings,
    checked: bool,
) -> PyResult<Bound<'py, PyDict>> {
    let dict = PyDict::new(py);
    dict.set_item("segment_bytes", settings.tuning.segment_bytes)?;
    dict.set_item("max_message_bytes", settings.max_message_bytes)?;
    dict.set_item("across_message_bytes", settings.limits().across)?;
    dict.set_item(
        "across_message_bytes_auto",
        settings.across_message_bytes.is_none(),
    )?;
    dict.set_item("node_major_rings", settings.tuning.node_major)?;
    dict.set_item("consistency_check", checked)?;
    Ok(dict)
}

/// Put calibration's message limit between nodes in force (where the user set none); every
/// rank alike, as it is part of every call's check. Returns the settings.
#[pyfunction]
fn use_calibrated_message_limit(py: Python<'_>, limit: usize) -> PyResult<Bound<'_, PyDict>> {
    let (settings, checked) = detached(py, || {
        let settings = runtime::update_settings(|s| s.calibrated_across_bytes = limit)?;
        Ok((settings, runtime::is_checked()?))
    })?;
    settings_dict(py, &settings, checked)
}

/// How a thread waiting for MPI polls: spin for `spin_us`, then sleep between polls, each
/// sleep doubling up to `max_sleep_us` (0: yield instead). The keywords change it first;
/// returns (spin_us, max_sleep_us). Local to this process: it changes no message.
#[pyfunction]
#[pyo3(signature = (spin_us=None, max_sleep_us=None))]
fn wait_policy(spin_us: Option<u64>, max_sleep_us: Option<u64>) -> (u64, u64) {
    let (spin, sleep) = runtime::wait_policy();
    let spin = spin_us.map_or(spin, Duration::from_micros);
    let sleep = max_sleep_us.map_or(sleep, Duration::from_micros);
    if spin_us.is_some() || max_sleep_us.is_some() {
        runtime::set_wait_policy(spin, sleep);
    }
    (spin.as_micros() as u64, sleep.as_micros() as u64)
}

/// The common call without a detour through Python: `x` a NumPy array of a registered dtype,
/// `out` None (a new array), `x` itself (in place: C-contiguous, aligned, writeable) or another
/// array of `x`'s dtype and shape, ringlet initialized, and for "auto" the cost model
/// installed. Out of place, `x` is read where it is (C-contiguous and aligned; otherwise from a
/// copy made here). Returns the result, or None to let the Python layer take the call (it
/// validates everything and explains what is wrong). On a process set this rank is not in, or
/// one that is gone, the core refuses it before sending anything, in the words the Python layer
/// would use.
#[pyfunction]
#[pyo3(signature = (x, op, out, algorithm, process_set = 0))]
fn allreduce_fast<'py>(
    py: Python<'py>,
    x: &Bound<'py, PyAny>,
    op: &Bound<'py, PyAny>,
    out: Option<&Bound<'py, PyAny>>,
    algorithm: &Bound<'py, PyAny>,
    process_set: SetId,
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
    // The array given as `out`, if any: `x` itself, or another of its dtype and shape.
    let given = match out {
        None => None,
        Some(out) => match out.cast::<PyUntypedArray>() {
            Ok(out) if out.is(x) => Some(out.clone()),
            Ok(out) if out.shape() == array.shape() && known_dtype(&out.dtype()) == Some(dtype) => {
                Some(out.clone())
            }
            _ => return Ok(None),
        },
    };
    if !runtime::allreduce::ready(algorithm, dtype, op)
        || !process::is_initialized()
        || !process::caller_named()
    {
        return Ok(None);
    }
    let shape = array.shape();
    // Where the result goes, and what it is reduced from: in place (`out` is `x`); from `x`
    // where it is (C-contiguous and aligned) into `out` or a new array; else from a copy.
    // SAFETY: `x` is the caller's for the whole call; only read.
    let input = unsafe { readable_bytes(array, "allreduce") }.ok();
    let (target, source) = match (given, input) {
        (Some(target), _) if target.is(x) => (target, None),
        (Some(target), Some(input)) => (target, Some(input)),
        (Some(_), None) => return Ok(None),
        (None, Some(input)) => (new_like(py, array)?, Some(input)),
        (None, None) => (x.call_method0("copy")?.cast_into::<PyUntypedArray>()?, None),
    };
    // SAFETY: `target` stays alive (owned by this call or the caller) until we return.
    let Some(output) = (unsafe { writable_bytes(&target) }) else {
        return Ok(None);
    };
    if source.is_some_and(|input| overlap(input, output)) {
        return Ok(None); // the Python layer refuses it, on every rank
    }
    detached(py, || match source {
        Some(input) => runtime::allreduce::allreduce_into(
            input,
            output,
            dtype,
            op,
            shape,
            algorithm,
            process_set,
        ),
        None => runtime::allreduce::allreduce(output, dtype, op, shape, algorithm, process_set),
    })?;
    Ok(Some(target.into_any()))
}

/// A new C-contiguous array of `array`'s dtype and shape (and subclass, as `copy()` keeps it),
/// its contents unset.
fn new_like<'py>(
    py: Python<'py>,
    array: &Bound<'py, PyUntypedArray>,
) -> PyResult<Bound<'py, PyUntypedArray>> {
    // SAFETY: `array` is a live NumPy array; the call returns a new reference, or null with a
    // Python error set.
    let fresh = unsafe {
        let pointer = numpy::npyffi::PY_ARRAY_API.PyArray_NewLikeArray(
            py,
            array.as_array_ptr(),
            numpy::npyffi::NPY_ORDER::NPY_CORDER,
            std::ptr::null_mut(),
            1,
        );
        Bound::from_owned_ptr_or_err(py, pointer)?
    };
    Ok(fresh.cast_into::<PyUntypedArray>()?)
}

/// Whether two byte ranges share memory.
fn overlap(a: &[u8], b: &[u8]) -> bool {
    let (a, b) = (a.as_ptr_range(), b.as_ptr_range());
    !a.is_empty() && !b.is_empty() && a.start < b.end && b.start < a.end
}

/// Allreduce a C-contiguous, aligned, writeable array in place; `dtype` names its elements.
#[pyfunction]
#[pyo3(signature = (array, dtype, op, algorithm, process_set = 0))]
fn allreduce(
    py: Python<'_>,
    array: &Bound<'_, PyUntypedArray>,
    dtype: &str,
    op: &str,
    algorithm: &str,
    process_set: SetId,
) -> PyResult<()> {
    let (dtype, op) = (element_type(array, dtype)?, ReduceOp::from_name(op)?);
    // SAFETY: `array` is borrowed from the caller for the whole call.
    let bytes = unsafe { contiguous(array, "allreduce")? };
    let shape = array.shape();
    detached(py, || {
        runtime::allreduce::allreduce(bytes, dtype, op, shape, algorithm, process_set)
    })
}

/// Broadcast a C-contiguous, aligned, writeable array from `root`, in place; `dtype` is its
/// NumPy dtype's name (any dtype: broadcast moves bytes).
#[pyfunction]
#[pyo3(signature = (array, dtype, root, algorithm, process_set = 0))]
fn broadcast(
    py: Python<'_>,
    array: &Bound<'_, PyUntypedArray>,
    dtype: &str,
    root: usize,
    algorithm: &str,
    process_set: SetId,
) -> PyResult<()> {
    // SAFETY: `array` is borrowed from the caller for the whole call.
    let bytes = unsafe { contiguous(array, "broadcast")? };
    let shape = array.shape();
    let array = Array {
        bytes,
        dtype,
        shape,
    };
    detached(py, || {
        runtime::broadcast::broadcast(array, root, algorithm, process_set)
    })
}

/// Every rank's C-contiguous `array` (of NumPy dtype `dtype`), concatenated along the first
/// dimension: (the bytes as a uint8 array, rows per rank).
#[pyfunction]
#[pyo3(signature = (array, dtype, algorithm, process_set = 0))]
fn allgather<'py>(
    py: Python<'py>,
    array: &Bound<'py, PyUntypedArray>,
    dtype: &str,
    algorithm: &str,
    process_set: SetId,
) -> PyResult<(Bound<'py, PyAny>, Vec<usize>)> {
    // SAFETY: `array` is borrowed from the caller for the whole call, and only read.
    let input = unsafe { readable_bytes(array, "allgather")? };
    let (shape, itemsize) = (array.shape(), array.dtype().itemsize());
    let gathered = detached(py, || {
        runtime::allgather::allgather(input, dtype, itemsize, shape, algorithm, process_set)
    })?;
    let bytes = bytes_array(py, gathered.storage, gathered.bytes)?;
    Ok((bytes, gathered.counts))
}

/// Rank r's `splits[q]` rows of its C-contiguous `array` go to rank q: (what this rank
/// received, concatenated in rank order, as the bytes of a uint8 array; rows from each rank).
#[pyfunction]
#[pyo3(signature = (array, dtype, splits, algorithm, process_set = 0))]
fn alltoall<'py>(
    py: Python<'py>,
    array: &Bound<'py, PyUntypedArray>,
    dtype: &str,
    splits: Vec<usize>,
    algorithm: &str,
    process_set: SetId,
) -> PyResult<(Bound<'py, PyAny>, Vec<usize>)> {
    // SAFETY: `array` is borrowed from the caller for the whole call, and only read.
    let input = unsafe { readable_bytes(array, "alltoall")? };
    let (shape, itemsize) = (array.shape(), array.dtype().itemsize());
    let received = detached(py, || {
        runtime::alltoall::alltoall(
            input,
            dtype,
            itemsize,
            shape,
            &splits,
            algorithm,
            process_set,
        )
    })?;
    let bytes = bytes_array(py, received.storage, received.bytes)?;
    Ok((bytes, received.counts))
}

/// This rank's block (`counts[rank]` rows) of the reduction of `array` over all ranks, as the
/// bytes of a uint8 array.
#[pyfunction]
#[pyo3(signature = (array, dtype, op, counts, algorithm, process_set = 0))]
fn reduce_scatter<'py>(
    py: Python<'py>,
    array: &Bound<'py, PyUntypedArray>,
    dtype: &str,
    op: &str,
    counts: Vec<usize>,
    algorithm: &str,
    process_set: SetId,
) -> PyResult<Bound<'py, PyAny>> {
    let (dtype, op) = (element_type(array, dtype)?, ReduceOp::from_name(op)?);
    // SAFETY: `array` is borrowed from the caller for the whole call, and only read.
    let input = unsafe { readable_bytes(array, "reduce_scatter")? };
    let shape = array.shape();
    let block = detached(py, || {
        runtime::reduce_scatter::reduce_scatter(
            input,
            dtype,
            op,
            shape,
            &counts,
            algorithm,
            process_set,
        )
    })?;
    bytes_array(py, block.storage, block.bytes)
}

/// The reduction of `array` over all ranks, into `out` on `root` (a C-contiguous, aligned,
/// writeable array of `array`'s dtype and size; `array` itself for in place); the other ranks
/// pass None. True on the root.
#[pyfunction]
#[pyo3(signature = (array, dtype, op, root, algorithm, out, process_set = 0))]
#[allow(clippy::too_many_arguments)]
fn reduce(
    py: Python<'_>,
    array: &Bound<'_, PyUntypedArray>,
    dtype: &str,
    op: &str,
    root: usize,
    algorithm: &str,
    out: Option<&Bound<'_, PyUntypedArray>>,
    process_set: SetId,
) -> PyResult<bool> {
    let (dtype, op) = (element_type(array, dtype)?, ReduceOp::from_name(op)?);
    let shape = array.shape();
    let data = match out {
        Some(out) if out.is(array) => {
            // SAFETY: `array` is borrowed from the caller for the whole call.
            Data::InPlace(unsafe { contiguous(array, "reduce")? })
        }
        Some(out) => {
            // SAFETY: both are borrowed from the caller for the whole call; the Python layer
            // has checked that they do not overlap (out=x comes as the same object, above).
            let input = unsafe { readable_bytes(array, "reduce")? };
            // SAFETY: as for `input`.
            let out = unsafe { contiguous(out, "reduce's out")? };
            Data::Into(input, out)
        }
        // SAFETY: `array` is borrowed from the caller for the whole call, and only read.
        None => Data::Read(unsafe { readable_bytes(array, "reduce")? }),
    };
    detached(py, || {
        runtime::reduce::reduce(data, dtype, op, shape, root, algorithm, process_set)
    })
}

/// One simulated `collective` of `nbytes` with `algorithm` on ranks placed on the nodes
/// `labels` (see `ringlet.simulate`). `intra`, `inter` and `global_link` are (bandwidth in bytes per
/// second, latency in seconds); `groups` of consecutive nodes share a global link each;
/// `half_duplex`: a connection between ranks on different nodes carries one direction at a time.
#[pyfunction]
#[pyo3(signature = (collective, algorithm, labels, nbytes, intra, inter, gamma, overhead = 0.0, node_major = true, memory = f64::INFINITY, groups = 1, global_link = (f64::INFINITY, 0.0), half_duplex = false))]
#[allow(clippy::too_many_arguments)]
fn simulate(
    py: Python<'_>,
    collective: &str,
    algorithm: &str,
    labels: Vec<usize>,
    nbytes: usize,
    intra: (f64, f64),
    inter: (f64, f64),
    gamma: f64,
    overhead: f64,
    node_major: bool,
    memory: f64,
    groups: usize,
    global_link: (f64, f64),
    half_duplex: bool,
) -> PyResult<Simulated> {
    let network = Network {
        intra: Link {
            bandwidth: intra.0,
            latency: intra.1,
        },
        inter: Link {
            bandwidth: inter.0,
            latency: inter.1,
        },
        gamma,
        overhead,
        memory,
        groups,
        global: Link {
            bandwidth: global_link.0,
            latency: global_link.1,
        },
        half_duplex,
    };
    let outcome = detached(py, || {
        runtime::simulate(collective, algorithm, &labels, nbytes, node_major, &network)
    })?;
    let pairs = |v: &[[u64; 2]]| v.iter().map(|l| (l[0], l[1])).collect::<Vec<_>>();
    Ok(Simulated {
        seconds: outcome.seconds,
        link_bytes: pairs(&outcome.link_bytes),
        group_bytes: pairs(&outcome.group_bytes),
        sent: outcome.sent,
        bytes_within: outcome.bytes_within,
    })
}

/// The algorithms the simulator can run for `collective` (every registered one; some cannot
/// run outside MPI or shared memory, and say so when simulated).
#[pyfunction]
fn simulated_algorithms(collective: &str) -> PyResult<Vec<&'static str>> {
    Ok(runtime::simulated_algorithms(collective)?)
}

/// Take part in the check of a `collective` call that this rank refused, so the other ranks
/// raise too (naming `reason`) instead of waiting; the caller then raises its own error.
#[pyfunction]
#[pyo3(signature = (collective, reason, process_set = 0))]
fn refuse(py: Python<'_>, collective: &str, reason: String, process_set: SetId) -> PyResult<()> {
    detached(py, || runtime::refuse(collective, reason, process_set))
}

/// Install calibration's parameters (its JSON) for every `auto` decision; every rank the same.
#[pyfunction]
fn install_parameters(py: Python<'_>, json: &str) -> PyResult<()> {
    detached(py, || selection::install_parameters(json))
}

/// Forget the installed parameters (every rank alike); the next `auto` call installs them again.
#[pyfunction]
fn uninstall_parameters(py: Python<'_>) -> PyResult<()> {
    detached(py, selection::uninstall_parameters)
}

/// The installed parameters' JSON, or None before calibration installs them.
#[pyfunction]
fn installed_parameters() -> Option<String> {
    selection::installed_parameters()
}

/// The built-in parameters' JSON.
#[pyfunction]
fn default_parameters() -> String {
    selection::default_parameters()
}

/// `json` checked (`ValueError` naming what is wrong) and completed with the built-in values.
#[pyfunction]
fn check_parameters(json: &str) -> PyResult<String> {
    Ok(selection::check_parameters(json)?)
}

/// The limits calibration times for messages between nodes, the one kept unless another wins
/// first.
#[pyfunction]
fn message_limit_options() -> Vec<usize> {
    selection::message_limit_options()
}

/// Of `timed` (limit, seconds), the limit to keep.
#[pyfunction]
fn choose_message_limit(timed: Vec<(usize, f64)>) -> PyResult<usize> {
    selection::choose_message_limit(&timed)
        .ok_or_else(|| pyo3::exceptions::PyValueError::new_err("no limit was timed"))
}

/// The simulator's network with the model's `parameters` (JSON) for `dtype`: (inside a node,
/// between nodes) as (bandwidth in bytes per second, latency in seconds), gamma, and whether a
/// connection between nodes carries one direction at a time.
#[pyfunction]
fn simulated_network(parameters: &str, dtype: &str) -> PyResult<SimulatedNetwork> {
    let network = selection::network(parameters, DType::from_name(dtype)?)?;
    let link = |l: Link| (l.bandwidth, l.latency);
    Ok(SimulatedNetwork {
        intra: link(network.intra),
        inter: link(network.inter),
        gamma: network.gamma,
        half_duplex: network.half_duplex,
    })
}

/// A `collective` (an allreduce by default) of `nbytes` of `dtype` under `op` on
/// `process_set`: (what `auto` runs, what that rests on: "one rank" | "table" | "environment"
/// | "model", each candidate's row). `parameters`: JSON to price with instead of the installed
/// ones; `nodes`: a placement (a node label per rank) to price on instead of the
/// communicator's. Local.
#[pyfunction]
#[pyo3(signature = (
    nbytes, dtype, op, parameters=None, nodes=None, process_set=0, simulate_up_to=0,
    collective="allreduce"
))]
#[allow(clippy::too_many_arguments)]
fn explain(
    py: Python<'_>,
    nbytes: usize,
    dtype: &str,
    op: &str,
    parameters: Option<&str>,
    nodes: Option<Vec<usize>>,
    process_set: SetId,
    simulate_up_to: usize,
    collective: &str,
) -> PyResult<Explanation> {
    let question = selection::Question {
        collective,
        nbytes,
        dtype: DType::from_name(dtype)?,
        op: ReduceOp::from_name(op)?,
        parameters,
        nodes: nodes.as_deref(),
        simulate_up_to,
    };
    let explained = detached(py, || selection::explain(process_set, question))?;
    let basis = match explained.basis {
        Basis::OneRank => "one rank",
        Basis::Table { overridden: false } => "table",
        Basis::Table { overridden: true } => "environment",
        Basis::Model => "model",
    };
    let candidates = explained
        .candidates
        .iter()
        .map(|c| Candidate {
            algorithm: c.name.to_string(),
            model_seconds: c.prediction.model,
            correction: c.prediction.correction,
            predicted_seconds: c.prediction.seconds,
            simulated_seconds: c.simulated,
        })
        .collect();
    Ok(Explanation {
        choice: explained.choice.to_string(),
        basis: basis.to_string(),
        candidates,
    })
}

/// What `auto` learned online on `process_set`: per range it has played, (dtype, op, range
/// index, its largest message, algorithm it runs now, calls, tries of the runner-up, switches).
#[pyfunction]
#[pyo3(signature = (process_set = 0))]
fn auto_refinements(py: Python<'_>, process_set: SetId) -> PyResult<Vec<AutoRefinement>> {
    Ok(detached(py, || runtime::refinements(process_set))?
        .into_iter()
        .map(
            |(dtype, op, range_index, upper_bytes, algorithm, calls, tries, switches)| {
                AutoRefinement {
                    dtype: dtype.name().to_string(),
                    op: op.name().to_string(),
                    range_index,
                    upper_bytes,
                    algorithm: algorithm.to_string(),
                    calls,
                    tries,
                    switches,
                }
            },
        )
        .collect())
}

/// The registered algorithms of `collective`, in order.
#[pyfunction]
#[pyo3(signature = (collective="allreduce"))]
fn algorithms(collective: &str) -> PyResult<Vec<&'static str>> {
    Ok(runtime::algorithms(collective)?)
}

/// Whether `algorithm` reduces `dtype` with `op`: ("full" | "own_arithmetic" | "no", reason).
#[pyfunction]
fn algorithm_support(
    collective: &str,
    algorithm: &str,
    dtype: &str,
    op: &str,
) -> PyResult<(&'static str, &'static str)> {
    let (dtype, op) = (DType::from_name(dtype)?, ReduceOp::from_name(op)?);
    Ok(runtime::support(collective, algorithm, dtype, op)?)
}

/// `ValueError` (naming the algorithms that can) unless `algorithm` ("auto" or a registered
/// name) can reduce `dtype` with `op`.
#[pyfunction]
fn check_algorithm(collective: &str, algorithm: &str, dtype: &str, op: &str) -> PyResult<()> {
    let (dtype, op) = (DType::from_name(dtype)?, ReduceOp::from_name(op)?);
    Ok(runtime::check_algorithm(collective, algorithm, dtype, op)?)
}

/// `algorithm`'s cost model for `nbytes` on ranks that run on `nodes` (one label per rank;
/// equal labels share a node): (messages, bytes sent, bytes reduced) inside a node on the
/// busiest rank, then (messages, bytes) over the busiest node's link.
#[pyfunction]
fn algorithm_cost(
    collective: &str,
    algorithm: &str,
    nodes: Vec<usize>,
    nbytes: usize,
) -> PyResult<AlgorithmCost> {
    let Tiered { within, across } = runtime::cost(collective, algorithm, &nodes, nbytes)?;
    Ok(AlgorithmCost {
        within_messages: within.messages,
        within_bytes: within.bytes,
        within_reduced: within.reduced,
        across_messages: across.messages,
        across_bytes: across.bytes,
    })
}

/// Each rank's node in `process_set`, numbered by their lowest rank
/// (`MPI_COMM_TYPE_SHARED`, as the MPI library groups them).
#[pyfunction]
#[pyo3(signature = (process_set = 0))]
fn nodes(py: Python<'_>, process_set: SetId) -> PyResult<Vec<usize>> {
    detached(py, || runtime::nodes(process_set))
}

/// Every dtype the kernels reduce: its name, bytes per element, whether floating-point.
#[pyfunction]
fn dtypes() -> Vec<DTypeInfo> {
    DType::ALL
        .iter()
        .map(|d| DTypeInfo {
            name: d.name().to_string(),
            itemsize: d.size(),
            is_float: d.is_float(),
        })
        .collect()
}

#[pyfunction]
fn ops() -> Vec<&'static str> {
    ReduceOp::ALL.iter().map(|op| op.name()).collect()
}

/// This rank's median seconds to exchange `nbytes` with its partner on `tier`: "any" (rank
/// r ^ 1), "within" (a rank of the same node), "across" (a node's first rank with the next
/// node's, as a ring does), "pairs" (every rank with the rank of its index on node
/// n ^ `distance`, both ways at once) or "pairs_one_way" (the same, the lower node sending);
/// ranks without a partner idle. Collective.
#[pyfunction]
#[pyo3(signature = (nbytes, repeats, tier = "any", distance = 1))]
fn measure_sendrecv(
    py: Python<'_>,
    nbytes: usize,
    repeats: usize,
    tier: &str,
    distance: usize,
) -> PyResult<f64> {
    let tier = runtime::Tier::from_name(tier, distance)?;
    detached(py, || runtime::measure_sendrecv(nbytes, repeats, tier))
}

/// Median seconds to sum `nbytes` of `dtype` into an accumulator, in cache. Local.
#[pyfunction]
fn measure_combine(py: Python<'_>, dtype: &str, nbytes: usize, repeats: usize) -> PyResult<f64> {
    let dtype = DType::from_name(dtype)?;
    detached(py, || runtime::measure_combine(dtype, nbytes, repeats))
}

/// The SIMD level the reduction kernels run at: "generic", "avx2" or "avx512".
#[pyfunction]
fn kernel_level() -> &'static str {
    runtime::kernel_level()
}

/// Per algorithm: (calls, bytes, seconds) of this process's allreduces since the last reset.
#[pyfunction]
fn stats() -> Vec<AlgorithmStats> {
    runtime::stats()
        .into_iter()
        .map(|(name, u)| AlgorithmStats {
            algorithm: name.to_string(),
            calls: u.calls,
            bytes: u.bytes,
            seconds: u.seconds,
        })
        .collect()
}

#[pyfunction]
fn reset_stats() {
    runtime::reset_stats();
}

#[pyfunction]
fn set_stats_enabled(enabled: bool) {
    runtime::set_stats_enabled(enabled);
}

/// Key this thread's collectives by `key` (a hash of the Python thread's name) in the
/// consistency check, so that two threads' calls never pair up across ranks unnoticed.
#[pyfunction]
fn set_thread_key(key: u64) {
    process::set_caller_thread(key);
}

/// Refuse collective calls on threads not let through, saying `reason` (None: no more).
#[pyfunction]
#[pyo3(signature = (reason))]
fn set_exclusive(reason: Option<String>) {
    process::set_exclusive(reason);
}

/// Let this thread's collectives through while they are exclusive; the previous setting.
#[pyfunction]
fn let_through(on: bool) -> bool {
    process::let_through(on)
}

/// End every process of the job now (MPI_Abort on MPI_COMM_WORLD), e.g. after an unhandled
/// exception on one rank, which would otherwise leave the others waiting forever.
#[pyfunction]
fn abort(code: i32) {
    process::abort(code)
}

/// Tests only: a real panic inside the core, on this thread or the background thread.
#[cfg(feature = "test-hooks")]
#[pyfunction]
fn _test_panic(py: Python<'_>, in_background: bool) -> PyResult<()> {
    detached(py, || runtime::testing::panic(in_background))
}

/// Tests only: rank 0 sends `sent` bytes to rank 1, which expects `expected`.
#[cfg(feature = "test-hooks")]
#[pyfunction]
fn _test_wrong_length_message(py: Python<'_>, sent: usize, expected: usize) -> PyResult<()> {
    detached(py, || {
        runtime::testing::wrong_length_message(sent, expected)
    })
}

/// Whether `process_set` has the node's shared memory: (available, why not, worth a warning).
#[pyfunction]
#[pyo3(signature = (process_set = 0))]
fn shared_memory(py: Python<'_>, process_set: SetId) -> PyResult<SharedMemoryStatus> {
    let (available, reason, worth_warning) = detached(py, || runtime::shared::status(process_set))?;
    Ok(SharedMemoryStatus {
        available,
        reason,
        worth_warning,
    })
}

/// Why `algorithm` cannot run on `process_set`, or None if it can.
#[pyfunction]
#[pyo3(signature = (collective, algorithm, process_set = 0))]
fn algorithm_unavailable(
    collective: &str,
    algorithm: &str,
    process_set: SetId,
) -> PyResult<Option<String>> {
    Ok(runtime::unavailable(collective, algorithm, process_set)?)
}

/// `nbytes` of zeroed shared memory on every rank of `process_set` (collective).
#[pyfunction]
#[pyo3(signature = (nbytes, process_set = 0))]
fn shared_empty(py: Python<'_>, nbytes: usize, process_set: SetId) -> PyResult<SharedBuffer> {
    let array = detached(py, || runtime::shared::allocate(nbytes, process_set))?;
    Ok(SharedBuffer { array })
}

/// This rank's part of a shared allocation; NumPy arrays view it through
/// `__array_interface__` and keep it alive.
#[pyclass(frozen, module = "ringlet._core")]
pub struct SharedBuffer {
    array: runtime::shared::SharedArray,
}

#[pymethods]
impl SharedBuffer {
    #[getter]
    fn nbytes(&self) -> usize {
        self.array.len()
    }

    #[getter]
    fn __array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let interface = PyDict::new(py);
        interface.set_item("shape", (self.array.len(),))?;
        interface.set_item("typestr", "|u1")?;
        interface.set_item("data", (self.array.as_ptr() as usize, false))?;
        interface.set_item("version", 3)?;
        Ok(interface)
    }
}

#[pymodule(gil_used = true)]
mod _core {
    #[pymodule_export]
    use super::buffers::register_dtype;
    #[pymodule_export]
    use super::doorbell::{open_doorbell, Doorbell};
    #[pymodule_export]
    use super::errors::{MismatchError, ProcessFailedError, RingletError};
    #[pymodule_export]
    use super::handles::{
        allgather_async, allreduce_group, allreduce_group_async, allreduce_group_fast,
        broadcast_async, default_fusion_threshold, fusion_threshold_bytes, reduce_scatter_async,
        ArrayHandle, Handle,
    };
    #[pymodule_export]
    use super::rows::{
        AlgorithmCost, AlgorithmStats, AutoRefinement, Candidate, DTypeInfo, Explanation, Group,
        ProcessSetRanks, SharedMemoryStatus, Simulated, SimulatedNetwork, XlaDType,
    };
    #[pymodule_export]
    use super::xla::{xla_dtypes, xla_handlers};
    #[pymodule_export]
    use super::{
        abort, add_process_set, algorithm_cost, algorithm_support, algorithm_unavailable,
        algorithms, allgather, allreduce, allreduce_fast, alltoall, auto_refinements, barrier,
        broadcast, check_algorithm, check_parameters, choose_message_limit, default_parameters,
        dtypes, explain, finalize, group, init, install_parameters, installed_parameters,
        is_initialized, join, kernel_level, let_through, measure_combine, measure_sendrecv,
        message_limit_options, mpi_library, nodes, ops, process_sets, reduce, reduce_scatter,
        refuse, remove_process_set, reset_stats, set_exclusive, set_stats_enabled, set_thread_key,
        settings, shared_empty, shared_memory, shutdown, simulate, simulated_algorithms,
        simulated_network, stats, uninstall_parameters, use_calibrated_message_limit, wait_policy,
        SharedBuffer,
    };
    // Hooks that make the core fail on purpose, for the failure tests; not in a release.
    #[cfg(feature = "test-hooks")]
    #[pymodule_export]
    use super::{_test_panic, _test_wrong_length_message};
}
