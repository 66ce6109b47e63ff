"""``horovod.common.process_sets``: ringlet.hvd.tensorflow's process sets."""

from ringlet.hvd.tensorflow import (  # noqa: F401
    ProcessSet,
    add_process_set,
    global_process_set,
    remove_process_set,
)
