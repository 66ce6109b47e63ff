"""What both files of tests/ulfm need: this Python's Open MPI must have ULFM, or the tests
fail (they are never skipped: make test-ulfm runs them in .venv-ompi5, whose Open MPI has)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent


def require_ulfm() -> None:
    try:
        info = subprocess.run([str(BIN / "ompi_info")], capture_output=True, text=True).stdout
    except OSError:
        info = ""  # no Open MPI beside this Python
    if "FT MPI support: yes" not in info:
        pytest.fail(f"{sys.executable}'s Open MPI has no ULFM (ompi_info does not say "
                    "'FT MPI support: yes'): run these tests with make test-ulfm, in "
                    ".venv-ompi5", pytrace=False)
