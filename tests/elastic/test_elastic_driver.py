"""The elastic driver's parts without a job: its settings and their errors, host discovery,
the blacklist's cooldown, the rank layout; a rank's pacing of the commits it ships; and
ringletrun's elastic command line refusing bad input before it starts anything. Plain
pytest."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import threading
import time
from multiprocessing import Pipe
from pathlib import Path

import pytest

from ringlet.elastic import _hosts, _link, _protocol
from ringlet.elastic._driver import ElasticSettings, _Driver
from ringlet.elastic._hosts import Blacklist, DiscoveryError, Slot, assign

RINGLETRUN = [sys.executable, "-m", "ringlet.run"]


def ringletrun(*args: str, seconds: float = 60,
               env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*RINGLETRUN, *args], capture_output=True, text=True,
                          timeout=seconds, env={**os.environ, **(env or {})})


def script(tmp_path: Path, body: str) -> str:
    path = tmp_path / "discover.sh"
    path.write_text("#!/bin/bash\n" + body + "\n")
    path.chmod(0o755)
    return str(path)


def test_discovery_output_is_read_as_hosts_and_slots() -> None:
    found = _hosts.parse_discovery_output("a:2\n\nb   # a comment\nc.example.org:3\n", 4, "s")
    assert found == {"a": 2, "b": 4, "c.example.org": 3}


@pytest.mark.parametrize("line", ["a:0", "a b", "a:x", "a:-1"])
def test_discovery_output_that_is_no_host_names_its_line(line: str) -> None:
    with pytest.raises(DiscoveryError, match=f"printed '{line}' on line 2: expected one host"):
        _hosts.parse_discovery_output(f"ok:1\n{line}\n", 1, "the script")


def test_a_failing_discovery_script_says_its_exit_code_and_its_last_words(
        tmp_path: Path) -> None:
    discovery = _hosts.ScriptDiscovery(script(tmp_path, "echo no cluster here >&2; exit 3"), 1)
    with pytest.raises(DiscoveryError, match="failed with exit code 3: no cluster here"):
        discovery.find()


def test_the_blacklist_cooldown_grows_exponentially_within_its_range() -> None:
    now = [100.0]
    blacklist = Blacklist((10, 100), clock=lambda: now[0])
    blacklist.add("h")
    first = blacklist.soonest_return()
    assert first is not None and 20 <= first <= 30  # low * 2 + U(0, 1) * low
    assert blacklist.excludes("h")
    now[0] += first
    assert not blacklist.excludes("h")
    blacklist.add("h")
    second = blacklist.soonest_return()
    assert second is not None and 40 <= second <= 50
    for _ in range(2):  # the third is 80-90 s, the fourth 160-170 s: over the top
        now[0] += 1000
        blacklist.add("h")
    assert blacklist.soonest_return() == 100  # clamped to the range's top


def test_without_a_cooldown_a_blacklisted_host_stays_out() -> None:
    blacklist = Blacklist(None, clock=lambda: 0.0)
    blacklist.add("h")
    assert blacklist.excludes("h") and blacklist.soonest_return() is None


def test_ranks_go_to_the_oldest_hosts_first_and_stop_at_max_np() -> None:
    hosts = {"new": 2, "old": 2, "older": 1}
    assert assign(hosts, ["older", "gone", "old"], 4) == [
        Slot("older", 0), Slot("old", 0), Slot("old", 1), Slot("new", 0)]


def test_slurm_task_counts_are_expanded() -> None:
    assert _hosts._expand_tasks("2(x3),1") == [2, 2, 2, 1]
    with pytest.raises(DiscoveryError):
        _hosts._expand_tasks("two")


@pytest.mark.parametrize(("args", "says"), [
    (["--min-np", "3", "--max-np", "2", "-H", "localhost:4"],
     "--min-np (3) is larger than --max-np (2)"),
    (["-np", "5", "--min-np", "1", "--max-np", "4", "-H", "localhost:4"],
     "-np (5) must lie between --min-np (1) and --max-np (4)"),
    (["--min-np", "1", "--blacklist-cooldown-range", "9", "3", "-H", "localhost:2"],
     "1 <= low <= high <= 3600"),
    (["--min-np", "1"], "elastic training needs hosts"),
])
def test_conflicting_elastic_options_are_refused_before_anything_runs(
        args: list[str], says: str) -> None:
    done = ringletrun(*args, "true")
    assert done.returncode == 2, done
    assert says in done.stderr, done.stderr


def test_a_discovery_script_that_fails_at_the_start_ends_the_run(tmp_path: Path) -> None:
    done = ringletrun("-np", "2", "--host-discovery-script",
                      script(tmp_path, "echo broken >&2; exit 1"), "true")
    assert done.returncode == 1, done
    assert "failed with exit code 1: broken" in done.stderr, done.stderr


def test_a_discovery_script_that_prints_garbage_at_the_start_ends_the_run(
        tmp_path: Path) -> None:
    done = ringletrun("-np", "2", "--host-discovery-script",
                      script(tmp_path, "echo 'host one'"), "true")
    assert done.returncode == 1, done
    assert "printed 'host one' on line 1" in done.stderr, done.stderr


def test_a_discovery_script_that_prints_nothing_times_out_clearly(tmp_path: Path) -> None:
    done = ringletrun("-np", "2", "--elastic-timeout", "1", "--host-discovery-script",
                      script(tmp_path, "true"), "true")
    assert done.returncode == 1, done
    assert "timed out after 1 s waiting for 2 slots" in done.stderr, done.stderr
    assert "found 0: none" in done.stderr, done.stderr


def test_a_discovery_script_that_fails_later_leaves_the_hosts_found_before(
        tmp_path: Path) -> None:
    """The driver's side of test_elastic_scenarios' job whose script breaks mid-run: a warning,
    and the hosts of the last discovery that worked."""
    runs = tmp_path / "runs"
    body = (f'echo x >> {runs}; [ "$(wc -l < {runs})" -gt 1 ] && {{ echo gone >&2; exit 4; }}; '
            "echo localhost:2; echo 127.0.0.1:1")
    settings = ElasticSettings(_hosts.ScriptDiscovery(script(tmp_path, body), 1), np=2,
                               min_np=2, max_np=4)
    err = io.StringIO()
    driver = _Driver(settings, lambda slots, environ: [], {}, io.StringIO(), err)
    try:
        assert driver.discover(first=True) == {"localhost": 2, "127.0.0.1": 1}
        assert err.getvalue() == ""
        assert driver.discover() == {"localhost": 2, "127.0.0.1": 1}
    finally:
        driver.close()
    assert "failed with exit code 4: gone; keeping the hosts found before" in err.getvalue()


def test_the_dry_run_shows_the_first_job_s_command(tmp_path: Path) -> None:
    done = ringletrun("--dry-run", "-np", "3", "--max-np", "3", "--host-discovery-script",
                      script(tmp_path, "echo a:2; echo b:2"), "python", "train.py")
    assert done.returncode == 0, done.stderr
    assert "-H a:2,b:1" in done.stdout and done.stdout.rstrip().endswith("python train.py")


def test_the_example_trains_under_the_elastic_driver() -> None:
    example = Path(__file__).resolve().parents[2] / "examples" / "elastic_train.py"
    done = ringletrun("-np", "2", "--min-np", "1", "-H", "localhost:2", sys.executable,
                      str(example), seconds=180)
    assert done.returncode == 0, done.stdout + done.stderr
    epochs = [line for line in done.stdout.splitlines() if line.startswith("epoch ")]
    assert len(epochs) == 3 and all("on 2 ranks" in line for line in epochs), done.stdout
    assert "job 1: 2 ranks on localhost:2" in done.stderr


def test_a_collective_outside_elastic_run_is_refused_and_ends_the_run(tmp_path: Path) -> None:
    program = tmp_path / "outside.py"
    program.write_text(
        "import numpy as np\nimport ringlet.hvd as hvd\nhvd.init()\n"
        "hvd.allreduce(np.ones(4), name='too.early')\n"
        "state = hvd.elastic.ObjectState(step=0)\n"
        "hvd.elastic.run(lambda state: None)(state)\n")
    done = ringletrun("-np", "2", "--min-np", "2", "-H", "localhost:2", sys.executable,
                      str(program), seconds=120)
    assert done.returncode == 1, done
    assert "OutsideRunError: hvd.allreduce was called outside elastic.run" in done.stderr, \
        done.stderr
    assert "before any rank reached elastic.run: nothing to recover" in done.stderr, done.stderr
    assert "job 2" not in done.stderr  # not restarted


def test_without_ulfm_the_driver_restarts_and_refuses_to_be_told_otherwise() -> None:
    """On this MPI (Open MPI 4.1, no ULFM) the mechanism is the restart: no --with-ft in the
    job's command; RINGLET_ELASTIC_MECHANISM=ulfm is refused, and so is a misspelled value."""
    args = ["--dry-run", "-np", "2", "--min-np", "2", "-H", "localhost:2", "python", "t.py"]
    done = ringletrun(*args)
    assert done.returncode == 0 and "--with-ft" not in done.stdout, done
    done = ringletrun(*args, env={"RINGLET_ELASTIC_MECHANISM": "ulfm"})
    assert done.returncode == 2, done
    assert "RINGLET_ELASTIC_MECHANISM=ulfm, but" in done.stderr, done.stderr
    assert "has no ULFM" in done.stderr, done.stderr
    done = ringletrun(*args, env={"RINGLET_ELASTIC_MECHANISM": "ulfn"})
    assert done.returncode == 2, done
    assert "RINGLET_ELASTIC_MECHANISM='ulfn': use auto, ulfm or restart" in done.stderr


def shipping(serialize_cpu_s: float, ack_delay_s: float) -> list[float]:
    """Commits 1, 2 and 3 through a DriverLink to a driver that acknowledges each after
    ``ack_delay_s``; commit 2 is made the moment 1 is acknowledged, and 3 right after 2.
    Returns when each commit reached the driver (seconds since the first was made)."""
    rank_end, driver_end = Pipe()
    link = _link.DriverLink(rank_end, generation=1, resumed=False)
    arrived: dict[int, float] = {}

    def driver() -> None:
        while len(arrived) < 2 or max(arrived) < 3:
            message = driver_end.recv()
            arrived[message.sequence] = time.monotonic()
            time.sleep(ack_delay_s)
            driver_end.send(_protocol.Ack(message.sequence))

    def serialize() -> bytes:
        burn_until = time.thread_time() + serialize_cpu_s
        while time.thread_time() < burn_until:
            pass
        return b"state"

    thread = threading.Thread(target=driver, daemon=True)
    thread.start()
    started = time.monotonic()
    link.commit(serialize)
    while link.stored() < 1:
        time.sleep(0.001)
    link.commit(serialize)
    link.commit(serialize)
    thread.join(30)
    assert not thread.is_alive(), f"the driver got commits {sorted(arrived)} only"
    return [arrived[s] - started for s in sorted(arrived)]


def test_a_cheap_commit_ships_at_once_however_slow_the_acknowledgement() -> None:
    # A loaded host acknowledges late; the commit cost rank 0 nothing, so it is not held back
    # (a restart would otherwise repeat steps the ranks had committed).
    arrivals = shipping(serialize_cpu_s=0, ack_delay_s=0.1)
    assert len(arrivals) in (2, 3), arrivals
    assert arrivals[1] - arrivals[0] < 0.1 + 0.5, arrivals


def test_a_costly_commit_holds_the_next_back_and_the_latest_wins() -> None:
    cost = 0.03  # CPU seconds: the next commit waits until cost / share have passed
    arrivals = shipping(serialize_cpu_s=cost, ack_delay_s=0)
    held = cost / _link.SHIPPING_SHARE
    assert len(arrivals) == 2, f"commit 2 was replaced by 3 while held: {arrivals}"
    assert arrivals[1] - arrivals[0] >= held * 0.8, (arrivals, held)


def test_a_process_failure_is_told_from_other_errors_whatever_carries_it() -> None:
    import ringlet
    from ringlet.elastic import _ulfm

    failed = ringlet.ProcessFailedError("MPI_Recv failed: MPI_ERR_PROC_FAILED: Process Failure")
    assert _ulfm.is_process_failure(failed)
    assert _ulfm.is_process_failure(ringlet.RingletError("allreduce: MPI_ERR_REVOKED"))
    # TensorFlow's UnknownError for an exception raised in a graph operation: the text only.
    carried = RuntimeError("Graph execution error:\nDetected at node RingletAllreduce\n"
                           f"{type(failed).__name__}: {failed}")
    assert _ulfm.is_process_failure(carried)
    assert not _ulfm.is_process_failure(ValueError("a shape differs"))
    assert not _ulfm.is_process_failure(ringlet.RingletError("allreduce: MPI_ERR_TRUNCATE"))


@pytest.mark.parametrize(("program", "status", "returncode"), [
    ("import os; os.abort()", 134, -6),
    ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", 137, -9),
    ("import sys; sys.exit(3)", 3, 3),
    ("pass", None, 0),
])
def test_a_rank_s_program_says_how_it_ended_badly_and_ends_the_same_way(
        program: str, status: int | None, returncode: int) -> None:
    """Under ULFM each rank runs under reporting_its_end: the driver reads the line it prints
    (RANK_END_PATTERN), and PRRTE sees the same signal or status as without it."""
    done = subprocess.run(_protocol.reporting_its_end([sys.executable, "-c", program]),
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "OMPI_COMM_WORLD_RANK": "5"})
    assert done.returncode == returncode, done
    found = _protocol.RANK_END_PATTERN.findall(done.stderr)
    assert found == ([] if status is None else [("5", str(status))]), done.stderr
