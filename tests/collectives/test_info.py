"""``python -m ringlet.info``: what ringlet runs on, checked against what mpi4py and the
process itself say (tests/wheels checks the same through the wheel on four MPIs)."""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import tomllib
from mpi4py import MPI

import ringlet
from ringlet import _mpi_abi, info


def test_the_report_names_the_library_this_process_runs_on(size):
    report = info.gather()
    mpi = report["mpi"]
    assert mpi["version"] == MPI.Get_library_version().strip("\0 \n")
    # One MPI library mapped, and it is the one reported.
    assert _mpi_abi.loaded_libraries() == [mpi["library"]]
    assert os.path.realpath(mpi["library"]) == mpi["library_file"]
    assert mpi["abi"] == ("openmpi" if "Open MPI" in mpi["version"] else "mpich")
    assert report["ranks"] == size and report["rank"] == ringlet.rank()
    assert report["simd"] in ("generic", "avx2", "avx512")
    assert report["extras"][info.REQUIRED]["numpy"] and report["extras"]["mpi4py"]["mpi4py"]
    available = ringlet._core.shared_memory(0).available
    assert report["shared_memory"]["available"] == bool(available)
    # The launcher that started this job is seen (the suite always runs under one).
    launcher = report["launcher"]
    assert launcher is not None and launcher["abi"] == mpi["abi"]


def test_the_text_says_each_fact_on_its_own_line():
    report = info.gather()
    text = info.render(report)
    for label, value in (("MPI library", report["mpi"]["library"]),
                         ("MPI ABI", report["mpi"]["abi"]),
                         ("SIMD kernels", report["simd"]),
                         ("calibration cache", report["calibration_cache"]),
                         ("chosen by", report["mpi"]["chosen_by"])):
        line = next(line for line in text.splitlines() if line.startswith(label))
        assert value in line, (label, line)
    lines = text.splitlines()
    for extra, packages in report["extras"].items():
        label = "packages" if extra == info.REQUIRED else f"  [{extra}]"
        line = next(line for line in lines if line.startswith(label + " "))
        for name, version in packages.items():
            assert (f"{name} {version}" if version else f"{name} (not installed)") in line, line


def test_the_command_prints_json_without_initializing(tmp_path):
    # A separate process, outside the job: a singleton that must not start MPI (--no-init).
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMPI_", "PMI_", "PMIX_", "HYDI_", "MPI_LOCAL"))}
    done = subprocess.run([sys.executable, "-m", "ringlet.info", "--json", "--no-init"],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["ringlet"] == ringlet.__version__
    assert report["shared_memory"] is None and report["launcher"] is None
    first_line = MPI.Get_library_version().strip("\0 \n").splitlines()[0]
    assert report["mpi"]["version"].splitlines()[0] == first_line


def test_two_libraries_loaded_are_a_warning_line():
    report = info.gather()
    report["mpi"] = {**report["mpi"], "loaded": ["/a/libmpi.so.40", "/b/libmpich.so.12"]}
    warning = [line for line in info.render(report).splitlines() if line.startswith("WARNING")]
    assert warning == ["WARNING            2 MPI libraries are loaded: /a/libmpi.so.40, "
                       "/b/libmpich.so.12"]


def canonical(name: str) -> str:
    """A distribution's name as the packaging specifications compare them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def test_every_extra_of_pyproject_is_reported_with_its_packages():
    # The reference is pyproject.toml itself, read here as TOML, and every installed
    # distribution's own metadata; ringlet.info reads neither, but ringlet's Requires-Dist.
    root = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").is_file())
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    expected = {info.REQUIRED: project["dependencies"], **project["optional-dependencies"]}
    installed = {canonical(d.metadata["Name"]): d.version
                 for d in importlib.metadata.distributions()}
    reported = info.gather(initialize=False)["extras"]
    assert sorted(reported) == sorted(expected)
    for extra, requirements in expected.items():
        names = list(dict.fromkeys(
            canonical(re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", r)[0]) for r in requirements))
        assert sorted(canonical(name) for name in reported[extra]) == sorted(names), extra
        for name, version in reported[extra].items():
            assert version == installed.get(canonical(name)), (extra, name)
    # What the hand-written list left out: every framework ringlet serves is reported.
    everything = {canonical(name) for packages in reported.values() for name in packages}
    assert {"torch", "jax", "optax", "tensorflow-cpu", "keras", "ml-dtypes"} <= everything


def test_requirements_are_read_by_extra_whatever_their_markers():
    requires = ["numpy>=1.22", "ml-dtypes>=0.4; extra == \"bf16\"",
                "mkdocstrings[python]>=0.27 ; extra == 'docs'",
                "ml_dtypes>=0.4 ; extra == \"jax\"",
                "jax>=0.10 ; python_version >= \"3.10\" and extra == \"jax\"",
                "jax>=0.10 ; extra == \"jax\""]
    assert info.declared(requires) == {
        info.REQUIRED: ["numpy"], "bf16": ["ml-dtypes"], "docs": ["mkdocstrings"],
        "jax": ["ml_dtypes", "jax"]}
