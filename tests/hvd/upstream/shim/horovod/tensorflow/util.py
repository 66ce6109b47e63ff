"""``horovod.tensorflow.util``: the one helper the tests import, as Horovod defines it."""

from tensorflow.python.eager import context


def _executing_eagerly() -> bool:
    """True when TensorFlow executes eagerly (Horovod's test helper for graph/eager branches)."""
    return context.executing_eagerly()
