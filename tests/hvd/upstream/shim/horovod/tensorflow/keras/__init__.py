"""``horovod.tensorflow.keras``: ringlet.hvd.tensorflow.keras, re-exported whole."""

import ringlet.hvd.tensorflow.keras as _ringlet
from ringlet.hvd.tensorflow.keras import *  # noqa: F403


def __getattr__(name: str):
    # hvd.callbacks and private helpers: ringlet's own.
    return getattr(_ringlet, name)
