"""Horovod's elastic API (``hvd.elastic``) for NumPy: ``run``, ``State``, ``ObjectState``,
``HostsUpdatedInterrupt``, over ``ringlet.elastic``. ``ringlet.hvd.torch.elastic`` adds
``TorchState`` and ``ElasticSampler``; ``ringlet.hvd.tensorflow.elastic`` and
``ringlet.hvd.keras.elastic`` the TensorFlow and Keras states."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ringlet.elastic
from ringlet.elastic import HostsUpdatedInterrupt, State, StateError, run

from ._api import api
from ._ops import HorovodInternalError


class ObjectState(ringlet.elastic.ObjectState):
    """Keyword arguments as attributes, synchronized through ``ringlet.hvd``'s
    ``broadcast_object`` (Horovod's ``ObjectState``; its two functions may be given)."""

    def __init__(self, bcast_object: Callable[[Any], Any] | None = None,
                 get_rank: Callable[[], int] | None = None, **kwargs: Any) -> None:
        super().__init__(bcast_object or (lambda obj: api.broadcast_object(obj, 0)),
                         get_rank or api.rank, **kwargs)

__all__ = ["HorovodInternalError", "HostsUpdatedInterrupt", "ObjectState", "State",
           "StateError", "run"]
