"""ringletrun's elastic driver on Open MPI 5 with ULFM: it launches with ``--with-ft ulfm``, a
rank that dies is left behind (its host blacklisted, the reset counted) while the survivors go
on in the same job, hosts that appear join at a restart, and the reset limit and the minimum
number of ranks still end the run with a clear error. tests/elastic's scenario harness and
training script (the final weights checked against the single-process replay); ``localhost``
and ``127.0.0.1`` are two hosts of this machine, as in Horovod's tests."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "elastic")]

import test_elastic_keras as keras_scenario  # noqa: E402
import test_elastic_scenarios as scenarios  # noqa: E402
from ulfm_common import require_ulfm  # noqa: E402

TWO_HOSTS = scenarios.TWO_HOSTS

require_ulfm()


def test_the_driver_turns_ulfm_on_unless_told_to_restart() -> None:
    args = [sys.executable, "-m", "ringlet.run", "--dry-run", "-np", "2", "--min-np", "2",
            "-H", "localhost:2", "python", "t.py"]
    done = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done
    words = shlex.split(done.stdout)
    at = words.index("--with-ft")
    assert words[at:at + 4] == ["--with-ft", "ulfm", "--mca", "osc"], words
    assert words[at + 4] == "^ucx", words
    at = words.index("async_mpi_finalize")
    assert words[at - 1:at + 2] == ["--mca", "async_mpi_finalize", "1"], words
    done = subprocess.run(args, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "RINGLET_ELASTIC_MECHANISM": "restart"})
    assert done.returncode == 0 and "--with-ft" not in done.stdout, done.stdout


def test_ranks_that_die_before_elastic_run_end_the_run_with_their_status() -> None:
    """PRRTE under --with-ft ulfm exits 0 when its processes die of a signal, and prints
    nothing: each rank's program says how it ended, so a job whose ranks crashed at start-up
    (before they said hello to the driver) is a failure, and one that succeeds without
    elastic.run still a success."""
    def ringletrun(*program: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "ringlet.run", "-np", "2", "--min-np", "2",
                               "-H", "localhost:2", *program], capture_output=True, text=True,
                              timeout=120)

    done = ringletrun(sys.executable, "-c", "import os; os.abort()")
    assert done.returncode == 1, done
    assert re.search(r"error: job 1: the process of rank [01] \(localhost\) ended with status "
                     r"134 \(SIGABRT\) before any rank reached elastic.run", done.stderr), done
    done = ringletrun(sys.executable, "-c", "pass")
    assert done.returncode == 0 and "ended with status" not in done.stderr, done


@pytest.mark.parametrize(("at", "sizes"), [("(1, 0)", [4, 3, 3]), ("(2, 3)", [4, 4, 3])],
                         ids=["mid-run", "last-step"])
def test_a_killed_rank_is_left_behind_and_the_job_goes_on(tmp_path: Path, at: str,
                                                          sizes: list[int]) -> None:
    """At the last step the others finish within the driver's grace for a death (in which a
    lost host would show): the rank is left behind all the same, and the run is not
    restarted. Not rank 0: Horovod's fault tolerance without scaling, which kills rank 0,
    is the test after this one."""
    done, results = scenarios.run(tmp_path, exit_schedule={at: ["127.0.0.1[0]"]},
                                  exit_mode="kill", np=4, hosts=",".join(TWO_HOSTS))
    assert done.returncode == 0, scenarios.output(done)
    assert [r["size"] for r in results] == sizes, scenarios.output(done)
    assert [r["rendezvous"] for r in results] == [1 + (s == 3) for s in sizes]
    assert len({r["pid"] for r in results}) == 1, "the job was restarted"
    assert "died; the 3 left go on without it (ULFM); blacklisted: 127.0.0.1" in done.stderr
    assert "job 2" not in done.stderr
    scenarios.check_weights(tmp_path, 3)


@pytest.mark.heavy
def test_fault_tolerance_without_scaling_rank_0_killed_goes_on_in_the_same_job(
        tmp_path: Path) -> None:
    """Horovod's fault tolerance without scaling (fixed hosts, rank 0 killed): the next rank
    becomes rank 0, logs the epochs and ships the commits; no restart. Its exception mode is
    test_a_rank_that_raises_ends_the_job_and_the_driver_restarts_without_its_host."""
    done, results = scenarios.run(tmp_path, exit_schedule={"(1, 0)": ["localhost[0]"]},
                                  exit_mode="kill", np=4, hosts=",".join(TWO_HOSTS))
    assert done.returncode == 0, scenarios.output(done)
    assert [r["size"] for r in results] == [4, 3, 3], scenarios.output(done)
    assert [r["rendezvous"] for r in results] == [1, 2, 2]
    pids = [r["pid"] for r in results]
    assert pids[0] != pids[1] == pids[2], "rank 0 is not a survivor of the same job"
    assert ("rank 0 (localhost[0]) of job 1 died; the 3 left go on without it (ULFM); "
            "blacklisted: localhost") in done.stderr, scenarios.output(done)
    assert "job 2" not in done.stderr
    scenarios.check_weights(tmp_path, 3)


@pytest.mark.heavy
def test_hosts_added_join_at_a_restart(tmp_path: Path) -> None:
    schedule = [(0, ["localhost:2"]), (None, TWO_HOSTS)]
    done, results = scenarios.run(tmp_path, schedule, np=2, min_np=2, max_np=4)
    assert done.returncode == 0, scenarios.output(done)
    assert [r["size"] for r in results] == [2, 4, 4], scenarios.output(done)
    assert [r["rendezvous"] for r in results] == [1, 2, 2]
    scenarios.check_weights(tmp_path, 4)


@pytest.mark.heavy
def test_hosts_added_then_removed_restart_each_time(tmp_path: Path) -> None:
    """Horovod's hosts added and removed: a change of hosts is a restart under ULFM too, and
    no rank dies (localhost's ranks stop at the commit)."""
    schedule = [(0, ["localhost:2"]), (1, TWO_HOSTS), (None, ["127.0.0.1:2"])]
    done, results = scenarios.run(tmp_path, schedule, np=2, min_np=2, max_np=4)
    assert done.returncode == 0, scenarios.output(done)
    jobs = re.findall(r"job \d+: (\d+) ranks on (\S+)", done.stderr)
    assert jobs == [("2", "localhost:2"), ("4", "localhost:2,127.0.0.1:2"),
                    ("2", "127.0.0.1:2")], scenarios.output(done)
    assert [r["size"] for r in results] == [2, 4, 2]
    assert [r["hostname"] for r in results] == ["localhost", "localhost", "127.0.0.1"]
    assert [r["rendezvous"] for r in results] == [1, 2, 3]
    assert "died" not in done.stderr
    scenarios.check_weights(tmp_path, 2)


@pytest.mark.heavy
def test_the_reset_limit_ends_the_run(tmp_path: Path) -> None:
    done, _ = scenarios.run(tmp_path, exit_schedule={"(1, 0)": ["127.0.0.1[0]"]},
                            exit_mode="kill", np=4, hosts=",".join(TWO_HOSTS), reset_limit=0)
    assert done.returncode != 0, scenarios.output(done)
    assert "number of resets during the elastic job exceeded its limit: 0" in done.stderr


@pytest.mark.heavy
def test_fewer_ranks_than_min_np_stop_and_time_out(tmp_path: Path) -> None:
    """The survivor stops at the commit after the driver's notice (the epoch's wait lets the
    notice arrive first), and no second host comes."""
    done, _ = scenarios.run(tmp_path, exit_schedule={"(1, 0)": ["127.0.0.1[0]"]},
                            exit_mode="kill", np=2, min_np=2,
                            hosts="localhost:1,127.0.0.1:1", timeout_s=3, epoch_wait=2,
                            seconds=120)
    assert done.returncode != 0, scenarios.output(done)
    assert "1 ranks left, fewer than --min-np 2: the job stops at its next commit" in done.stderr
    assert "timed out after 3 s waiting for 2 slots" in done.stderr


@pytest.mark.heavy
def test_a_rank_that_raises_ends_the_job_and_the_driver_restarts_without_its_host(
        tmp_path: Path) -> None:
    """An exception is not a process failure: the rank aborts the job (as on any MPI), and
    the driver restarts it on the other host, from the last commit (Horovod's semantics)."""
    done, results = scenarios.run(tmp_path, exit_schedule={"(1, 0)": ["localhost[0]"]},
                                  exit_mode="exception", np=4, hosts=",".join(TWO_HOSTS))
    assert done.returncode == 0, scenarios.output(done)
    assert [r["size"] for r in results] == [4, 2, 2], scenarios.output(done)
    assert [r["rendezvous"] for r in results] == [1, 2, 2]
    assert "blacklisted: localhost" in done.stderr
    scenarios.check_weights(tmp_path, 2)


@pytest.mark.heavy
@pytest.mark.parametrize(("exit_mode", "why"),
                         [("kill", "(every rank died: none is left to go on)"),
                          ("exception", "(every rank failed)")], ids=["kill", "exception"])
def test_all_ranks_failing_end_the_run(tmp_path: Path, exit_mode: str, why: str) -> None:
    """Killed, no survivor is left to go on (and the launcher under ULFM exits 0: it ended
    no rank); raising, each rank says so: either way the run ends, with no restart on a host
    whose ranks failed too."""
    every = ["localhost[0]", "localhost[1]", "127.0.0.1[0]", "127.0.0.1[1]"]
    done, _ = scenarios.run(tmp_path, [(None, TWO_HOSTS)], {"(1, 0)": every}, exit_mode)
    assert done.returncode != 0, scenarios.output(done)
    assert "one or more processes exited with non-zero status" in done.stderr, \
        scenarios.output(done)
    assert why in done.stderr, scenarios.output(done)
    assert "job 2" not in done.stderr


@pytest.mark.heavy
def test_survivors_go_on_with_every_host_blacklisted(tmp_path: Path) -> None:
    """A rank killed on each host blacklists both, but the survivors need no new host: they
    go on in the same job to the end (the blacklist keeps ranks from starting there, it ends
    none). The epochs' wait keeps the job running past the driver's grace for a death."""
    done, results = scenarios.run(tmp_path, [(None, TWO_HOSTS)],
                                  {"(1, 0)": ["localhost[0]", "127.0.0.1[0]"]}, "kill",
                                  epoch_wait=2)
    assert done.returncode == 0, scenarios.output(done)
    assert [r["size"] for r in results] == [4, 2, 2], scenarios.output(done)
    assert [r["rendezvous"] for r in results] == [1, 2, 2]
    pids = [r["pid"] for r in results]
    assert pids[0] != pids[1] == pids[2], "rank 0 is not a survivor of the same job"
    ended = done.stderr.index("job 1's launcher exited (0)")
    for died in ("rank 0 (localhost[0]) of job 1 died; the 2 left go on without it (ULFM); "
                 "blacklisted: localhost",
                 "rank 2 (127.0.0.1[0]) of job 1 died; the 2 left go on without it (ULFM); "
                 "blacklisted: 127.0.0.1"):
        assert 0 <= done.stderr.find(died) < ended, scenarios.output(done)
    assert "job 2" not in done.stderr and "hosts changed" not in done.stderr
    scenarios.check_weights(tmp_path, 2)


@pytest.mark.heavy
def test_a_blacklisted_host_back_after_its_cooldown_joins_at_a_restart(
        tmp_path: Path) -> None:
    """Horovod's resurrecting blacklisted hosts, the rank killed: left behind, its host back
    2 s later (the cooldown range 1-2 s clamps Horovod's backoff to 2 s), that is, hosts
    added: the job stops at its next commit and restarts on 4 ranks. The epochs' 7 s wait
    puts death, grace (2 s), cooldown and notice inside the epoch of each death."""
    done, results = scenarios.run(tmp_path, [(None, TWO_HOSTS)],
                                  {"(1, 0)": ["127.0.0.1[1]"], "(3, 0)": ["127.0.0.1[1]"]},
                                  "kill", epochs=5, epoch_wait=7, cooldown=(1, 2),
                                  seconds=300)
    assert done.returncode == 0, scenarios.output(done)
    jobs = re.findall(r"job \d+: (\d+) ranks on (\S+)", done.stderr)
    assert jobs == [("4", "localhost:2,127.0.0.1:2")] * 3, scenarios.output(done)
    assert done.stderr.count("rank 3 (127.0.0.1[1]) of job ") == 2
    for job in (1, 2):
        assert (f"rank 3 (127.0.0.1[1]) of job {job} died; the 3 left go on without it "
                "(ULFM); blacklisted: 127.0.0.1") in done.stderr, scenarios.output(done)
    assert done.stderr.count("hosts changed: localhost:2,127.0.0.1:2; the job stops") == 2
    assert [r["epoch"] for r in results] == [0, 1, 2, 3, 4]
    assert [r["size"] for r in results] == [4, 3, 4, 3, 4]
    assert [r["rendezvous"] for r in results] == [1, 2, 3, 4, 5]
    assert [r["hostname"] for r in results] == ["localhost"] * 5
    pids = [r["pid"] for r in results]
    assert pids[0] == pids[1] != pids[2] == pids[3] != pids[4] != pids[0], pids
    scenarios.check_weights(tmp_path, 4)


@pytest.mark.heavy
@pytest.mark.parametrize("backend", ["tensorflow", "jax", "torch"])
def test_keras_survivors_of_a_killed_rank_go_on_in_the_same_job(tmp_path: Path,
                                                                backend: str) -> None:
    """tests/elastic/test_elastic_keras.py's run under ULFM: Keras's functions are traced
    again on the shrunk communicator, and the three left finish in the same job. On JAX the
    failed step's error also sits in the token JAX hands to the next step, which ringlet.jax
    drops (else every step after the recovery failed with it, and the run never ended)."""
    done, epochs, said = keras_scenario.run_keras_killing_one(tmp_path, backend)
    assert [(e["epoch"], e["size"]) for e in epochs] == [(1, 4), (2, 3), (3, 3)], said
    assert [e["rendezvous"] for e in epochs] == [1, 2, 2], said
    assert len({e["pid"] for e in epochs}) == 1, "the job was restarted"
    assert "died; the 3 left go on without it (ULFM); blacklisted: 127.0.0.1" in done.stderr
