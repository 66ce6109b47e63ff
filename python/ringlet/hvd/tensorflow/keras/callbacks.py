"""``ringlet.hvd.tensorflow.keras.callbacks``: ``ringlet.hvd.keras.callbacks`` (Horovod's
``horovod.tensorflow.keras.callbacks``)."""

from ringlet.hvd.keras.callbacks import *  # noqa: F403
from ringlet.hvd.keras.callbacks import __all__ as __all__
