"""What the Jupyter tests on the emulated cluster run on their MPI engines (ipyparallel sends
`@interactive` functions by value, so the engines need not import this module)."""

from __future__ import annotations

from ipyparallel import interactive


@interactive
def allreduce_of_ranks():
    import numpy as np

    import ringlet

    x = np.arange(1000, dtype=np.float32) + ringlet.rank()
    return ringlet.allreduce(x, algorithm="two_tier"), ringlet.allreduce(x, algorithm="ring")


@interactive
def mismatched():
    import numpy as np

    import ringlet

    return ringlet.allreduce(np.ones(3 + ringlet.rank(), np.float64))
