"""Run the Python test suite under mpirun at several rank counts and total every rank's results.

    python tests/run_mpi_suite.py [--sizes 1 2 3 4 5 8] [--launcher mpirun.mpich]
                                  [--timeout 900] [--plain tests/jobs ...] [--plain-streams 2]
                                  [pytest args...]

The launcher is --launcher, else $RINGLET_MPIRUN, else `mpirun`: Open MPI's or MPICH's (Hydra).
Open MPI-only options go to Open MPI alone; the time limit of each run is enforced here (the
launcher and every process below it are killed), so it holds under any launcher. The tests
that launch jobs themselves (--plain) run `mpirun`: when the launcher is another one, a
directory where `mpirun` and `mpiexec` mean the launcher comes first on their PATH.
More ranks than cores is fine for Open MPI (it oversubscribes with the environment the Makefile
sets, and yields); Hydra starts them too, but MPICH busy-polls, so its collectives then cost
milliseconds each, not microseconds. Exits non-zero if any rank of any run failed; ends with
one line "N passed, N failed".
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT_SECONDS = 900  # a hung run ends instead of stalling CI
KILL_GRACE_SECONDS = 10  # between SIGTERM and SIGKILL to the run's process group


class Launcher:
    """An MPI launcher: its command, its flavor, and the PATH under which it is `mpirun`."""

    def __init__(self, command: str):
        path = shutil.which(command)
        if path is None:
            sys.exit(f"run_mpi_suite: launcher {command!r} not found on PATH")
        self.command = command
        self.path = path
        self.flavor = self._flavor()
        self.environment = dict(os.environ)
        if os.path.realpath(shutil.which("mpirun") or "") != os.path.realpath(path):
            # Jobs the tests start with `mpirun` must use this launcher too.
            bin_dir = ROOT / "build" / "test-launchers" / Path(command).name / "bin"
            bin_dir.mkdir(parents=True, exist_ok=True)
            for name in ("mpirun", "mpiexec"):
                # A script, not a symlink: Hydra finds hydra_pmi_proxy beside its argv[0].
                script = bin_dir / name
                script.unlink(missing_ok=True)
                script.write_text(f'#!/bin/sh\nexec {shlex.quote(path)} "$@"\n')
                script.chmod(0o755)
            self.environment["PATH"] = f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"

    def _flavor(self) -> str:
        try:
            output = subprocess.run([self.path, "--version"], capture_output=True, text=True,
                                    stdin=subprocess.DEVNULL, timeout=60)
        except (OSError, subprocess.SubprocessError):
            return "unknown"
        text = output.stdout + output.stderr
        if "Open MPI" in text or "OpenRTE" in text:
            return "openmpi"
        if "HYDRA" in text or "MPICH" in text:
            return "mpich"
        return "unknown"

    def command_line(self, size: int, timeout: float) -> list[str]:
        extra = ["--timeout", str(int(timeout))] if self.flavor == "openmpi" else []
        return [self.command, *extra, "-n", str(size)]


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (Linux /proc; none elsewhere). Hydra starts its proxies and
    ranks in sessions of their own, out of reach of a signal to the launcher's group."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, queue = [], [pid]
    while queue:
        for child in children.get(queue.pop(), []):
            found.append(child)
            queue.append(child)
    return found


def kill_group(process: subprocess.Popen, sig: int, others: Sequence[int] = ()) -> None:
    for kill, target in [(os.killpg, process.pid), *((os.kill, pid) for pid in others)]:
        try:
            kill(target, sig)
        except (ProcessLookupError, PermissionError):
            pass


def call(command: list[str], env: dict[str, str], timeout: float, output=None) -> int:
    """Run `command` in its own process group (its output into `output`, a file, if given);
    past `timeout` seconds, end it and everything it started (launcher, proxies and ranks) and
    return 124, as timeout(1) does."""
    process = subprocess.Popen(command, cwd=ROOT, env=env, start_new_session=True,
                               stdout=output, stderr=output and subprocess.STDOUT)
    RUNNING.add(process)
    try:
        return process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        print(f"\n*** still running after {timeout:.0f} s: killing {' '.join(command[:4])} ...",
              flush=True)
        below = descendants(process.pid)
        kill_group(process, signal.SIGTERM)  # lets the launcher take its ranks down and say so
        try:
            process.wait(timeout=KILL_GRACE_SECONDS)
        except subprocess.TimeoutExpired:
            pass
        kill_group(process, signal.SIGKILL, below)  # and whatever is left
        process.wait()
        return 124
    except KeyboardInterrupt:
        kill_group(process, signal.SIGKILL, descendants(process.pid))
        process.wait()
        raise
    finally:
        RUNNING.discard(process)


# What `call` runs, in every thread: a Ctrl-C reaches only the main thread, which ends them all.
RUNNING: set[subprocess.Popen] = set()


def count(report: Path) -> tuple[int, int, int]:
    """(passed, failed, skipped) from one rank's JUnit report."""
    suite = ET.parse(report).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    assert suite is not None, f"{report} holds no testsuite"
    tests, skipped = int(suite.get("tests", 0)), int(suite.get("skipped", 0))
    failed = int(suite.get("failures", 0)) + int(suite.get("errors", 0))
    return tests - failed - skipped, failed, skipped


def failing(report: Path, where: str) -> list[str]:
    """One line per failed or erroring test in a JUnit report: where it ran, its id, and the
    first line of its message (so that the end of a long log still says what failed)."""
    lines = []
    for case in ET.parse(report).getroot().iter("testcase"):
        for problem in [*case.findall("failure"), *case.findall("error")]:
            message = (problem.get("message") or problem.text or "").strip().splitlines()
            lines.append(f"{where}: {case.get('classname')}::{case.get('name')}: "
                         f"{message[0][:200] if message else problem.tag}")
    return lines


# Every failed test of the whole suite, printed again at its end.
FAILED_TESTS: list[str] = []


# Importing torch loads its CUDA libraries in every rank; its tests run up to this many ranks
# (the issue asks for 1-4), which keeps the oversubscribed 5- and 8-rank runs quick.
TORCH_MAX_RANKS = 4
TORCH_TESTS = ("test_hvd_torch.py", "test_hvd_process_sets.py")


def run(launcher: Launcher, size: int, pytest_args: list[str], timeout: float,
        reports_root: Path, cache: Path) -> tuple[int, int, int]:
    reports = reports_root / f"n{size}"
    shutil.rmtree(reports, ignore_errors=True)
    reports.mkdir(parents=True)
    if size > TORCH_MAX_RANKS:
        for torch_tests in TORCH_TESTS:
            pytest_args = [*pytest_args, "--ignore", str(ROOT / "tests/hvd/torch" / torch_tests)]
    command = [
        # Open MPI's own --timeout (with its report) comes first; ours is the backstop.
        *launcher.command_line(size, timeout),
        # The suites' shared fixtures and references (tests/mpi_fixtures.py).
        sys.executable, str(ROOT / "tests" / "mpi_pytest.py"), "-p", "mpi_fixtures", *pytest_args,
    ]
    print(f"\n=== {size} rank{'s' if size > 1 else ''}: {' '.join(command)}", flush=True)
    started = time.monotonic()
    # One calibration per rank count, shared by that run's tests, never the user's cache.
    environment = {
        **launcher.environment,
        "RINGLET_TEST_REPORTS": str(reports),
        "RINGLET_CACHE_DIR": str(cache),
    }
    code = call(command, environment, timeout + 2 * KILL_GRACE_SECONDS)
    passed = failed = skipped = 0
    for rank in range(size):
        report = reports / f"rank{rank}.xml"
        if not report.exists():
            current = reports / f"rank{rank}.current"
            where = current.read_text().strip() if current.exists() else "before any test"
            print(f"rank {rank} wrote no report (crashed or killed) in {where}")
            log = reports / f"rank{rank}.log"
            if rank != 0 and log.exists():
                tail = log.read_text(errors="replace").splitlines()[-60:]
                print(f"--- rank {rank} output, last lines ---\n" + "\n".join(tail))
            FAILED_TESTS.append(f"{size} ranks, rank {rank}: no report (crashed or killed) "
                                f"in {where}")
            failed += 1
            continue
        p, f, s = count(report)
        passed, failed, skipped = passed + p, failed + f, skipped + s
        FAILED_TESTS.extend(failing(report, f"{size} ranks, rank {rank}"))
        if f and rank != 0 and (reports / f"rank{rank}.log").exists():
            print(f"--- rank {rank} output ---\n{(reports / f'rank{rank}.log').read_text()}")
    if code == 124:
        print(f"the run was killed after {timeout:.0f} s")
        FAILED_TESTS.append(f"{size} ranks: killed after {timeout:.0f} s")
        failed += 1
    elif code != 0 and failed == 0:
        # A rank that crashed after its tests (at exit, in finalization): say which, with the
        # end of what it printed (rank 0's is above).
        print(f"{launcher.command} exited with {code} although every report passed")
        for rank in range(1, size):
            log = reports / f"rank{rank}.log"
            if log.exists():
                tail = log.read_text(errors="replace").splitlines()[-60:]
                print(f"--- rank {rank} output, last lines ---\n" + "\n".join(tail))
        FAILED_TESTS.append(f"{size} ranks: {launcher.command} exited with {code} after every "
                            "test passed")
        failed += 1
    print(f"=== {size} ranks: {passed} passed, {failed} failed, {skipped} skipped "
          f"(all ranks) in {time.monotonic() - started:.1f} s", flush=True)
    return passed, failed, skipped


def run_plain(launcher: Launcher, path: str, timeout: float,
              reports_root: Path) -> tuple[int, int, int]:
    """Tests that launch mpirun jobs themselves (failure handling), or none (tooling): one
    ordinary process, with a temporary directory of its own (others may run beside it). Its
    output goes to a log, printed whole when it ends."""
    name = f"plain-{path.strip('/').replace('/', '-')}"
    report, log = reports_root / f"{name}.xml", reports_root / f"{name}.log"
    report.parent.mkdir(parents=True, exist_ok=True)
    report.unlink(missing_ok=True)
    temporary = Path(tempfile.mkdtemp(prefix=f"ringlet-{name}-"))
    command = [sys.executable, "-m", "pytest", "-q", "--color=no", "-p", "no:cacheprovider",
               f"--junitxml={report}", f"--basetemp={temporary}", path]
    started = time.monotonic()
    with PRINTING:  # the whole output comes at the end; until then, this says where it grows
        print(f"--- started {path} (its output, live: {log})", flush=True)
    with log.open("w") as output:
        code = call(command, launcher.environment, timeout, output)
    passed, failed, skipped = count(report) if report.exists() else (0, 1, 0)
    if code != 0 and failed == 0:
        failed = 1
    with PRINTING:
        print(f"\n=== tests run by one process ({time.monotonic() - started:.0f} s): "
              f"{' '.join(command)}\n{log.read_text(errors='replace').rstrip()}", flush=True)
        if report.exists():
            FAILED_TESTS.extend(failing(report, path))
    if not failed:
        shutil.rmtree(temporary, ignore_errors=True)
    return passed, failed, skipped


PRINTING = threading.Lock()


def run_plain_suites(launcher: Launcher, paths: list[str], streams: int, timeout: float,
                     reports_root: Path) -> list[tuple[int, int, int]]:
    """The single-process suites, `streams` at a time: they wait on the jobs they launch for
    much of their time, so two share the cores well."""
    with ThreadPoolExecutor(max_workers=max(1, streams)) as pool:
        try:
            return list(pool.map(lambda path: run_plain(launcher, path, timeout, reports_root),
                                 paths))
        except KeyboardInterrupt:
            pool.shutdown(cancel_futures=True, wait=False)
            for process in list(RUNNING):
                kill_group(process, signal.SIGKILL, descendants(process.pid))
            raise


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="*", default=[1, 2, 3, 4, 5, 8],
                        help="rank counts (none: only the --plain tests)")
    parser.add_argument("--plain", nargs="*", default=[],
                        help="test paths run by one ordinary pytest process (they launch jobs)")
    parser.add_argument("--plain-streams", type=int, default=1,
                        help="how many of the --plain processes run at once (default 1)")
    parser.add_argument("--launcher", default=os.environ.get("RINGLET_MPIRUN") or "mpirun",
                        help="the MPI launcher (default: $RINGLET_MPIRUN, else mpirun)")
    parser.add_argument("--timeout", type=float, default=TIMEOUT_SECONDS,
                        help="seconds each run may take before it is killed")
    args, pytest_args = parser.parse_known_args()
    launcher = Launcher(args.launcher)
    # Reports and calibration cache per launcher: runs under two MPIs never mix them (a
    # launcher given by its path, as a venv's bin/mpirun, is labelled with its prefix too).
    given = Path(args.launcher)
    label = given.name if given.parent == Path() else f"{given.parent.parent.name}-{given.name}"
    reports_root = ROOT / "build" / "test-reports" / label
    cache = ROOT / "build" / "test-cache" / label
    shutil.rmtree(cache, ignore_errors=True)
    print(f"launcher: {launcher.path} ({launcher.flavor})", flush=True)
    totals = run_plain_suites(launcher, args.plain, args.plain_streams, args.timeout,
                              reports_root)
    totals += [run(launcher, size, pytest_args or ["-q", "tests/collectives"], args.timeout,
                   reports_root, cache)
               for size in args.sizes]
    passed = sum(t[0] for t in totals)
    failed = sum(t[1] for t in totals)
    skipped = sum(t[2] for t in totals)
    print(f"\nMPI suite under {args.launcher} over sizes {args.sizes} (every rank counted) and "
          f"{args.plain or 'no'} single-process tests:")
    if FAILED_TESTS:
        print("failed:\n  " + "\n  ".join(FAILED_TESTS))
    print(f"{passed} passed, {failed} failed" + (f", {skipped} skipped" if skipped else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
