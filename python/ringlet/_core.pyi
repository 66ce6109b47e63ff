"""Type stubs for ringlet's Rust extension (src/bindings), checked against it by stubtest."""

from typing import Any, final

import numpy as np
import numpy.typing as npt
from typing_extensions import disjoint_base

__all__ = [
    "AlgorithmCost",
    "AlgorithmStats",
    "ArrayHandle",
    "AutoRefinement",
    "Candidate",
    "DTypeInfo",
    "Doorbell",
    "Explanation",
    "Group",
    "Handle",
    "MismatchError",
    "ProcessFailedError",
    "ProcessSetRanks",
    "RingletError",
    "SharedBuffer",
    "SharedMemoryStatus",
    "Simulated",
    "SimulatedNetwork",
    "XlaDType",
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
    "allreduce_group",
    "allreduce_group_async",
    "allreduce_group_fast",
    "alltoall",
    "auto_refinements",
    "barrier",
    "broadcast",
    "broadcast_async",
    "check_algorithm",
    "check_parameters",
    "choose_message_limit",
    "default_fusion_threshold",
    "default_parameters",
    "dtypes",
    "explain",
    "finalize",
    "fusion_threshold_bytes",
    "group",
    "init",
    "install_parameters",
    "installed_parameters",
    "is_initialized",
    "join",
    "kernel_level",
    "let_through",
    "measure_combine",
    "measure_sendrecv",
    "message_limit_options",
    "mpi_library",
    "nodes",
    "open_doorbell",
    "ops",
    "process_sets",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_async",
    "refuse",
    "register_dtype",
    "remove_process_set",
    "reset_stats",
    "set_exclusive",
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

class ProcessFailedError(RingletError):
    """A rank of the communicator died (or the communicator was revoked because one did), under
    MPI's fault tolerance (ULFM): the survivors can go on without it (ringlet.elastic.run)."""

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

@final
class Doorbell:
    """A doorbell over a process set's ranks (runtime/doorbell.rs)."""

    def ring(self, value: int) -> None:
        """Wake every other member's wait, telling it ``value``."""
    def wait(self, timeout: float, longest_pause: float = 0.001) -> int | None:
        """The largest value rung since the last wait; None if interrupted or timed out."""
    def interrupt(self) -> None:
        """End this rank's wait now (or its next one at once)."""
    def close(self) -> None: ...

def open_doorbell(process_set: int = 0) -> Doorbell:
    """Collective over the set's members; needs MPI_THREAD_MULTIPLE."""

# Records: frozen, compared by value, fields read-only (src/bindings/rows.rs).

@final
class Group:
    """This rank's place in a process set."""

    @property
    def rank(self) -> int: ...
    @property
    def size(self) -> int: ...
    @property
    def hosts(self) -> list[str]:
        """Each rank's host, by rank."""

@final
class ProcessSetRanks:
    """A process set and its ranks (in ringlet's communicator)."""

    @property
    def id(self) -> int: ...
    @property
    def ranks(self) -> list[int]: ...

@final
class DTypeInfo:
    """One element type the kernels reduce."""

    @property
    def name(self) -> str: ...
    @property
    def itemsize(self) -> int: ...
    @property
    def is_float(self) -> bool: ...

@final
class XlaDType:
    """One element type the XLA handlers take, by NumPy name."""

    @property
    def name(self) -> str: ...
    @property
    def reducible(self) -> bool: ...

@final
class SharedMemoryStatus:
    """Whether the ranks of a process set share the node's memory."""

    @property
    def available(self) -> bool: ...
    @property
    def reason(self) -> str:
        """Why not ("" when available)."""
    @property
    def worth_warning(self) -> bool: ...

@final
class AlgorithmCost:
    """An algorithm's cost model for one call: inside a node on the busiest rank, and over
    the busiest node's link."""

    @property
    def within_messages(self) -> float: ...
    @property
    def within_bytes(self) -> float: ...
    @property
    def within_reduced(self) -> float: ...
    @property
    def across_messages(self) -> float: ...
    @property
    def across_bytes(self) -> float: ...

@final
class Candidate:
    """One candidate of an explained ``auto`` choice."""

    @property
    def algorithm(self) -> str: ...
    @property
    def model_seconds(self) -> float: ...
    @property
    def correction(self) -> float:
        """Measured over modelled seconds (1.0 until calibration measured it)."""
    @property
    def predicted_seconds(self) -> float: ...
    @property
    def simulated_seconds(self) -> float | None: ...

@final
class Explanation:
    """What ``auto`` runs for a call, what that rests on, and every candidate."""

    @property
    def choice(self) -> str: ...
    @property
    def basis(self) -> str:
        """"one rank" | "table" | "environment" | "model"."""
    @property
    def candidates(self) -> list[Candidate]: ...

@final
class AutoRefinement:
    """What ``auto`` learned online for one range of message sizes it has played."""

    @property
    def dtype(self) -> str: ...
    @property
    def op(self) -> str: ...
    @property
    def range_index(self) -> int: ...
    @property
    def upper_bytes(self) -> int: ...
    @property
    def algorithm(self) -> str: ...
    @property
    def calls(self) -> int: ...
    @property
    def tries(self) -> int: ...
    @property
    def switches(self) -> int: ...

@final
class AlgorithmStats:
    """One algorithm's allreduces in this process since the last reset."""

    @property
    def algorithm(self) -> str: ...
    @property
    def calls(self) -> int: ...
    @property
    def bytes(self) -> int: ...
    @property
    def seconds(self) -> float: ...

@final
class Simulated:
    """One simulated collective: (messages, bytes) per rank in ``sent``; (out, in) bytes per
    node's link in ``link_bytes`` and per group's global link in ``group_bytes``."""

    @property
    def seconds(self) -> float: ...
    @property
    def sent(self) -> list[tuple[int, int]]: ...
    @property
    def link_bytes(self) -> list[tuple[int, int]]: ...
    @property
    def bytes_within(self) -> int: ...
    @property
    def group_bytes(self) -> list[tuple[int, int]]: ...

@final
class SimulatedNetwork:
    """The simulator's network as the model's parameters price it: links as (bandwidth in
    bytes per second, latency in seconds)."""

    @property
    def intra(self) -> tuple[float, float]: ...
    @property
    def inter(self) -> tuple[float, float]: ...
    @property
    def gamma(self) -> float: ...
    @property
    def half_duplex(self) -> bool: ...

def init(comm_fortran_handle: int | None = None) -> tuple[bool, str]:
    """Initialize MPI if needed and set up ringlet's communicator.

    Returns (ringlet initialized MPI, granted thread level)."""

def is_initialized() -> bool: ...
def shutdown() -> None: ...
def finalize() -> bool: ...
def group(process_set: int = 0) -> Group:
    """This rank's place in `process_set` (0: ringlet's communicator)."""

def barrier(process_set: int = 0) -> None: ...
def join(process_set: int = 0) -> int:
    """Add zeros to the others' sum and avg allreduces until every rank has joined; the last."""

def add_process_set(ranks: list[int]) -> int:
    """Add a process set of `ranks` (sorted, distinct) and return its id. Collective."""

def remove_process_set(process_set: int) -> bool: ...
def process_sets() -> list[ProcessSetRanks]: ...
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
    x: object, op: object, out: object | None, algorithm: object, process_set: int = 0
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
) -> Simulated: ...
def simulated_algorithms(collective: str) -> list[str]: ...
def refuse(collective: str, reason: str, process_set: int = 0) -> None: ...
def allreduce_group(
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
    out: list[npt.NDArray[Any]] | None = None,
) -> None: ...
def allreduce_group_fast(
    arrays: object,
    op: str,
    fusion_threshold: int | None = None,
    process_set: int = 0,
    out: object | None = None,
) -> bool: ...
def fusion_threshold_bytes(value: int | None = None) -> int: ...
def default_fusion_threshold() -> int: ...
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
    out: list[npt.NDArray[Any]] | None = None,
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
def simulated_network(parameters: str, dtype: str) -> SimulatedNetwork: ...
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
) -> Explanation: ...

def auto_refinements(process_set: int = 0) -> list[AutoRefinement]: ...
def algorithms(collective: str = "allreduce") -> list[str]: ...
def check_algorithm(collective: str, algorithm: str, dtype: str, op: str) -> None: ...
def algorithm_support(collective: str, algorithm: str, dtype: str, op: str) -> tuple[str, str]: ...
def algorithm_cost(
    collective: str, algorithm: str, nodes: list[int], nbytes: int
) -> AlgorithmCost:
    """For ranks on ``nodes`` (a label each)."""

def nodes(process_set: int = 0) -> list[int]:
    """Each rank's node (MPI_COMM_TYPE_SHARED), numbered by the node's lowest rank."""

def dtypes() -> list[DTypeInfo]: ...
def ops() -> list[str]: ...
def wait_policy(spin_us: int | None = None, max_sleep_us: int | None = None) -> tuple[int, int]:
    """How a waiting thread polls MPI: (spin_us, max_sleep_us); the keywords change it first."""

def measure_sendrecv(
    nbytes: int, repeats: int, tier: str = "any", distance: int = 1
) -> float: ...
def measure_combine(dtype: str, nbytes: int, repeats: int) -> float: ...
def kernel_level() -> str: ...
def stats() -> list[AlgorithmStats]: ...
def reset_stats() -> None: ...
def set_stats_enabled(enabled: bool) -> None: ...
def set_thread_key(key: int) -> None: ...
def set_exclusive(reason: str | None) -> None:
    """Refuse collective calls on threads not let through, saying ``reason`` (None: no more)."""
def let_through(on: bool) -> bool:
    """Let this thread's collectives through while they are exclusive; the previous setting."""
def abort(code: int) -> None:
    """MPI_Abort on MPI_COMM_WORLD: ends every process of the job."""


# Only in builds with the `test-hooks` feature (the development build, which stubtest checks;
# not the wheel).
def _test_panic(in_background: bool) -> None: ...
def _test_wrong_length_message(sent: int, expected: int) -> None: ...

def shared_memory(process_set: int = 0) -> SharedMemoryStatus: ...
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
def xla_dtypes() -> list[XlaDType]: ...
