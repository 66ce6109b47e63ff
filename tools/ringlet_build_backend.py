"""ringlet's PEP 517 backend: maturin's, building in a cargo target directory of its MPI.

`pip install .` and `pip install -e .` build in target/mpi/<key>, where <key> names the MPI
the build compiles against (tools/mpi_build_key.py: `$MPICC`, else `mpicc`, ...), so that
switching MPI never links one MPI's libmpi with code compiled for another. A CARGO_TARGET_DIR
(or CARGO_BUILD_TARGET_DIR) set by the user is left alone.
"""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path
from typing import Any, Callable

import maturin
from maturin import (  # noqa: F401  (the hooks that build nothing, as maturin has them)
    build_sdist,
    get_requires_for_build_editable,
    get_requires_for_build_sdist,
    get_requires_for_build_wheel,
    prepare_metadata_for_build_editable,
    prepare_metadata_for_build_wheel,
)
from mpi_build_key import target_dir


def keyed(hook: Callable[..., Any]) -> Callable[..., Any]:
    """`hook` with CARGO_TARGET_DIR set to this MPI's directory (the hooks run in the project
    directory)."""

    @functools.wraps(hook)
    def build(*args: Any, **kwargs: Any) -> Any:
        chosen = os.environ.get("CARGO_TARGET_DIR") or os.environ.get("CARGO_BUILD_TARGET_DIR")
        if not chosen:
            chosen = os.environ["CARGO_TARGET_DIR"] = str(target_dir(Path.cwd().resolve()))
        print(f"ringlet: cargo target directory {chosen}", file=sys.stderr, flush=True)
        return hook(*args, **kwargs)

    return build


build_wheel = keyed(maturin.build_wheel)
build_editable = keyed(maturin.build_editable)
