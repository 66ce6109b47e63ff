"""``import ringlet.hvd.tensorflow.keras as hvd``: Horovod's ``horovod.tensorflow.keras``, which is
``ringlet.hvd.keras`` (Keras 3, on any backend; this name for scripts that import Horovod's)."""

from ringlet.hvd.keras import *  # noqa: F403
from ringlet.hvd.keras import __all__ as __all__
from ringlet.hvd.keras import callbacks as callbacks
from ringlet.hvd.keras import elastic as elastic
