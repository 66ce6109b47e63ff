"""tools/mpi_build_key.py and the PEP 517 backend that uses it (tools/ringlet_build_backend.py).

The key names the MPI a build compiles against; the build directory is target/mpi/<key>, so
builds against different MPIs never share objects. Ordinary pytest, not under mpirun.
"""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOOLS = ROOT / "tools"
sys.path.insert(0, str(TOOLS))
import mpi_build_key  # noqa: E402

OPENMPI = {
    "-show": "gcc -I/opt/openmpi/include -L/opt/openmpi/lib -lmpi",
    "-showme:version": "mpicc: Open MPI 4.1.4 (Language: C)",
}
MPICH = {
    "-show": "gcc -I/opt/mpich/include -L/opt/mpich/lib -lmpich",
    "-v": "mpicc for MPICH version 4.0.2",
}


def write_wrapper(path: Path, answers: dict[str, str]) -> Path:
    lines = ["#!/bin/sh", 'case "$1" in']
    lines += [f"    {argument}) echo '{text}' ;;" for argument, text in answers.items()]
    lines += ['    *) echo "gcc: error: unrecognized command-line option $1" >&2; exit 1 ;;',
              "esac", ""]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines))
    path.chmod(0o755)
    return path


def key(**env: str) -> str:
    """The key printed by the script run as a command with exactly this environment."""
    completed = subprocess.run([sys.executable, str(TOOLS / "mpi_build_key.py")], env=env,
                               capture_output=True, text=True, check=True, timeout=60)
    assert completed.stdout.count("\n") == 1
    return completed.stdout.strip()


@pytest.fixture
def two_mpis(tmp_path: Path) -> tuple[Path, Path]:
    """Two bin directories, each with an `mpicc`: Open MPI's and MPICH's."""
    write_wrapper(tmp_path / "openmpi" / "bin" / "mpicc", OPENMPI)
    write_wrapper(tmp_path / "mpich" / "bin" / "mpicc", MPICH)
    return tmp_path / "openmpi" / "bin", tmp_path / "mpich" / "bin"


def test_the_key_follows_path(two_mpis: tuple[Path, Path]):
    openmpi, mpich = two_mpis
    first, second = key(PATH=str(openmpi)), key(PATH=str(mpich))
    assert first.startswith("openmpi-") and second.startswith("mpich-")
    assert first != second
    assert key(PATH=f"{mpich}:{openmpi}") == second


def test_the_key_follows_mpicc(two_mpis: tuple[Path, Path]):
    openmpi, mpich = two_mpis
    assert key(PATH=str(openmpi), MPICC=str(mpich / "mpicc")) == key(PATH=str(mpich))
    assert key(PATH=str(openmpi), MPICC="") == key(PATH=str(openmpi))  # empty means unset


def test_the_key_is_stable(two_mpis: tuple[Path, Path]):
    openmpi, _ = two_mpis
    keys = {key(PATH=str(openmpi)) for _ in range(3)}
    keys.add(mpi_build_key.build_key({"PATH": str(openmpi)}))
    assert len(keys) == 1
    [only] = keys
    assert len(only.split("-")[1]) == 8


def test_one_mpi_under_two_names_has_one_key(two_mpis: tuple[Path, Path], tmp_path: Path):
    openmpi, _ = two_mpis
    (tmp_path / "alias").mkdir()
    (tmp_path / "alias" / "mpicc.openmpi").symlink_to(openmpi / "mpicc")
    assert key(PATH=str(tmp_path / "alias"), MPICC="mpicc.openmpi") == key(PATH=str(openmpi))


def test_the_key_changes_with_the_wrapper_flags(two_mpis: tuple[Path, Path]):
    openmpi, _ = two_mpis
    before = key(PATH=str(openmpi))
    write_wrapper(openmpi / "mpicc", {**OPENMPI, "-show": OPENMPI["-show"] + " -lhwloc"})
    assert key(PATH=str(openmpi)) != before


def test_pkg_config_when_there_is_no_wrapper(tmp_path: Path, two_mpis: tuple[Path, Path]):
    """As mpi-sys's build: a wrapper that cannot be run means pkg-config (mpich, then ompi);
    MPI_PKG_CONFIG, when set, is used alone."""
    openmpi, _ = two_mpis
    bin_dir = tmp_path / "pkg"
    script = bin_dir / "pkg-config"
    bin_dir.mkdir()
    script.write_text('#!/bin/sh\ncase "$2" in ompi) echo "-lmpi $1" ;; *) exit 1 ;; esac\n')
    script.chmod(0o755)
    assert key(PATH=str(bin_dir)).startswith("openmpi-")
    assert key(PATH=str(bin_dir), MPICC=str(tmp_path / "missing")).startswith("openmpi-")
    assert key(PATH=f"{openmpi}:{bin_dir}", MPI_PKG_CONFIG="ompi") == key(PATH=str(bin_dir))
    assert key(PATH=str(tmp_path / "empty")).startswith("none-")


def test_real_mpis_have_different_keys():
    if not (shutil.which("mpicc") and shutil.which("mpicc.mpich")):
        pytest.skip("needs the default mpicc and MPICH's mpicc.mpich")
    env = {"PATH": os.environ["PATH"]}
    default, mpich = key(**env, MPICC="mpicc"), key(**env, MPICC="mpicc.mpich")
    assert mpich.startswith("mpich-")
    assert default != mpich
    assert key(**env) == default
    assert key(**env, MPICC="mpicc.mpich") == mpich


# --- the PEP 517 backend ---------------------------------------------------------------------


@pytest.fixture
def backend(monkeypatch: pytest.MonkeyPatch):
    """tools/ringlet_build_backend.py over a stand-in for maturin that records the environment
    each hook saw."""
    seen: list[tuple[str, str | None]] = []

    def hook(name: str):
        def record(*args, **kwargs):
            seen.append((name, os.environ.get("CARGO_TARGET_DIR")))
            return name
        return record

    fake = types.ModuleType("maturin")
    for name in ("build_wheel", "build_editable", "build_sdist", "get_requires_for_build_wheel",
                 "get_requires_for_build_editable", "get_requires_for_build_sdist",
                 "prepare_metadata_for_build_wheel", "prepare_metadata_for_build_editable"):
        setattr(fake, name, hook(name))
    monkeypatch.setitem(sys.modules, "maturin", fake)
    for variable in ("CARGO_TARGET_DIR", "CARGO_BUILD_TARGET_DIR"):
        monkeypatch.setenv(variable, "")  # restored after the test, whatever the backend sets
        monkeypatch.delenv(variable)
    monkeypatch.delitem(sys.modules, "ringlet_build_backend", raising=False)
    module = importlib.import_module("ringlet_build_backend")
    module.seen = seen
    return module


@pytest.mark.parametrize("hook", ["build_wheel", "build_editable"])
def test_backend_builds_in_the_directory_of_the_mpi(
        backend, hook: str, two_mpis: tuple[Path, Path], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch):
    _, mpich = two_mpis
    project = tmp_path / "project"
    project.mkdir()
    monkeypatch.chdir(project)
    monkeypatch.setenv("PATH", str(mpich))
    monkeypatch.delenv("MPICC", raising=False)
    assert getattr(backend, hook)(str(tmp_path / "wheels")) == hook
    expected = project.resolve() / "target" / "mpi" / key(PATH=str(mpich))
    assert backend.seen == [(hook, str(expected))]


def test_backend_keeps_the_users_target_dir(backend, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("CARGO_TARGET_DIR", "/somewhere/else")
    backend.build_wheel("wheels")
    assert backend.seen == [("build_wheel", "/somewhere/else")]


def test_backend_has_every_hook_of_maturin(backend):
    tomllib = pytest.importorskip("tomllib")

    build_system = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]
    assert build_system["build-backend"] == "ringlet_build_backend"
    assert build_system["backend-path"] == ["tools"]
    for name in dir(sys.modules["maturin"]):
        if name.startswith(("build_", "get_requires_", "prepare_metadata_")):
            assert getattr(backend, name)("directory") == name
