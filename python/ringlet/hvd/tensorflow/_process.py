"""Horovod's TensorFlow process functions: the size and rank as operations, barrier, join,
and the object collectives."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf

import ringlet

from .._api import api
from .._process_sets import global_process_set
from ._graph import checked_member, not_converted, run_op

__all__ = ["allgather_object", "barrier", "broadcast_object", "broadcast_object_fn", "join",
           "local_rank_op", "local_size_op", "process_set_included_op", "rank_op", "size_op"]


def _int_op(value: Callable[[], int], name: str) -> tf.Tensor:
    return tf.constant(value(), dtype=tf.int32, name=name)


def size_op(process_set_id: int = 0, name: Any = None) -> tf.Tensor:
    """The number of ranks (of the process set with this id) as an int32 tensor."""
    return _int_op(lambda: _sized(process_set_id)[0], name or "size")


def rank_op(name: Any = None) -> tf.Tensor:
    """This rank, as an int32 tensor."""
    return _int_op(ringlet.rank, name or "rank")


def local_size_op(name: Any = None) -> tf.Tensor:
    """The number of ranks on this host, as an int32 tensor."""
    return _int_op(api.local_size, name or "local_size")


def local_rank_op(name: Any = None) -> tf.Tensor:
    """This rank's index on its host, as an int32 tensor."""
    return _int_op(api.local_rank, name or "local_rank")


def process_set_included_op(process_set_id: int = 0, name: Any = None) -> tf.Tensor:
    """1 if this rank belongs to the process set with this id, else 0 (int32)."""
    return _int_op(lambda: _sized(process_set_id)[1], name or "process_set_included")


def _sized(process_set_id: int) -> tuple[int, int]:
    """(size, included) of the process set with this id."""
    if process_set_id == 0:
        return ringlet.size(), 1
    for added in ringlet.process_sets():
        if added.id == process_set_id:
            return len(added.ranks), int(ringlet.rank() in added.ranks)
    raise ValueError(f"no process set has id {process_set_id}")


@not_converted
def barrier(process_set: Any = global_process_set) -> Any:
    """Wait until every rank (of ``process_set``) has called it; in a graph, an operation."""
    checked_member(process_set)

    def compute() -> list[np.ndarray]:
        api.barrier(process_set)
        return [np.zeros((), np.int32)]

    if tf.executing_eagerly():
        api.barrier(process_set)
        return None
    return run_op(compute, [], [tf.int32], [tf.TensorShape([])], "RingletBarrier")[0]


@not_converted
def join() -> Any:
    """Until every rank has joined, add zeros to the others' Sum and Average allreduces;
    returns the rank that joined last (an int32 tensor, as Horovod's)."""

    def compute() -> list[np.ndarray]:
        return [np.array(api.join(), dtype=np.int32)]

    return run_op(compute, [], [tf.int32], [tf.TensorShape([])], "RingletJoin")[0]


def broadcast_object(obj: Any, root_rank: int = 0, session: Any = None, name: Any = None,
                     process_set: Any = global_process_set) -> Any:
    """``root_rank``'s picklable ``obj`` on every rank (eagerly)."""
    return api.broadcast_object(obj, root_rank, process_set=process_set)


def broadcast_object_fn(root_rank: int = 0, session: Any = None, name: Any = None,
                        process_set: Any = global_process_set) -> Callable[[Any], Any]:
    """A function that broadcasts its argument from ``root_rank``."""
    return lambda obj: broadcast_object(obj, root_rank, session, name, process_set)


def allgather_object(obj: Any, session: Any = None, name: Any = None,
                     process_set: Any = global_process_set) -> list[Any]:
    """Every rank's picklable ``obj``, as a list indexed by rank (eagerly)."""
    return api.allgather_object(obj, process_set=process_set)


