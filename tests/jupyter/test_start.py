"""ringlet.jupyter.start: MPI engines from ipyparallel, ringlet initialized on each, results and
errors brought back, and nothing left running after ipyparallel's own stop.

The functions sent to the engines are marked ``interactive`` (ipyparallel's way to send them by
value, as a notebook's own functions are: the engines cannot import this test module)."""

from __future__ import annotations

import shutil

import ipyparallel
import numpy as np
import pytest
from ipyparallel import interactive

from ringlet import jupyter, run

from ipp_processes import processes_of_cluster, wait_until_gone


@interactive
def identity():
    import os

    import ringlet

    return ringlet.rank(), ringlet.size(), ringlet.is_initialized(), os.getpid()


@interactive
def rank_dependent_sum():
    import numpy as np

    import ringlet

    x = np.arange(8, dtype=np.float64) * (ringlet.rank() + 1)
    return ringlet.allreduce(x)


@interactive
def mismatched_allreduce():
    import numpy as np

    import ringlet

    return ringlet.allreduce(np.ones(4 + ringlet.rank(), np.float32))


@interactive
def fails_on_rank_one():
    import ringlet

    if ringlet.rank() == 1:
        raise ValueError("only rank 1 objects")
    return ringlet.rank()


@pytest.fixture(scope="module")
def two_engines():
    cluster, view = jupyter.start(n=2, progress=False, timeout=90)
    yield cluster, view
    cluster.stop_cluster_sync()


def test_start_initializes_every_engine_in_rank_order(two_engines):
    cluster, view = two_engines
    ranks = jupyter.run(view, identity)
    assert [(r, s, ok) for r, s, ok, _ in ranks] == [(0, 2, True), (1, 2, True)]
    assert len(view) == 2 and view.block
    assert processes_of_cluster(cluster.cluster_id), "no process carries the cluster's id"


def test_run_returns_each_ranks_result_and_the_allreduce_is_right(two_engines):
    _, view = two_engines
    results = jupyter.run(view, rank_dependent_sum)
    expected = np.arange(8, dtype=np.float64) * 3
    assert len(results) == 2
    for result in results:
        np.testing.assert_array_equal(result, expected)


def test_a_mismatch_reaches_the_notebook_from_every_rank_and_the_ranks_stay_in_step(two_engines):
    _, view = two_engines
    with pytest.raises(jupyter.EngineError) as caught:
        jupyter.run(view, mismatched_allreduce)
    assert sorted(caught.value.errors) == [0, 1]
    assert {name for name, _ in caught.value.errors.values()} == {"MismatchError"}
    message = str(caught.value)
    assert message.startswith("mismatched_allreduce failed on 2 ranks:")
    assert "ranks 0, 1: MismatchError:" in message and "float32[4]" in message
    for result in jupyter.run(view, rank_dependent_sum):
        np.testing.assert_array_equal(result, np.arange(8, dtype=np.float64) * 3)


def test_an_error_on_one_rank_names_that_rank(two_engines):
    _, view = two_engines
    with pytest.raises(jupyter.EngineError) as caught:
        jupyter.run(view, fails_on_rank_one)
    assert caught.value.errors == {1: ("ValueError", "only rank 1 objects")}
    assert "rank 1: ValueError: only rank 1 objects" in str(caught.value)


def test_explain_and_benchmark_tables_render_as_text_and_html(two_engines):
    _, view = two_engines
    table = jupyter.explain(view, 1 << 16)
    chosen = [row[0] for row in table.rows if row[-1] == "chosen"]
    assert len(chosen) == 1 and chosen[0] in jupyter.run(view, _algorithms)[0]
    assert "<table>" in table._repr_html_() and chosen[0] in str(table)
    bench = jupyter.benchmark(view, sizes=[1024, 65536], repeats=3, progress=False)
    assert bench.sizes == [1024, 65536]
    assert set(bench.seconds) == {"auto", "mpi"}
    assert all(s > 0 for values in bench.seconds.values() for s in values)
    assert "auto / mpi" in bench._repr_html_()
    axes = bench.plot()
    assert len(axes.get_lines()) == 2


@interactive
def _algorithms():
    import ringlet

    return ringlet.algorithms()


def test_stop_leaves_no_process_behind():
    cluster, view = jupyter.start(n=3, progress=True, timeout=90)
    pids = [pid for *_, pid in jupyter.run(view, identity)]
    assert len(set(pids)) == 3
    running = processes_of_cluster(cluster.cluster_id)
    assert set(pids) <= {pid for pid, _ in running}
    cluster.stop_cluster_sync()
    assert wait_until_gone(cluster.cluster_id) == []


def test_hosts_are_passed_to_mpiexec():
    cluster, view = jupyter.start(n=2, hosts=["localhost:2"], progress=False, timeout=90)
    try:
        assert [r for r, *_ in jupyter.run(view, identity)] == [0, 1]
        (engines,) = cluster.engines.values()
        command = engines.find_args()
        # No mpiexec given: the launcher of the MPI ringlet loads, as ringletrun finds it.
        assert command[0] == shutil.which(run.default_launcher("mpiexec").launcher)
        assert cluster.controller_ip == "*"  # engines on other hosts must reach it
        if jupyter._mpi_flavor(command[0]) == "openmpi":
            assert "--host" in command and "localhost:2" in command
            for name in jupyter.IPYPARALLEL_VARIABLES:  # remote ranks get only what -x names
                assert ["-x", name] in [command[i:i + 2] for i in range(len(command))]
        else:
            assert "-hosts" in command and "localhost:2" in command
    finally:
        cluster.stop_cluster_sync()
    assert wait_until_gone(cluster.cluster_id) == []


def test_engines_that_cannot_start_raise_with_the_launchers_words_and_leave_nothing():
    with pytest.raises(RuntimeError, match=r"0 of 2 engines registered") as caught:
        jupyter.start(n=2, mpi_args=["--no-such-mpiexec-option"], progress=False, timeout=8,
                      cluster_id="ringlet-test-broken")
    assert "no-such-mpiexec-option" in str(caught.value)
    assert wait_until_gone("ringlet-test-broken") == []


def test_a_launcher_seen_to_stop_is_told_the_same_way(monkeypatch):
    # ipyparallel notices a launcher that exits at once either before the timeout (its
    # EngineError, "Engine set stopped") or not (a timeout): a fresh-clone run met the first.
    import ipyparallel

    def stopped(self, n, timeout=-1, interactive=None):
        raise ipyparallel.error.EngineError("Engine set stopped: {'exit_code': 1}")

    monkeypatch.setattr(ipyparallel.Client, "wait_for_engines", stopped)
    with pytest.raises(RuntimeError, match=r"0 of 2 engines registered before the launcher "
                                           r"stopped \(Engine set stopped") as caught:
        jupyter.start(n=2, mpi_args=["--no-such-mpiexec-option"], progress=False,
                      cluster_id="ringlet-test-stopped")
    assert isinstance(caught.value.__cause__, ipyparallel.error.EngineError)
    assert wait_until_gone("ringlet-test-stopped") == []


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"n": 0}, "n must be a positive number of engines"),
        ({"n": 2.5}, "n must be a positive number of engines"),
        ({"n": 2, "hosts": ["node1"], "engines": "slurm"}, "hosts applies to engines='mpi' only"),
        ({"n": 2, "sbatch_args": ["--nodes=2"]}, "sbatch_args applies to engines='slurm' only"),
        ({"n": 2, "hosts": [""]}, "hosts must be a hostfile's path or a list of host names"),
        ({"n": 2, "mpiexec": "no-such-mpiexec"}, "no MPI launcher 'no-such-mpiexec' on PATH"),
    ],
)
def test_bad_arguments_are_refused_before_anything_starts(kwargs, message):
    with pytest.raises(ValueError, match=message):
        jupyter.start(progress=False, **kwargs)


def test_without_mpiexec_the_launcher_of_ringlets_mpi_is_used(monkeypatch):
    asked = []

    def launcher_of_ringlets_mpi(default: str) -> run.FoundLauncher:
        asked.append(default)
        return run.FoundLauncher("no-such-launcher-of-ringlets-mpi", None, "a test's")

    monkeypatch.setattr(run, "default_launcher", launcher_of_ringlets_mpi)
    with pytest.raises(ValueError, match="no MPI launcher 'no-such-launcher-of-ringlets-mpi'"):
        jupyter.start(n=2, progress=False)
    assert asked == ["mpiexec"]  # as before, when no MPI library is found
    with pytest.raises(ValueError, match="no MPI launcher 'no-such-mpiexec'"):
        jupyter.start(n=2, progress=False, mpiexec="no-such-mpiexec")
    assert asked == ["mpiexec"]  # a launcher named is not looked for


def test_slurm_engines_get_pmix_the_sbatch_args_and_a_controller_they_reach(monkeypatch):
    """What start() gives ipyparallel's Slurm launcher (tests/cluster/test_slurm.py runs
    it under a real Slurm)."""
    recorded = {}

    class Submitted(Exception):
        pass

    class RecordingCluster:
        def __init__(self, **kwargs):
            recorded["cluster"] = kwargs

        def start_controller_sync(self):
            pass

        def start_engines_sync(self, **kwargs):
            recorded["engines"] = kwargs
            raise Submitted

        def stop_cluster_sync(self):
            recorded["stopped"] = True

    monkeypatch.setattr(ipyparallel, "Cluster", RecordingCluster)
    monkeypatch.delenv("SLURM_MPI_TYPE", raising=False)
    with pytest.raises(Submitted):
        jupyter.start(n=4, engines="slurm", progress=False, environment={"A": "1"},
                      sbatch_args=["--nodes=2", "--ntasks-per-node=2"])
    assert recorded["cluster"]["engines"] == "slurm"
    assert recorded["cluster"]["controller_ip"] == "*"
    assert recorded["engines"] == {
        "n": 4, "environment": {"A": "1", "SLURM_MPI_TYPE": "pmix"},
        "submit_command": ["sbatch", "--nodes=2", "--ntasks-per-node=2"]}
    assert recorded["stopped"]
    # The caller's choice of PMI wins, from the environment the job inherits or from `environment`.
    monkeypatch.setenv("SLURM_MPI_TYPE", "pmi2")
    with pytest.raises(Submitted):
        jupyter.start(n=2, engines="slurm", progress=False)
    assert recorded["engines"]["environment"] == {}
    with pytest.raises(Submitted):
        jupyter.start(n=2, engines="slurm", progress=False,
                      environment={"SLURM_MPI_TYPE": "pmix_v4"})
    assert recorded["engines"]["environment"] == {"SLURM_MPI_TYPE": "pmix_v4"}
