"""Type stubs for ringlet's Rust extension (src/bindings), checked against it by stubtest."""

from typing import Any, final

import numpy as np
import numpy.typing as npt
from typing_extensions import disjoint_base

__all__ = [
    "ArrayHandle",
    "Handle",
    "MismatchError",
    "RingletError",
    "SharedBuffer",
    "_test_panic",
    "_test_wrong_length_message",
    "abort",
    "add_process_set",
    "algorithm_cost",
    "algorithm_support",
    "algorithm_unavailable",
    "algorithms",
    "allgather",
    "allgather_async",
    "allreduce",
    "allreduce_fast",
    "allreduce_group_async",
    "alltoall",
    "auto_refinements",
    "barrier",
    "broadcast",
    "broadcast_async",
    "check_algorithm",
    "check_parameters",
    "choose_message_limit",
    "default_parameters",
    "dtypes",
    "explain",
    "finalize",
    "group",
    "init",
    "install_parameters",
    "installed_parameters",
    "is_initialized",
    "join",
    "kernel_level",
    "measure_combine",
    "measure_sendrecv",
    "message_limit_options",
    "mpi_library",
    "nodes",
    "ops",
    "process_sets",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_async",
    "refuse",
    "register_dtype",
    "remove_process_set",
    "reset_stats",
    "set_stats_enabled",
    "set_thread_key",
    "settings",
    "shared_empty",
    "shared_memory",
    "shutdown",
    "simulate",
    "simulated_algorithms",
    "simulated_network",
    "stats",
    "uninstall_parameters",
    "use_calibrated_message_limit",
    "wait_policy",
    "xla_dtypes",
    "xla_handlers",
]

class RingletError(RuntimeError):
    """A collective failed: MPI reported an error, or ringlet is not usable in this process."""

class MismatchError(RingletError):
    """Ranks disagree on the collective they are in (shape, dtype, op, algorithm or order)."""

@disjoint_base
class Handle:
    """A queued collective."""

    def done(self) -> bool: ...
    def wait(self) -> None: ...
    def timing(self) -> tuple[float, float] | None:
        """Once done: (seconds it waited in the queue, seconds it ran)."""

@final
class ArrayHandle(Handle):
    """A queued collective that produces a new array."""

    def result(self) -> tuple[npt.NDArray[np.uint8], list[int]]:
        """After wait(): (the bytes, rows from each rank); once only."""

def init(comm_fortran_handle: int | None = None) -> tuple[bool, str]:
    """Initialize MPI if needed and set up ringlet's communicator.

    Returns (ringlet initialized MPI, granted thread level)."""

def is_initialized() -> bool: ...
def shutdown() -> None: ...
def finalize() -> bool: ...
def group(process_set: int = 0) -> tuple[int, int, list[str]]:
    """(rank, size, each rank's host) in `process_set` (0: ringlet's communicator)."""

def barrier(process_set: int = 0) -> None: ...
def join(process_set: int = 0) -> int:
    """Add zeros to the others' sum and avg allreduces until every rank has joined; the last."""

def add_process_set(ranks: list[int]) -> int:
    """Add a process set of `ranks` (sorted, distinct) and return its id. Collective."""

def remove_process_set(process_set: int) -> bool: ...
def process_sets() -> list[tuple[int, list[int]]]: ...
def mpi_library() -> tuple[str, str]:
    """(the MPI library's own description, the MPI ringlet was compiled against)."""

def settings(
    segment_bytes: int | None = None,
    max_message_bytes: int | None = None,
    node_major_rings: bool | None = None,
    across_message_bytes: int | None = None,
    across_message_bytes_auto: bool = False,
) -> dict[str, int | bool]: ...
def use_calibrated_message_limit(limit: int) -> dict[str, int | bool]: ...
def allreduce_fast(
    x: object, op: object, out: object | None, algorithm: object
) -> npt.NDArray[Any] | None:
    """The common call in Rust; None means the Python layer must take it."""

def allreduce(
    array: npt.NDArray[Any], dtype: str, op: str, algorithm: str, process_set: int = 0
) -> None:
    """Allreduce a C-contiguous, aligned, writeable array in place; `dtype` names its elements."""

def broadcast(
    array: npt.NDArray[Any], dtype: str, root: int, algorithm: str, process_set: int = 0
) -> None: ...
def allgather(
    array: npt.NDArray[Any], dtype: str, algorithm: str, process_set: int = 0
) -> tuple[npt.NDArray[np.uint8], list[int]]: ...
def alltoall(
    array: npt.NDArray[Any], dtype: str, splits: list[int], algorithm: str, process_set: int = 0
) -> tuple[npt.NDArray[np.uint8], list[int]]: ...
def reduce_scatter(
    array: npt.NDArray[Any],
    dtype: str,
    op: str,
    counts: list[int],
    algorithm: str,
    process_set: int = 0,
) -> npt.NDArray[np.uint8]: ...
def reduce(
    array: npt.NDArray[Any],
    dtype: str,
    op: str,
    root: int,
    algorithm: str,
    out: npt.NDArray[Any] | None,
    process_set: int = 0,
) -> bool: ...
def simulate(
    collective: str,
    algorithm: str,
    labels: list[int],
    nbytes: int,
    intra: tuple[float, float],
    inter: tuple[float, float],
    gamma: float,
    overhead: float = 0.0,
    node_major: bool = True,
    memory: float = ...,
    groups: int = 1,
    global_link: tuple[float, float] = ...,
    half_duplex: bool = False,
) -> tuple[float, list[tuple[int, int]], list[tuple[int, int]], int, list[tuple[int, int]]]: ...
def simulated_algorithms(collective: str) -> list[str]: ...
def refuse(collective: str, reason: str, process_set: int = 0) -> None: ...
def allreduce_group_async(
    arrays: list[npt.NDArray[Any]],
    dtype: str,
    wire_dtype: str,
    op: str,
    algorithm: str,
    prescale: float,
    postscale: float,
    fusion_bytes: int,
    pack_below: int | None = None,
    process_set: int = 0,
) -> Handle: ...
def allgather_async(
    array: npt.NDArray[Any], dtype: str, algorithm: str, process_set: int = 0
) -> ArrayHandle: ...
def reduce_scatter_async(
    array: npt.NDArray[Any],
    dtype: str,
    op: str,
    counts: list[int],
    algorithm: str,
    process_set: int = 0,
) -> ArrayHandle: ...
def broadcast_async(
    array: npt.NDArray[Any], dtype: str, root: int, algorithm: str, process_set: int = 0
) -> Handle: ...
def register_dtype(descr: np.dtype[Any], name: str) -> None: ...
def install_parameters(json: str) -> None: ...
def installed_parameters() -> str | None: ...
def uninstall_parameters() -> None: ...
def default_parameters() -> str: ...
def check_parameters(json: str) -> str: ...
def message_limit_options() -> list[int]: ...
def simulated_network(
    parameters: str, dtype: str
) -> tuple[tuple[float, float], tuple[float, float], float, bool]: ...
def choose_message_limit(timed: list[tuple[int, float]]) -> int: ...
def explain(
    nbytes: int,
    dtype: str,
    op: str,
    parameters: str | None = None,
    nodes: list[int] | None = None,
    process_set: int = 0,
    simulate_up_to: int = 0,
    collective: str = "allreduce",
) -> tuple[str, str, list[tuple[str, float, float, float, float | None]]]:
    """(what auto runs, what that rests on, per candidate: (algorithm, model seconds,
    measured/model, predicted seconds, simulated seconds or None))."""

def auto_refinements(
    process_set: int = 0,
) -> list[tuple[str, str, int, int, str, int, int, int]]: ...
def algorithms(collective: str = "allreduce") -> list[str]: ...
def check_algorithm(collective: str, algorithm: str, dtype: str, op: str) -> None: ...
def algorithm_support(collective: str, algorithm: str, dtype: str, op: str) -> tuple[str, str]: ...
def algorithm_cost(
    collective: str, algorithm: str, nodes: list[int], nbytes: int
) -> tuple[float, float, float, float, float]:
    """(messages, bytes sent, bytes reduced) inside a node on the busiest rank, then
    (messages, bytes) over the busiest node's link, for ranks on ``nodes`` (a label each)."""

def nodes(process_set: int = 0) -> list[int]:
    """Each rank's node (MPI_COMM_TYPE_SHARED), numbered by the node's lowest rank."""

def dtypes() -> list[tuple[str, int, bool]]: ...
def ops() -> list[str]: ...
def wait_policy(spin_us: int | None = None, max_sleep_us: int | None = None) -> tuple[int, int]:
    """How a waiting thread polls MPI: (spin_us, max_sleep_us); the keywords change it first."""

def measure_sendrecv(
    nbytes: int, repeats: int, tier: str = "any", distance: int = 1
) -> float: ...
def measure_combine(dtype: str, nbytes: int, repeats: int) -> float: ...
def kernel_level() -> str: ...
def stats() -> list[tuple[str, int, int, float]]: ...
def reset_stats() -> None: ...
def set_stats_enabled(enabled: bool) -> None: ...
def set_thread_key(key: int) -> None: ...
def abort(code: int) -> None:
    """MPI_Abort on MPI_COMM_WORLD: ends every process of the job."""


# Only in builds with the `test-hooks` feature (the development build, which stubtest checks;
# not the wheel).
def _test_panic(in_background: bool) -> None: ...
def _test_wrong_length_message(sent: int, expected: int) -> None: ...

def shared_memory(process_set: int = 0) -> tuple[bool, str, bool]:
    """(the ranks share the node's memory, why not, whether that deserves a warning)."""
def algorithm_unavailable(
    collective: str, algorithm: str, process_set: int = 0
) -> str | None: ...
def shared_empty(nbytes: int, process_set: int = 0) -> SharedBuffer:
    """``nbytes`` of zeroed shared memory on every rank (collective)."""

@final
class SharedBuffer:
    """This rank's part of a shared allocation, viewed by NumPy (``__array_interface__``)."""

    @property
    def nbytes(self) -> int: ...
    @property
    def __array_interface__(self) -> dict[str, Any]: ...

# XLA FFI handlers for ringlet.jax: target name -> PyCapsule of the handler.
def xla_handlers() -> dict[str, Any]: ...
def xla_dtypes() -> list[tuple[str, bool]]: ...
