"""tests/run_mpi_suite.py: launchers of either MPI, the time limit it enforces itself, and the
single-process suites run side by side.

Ordinary pytest, not under mpirun (the real-launcher tests start small jobs themselves).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("run_mpi_suite", ROOT / "tests" / "run_mpi_suite.py")
assert _spec is not None and _spec.loader is not None
suite = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(suite)

OPENMPI_VERSION = "mpirun (Open MPI) 4.1.4"
HYDRA_VERSION = "HYDRA build details:\n    Version:                                 4.0.2"


def fake_launcher(directory: Path, name: str, version: str) -> Path:
    path = directory / name
    directory.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\n[ \"$1\" = --version ] && printf '%s\\n' '{version}'\n")
    path.chmod(0o755)
    return path


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie waiting for its reaper counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def wait_gone(pids: list[int], seconds: float = 10) -> list[int]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(alive(pid) for pid in pids):
        time.sleep(0.05)
    return [pid for pid in pids if alive(pid)]


@pytest.fixture
def launchers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A PATH with Open MPI's `mpirun` and MPICH's `mpirun.mpich` (fakes); the suite's ROOT
    moved to tmp_path."""
    bin_dir = tmp_path / "bin"
    fake_launcher(bin_dir, "mpirun", OPENMPI_VERSION)
    fake_launcher(bin_dir, "mpirun.openmpi", OPENMPI_VERSION.replace("mpirun", "mpirun.openmpi"))
    fake_launcher(bin_dir, "mpirun.mpich", HYDRA_VERSION)
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.setattr(suite, "ROOT", tmp_path)
    return bin_dir


def test_open_mpi_gets_its_own_timeout_option(launchers: Path):
    launcher = suite.Launcher("mpirun")
    assert launcher.flavor == "openmpi"
    assert launcher.command_line(4, 900) == ["mpirun", "--timeout", "900", "-n", "4"]
    assert launcher.environment["PATH"] == str(launchers)  # mpirun is this launcher already


def test_hydra_gets_no_open_mpi_options(launchers: Path, tmp_path: Path):
    launcher = suite.Launcher("mpirun.mpich")
    assert launcher.flavor == "mpich"
    assert launcher.command_line(3, 900) == ["mpirun.mpich", "-n", "3"]
    # Jobs the tests launch with `mpirun` (tests/jobs) get MPICH's launcher too.
    first = launcher.environment["PATH"].split(os.pathsep)[0]
    for name in ("mpirun", "mpiexec"):
        script = Path(first) / name
        assert str(launchers / "mpirun.mpich") in script.read_text()
        answer = subprocess.run([str(script), "--version"], capture_output=True, text=True)
        assert answer.stdout.startswith("HYDRA build details:")
    assert first.startswith(str(tmp_path / "build" / "test-launchers"))


def test_open_mpi_under_another_name_is_still_open_mpi(launchers: Path):
    launcher = suite.Launcher("mpirun.openmpi")
    assert launcher.command_line(2, 60) == ["mpirun.openmpi", "--timeout", "60", "-n", "2"]


def test_launcher_from_the_environment(launchers: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("RINGLET_MPIRUN", "mpirun.mpich")
    seen = []
    monkeypatch.setattr(suite, "run_plain", lambda launcher, *args: seen.append(launcher) or
                        (1, 0, 0))
    monkeypatch.setattr(sys, "argv", ["run_mpi_suite.py", "--sizes", "--plain", "x"])
    assert suite.main() == 0
    assert [launcher.command for launcher in seen] == ["mpirun.mpich"]


def test_plain_suites_run_side_by_side_and_a_failure_is_counted(tmp_path, monkeypatch):
    # Suites a and b each wait for the other to start: they pass only if they run at once.
    for mine, other in (("a", "b"), ("b", "a")):
        (tmp_path / mine).mkdir()
        (tmp_path / mine / f"test_{mine}.py").write_text(textwrap.dedent(f"""
            import time
            from pathlib import Path

            def test_meets_the_other(tmp_path):
                Path({str(tmp_path)!r}, "{mine}.started").write_text(str(tmp_path))
                deadline = time.monotonic() + 30
                while not Path({str(tmp_path)!r}, "{other}.started").exists():
                    assert time.monotonic() < deadline, "the other suite never started"
                    time.sleep(0.05)
        """))
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "test_c.py").write_text("def test_fails():\n    assert False\n")
    monkeypatch.setattr(suite, "FAILED_TESTS", [])
    launcher = SimpleNamespace(environment=dict(os.environ))
    totals = suite.run_plain_suites(launcher, [str(tmp_path / name) for name in "abc"], 2, 120,
                                    tmp_path / "reports")
    assert totals == [(1, 0, 0), (1, 0, 0), (0, 1, 0)]
    # One line for the failed test (its class name is its file's, prefixed by where pytest
    # puts the root: that depends on where the temporary directory lies).
    assert len(suite.FAILED_TESTS) == 1 and "test_c::test_fails: assert False" in \
        suite.FAILED_TESTS[0], suite.FAILED_TESTS
    # Each ran in a temporary directory of its own.
    assert (tmp_path / "a.started").read_text() != (tmp_path / "b.started").read_text()


def test_a_missing_launcher_is_an_error(launchers: Path):
    with pytest.raises(SystemExit, match=r"mpiexec\.nowhere"):
        suite.Launcher("mpiexec.nowhere")


def test_the_time_limit_kills_the_whole_group(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(suite, "ROOT", tmp_path)
    monkeypatch.setattr(suite, "KILL_GRACE_SECONDS", 1)
    pids = tmp_path / "pids"
    # A background child, and a foreground one that ignores SIGTERM: SIGKILL must follow.
    script = f"sleep 300 & echo $! >> {pids}; (trap '' TERM; sleep 300) & echo $! >> {pids}; wait"
    started = time.monotonic()
    code = suite.call(["/bin/sh", "-c", script], dict(os.environ), timeout=1)
    assert code == 124
    assert time.monotonic() - started < 10
    children = [int(pid) for pid in pids.read_text().split()]
    assert len(children) == 2
    assert wait_gone(children) == []


def test_the_time_limit_reaches_processes_in_sessions_of_their_own(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """As Hydra's proxies and ranks: started with setsid, out of the launcher's group."""
    monkeypatch.setattr(suite, "ROOT", tmp_path)
    monkeypatch.setattr(suite, "KILL_GRACE_SECONDS", 1)
    pid_file = tmp_path / "pid"
    launcher = ("import subprocess, sys; child = subprocess.Popen(['sleep', '300'], "
                f"start_new_session=True); open({str(pid_file)!r}, 'w').write(str(child.pid)); "
                "child.wait()")
    code = suite.call([sys.executable, "-c", launcher], dict(os.environ), timeout=2)
    assert code == 124
    assert wait_gone([int(pid_file.read_text())]) == []


def test_a_run_within_the_limit_returns_its_code(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(suite, "ROOT", tmp_path)
    assert suite.call(["/bin/sh", "-c", "exit 3"], dict(os.environ), timeout=30) == 3


@pytest.mark.parametrize("name", ["mpirun.openmpi", "mpirun.mpich"])
def test_real_launchers_jobs_are_killed_at_the_limit(name: str, tmp_path: Path):
    """A hung 2-rank job under the real launcher ends at the limit, ranks and all."""
    if shutil.which(name) is None:
        pytest.skip(f"{name} is not installed")
    launcher = suite.Launcher(name)
    assert launcher.flavor == name.split(".")[1]
    pids = tmp_path / "pids"
    rank = (f"import os, time; open({str(pids)!r}, 'a').write(f'{{os.getpid()}}\\n'); "
            "time.sleep(300)")
    env = {**launcher.environment, "OMPI_ALLOW_RUN_AS_ROOT": "1",
           "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "OMPI_MCA_rmaps_base_oversubscribe": "1"}
    # The launcher's own --timeout (Open MPI) is longer than ours here: ours must do it.
    command = [*launcher.command_line(2, 600), sys.executable, "-c", rank]
    started = time.monotonic()
    code = suite.call(command, env, timeout=8)
    assert code == 124
    assert time.monotonic() - started < 8 + 2 * suite.KILL_GRACE_SECONDS + 5
    ranks = [int(pid) for pid in pids.read_text().split()]
    assert len(ranks) == 2, "both ranks started within the limit"
    assert wait_gone(ranks) == []


@pytest.mark.parametrize("name", ["mpirun.openmpi", "mpirun.mpich"])
def test_jobs_the_tests_launch_use_the_launcher(name: str, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch):
    """`mpirun -n 2` on the PATH the suite gives the tests starts a 2-rank job of that MPI."""
    if shutil.which(name) is None:
        pytest.skip(f"{name} is not installed")
    monkeypatch.setattr(suite, "ROOT", tmp_path)
    launcher = suite.Launcher(name)
    env = {**launcher.environment, "OMPI_ALLOW_RUN_AS_ROOT": "1",
           "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "OMPI_MCA_rmaps_base_oversubscribe": "1"}
    # One write per rank: the launcher forwards each rank's output in the chunks it gets.
    show = ("import os; e = os.environ; os.write(1, (f\"{e.get('OMPI_COMM_WORLD_SIZE') or "
            "e.get('PMI_SIZE')} {'Open MPI' if 'OMPI_COMM_WORLD_SIZE' in e else 'MPICH'}\\n\""
            ").encode())")
    job = subprocess.run(["mpirun", "-n", "2", sys.executable, "-c", show], env=env,
                         capture_output=True, text=True, timeout=120)
    assert job.returncode == 0, job.stderr
    flavor = "Open MPI" if launcher.flavor == "openmpi" else "MPICH"
    assert job.stdout.splitlines() == [f"2 {flavor}"] * 2, job.stdout + job.stderr


def test_failed_tests_are_named_with_their_first_message_line(tmp_path: Path):
    report = tmp_path / "rank0.xml"
    report.write_text(
        '<testsuites><testsuite tests="3" failures="1" errors="1" skipped="0">'
        '<testcase classname="tests.python.test_a" name="test_ok"/>'
        '<testcase classname="tests.python.test_a" name="test_bad">'
        '<failure message="assert 1 == 2&#10;more">trace</failure></testcase>'
        '<testcase classname="tests.python.test_b" name="test_broken">'
        '<error message="">boom</error></testcase>'
        '</testsuite></testsuites>')
    assert suite.count(report) == (1, 2, 0)
    assert suite.failing(report, "2 ranks, rank 0") == [
        "2 ranks, rank 0: tests.python.test_a::test_bad: assert 1 == 2",
        "2 ranks, rank 0: tests.python.test_b::test_broken: boom",
    ]
