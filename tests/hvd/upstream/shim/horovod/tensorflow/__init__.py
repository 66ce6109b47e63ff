"""``horovod.tensorflow``: ringlet.hvd.tensorflow, re-exported whole."""

import ringlet.hvd.tensorflow as _ringlet
from ringlet.hvd.tensorflow import *  # noqa: F403

from . import util as util
from .util import _executing_eagerly as _executing_eagerly


def __getattr__(name: str):
    # Names outside __all__ (private helpers the tests poke at) are
    # ringlet's own, or ringlet's AttributeError.
    return getattr(_ringlet, name)
