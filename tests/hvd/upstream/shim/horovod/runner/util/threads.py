"""``horovod.runner.util.threads.in_thread``, which tests/hvd/upstream/common.py imports."""

import threading
from typing import Any, Callable


def in_thread(target: Callable[..., Any], args: tuple = (), name: Any = None,
              daemon: bool = True, silent: bool = False) -> threading.Thread:
    """Run target(*args) in a started background thread (silent: swallow its exceptions)."""
    if not isinstance(args, tuple):
        raise ValueError(f"args must be a tuple, not {type(args)}, "
                         "for a single argument use (arg,)")

    def quiet(*a: Any) -> None:
        try:
            target(*a)
        except Exception:
            pass

    thread = threading.Thread(target=quiet if silent else target, args=args, name=name,
                              daemon=daemon)
    thread.start()
    return thread
