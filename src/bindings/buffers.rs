//! NumPy arrays as the core's byte buffers: zero-copy views of their memory, their shapes, the
//! dtypes the fast path knows, and arrays made from buffers the core filled.

use crate::runtime::DType;
use numpy::npyffi::flags::{NPY_ARRAY_ALIGNED, NPY_ARRAY_C_CONTIGUOUS, NPY_ARRAY_WRITEABLE};
use numpy::PyUntypedArrayMethods;
use numpy::{IntoPyArray, PyArray1, PyArrayDescr, PyArrayDescrMethods, PyUntypedArray};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// The bytes of a C-contiguous, aligned, writeable NumPy array, or `None` if it is not one.
///
/// # Safety
/// The slice aliases the array's memory: the caller keeps `array` alive while using it, and
/// the array must not be resized or written by anyone else meanwhile (the documented contract
/// of every ringlet call, as of MPI's own buffers).
pub unsafe fn writable_bytes<'a>(array: &Bound<'_, PyUntypedArray>) -> Option<&'a mut [u8]> {
    // SAFETY: the caller's contract.
    unsafe { writable_elements(array, array.dtype().itemsize()) }
}

/// [`writable_bytes`] of an array whose elements are known to be `itemsize` bytes (it saves
/// a lookup of the dtype per array of a group).
///
/// # Safety
/// As for [`writable_bytes`].
pub unsafe fn writable_elements<'a>(
    array: &Bound<'_, PyUntypedArray>,
    itemsize: usize,
) -> Option<&'a mut [u8]> {
    let required = NPY_ARRAY_C_CONTIGUOUS | NPY_ARRAY_ALIGNED | NPY_ARRAY_WRITEABLE;
    // SAFETY: `array` is a live NumPy array, so its object header can be read.
    let fields = unsafe { &(*array.as_array_ptr()).fields };
    if fields.flags & required != required {
        return None;
    }
    let nbytes = array.len() * itemsize;
    if nbytes == 0 {
        return Some(&mut []);
    }
    // SAFETY: a C-contiguous array's data is `nbytes` bytes at `data`; the caller's contract
    // covers lifetime and exclusivity.
    Some(unsafe { std::slice::from_raw_parts_mut(fields.data.cast::<u8>(), nbytes) })
}

/// The bytes of a C-contiguous, aligned NumPy array (read-only ones too), or a `ValueError`.
///
/// # Safety
/// As for [`writable_bytes`]; the caller only reads the slice.
pub unsafe fn readable_bytes<'a>(
    array: &Bound<'_, PyUntypedArray>,
    what: &str,
) -> PyResult<&'a [u8]> {
    let required = NPY_ARRAY_C_CONTIGUOUS | NPY_ARRAY_ALIGNED;
    // SAFETY: `array` is a live NumPy array, so its object header can be read.
    let fields = unsafe { &(*array.as_array_ptr()).fields };
    if fields.flags & required != required {
        return Err(PyValueError::new_err(format!(
            "{what} needs a C-contiguous, aligned array"
        )));
    }
    let nbytes = array.len() * array.dtype().itemsize();
    if nbytes == 0 {
        return Ok(&[]);
    }
    // SAFETY: as in `writable_bytes`.
    Ok(unsafe { std::slice::from_raw_parts(fields.data.cast::<u8>(), nbytes) })
}

/// [`writable_bytes`] or a `ValueError` naming what needs it.
///
/// # Safety
/// As for [`writable_bytes`].
pub unsafe fn contiguous<'a>(
    array: &Bound<'_, PyUntypedArray>,
    what: &str,
) -> PyResult<&'a mut [u8]> {
    // SAFETY: the caller's contract.
    unsafe { writable_bytes(array) }.ok_or_else(|| {
        PyValueError::new_err(format!(
            "{what} needs a C-contiguous, aligned, writeable array"
        ))
    })
}

/// `name` as a reducible dtype, checked against the array's element size.
pub fn element_type(array: &Bound<'_, PyUntypedArray>, name: &str) -> PyResult<DType> {
    let dtype = DType::from_name(name)?;
    let itemsize = array.dtype().itemsize();
    if itemsize != dtype.size() {
        return Err(PyValueError::new_err(format!(
            "the array's elements are {itemsize} bytes, not a {name}'s {}",
            dtype.size()
        )));
    }
    Ok(dtype)
}

/// The first `bytes` bytes of `storage` as a new uint8 array, without a copy.
pub fn bytes_array(py: Python<'_>, storage: Vec<u64>, bytes: usize) -> PyResult<Bound<'_, PyAny>> {
    let words: Bound<'_, PyArray1<u64>> = storage.into_pyarray(py);
    let all = words.call_method1("view", ("uint8",))?;
    all.get_item(pyo3::types::PySlice::new(py, 0, bytes as isize, 1))
}

/// Dtype objects the Python layer has vetted, so the fast path can recognize them by identity
/// (bfloat16 has no fixed NumPy type number).
static KNOWN_DTYPES: Mutex<Vec<(Py<PyArrayDescr>, DType)>> = Mutex::new(Vec::new());

/// The descriptor last found in [`KNOWN_DTYPES`] and its dtype's index in [`DType::ALL`],
/// packed as `address << 8 | index` (0: none): most calls ask about the same dtype as the one
/// before, and a registered descriptor lives as long as the process (the table holds it).
static LAST_FOUND: AtomicUsize = AtomicUsize::new(0);

pub fn known_dtype(descr: &Bound<'_, PyArrayDescr>) -> Option<DType> {
    let address = descr.as_ptr() as usize;
    let last = LAST_FOUND.load(Ordering::Relaxed);
    if last != 0 && last >> 8 == address {
        return DType::ALL.get(last & 0xff).copied();
    }
    let known = KNOWN_DTYPES.lock().unwrap_or_else(|e| e.into_inner());
    let dtype = known
        .iter()
        .find(|(d, _)| d.as_ptr() == descr.as_ptr())
        .map(|(_, dtype)| *dtype)?;
    if let Some(index) = DType::ALL.iter().position(|&d| d == dtype) {
        if address < 1 << (usize::BITS - 8) {
            LAST_FOUND.store(address << 8 | index, Ordering::Relaxed);
        }
    }
    Some(dtype)
}

/// Tell the fast path that `descr` (a native-byte-order dtype object) holds `name` elements.
#[pyfunction]
pub fn register_dtype(descr: Bound<'_, PyArrayDescr>, name: &str) -> PyResult<()> {
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
