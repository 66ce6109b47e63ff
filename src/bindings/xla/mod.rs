//! ringlet's collectives as XLA FFI handlers, for `ringlet.jax` inside `jax.jit`: each reads
//! XLA's buffers and attributes, calls the runtime (which checks and agrees on the call with
//! the other ranks and watches the wait, as for NumPy arrays), and turns an error into an XLA
//! error whose message starts with the Python exception's name (`ringlet.jax` raises that).
//!
//! The inputs are read where XLA keeps them; the results are written into the buffers XLA
//! allocated for them (which XLA may alias to the input, see `input_output_aliases`).

mod api;

use super::errors::PyKind;
use super::rows::XlaDType;
use crate::error::{CoreError, Result};
use crate::runtime::broadcast::Array;
use crate::runtime::grouped_allreduce::{Dims, Group, Shapes};
use crate::runtime::process::{self, SetId};
use crate::runtime::{self, DType, ReduceOp};
use api::{CallFrame, Error};
use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyDict};
use std::ffi::{c_void, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr::NonNull;

/// The caller key of every collective XLA runs (see `process::set_caller_thread`): XLA's
/// threads differ between ranks, and JAX's ordered effects already put the calls in program
/// order.
const XLA_CALLER: u64 = u64::from_le_bytes(*b"xla-ffi\0");

/// The handlers, by the target name `ringlet.jax` registers them under.
#[pyfunction]
pub fn xla_handlers(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let handlers: [(&str, api::Handler); 6] = [
        ("ringlet_allreduce", allreduce),
        ("ringlet_tree_allreduce", tree_allreduce),
        ("ringlet_broadcast", broadcast),
        ("ringlet_allgather", allgather),
        ("ringlet_reduce_scatter", reduce_scatter),
        ("ringlet_barrier", barrier),
    ];
    let dict = PyDict::new(py);
    for (name, handler) in handlers {
        let pointer = NonNull::new(handler as *mut c_void)
            .ok_or_else(|| pyo3::exceptions::PyRuntimeError::new_err("null handler"))?;
        // SAFETY: a function pointer, valid for the life of the process (the extension is never
        // unloaded); XLA calls it with a call frame.
        let capsule =
            unsafe { PyCapsule::new_with_pointer(py, pointer, c"xla._CUSTOM_CALL_TARGET") }?;
        dict.set_item(name, capsule)?;
    }
    Ok(dict)
}

/// The element types the handlers take, by NumPy name, and whether ringlet reduces each.
#[pyfunction]
pub fn xla_dtypes() -> Vec<XlaDType> {
    (0..64)
        .filter_map(element)
        .map(|e| XlaDType {
            name: e.name.to_string(),
            reducible: e.reducible.is_some(),
        })
        .collect()
}

unsafe extern "C" fn allreduce(frame: *mut CallFrame) -> *mut Error {
    // SAFETY: XLA passes a live call frame.
    unsafe { handle(frame, run_allreduce) }
}

unsafe extern "C" fn tree_allreduce(frame: *mut CallFrame) -> *mut Error {
    // SAFETY: XLA passes a live call frame.
    unsafe { handle(frame, run_tree_allreduce) }
}

unsafe extern "C" fn broadcast(frame: *mut CallFrame) -> *mut Error {
    // SAFETY: XLA passes a live call frame.
    unsafe { handle(frame, run_broadcast) }
}

unsafe extern "C" fn allgather(frame: *mut CallFrame) -> *mut Error {
    // SAFETY: XLA passes a live call frame.
    unsafe { handle(frame, run_allgather) }
}

unsafe extern "C" fn reduce_scatter(frame: *mut CallFrame) -> *mut Error {
    // SAFETY: XLA passes a live call frame.
    unsafe { handle(frame, run_reduce_scatter) }
}

unsafe extern "C" fn barrier(frame: *mut CallFrame) -> *mut Error {
    // SAFETY: XLA passes a live call frame.
    unsafe { handle(frame, |frame| runtime::barrier(frame.process_set()?)) }
}

/// In place where XLA aliased the result to the input (a value computed in the function),
/// otherwise from the input where it is into the result (an argument, which XLA keeps).
fn run_allreduce(frame: &Frame) -> Result<()> {
    let (input, mut output) = (frame.arg(0)?, frame.ret(0)?);
    let (dtype, op) = (input.reducible()?, frame.op()?);
    let (algorithm, set) = (frame.string("algorithm")?, frame.process_set()?);
    if output.data == input.data {
        let result = output.holding(&input)?;
        return runtime::allreduce::allreduce(result, dtype, op, &input.dims, algorithm, set);
    }
    let result = output.bytes_mut();
    if result.len() != input.len()? {
        return Err(internal("the result's size differs from the input's"));
    }
    runtime::allreduce::allreduce_into(
        input.bytes(),
        result,
        dtype,
        op,
        &input.dims,
        algorithm,
        set,
    )
}

/// Arrays of one dtype, fused as ringlet fuses gradients.
fn run_tree_allreduce(frame: &Frame) -> Result<()> {
    let count = frame.arguments();
    let mut shapes = Shapes::with_capacity(count);
    let mut results = Vec::with_capacity(count);
    let mut dtype = None;
    for index in 0..count {
        let (input, mut output) = (frame.arg(index)?, frame.ret(index)?);
        let this = input.reducible()?;
        if *dtype.get_or_insert(this) != this {
            return Err(internal("the arrays of a fused allreduce differ in dtype"));
        }
        shapes.push(Dims::from_slice(&input.dims));
        output.holding(&input)?;
        results.push(output);
    }
    let Some(dtype) = dtype else {
        return Ok(());
    };
    let group = Group {
        dtype,
        wire: dtype,
        op: frame.op()?,
        algorithm: frame.string("algorithm")?.to_string().into(),
        prescale: 1.0,
        postscale: 1.0,
        fusion_bytes: usize::try_from(frame.int("fusion_bytes")?).unwrap_or(0),
        pack_below: None,
        shapes,
        thread: XLA_CALLER,
        set: frame.process_set()?,
    };
    let mut arrays: Vec<&mut [u8]> = results.iter_mut().map(XlaArray::bytes_mut).collect();
    runtime::grouped_allreduce::allreduce_group(&mut arrays, &group)
}

fn run_broadcast(frame: &Frame) -> Result<()> {
    let (input, mut output) = (frame.arg(0)?, frame.ret(0)?);
    let root = usize::try_from(frame.int("root")?)
        .map_err(|_| CoreError::InvalidArgument("root must not be negative".into()))?;
    let dtype = input.element()?.name;
    let array = Array {
        bytes: output.holding(&input)?,
        dtype,
        shape: &input.dims,
    };
    runtime::broadcast::broadcast(
        array,
        root,
        frame.string("algorithm")?,
        frame.process_set()?,
    )
}

fn run_allgather(frame: &Frame) -> Result<()> {
    let (input, mut output) = (frame.arg(0)?, frame.ret(0)?);
    let element = input.element()?;
    let gathered = runtime::allgather::allgather(
        input.bytes(),
        element.name,
        element.size,
        &input.dims,
        frame.string("algorithm")?,
        frame.process_set()?,
    )?;
    // The counts are every rank's, so every rank refuses alike.
    let rows = input.dims.first().copied().unwrap_or(1);
    if gathered.counts.iter().any(|&count| count != rows) {
        return Err(CoreError::InvalidArgument(format!(
            "inside jax.jit, allgather needs the same shape on every rank (its result's shape \
             is fixed when it is traced); the ranks have {:?} rows",
            gathered.counts
        )));
    }
    output.fill(bytemuck::cast_slice(&gathered.storage), gathered.bytes)
}

fn run_reduce_scatter(frame: &Frame) -> Result<()> {
    let (input, mut output) = (frame.arg(0)?, frame.ret(0)?);
    let (dtype, op, set) = (input.reducible()?, frame.op()?, frame.process_set()?);
    let (_, size, _) = runtime::group(set)?;
    let rows = input.dims.first().copied().unwrap_or(1);
    let counts = vec![rows / size.max(1); size];
    let block = runtime::reduce_scatter::reduce_scatter(
        input.bytes(),
        dtype,
        op,
        &input.dims,
        &counts,
        frame.string("algorithm")?,
        set,
    )?;
    output.fill(bytemuck::cast_slice(&block.storage), block.bytes)
}

/// Answer XLA's questions, or run `body` on the frame, mapping errors and panics to XLA errors.
///
/// # Safety
/// `frame` is null or a live call frame of XLA's.
unsafe fn handle(frame: *mut CallFrame, body: fn(&Frame) -> Result<()>) -> *mut Error {
    // SAFETY: the caller's contract.
    let Some(frame) = (unsafe { frame.as_ref() }) else {
        return std::ptr::null_mut();
    };
    // SAFETY: XLA's frame, with its extension chain.
    if unsafe { answer_metadata(frame) } || frame.stage != api::STAGE_EXECUTE {
        return std::ptr::null_mut();
    }
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        process::as_caller(XLA_CALLER, || body(&Frame { frame }))
    }));
    let error = match outcome {
        Ok(Ok(())) => return std::ptr::null_mut(),
        Ok(Err(error)) => error,
        Err(_) => CoreError::Communication("internal error in ringlet's XLA handler".into()),
    };
    // SAFETY: the frame's API table is XLA's own.
    unsafe { xla_error(frame, &error) }
}

/// If XLA asks for the handler's metadata (instead of running it), give it and say so.
///
/// # Safety
/// `frame`'s extension chain is XLA's.
unsafe fn answer_metadata(frame: &CallFrame) -> bool {
    // SAFETY: XLA's extension pointer: null or a live extension.
    let Some(extension) = (unsafe { frame.extension_start.as_ref() }) else {
        return false;
    };
    if extension.kind != api::EXTENSION_METADATA {
        return false;
    }
    let extension = frame.extension_start as *mut api::MetadataExtension;
    // SAFETY: an extension of the metadata kind is a MetadataExtension, whose metadata XLA
    // owns and lets the handler fill in.
    if let Some(metadata) = unsafe { (*extension).metadata.as_mut() } {
        metadata.api_version = api::ApiVersion {
            struct_size: std::mem::size_of::<api::ApiVersion>(),
            extension_start: std::ptr::null_mut(),
            major_version: api::API_MAJOR,
            minor_version: api::API_MINOR,
        };
        metadata.traits = 0;
    }
    true
}

/// An XLA error that carries `error`, as "ExceptionName: message".
///
/// # Safety
/// `frame.api` is XLA's API table.
unsafe fn xla_error(frame: &CallFrame, error: &CoreError) -> *mut Error {
    let kind = PyKind::of(error);
    let text = format!("{}: {error}", kind.name()).replace('\0', " ");
    let message = CString::new(text).unwrap_or_default();
    // SAFETY: XLA's API table, valid during the call.
    let Some(create) = (unsafe { frame.api.as_ref() }).and_then(|api| api.error_create) else {
        return std::ptr::null_mut();
    };
    let mut args = api::ErrorCreateArgs {
        struct_size: std::mem::size_of::<api::ErrorCreateArgs>(),
        extension_start: std::ptr::null_mut(),
        message: message.as_ptr(),
        errc: match kind {
            PyKind::Value | PyKind::Type => api::CODE_INVALID_ARGUMENT,
            PyKind::Ringlet | PyKind::ProcessFailed | PyKind::Mismatch => api::CODE_INTERNAL,
        },
    };
    // SAFETY: XLA copies the message; `args` lives through the call.
    unsafe { create(&mut args) }
}

/// A call frame, read safely.
struct Frame<'a> {
    frame: &'a CallFrame,
}

impl Frame<'_> {
    fn arg(&self, index: usize) -> Result<XlaArray> {
        let args = &self.frame.args;
        // SAFETY: XLA's arguments: `size` types and pointers.
        unsafe { XlaArray::at(args.size, args.types, args.args, index, "argument") }
    }

    /// How many arguments are arrays (the ordered effect's token follows them).
    fn arguments(&self) -> usize {
        let total = usize::try_from(self.frame.args.size).unwrap_or(0);
        (0..total)
            .take_while(|&index| {
                self.arg(index)
                    .is_ok_and(|array| array.dtype != api::data_type::TOKEN)
            })
            .count()
    }

    fn ret(&self, index: usize) -> Result<XlaArray> {
        let rets = &self.frame.rets;
        // SAFETY: XLA's results: `size` types and pointers.
        unsafe { XlaArray::at(rets.size, rets.types, rets.rets, index, "result") }
    }

    /// The attribute `name`'s type and value pointer.
    fn attribute(&self, name: &str) -> Result<(i32, *const c_void)> {
        let attrs = &self.frame.attrs;
        for index in 0..usize::try_from(attrs.size).unwrap_or(0) {
            // SAFETY: XLA's attributes: `size` types, names and values.
            let (kind, span, value) = unsafe {
                (
                    *attrs.types.add(index),
                    &**attrs.names.add(index),
                    *attrs.attrs.add(index),
                )
            };
            // SAFETY: an attribute's name is `len` bytes at `ptr`.
            let bytes = unsafe { std::slice::from_raw_parts(span.ptr.cast::<u8>(), span.len) };
            if bytes == name.as_bytes() {
                return Ok((kind, value));
            }
        }
        Err(internal(&format!("no attribute {name:?}")))
    }

    fn string(&self, name: &str) -> Result<&str> {
        match self.attribute(name)? {
            (api::ATTR_STRING, value) => {
                // SAFETY: a string attribute's value is a ByteSpan.
                let span = unsafe { &*value.cast::<api::ByteSpan>() };
                // SAFETY: `len` bytes at `ptr`, alive for the call.
                let bytes = unsafe { std::slice::from_raw_parts(span.ptr.cast::<u8>(), span.len) };
                std::str::from_utf8(bytes).map_err(|_| internal("an attribute is not UTF-8"))
            }
            _ => Err(internal(&format!("attribute {name:?} is not a string"))),
        }
    }

    fn int(&self, name: &str) -> Result<i64> {
        match self.attribute(name)? {
            (api::ATTR_SCALAR, value) => {
                // SAFETY: a scalar attribute's value is a Scalar.
                let scalar = unsafe { &*value.cast::<api::Scalar>() };
                if scalar.dtype != api::data_type::S64 {
                    return Err(internal(&format!("attribute {name:?} is not an int64")));
                }
                // SAFETY: an int64 scalar's value points at 8 bytes.
                Ok(unsafe { scalar.value.cast::<i64>().read_unaligned() })
            }
            _ => Err(internal(&format!("attribute {name:?} is not a scalar"))),
        }
    }

    fn op(&self) -> Result<ReduceOp> {
        ReduceOp::from_name(self.string("op")?)
    }

    fn process_set(&self) -> Result<SetId> {
        SetId::try_from(self.int("process_set")?).map_err(|_| internal("bad process set id"))
    }
}

/// What an XLA element type is to ringlet: its NumPy name and size, and the dtype ringlet
/// reduces it as (if it can).
struct Element {
    name: &'static str,
    size: usize,
    reducible: Option<DType>,
}

/// The XLA element types ringlet moves; all but these six are moved, not reduced.
fn element(code: i32) -> Option<Element> {
    use api::data_type as t;
    let (name, size, reducible) = match code {
        t::F32 => ("float32", 4, Some(DType::F32)),
        t::F64 => ("float64", 8, Some(DType::F64)),
        t::F16 => ("float16", 2, Some(DType::F16)),
        t::BF16 => ("bfloat16", 2, Some(DType::BF16)),
        t::S32 => ("int32", 4, Some(DType::I32)),
        t::S64 => ("int64", 8, Some(DType::I64)),
        1 => ("bool", 1, None),
        2 => ("int8", 1, None),
        3 => ("int16", 2, None),
        6 => ("uint8", 1, None),
        7 => ("uint16", 2, None),
        8 => ("uint32", 4, None),
        9 => ("uint64", 8, None),
        15 => ("complex64", 8, None),
        18 => ("complex128", 16, None),
        _ => return None,
    };
    Some(Element {
        name,
        size,
        reducible,
    })
}

/// One of XLA's buffers: where, of what, and its shape.
struct XlaArray {
    data: *mut u8,
    dtype: i32,
    dims: Vec<usize>,
}

impl XlaArray {
    /// The `index`th of `size` buffers.
    ///
    /// # Safety
    /// `types` and `pointers` hold `size` entries of XLA's.
    unsafe fn at(
        size: i64,
        types: *const i32,
        pointers: *const *mut c_void,
        index: usize,
        what: &str,
    ) -> Result<Self> {
        if index >= usize::try_from(size).unwrap_or(0) {
            return Err(internal(&format!("no {what} {index}")));
        }
        // SAFETY: the caller's contract; `index` is in range.
        let (kind, pointer) = unsafe { (*types.add(index), *pointers.add(index)) };
        if kind != api::BUFFER {
            return Err(internal(&format!("{what} {index} is not a buffer")));
        }
        // SAFETY: a buffer entry points at an XLA_FFI_Buffer.
        let buffer = unsafe { &*pointer.cast::<api::Buffer>() };
        let rank = usize::try_from(buffer.rank).unwrap_or(0);
        let dims = if rank == 0 {
            Vec::new()
        } else {
            // SAFETY: `rank` dimensions at `dims`.
            unsafe { std::slice::from_raw_parts(buffer.dims, rank) }
                .iter()
                .map(|&d| usize::try_from(d).unwrap_or(0))
                .collect()
        };
        Ok(XlaArray {
            data: buffer.data.cast(),
            dtype: buffer.dtype,
            dims,
        })
    }

    fn element(&self) -> Result<Element> {
        element(self.dtype).ok_or_else(|| {
            CoreError::UnsupportedDtype(format!("XLA element type {} is not supported", self.dtype))
        })
    }

    fn reducible(&self) -> Result<DType> {
        let element = self.element()?;
        element.reducible.ok_or_else(|| {
            CoreError::UnsupportedDtype(format!("{} cannot be reduced", element.name))
        })
    }

    fn len(&self) -> Result<usize> {
        Ok(self.dims.iter().product::<usize>() * self.element()?.size)
    }

    fn bytes(&self) -> &[u8] {
        match self.len() {
            // SAFETY: XLA's buffer of this shape and type, alive and unchanged for the call.
            Ok(len) if len > 0 && !self.data.is_null() => unsafe {
                std::slice::from_raw_parts(self.data, len)
            },
            _ => &[],
        }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        match self.len() {
            // SAFETY: XLA's result buffer of this shape and type, the handler's alone for the
            // call.
            Ok(len) if len > 0 && !self.data.is_null() => unsafe {
                std::slice::from_raw_parts_mut(self.data, len)
            },
            _ => &mut [],
        }
    }

    /// This result buffer, holding a copy of `input` (none if XLA aliased them).
    fn holding(&mut self, input: &XlaArray) -> Result<&mut [u8]> {
        let (len, aliased) = (input.len()?, self.data == input.data);
        let result = self.bytes_mut();
        if result.len() != len {
            return Err(internal("the result's size differs from the input's"));
        }
        if !aliased {
            result.copy_from_slice(input.bytes());
        }
        Ok(result)
    }

    /// Write the first `len` bytes of `source` into this result buffer, which must be as long.
    fn fill(&mut self, source: &[u8], len: usize) -> Result<()> {
        let result = self.bytes_mut();
        match source.get(..len) {
            Some(data) if data.len() == result.len() => {
                result.copy_from_slice(data);
                Ok(())
            }
            _ => Err(internal("the result's size differs from the collective's")),
        }
    }
}

fn internal(what: &str) -> CoreError {
    CoreError::Communication(format!("ringlet's XLA handler: {what}"))
}
