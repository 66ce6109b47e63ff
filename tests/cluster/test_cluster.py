"""ringlet across the hosts of the emulated cluster (tests/cluster/run.sh starts these
under tools/emulated_cluster.sh mpirun, once per layout): the topology as MPI sees it, every
allreduce algorithm exact and bit-identical on every rank, in every dtype, whatever the
placement, and every algorithm of reduce, broadcast, allgather and reduce_scatter exact.

Inputs are small integers derived from (rank, index), so every rank computes every rank's input
and the exact sum itself; mpi4py's allgather compares the results' bytes across ranks."""

from __future__ import annotations

import hashlib
import os

import ml_dtypes
import numpy as np
import pytest
from mpi4py import MPI

import ringlet

COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.rank, COMM.size
DTYPES = {
    "float32": np.float32, "float64": np.float64, "int32": np.int32, "int64": np.int64,
    "float16": np.float16, "bfloat16": ml_dtypes.bfloat16,
}
COUNTS = [1, 7, SIZE + 1, 1000, 1 << 20]  # 1 << 20 float32: 4 MiB over the shaped links

ringlet.init()


def layout() -> tuple[list[str], list[int]]:
    """Every rank's host name, and its node (numbered by lowest rank), from mpi4py alone."""
    names = COMM.allgather(MPI.Get_processor_name())
    node = COMM.Split_type(MPI.COMM_TYPE_SHARED, key=RANK)
    leaders = COMM.allgather(node.allreduce(RANK, op=MPI.MIN))
    node.Free()
    firsts = list(dict.fromkeys(leaders))
    return names, [firsts.index(leader) for leader in leaders]


def test_the_job_spans_several_hosts():
    names, nodes = layout()
    assert len(set(nodes)) > 1, "the emulated cluster runs this on one host"
    # One node per host name: the namespaces' hostnames are what MPI groups by.
    assert len(set(names)) == len(set(nodes))
    assert all(names[r] == names[s] for r in range(SIZE) for s in range(SIZE)
               if nodes[r] == nodes[s])


def test_pieces_between_hosts_are_in_force_from_init():
    """Before any auto call: init took the pieces between nodes from the cached calibration or
    measured them, so calls with an explicit algorithm send what calibration would."""
    from ringlet import _core, calibration

    settings = ringlet.settings()
    assert settings["across_message_bytes_auto"] is True
    limit = settings["across_message_bytes"]
    assert limit in _core.message_limit_options()
    assert _core.installed_parameters() is None, "auto has run already: this test must come first"
    key = calibration.calibration_key()
    measured = calibration._pieces_measured.get(calibration._digest(key))
    cached = calibration.cache_path(key).exists()
    assert cached or (measured is not None and measured[0] == limit)
    assert COMM.allgather(limit) == [limit] * SIZE


def test_other_hosts_get_a_logins_environment_not_the_callers():
    # run.sh sets CALLER_ONLY for mpirun and does not forward it (-x), as ssh would not.
    on_first_host = MPI.Get_processor_name() == "rgl-h0"
    assert (os.environ.get("CALLER_ONLY") == "1") == on_first_host
    assert os.environ.get("RINGLET_TEST_REPORTS")  # what mpirun forwards arrives everywhere


def test_idle_ranks_yield_the_cores_the_hosts_share():
    # Every emulated host runs on this machine's few cores; ranks that busy-poll while they wait
    # would make each step between hosts wait for the scheduler (tools/emulated_cluster.sh).
    assert os.environ.get("OMPI_MCA_mpi_yield_when_idle") == "1"


def test_topology_is_the_mpi_librarys(monkeypatch):
    names, nodes = layout()
    topology = ringlet.topology()
    assert list(topology.hosts) == names
    assert list(topology.nodes) == nodes
    mine = [r for r in range(SIZE) if nodes[r] == nodes[RANK]]
    assert (topology.local_rank, topology.local_size) == (mine.index(RANK), len(mine))
    assert (topology.cross_rank, topology.cross_size) == (nodes[RANK], len(set(nodes)))
    hosts = len(set(nodes))
    counts = [nodes.count(n) for n in range(hosts)]
    if all(nodes[r] <= nodes[r + 1] for r in range(SIZE - 1)):
        expected = "block"
    elif len(set(counts)) == 1 and all(nodes[r] == r % hosts for r in range(SIZE)):
        expected = "round-robin"
    else:
        expected = "irregular"
    assert topology.placement == expected
    assert "two_tier" in str(topology) and f"placement {expected}" in str(topology)
    import ringlet.hvd as hvd

    # Order matching: no negotiation thread, whose cycles would meet the next tests' own
    # collectives (ringlet's API) in another order on another rank.
    monkeypatch.setenv("RINGLET_HVD_MATCHING", "order")
    hvd.init()
    assert (hvd.local_rank(), hvd.local_size(), hvd.cross_rank(), hvd.cross_size()) == (
        topology.local_rank, topology.local_size, topology.cross_rank, topology.cross_size)
    assert hvd.is_homogeneous() == (len(set(counts)) == 1)


def available() -> list[str]:
    return [a for a in ringlet.ALGORITHMS
            if ringlet._core.algorithm_unavailable("allreduce", a, 0) is None]


RUNNABLE = [(a, d) for a in ["auto", *available()] for d in DTYPES
            if not (a == "mpi" and d in ("float16", "bfloat16"))]  # MPI has no 16-bit floats


def test_shared_memory_is_refused_with_its_reason_across_hosts():
    assert "shm" in ringlet.ALGORITHMS and "shm" not in available()
    x = np.ones(16, np.float32)
    with pytest.raises(ValueError, match="every rank on one node"):
        ringlet.allreduce(x, algorithm="shm")
    assert np.array_equal(x, np.ones(16, np.float32)), "the input changed"
    np.testing.assert_array_equal(ringlet.allreduce(x, algorithm="ring"), np.full(16, SIZE))


def inputs(count: int, dtype) -> list[np.ndarray]:
    index = np.arange(count)
    return [((r * 7 + index) % 5 - 2).astype(dtype) for r in range(SIZE)]


def digest(array: np.ndarray) -> str:
    return hashlib.sha256(array.tobytes()).hexdigest()


def test_every_algorithm_but_shm_runs_across_hosts():
    assert {a for a, _ in RUNNABLE} == {"auto", *ringlet.ALGORITHMS} - {"shm"}


@pytest.mark.parametrize(("algorithm", "dtype"), RUNNABLE)
def test_every_algorithm_is_exact_and_identical_on_every_rank(algorithm, dtype):
    np_dtype = DTYPES[dtype]
    for count in COUNTS if dtype == "float32" else COUNTS[:-1]:
        mine = inputs(count, np_dtype)
        expected = np.sum(np.stack(mine).astype(np.float64), axis=0).astype(np_dtype)
        result = ringlet.allreduce(mine[RANK], op="sum", algorithm=algorithm)
        np.testing.assert_array_equal(result, expected, err_msg=f"{algorithm} {count}")
        assert COMM.allgather(digest(result)) == [digest(result)] * SIZE


@pytest.mark.parametrize("algorithm", ["auto", "ring", "halving_doubling", "two_tier"])
def test_averages_and_extremes_agree_bit_for_bit(algorithm):
    rng = np.random.default_rng(RANK)
    x = rng.standard_normal(4099).astype(np.float32)
    everyone = np.stack(COMM.allgather(x))
    mean = ringlet.allreduce(x, op="avg", algorithm=algorithm)
    np.testing.assert_allclose(mean, everyone.mean(axis=0), rtol=1e-5, atol=1e-6)
    assert COMM.allgather(digest(mean)) == [digest(mean)] * SIZE
    ints = (np.arange(1000) * (RANK + 3) % 97).astype(np.int32)
    stacked = np.stack(COMM.allgather(ints))
    for op, reference in (("max", stacked.max(axis=0)), ("min", stacked.min(axis=0))):
        np.testing.assert_array_equal(ringlet.allreduce(ints, op=op, algorithm=algorithm),
                                      reference)


def test_fused_gradients_average_across_hosts():
    grads = [np.full(n, RANK + 1, np.float32) for n in (3, 70_000, 5, 1 << 16)]
    ringlet.average_gradients(grads)
    mean = (SIZE + 1) / 2
    for g in grads:
        np.testing.assert_array_equal(g, np.full(g.shape, mean, np.float32))


@pytest.mark.parametrize("algorithm", ["two_tier", "ring", "auto"])
def test_prescale_and_postscale_apply_once_whatever_the_hosts(algorithm):
    """Uneven hosts included: a rank alone on its host scales its input as the others' rings do."""
    grads = [np.full(n, RANK + 1, np.float32) for n in (5, 1000, 1 << 15)]
    ringlet.average_gradients(grads, op="sum", prescale=2.0, postscale=0.25,
                              algorithm=algorithm)
    want = 2.0 * SIZE * (SIZE + 1) / 2 * 0.25
    for g in grads:
        np.testing.assert_array_equal(g, np.full(g.shape, want, np.float32))
        assert COMM.allgather(digest(g)) == [digest(g)] * SIZE


def other_collectives() -> list[tuple[str, str]]:
    return [(collective, algorithm)
            for collective in ("reduce", "broadcast", "allgather", "reduce_scatter")
            for algorithm in ("auto", *ringlet.algorithms(collective))]


@pytest.mark.parametrize(("collective", "algorithm"), other_collectives())
def test_the_other_collectives_are_exact_across_hosts(collective, algorithm):
    """reduce, broadcast, allgather and reduce_scatter with each of their algorithms, at a few
    sizes, roots at both ends; results against NumPy on every rank."""
    for count in (1, SIZE + 3, 70_000):
        mine = inputs(count, np.int32)
        total = np.sum(np.stack(mine), axis=0, dtype=np.int32)
        if collective == "reduce":
            for root in (0, SIZE - 1):
                result = ringlet.reduce(mine[RANK], root, algorithm=algorithm)
                if RANK == root:
                    np.testing.assert_array_equal(result, total, err_msg=f"{algorithm} {count}")
                else:
                    assert result is None
        elif collective == "broadcast":
            for root in (0, SIZE - 1):
                result = ringlet.broadcast(mine[RANK], root, algorithm=algorithm)
                np.testing.assert_array_equal(result, mine[root], err_msg=f"{algorithm} {count}")
        elif collective == "allgather":
            rows = mine[RANK][: count // (RANK + 1)]  # a different share on every rank
            result = ringlet.allgather(rows, algorithm=algorithm)
            expected = np.concatenate([mine[r][: count // (r + 1)] for r in range(SIZE)])
            np.testing.assert_array_equal(result, expected, err_msg=f"{algorithm} {count}")
        else:
            block = ringlet.reduce_scatter(mine[RANK], algorithm=algorithm)
            expected = np.array_split(total, SIZE)[RANK]
            np.testing.assert_array_equal(block, expected, err_msg=f"{algorithm} {count}")


def test_calibration_installs_its_pieces_between_hosts_alike_on_every_rank():
    """Calibration times pairs of hosts exchanging both ways with whole messages and with
    pieces, and installs its choice (it is part of every call's fingerprint, so it must be the
    same everywhere); what is installed is what the parameters say."""
    from ringlet import _core

    params = ringlet.calibrate().model()
    settings = ringlet.settings()
    assert settings["across_message_bytes_auto"] is True
    assert settings["across_message_bytes"] == params["across_message_bytes"]
    assert params["across_message_bytes"] in _core.message_limit_options()
    assert params["exchange_slowdown"] > 0
    mine = (params["across_message_bytes"], params["exchange_slowdown"], params["beta_across"])
    assert COMM.allgather(mine) == [mine] * SIZE


@pytest.mark.parametrize("algorithm", ["auto", *available()])
def test_every_algorithm_is_exact_with_small_pieces_between_hosts(algorithm):
    """1000-byte pieces between hosts (not a multiple of 8: pieces cut through elements, which
    the receiver puts back together), whole messages inside each host."""
    before = ringlet.settings()
    ringlet.settings(across_message_bytes=1000)
    try:
        for dtype in (np.float64, np.int32):
            for count in (7, 70_000):
                mine = inputs(count, dtype)
                expected = np.sum(np.stack(mine), axis=0, dtype=dtype)
                result = ringlet.allreduce(mine[RANK], algorithm=algorithm)
                np.testing.assert_array_equal(result, expected, err_msg=f"{algorithm} {count}")
                assert COMM.allgather(digest(result)) == [digest(result)] * SIZE
        # A calibration meanwhile keeps the user's limit in force.
        if algorithm == "auto":
            ringlet.calibrate()
            assert ringlet.settings()["across_message_bytes"] == 1000
    finally:
        ringlet.settings(across_message_bytes="auto")
    assert ringlet.settings() == before
