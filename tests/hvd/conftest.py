"""``ringlet.hvd``'s matching per module: ``hvd_initialized`` starts a module as a Horovod
script starts (``hvd.init()``: by name, unless RINGLET_HVD_MATCHING says otherwise), and name
matching ends with the module that started it: otherwise its negotiation would outlive the
module, and its cycles could meet a later module's own collectives (ringlet's API, called from
the test's thread) in another order on another rank."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import ringlet
import ringlet.hvd as hvd
from ringlet.hvd._api import use_matching
from ringlet.hvd._state import state


@pytest.fixture(autouse=True, scope="module")
def _no_negotiation_after_the_module() -> Iterator[None]:
    yield
    if ringlet.is_initialized() and state.negotiator is not None:
        try:
            hvd.barrier()  # every rank level first: the first to stop would fail the others' ops
        finally:
            use_matching("order")


@pytest.fixture(scope="module")
def hvd_initialized() -> None:
    """``hvd.init()`` once, before the module's first test (``pytestmark``)."""
    hvd.init()
