"""Bad input: a clear exception of the documented type, and the input left unchanged.

Every check happens before any communication, on every rank alike, so no rank is left waiting.
"""

from __future__ import annotations

import numpy as np
import pytest

import ringlet
from ringlet import _core


def test_unsupported_dtypes_raise_type_error_listing_the_supported_ones():
    for bad in [
        np.zeros(3, dtype=np.complex64),
        np.zeros(3, dtype=bool),
        np.zeros(3, dtype=np.uint8),
        np.zeros(3, dtype=np.int16),
        np.array(["a", "b"]),
        np.array([object(), object()]),
        np.zeros(3, dtype=[("a", np.float32)]),
    ]:
        with pytest.raises(TypeError, match=r"supported dtypes: float32, float64, float16"):
            ringlet.allreduce(bad)


def test_non_arrays_raise_type_error():
    with pytest.raises(TypeError, match=r"numpy.ndarray"):
        ringlet.allreduce([1.0, 2.0])  # type: ignore[arg-type]


@pytest.mark.parametrize("op", ["mean", "SUM", "", None, 3])
def test_unknown_op_raises_value_error(op):
    x = np.ones(4, dtype=np.float32)
    with pytest.raises(ValueError, match=r"unknown op .*accepted: 'sum', 'avg', 'min'"):
        ringlet.allreduce(x, op, out=x)
    assert (x == 1).all()


@pytest.mark.parametrize("algorithm", ["tree", "Ring", "", None])
def test_unknown_algorithm_raises_value_error(algorithm):
    x = np.ones(4, dtype=np.float32)
    with pytest.raises(ValueError, match=r"unknown algorithm .*accepted: 'auto', 'ring'"):
        ringlet.allreduce(x, algorithm=algorithm, out=x)
    assert (x == 1).all()


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_mpi_algorithm_refuses_sixteen_bit_floats(dtype):
    from mpi_fixtures import np_dtype

    x = np.ones(4, dtype=np_dtype(dtype))
    with pytest.raises(ValueError, match=r"MPI has no 16-bit float type"):
        ringlet.allreduce(x, algorithm="mpi", out=x)
    assert (x == 1).all()


def test_in_place_on_read_only_array_says_so():
    x = np.ones(8, dtype=np.float64)
    x.flags.writeable = False
    with pytest.raises(ValueError, match=r"in-place allreduce .* read-only"):
        ringlet.allreduce(x, out=x)
    assert (x == 1).all()


def test_in_place_on_non_contiguous_view_says_so():
    base = np.ones(16, dtype=np.float32)
    view = base[::2]
    with pytest.raises(ValueError, match=r"in-place allreduce .* not C-contiguous"):
        ringlet.allreduce(view, out=view)
    assert (base == 1).all()


def test_in_place_on_foreign_byte_order_says_so():
    x = np.ones(4, dtype=">f4")
    with pytest.raises(ValueError, match=r"byte order"):
        ringlet.allreduce(x, out=x)


def test_out_of_place_accepts_foreign_byte_order(size):
    x = np.arange(4, dtype=">f4")
    result = ringlet.allreduce(x)
    assert result.dtype.isnative and np.array_equal(result, np.arange(4) * size)


@pytest.mark.parametrize(
    "out",
    [
        np.empty(5, dtype=np.float32),
        np.empty((2, 2), dtype=np.float32),
        np.empty(4, dtype=np.float64),
    ],
)
def test_out_of_wrong_shape_or_dtype_raises_value_error(out):
    x = np.ones(4, dtype=np.float32)
    out[...] = 7
    with pytest.raises(ValueError, match=r"out must have x's dtype and shape"):
        ringlet.allreduce(x, out=out)
    assert (out == 7).all() and (x == 1).all()


def test_out_that_is_not_an_array_raises_value_error():
    with pytest.raises(ValueError, match=r"out must be a numpy.ndarray"):
        ringlet.allreduce(np.ones(3, dtype=np.float32), out=[0, 0, 0])  # type: ignore[arg-type]


def test_out_partly_overlapping_x_raises_value_error():
    base = np.arange(10, dtype=np.float64)
    with pytest.raises(ValueError, match=r"overlaps x"):
        ringlet.allreduce(base[:6], out=base[4:])
    assert np.array_equal(base, np.arange(10))


def test_non_contiguous_out_raises_value_error():
    out = np.zeros(8, dtype=np.float32)[::2]
    with pytest.raises(ValueError, match=r"out needs a C-contiguous"):
        ringlet.allreduce(np.ones(4, dtype=np.float32), out=out)


def test_the_core_rejects_bad_arguments_itself():
    """The bindings validate too, so a caller that skips the Python layer still gets errors."""
    buf = np.zeros(8, dtype=np.float32)
    with pytest.raises(TypeError, match=r"unsupported dtype"):
        _core.allreduce(buf, "complex64", "sum", "ring")
    with pytest.raises(ValueError, match=r"unknown op"):
        _core.allreduce(buf, "float32", "mean", "ring")
    with pytest.raises(ValueError, match=r"unknown algorithm"):
        _core.allreduce(buf, "float32", "sum", "tree")
    with pytest.raises(ValueError, match=r"elements are 1 bytes, not a float32's 4"):
        _core.allreduce(np.zeros(8, dtype=np.uint8), "float32", "sum", "ring")
    with pytest.raises(ValueError, match=r"C-contiguous, aligned, writeable"):
        _core.allreduce(np.zeros(9, dtype=np.float64)[::2], "float64", "sum", "ring")
    unaligned = np.zeros(17, dtype=np.uint8)[1:].view(np.float64)
    with pytest.raises(ValueError, match=r"C-contiguous, aligned, writeable"):
        _core.allreduce(unaligned, "float64", "sum", "ring")
    with pytest.raises(ValueError, match=r"C-contiguous, aligned, writeable"):
        _core.broadcast(np.zeros(8, dtype=np.float32)[::2], "float32", 0, "auto")


def test_misaligned_arrays_are_reduced_out_of_place_and_refused_in_place(size):
    unaligned = np.zeros(17, dtype=np.uint8)[1:].view(np.float64)
    unaligned[:] = [1.5, -2.0]
    assert not unaligned.flags.aligned
    assert np.array_equal(ringlet.allreduce(unaligned), np.array([1.5, -2.0]) * size)
    with pytest.raises(ValueError, match=r"not aligned"):
        ringlet.allreduce(unaligned, out=unaligned)


def test_a_panic_in_the_core_surfaces_as_ringlet_error_and_leaves_it_usable(size):
    """A real Rust panic (a test hook), on the calling thread and on the background thread."""
    with pytest.raises(ringlet.RingletError, match=r"internal error in ringlet's core: a test "
                                                   r"asked for a panic"):
        _core._test_panic(False)
    with pytest.raises(ringlet.RingletError, match=r"a queued collective panicked"):
        _core._test_panic(True)
    # Neither the locks nor the background thread are left broken.
    assert ringlet.allreduce(np.ones(3), "sum")[0] == size
    handle = ringlet.allreduce_async(np.ones(3), "sum")
    assert handle.wait()[0] == size
