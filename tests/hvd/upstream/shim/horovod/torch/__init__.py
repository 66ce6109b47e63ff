"""``horovod.torch``: ringlet.hvd.torch, re-exported whole."""

import ringlet.hvd.torch as _ringlet
from ringlet.hvd.torch import *  # noqa: F403


def __getattr__(name: str):
    # Names outside __all__ (private helpers) are ringlet's own, or
    # ringlet's AttributeError.
    return getattr(_ringlet, name)
