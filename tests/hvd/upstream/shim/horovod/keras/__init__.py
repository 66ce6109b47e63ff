"""``horovod.keras``: ringlet.hvd.keras, re-exported whole."""

import ringlet.hvd.keras as _ringlet
from ringlet.hvd.keras import *  # noqa: F403


def __getattr__(name: str):
    return getattr(_ringlet, name)
