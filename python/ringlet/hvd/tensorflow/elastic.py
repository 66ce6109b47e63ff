"""Horovod's elastic API for TensorFlow 2 (``hvd.elastic`` after ``import
ringlet.hvd.tensorflow as hvd``): ``run``, ``TensorFlowKerasState`` (a Keras model and its
optimizer) and ``TensorFlowState`` (a list of variables), as ``horovod.tensorflow.elastic``."""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf

from ringlet.elastic import HostsUpdatedInterrupt, State, StateError, run

from .._ops import HorovodInternalError
from ..elastic import ObjectState
from ..keras.elastic import KerasState
from ._collectives import broadcast_variables

__all__ = ["HorovodInternalError", "HostsUpdatedInterrupt", "ObjectState", "State",
           "StateError", "TensorFlowKerasState", "TensorFlowState", "run"]


class TensorFlowKerasState(KerasState):
    """A built Keras model and its optimizer (Keras 3, TensorFlow's backend), and any other
    values as attributes. Horovod's ``TensorFlowKerasState``."""


class TensorFlowState(ObjectState):
    """TensorFlow variables (``variables``; TensorFlow 2 has no global ones to default to)
    and any other values as attributes: ``save`` copies the variables' values, ``restore``
    assigns them back, ``sync`` broadcasts rank 0's. Horovod's ``TensorFlowState``."""

    def __init__(self, variables: Any = None, session: Any = None, **kwargs: Any) -> None:
        if session is not None:
            raise ValueError("TensorFlowState(session=...) is TensorFlow 1's; ringlet.hvd."
                             "tensorflow runs TensorFlow 2 eagerly and in tf.function")
        self.variables = list(variables if variables is not None
                              else tf.compat.v1.global_variables())
        if not self.variables:
            raise ValueError("TensorFlowState needs the variables to keep: TensorFlowState("
                             "variables=model.variables, ...)")
        self._save_variables()
        super().__init__(**kwargs)

    def _save_variables(self) -> None:
        self._values = [np.array(v.numpy()) for v in self.variables]

    def save(self) -> None:
        self._save_variables()
        super().save()

    def restore(self) -> None:
        for variable, value in zip(self.variables, self._values, strict=True):
            variable.assign(value)
        super().restore()

    def sync(self) -> None:
        broadcast_variables(self.variables, root_rank=0)
        self._save_variables()
        super().sync()

    def snapshot(self) -> bytes:
        return self.serializer()()

    def serializer(self) -> Callable[[], bytes]:
        # The saved values are fresh copies: serialized later, on the commit thread.
        values = self._values
        objects = pickle.dumps(self._saved_state, protocol=pickle.HIGHEST_PROTOCOL)
        return lambda: pickle.dumps({"variables": values, "objects": objects},
                                    protocol=pickle.HIGHEST_PROTOCOL)

    def load_snapshot(self, payload: bytes) -> None:
        saved = pickle.loads(payload)
        self._values, self._saved_state = saved["variables"], pickle.loads(saved["objects"])
        self.restore()
