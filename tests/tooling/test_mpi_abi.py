"""The loader's decision (python/ringlet/_mpi_abi.py): which MPI library a wheel's ringlet
loads, and why, on machines described to it (environment, loaded libraries, parent processes,
files). Ordinary pytest; tests/wheels runs the same decision for real on four MPIs.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Loaded from its file: importing the package would load the core, and this module must decide
# without it.
_spec = importlib.util.spec_from_file_location("ringlet_mpi_abi_under_test",
                                               ROOT / "python" / "ringlet" / "_mpi_abi.py")
assert _spec and _spec.loader
mpi_abi = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = mpi_abi
_spec.loader.exec_module(mpi_abi)

MULTIARCH = "/usr/lib/x86_64-linux-gnu"
DEBIAN = {f"{MULTIARCH}/libmpi.so.40", f"{MULTIARCH}/libmpich.so.12"}
OPENMPI_LAUNCH = {"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "0"}
HYDRA_LAUNCH = {"PMI_SIZE": "2", "PMI_RANK": "0", "HYDI_CONTROL_FD": "7"}


def world(files: set[str] = frozenset(), env: dict[str, str] | None = None,
          loaded: list[str] | None = None, parents: list[str] | None = None,
          prefix: str = "/work/venv", cache: list[str] | None = None) -> object:
    existing = set(files)
    return mpi_abi._World(env=env or {}, loaded=loaded or [], parents=parents or [],
                          prefix=prefix, exists=existing.__contains__,
                          ld_cache=lambda: list(cache or []))


def test_the_file_name_tells_the_abi() -> None:
    assert mpi_abi.abi_of_name("/usr/lib/x86_64-linux-gnu/libmpi.so.40.30.4") == "openmpi"
    assert mpi_abi.abi_of_name("/venv/lib/libmpi.so.40") == "openmpi"
    assert mpi_abi.abi_of_name("/venv/lib/libmpi.so.12") == "mpich"
    assert mpi_abi.abi_of_name("/usr/lib/x86_64-linux-gnu/libmpich.so.12.2.2") == "mpich"
    assert mpi_abi.abi_of_name("/venv/lib/libmpi_abi.so.1") is None
    assert mpi_abi.abi_of_name("/usr/lib/libmpi_cxx.so.40") is None


def test_loaded_libraries_come_from_the_memory_map() -> None:
    maps = "\n".join([
        "7f00-7f01 r-xp 00000000 fe:01 12 /usr/lib/x86_64-linux-gnu/libc.so.6",
        "7f02-7f03 r--p 00000000 fe:01 13 /venv/lib/libmpi.so.40",
        "7f03-7f04 r-xp 00001000 fe:01 13 /venv/lib/libmpi.so.40",
        "7f05-7f06 rw-p 00000000 00:00 0 ",
        "7f07-7f08 r-xp 00000000 fe:01 14 /usr/lib/x86_64-linux-gnu/libmpi_cxx.so.40.30.1",
    ])
    assert mpi_abi.loaded_libraries(maps) == ["/venv/lib/libmpi.so.40"]


def test_ringlet_libmpi_wins_over_everything() -> None:
    forced = "/opt/intel/mpi/lib/release/libmpi.so.12"
    choice = mpi_abi.choose(world(DEBIAN | {forced}, {"RINGLET_LIBMPI": forced, **OPENMPI_LAUNCH},
                                  loaded=[f"{MULTIARCH}/libmpi.so.40"]))
    assert (choice.path, choice.abi, choice.reason) == (forced, "mpich", "RINGLET_LIBMPI")


def test_bad_settings_are_refused_with_what_is_accepted() -> None:
    with pytest.raises(ValueError, match="no such file"):
        mpi_abi.choose(world(DEBIAN, {"RINGLET_LIBMPI": "/nowhere/libmpi.so.40"}))
    with pytest.raises(ValueError, match="openmpi and mpich"):
        mpi_abi.choose(world(DEBIAN, {"RINGLET_MPI_ABI": "intel"}))
    with pytest.raises(ValueError, match="RINGLET_MPI_ABI=openmpi or mpich"):
        mpi_abi.choose(world({"/opt/x/libfoo.so"}, {"RINGLET_LIBMPI": "/opt/x/libfoo.so"}))
    named = mpi_abi.choose(world({"/opt/x/libfoo.so"}, {"RINGLET_LIBMPI": "/opt/x/libfoo.so",
                                                        "RINGLET_MPI_ABI": "mpich"}))
    assert named.abi == "mpich"


def test_ringlet_mpi_abi_narrows_the_search() -> None:
    choice = mpi_abi.choose(world(DEBIAN, {"RINGLET_MPI_ABI": "mpich"}))
    assert choice.path == f"{MULTIARCH}/libmpich.so.12"
    default = mpi_abi.choose(world(DEBIAN))
    assert default.path == f"{MULTIARCH}/libmpi.so.40"


def test_a_library_already_loaded_is_used_whatever_else_there_is() -> None:
    venv = "/work/venv/lib/libmpi.so.12"
    choice = mpi_abi.choose(world(DEBIAN | {venv}, OPENMPI_LAUNCH, loaded=[venv]))
    assert choice.path == venv and choice.reason.startswith("already loaded")
    # ... and a launcher of the other ABI is then a mismatch that init reports.
    problem = mpi_abi.mismatch(choice)
    assert problem is not None and "Open MPI's mpirun" in problem and venv in problem


def test_the_launchers_mpi_wins_over_the_venv_and_the_system() -> None:
    venv_ompi = "/work/venv/lib/libmpi.so.40"
    # Debian's Open MPI 4.1 launched the rank, although the venv has PyPI's Open MPI 5.
    choice = mpi_abi.choose(world(DEBIAN | {venv_ompi}, OPENMPI_LAUNCH,
                                  parents=["/usr/bin/orterun", "/usr/bin/bash"]))
    assert choice.path == f"{MULTIARCH}/libmpi.so.40"
    assert "launcher" in choice.reason and choice.launcher.program == "/usr/bin/orterun"
    # The venv's Open MPI 5 launched it (PRRTE says where its library is).
    choice = mpi_abi.choose(world(DEBIAN | {venv_ompi},
                                  {**OPENMPI_LAUNCH, "OMPI_LIBDIR_LOC": "/work/venv/lib"},
                                  parents=["/work/venv/bin/prterun"]))
    assert choice.path == venv_ompi and mpi_abi.mismatch(choice) is None


def test_hydra_means_the_mpich_abi_even_where_open_mpi_comes_first() -> None:
    choice = mpi_abi.choose(world(DEBIAN, HYDRA_LAUNCH, parents=["/usr/bin/hydra_pmi_proxy"]))
    assert choice.path == f"{MULTIARCH}/libmpich.so.12"
    assert choice.launcher.abi == "mpich"
    # No library at the launcher's prefix: the search goes on, for the launcher's ABI only.
    choice = mpi_abi.choose(world({f"{MULTIARCH}/libmpi.so.40", "/work/venv/lib/libmpi.so.12"},
                                  HYDRA_LAUNCH, parents=["/opt/hydra/bin/hydra_pmi_proxy"]))
    assert choice.path == "/work/venv/lib/libmpi.so.12"


def test_the_venv_comes_before_the_system() -> None:
    choice = mpi_abi.choose(world(DEBIAN | {"/work/venv/lib/libmpi.so.12"}))
    assert choice.path == "/work/venv/lib/libmpi.so.12" and "environment" in choice.reason


def test_ld_library_path_and_the_linker_cache_are_searched() -> None:
    module = "/opt/modules/openmpi-4.1/lib/libmpi.so.40"
    choice = mpi_abi.choose(world({module}, {"LD_LIBRARY_PATH": "/opt/modules/openmpi-4.1/lib"}))
    assert choice.path == module
    cached = "/opt/elsewhere/libmpich.so.12"
    choice = mpi_abi.choose(world({cached}, cache=["/lib/libc.so.6", cached]))
    assert choice.path == cached and "ldconfig" in choice.reason


def test_no_mpi_is_an_import_error_that_says_what_was_tried_and_what_to_do() -> None:
    with pytest.raises(ImportError) as raised:
        mpi_abi.choose(world(set()))
    message = str(raised.value)
    for expected in ("libmpi.so.40", "/work/venv/lib", "ldconfig", "module load",
                     "apt install openmpi-bin", "pip install 'ringlet[openmpi]'"):
        assert expected in message, (expected, message)
    # Under Hydra the message says which ABI was needed, and why.
    with pytest.raises(ImportError, match=r"MPICH's Hydra .* the MPICH ABI is needed"):
        mpi_abi.choose(world({f"{MULTIARCH}/libmpi.so.40"}, HYDRA_LAUNCH))


def test_srun_and_unknown_launchers_do_not_restrict_the_abi() -> None:
    env = {"SLURM_STEP_ID": "0", "PMI_SIZE": "2", "PMI_RANK": "1"}
    launcher = mpi_abi.detect_launcher(env, ["/usr/sbin/slurmstepd"])
    assert launcher is not None and launcher.name == "srun" and launcher.abi is None
    assert mpi_abi.detect_launcher({}, ["/usr/bin/bash"]) is None
    choice = mpi_abi.choose(world(DEBIAN, env, parents=["/usr/sbin/slurmstepd"]))
    assert choice.path == f"{MULTIARCH}/libmpi.so.40" and mpi_abi.mismatch(choice) is None


def test_an_abi_asked_for_against_the_launcher_is_found_elsewhere_and_refused_at_init():
    # Debian's Open MPI launched the rank; RINGLET_MPI_ABI=mpich finds Debian's MPICH, which is
    # not "the launcher's library", and init will refuse it.
    choice = mpi_abi.choose(world(DEBIAN, {**OPENMPI_LAUNCH, "RINGLET_MPI_ABI": "mpich"},
                                  parents=["/usr/bin/orterun"]))
    assert choice.path == f"{MULTIARCH}/libmpich.so.12"
    assert "launcher" not in choice.reason
    problem = mpi_abi.mismatch(choice)
    assert problem is not None and "started by Open MPI's mpirun" in problem
    assert "every rank would run alone" in problem
