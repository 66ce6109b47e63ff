"""The selector: its model, overrides, calibration cache, agreement across ranks, explain()."""

from __future__ import annotations

import os

import numpy as np
import pytest
from mpi4py import MPI

import ringlet
from ringlet import _core, selector

SIZES = [2**k for k in range(0, 31)]


@pytest.fixture
def fresh_table(monkeypatch):
    """Rebuild the auto table inside the test and again afterwards (env overrides apply then)."""
    _core.clear_auto_table()
    yield monkeypatch
    monkeypatch.undo()
    _core.clear_auto_table()


@pytest.fixture
def quick_calibration(monkeypatch, comm):
    """A cache directory of the test's own (the same path on every rank), and few sizes."""
    base = comm.bcast(os.environ.get("RINGLET_CACHE_DIR", "build/test-cache"), root=0)
    directory = os.path.join(base, f"selector-{comm.bcast(os.getpid(), root=0)}")
    monkeypatch.setenv("RINGLET_CACHE_DIR", directory)
    monkeypatch.setattr(selector, "CALIBRATION_SIZES", (8, 4096, 65536))
    monkeypatch.setattr(selector, "LARGE_CALIBRATION_SIZE", 262144)
    _core.clear_auto_table()
    yield directory
    monkeypatch.undo()
    _core.clear_auto_table()


def ran(algorithm_call) -> str:
    """The one algorithm a call ran, from the core's per-algorithm counters."""
    ringlet.reset_stats()
    algorithm_call()
    used = ringlet.stats()
    assert len(used) == 1 and next(iter(used.values()))["calls"] == 1, used
    return next(iter(used))


@pytest.mark.parametrize("algorithm", selector.ALGORITHMS)
@pytest.mark.parametrize("ranks", [2, 3, 4, 5, 8, 16, 64])
def test_model_time_never_decreases_with_message_size(algorithm, ranks):
    params = selector.Parameters(gamma={"float32": 1 / 20e9})
    times = [selector.model_seconds(algorithm, m, ranks, "float32", params) for m in SIZES]
    assert all(a <= b for a, b in zip(times, times[1:])), times
    assert times[0] > 0


def test_model_prefers_latency_optimal_small_and_bandwidth_optimal_large():
    params = selector.Parameters(alpha=5e-6, beta=1e-9, gamma={"float32": 1e-10})
    # One meeting in shared memory beats log2(16) messages where the ranks share memory.
    latency_optimal = ("recursive_doubling", "mpi", "shm")
    assert selector.best(64, 16, "float32", params) in latency_optimal
    assert selector.best(256 << 20, 16, "float32", params) in (
        "ring", "pipelined_ring", "halving_doubling", "mpi"
    )
    model = lambda a, m: selector.model_seconds(a, m, 16, "float32", params)  # noqa: E731
    assert model("recursive_doubling", 64) < model("ring", 64)  # 4 rounds, not 30
    assert model("shm", 64) < model("recursive_doubling", 64)  # 1 meeting, not 4 messages
    assert model("ring", 256 << 20) < model("recursive_doubling", 256 << 20)


BLOCK_4X2 = [0, 0, 1, 1, 2, 2, 3, 3]
ROUND_ROBIN_4X2 = [0, 1, 2, 3, 0, 1, 2, 3]


@pytest.mark.parametrize("nodes", [BLOCK_4X2, ROUND_ROBIN_4X2, [0, 0, 0, 1]])
def test_across_nodes_the_model_prices_each_nodes_link(nodes):
    """A 1 Gbit/s network under 20 GB/s nodes: the two tiers send the node's result once over
    each link (the bound, 2(H-1)/H m), the node-major ring a block per step, and a schedule
    that ignores nodes sends every rank's traffic over its node's link."""
    params = selector.Parameters(alpha=1e-6, beta=1 / 20e9, gamma={"float32": 1 / 20e9},
                                 alpha_across=50e-6, beta_across=8 / 1e9)
    m, ranks, hosts = 16 << 20, len(nodes), len(set(nodes))
    model = {a: selector.model_seconds(a, m, ranks, "float32", params, nodes)
             for a in ("ring", "halving_doubling", "two_tier")}
    bound = 2 * (hosts - 1) / hosts * m * params.beta_across
    assert bound <= model["two_tier"] < 1.1 * bound, model
    assert model["two_tier"] < model["ring"] < model["halving_doubling"], model
    # On one node there is no link: the two tiers are the ring.
    one = [0] * ranks
    assert selector.model_seconds("two_tier", m, ranks, "float32", params, one) == \
        selector.model_seconds("ring", m, ranks, "float32", params, one)


def test_the_layout_is_the_communicators_own(comm, size):
    nodes = selector.layout(size)
    node_comm = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.rank)
    leaders = comm.allgather(node_comm.allreduce(comm.rank, op=MPI.MIN))
    node_comm.Free()
    firsts = list(dict.fromkeys(leaders))
    assert nodes == [firsts.index(leader) for leader in leaders]
    assert selector.layout(size + 3) == [0] * (size + 3)  # a what-if: one node


def test_sixteen_bit_floats_and_float_min_max_never_go_to_mpi():
    params = selector.Parameters(alpha=1e-7)  # an MPI allreduce would win small messages
    table = selector.build_table(4, params)
    for dtype in ("float16", "bfloat16"):
        assert "mpi" not in selector.candidates(dtype)
        for op in ringlet.OPS:
            assert all(name != "mpi" for _, name in table[dtype, op])
    for dtype in ("float32", "float64", "float16", "bfloat16"):
        for op in ("min", "max"):
            assert "mpi" not in selector.candidates(dtype, op)
            assert all(name != "mpi" for _, name in table[dtype, op])
    assert "mpi" in selector.candidates("int64", "min")


def test_explicit_algorithm_beats_auto(size):
    x = np.ones(1000, dtype=np.float32)
    for algorithm in ringlet.ALGORITHMS:
        assert ran(lambda a=algorithm: ringlet.allreduce(x, algorithm=a)) == algorithm


def test_environment_forces_one_algorithm(fresh_table, size):
    fresh_table.setenv("RINGLET_ALGORITHM", "halving_doubling")
    for nbytes in (8, 4096, 1 << 20):
        x = np.ones(nbytes // 4, dtype=np.float32)
        expected = "ring" if size == 1 else "halving_doubling"
        assert ran(lambda x=x: ringlet.allreduce(x)) == expected


def test_environment_thresholds(fresh_table, size):
    fresh_table.setenv("RINGLET_AUTO_TABLE", "recursive_doubling:1K,pipelined_ring:64K,ring")
    expected = {512: "recursive_doubling", 1024: "recursive_doubling", 4096: "pipelined_ring",
                1 << 20: "ring"}
    for nbytes, algorithm in expected.items():
        x = np.ones(nbytes // 4, dtype=np.float32)
        got = ran(lambda x=x: ringlet.allreduce(x, "sum"))
        assert got == ("ring" if size == 1 else algorithm), (nbytes, got)


def test_bad_environment_values_are_clear_errors(fresh_table):
    fresh_table.setenv("RINGLET_ALGORITHM", "tree")
    with pytest.raises(ValueError, match=r"unknown algorithm 'tree'"):
        ringlet.allreduce(np.ones(4, dtype=np.float32))


def test_every_rank_makes_the_same_choices(comm):
    x = np.ones(3, dtype=np.float64)
    ringlet.allreduce(x)  # builds the table (calibrating or loading the cache)
    mine = repr(sorted(selector._table.items()))
    assert all(other == mine for other in comm.allgather(mine))
    choices = [selector.choose(m, ringlet.size(), "bfloat16", "sum") for m in SIZES]
    assert all(other == choices for other in comm.allgather(choices))
    # The Rust table and the Python one agree.
    for m in SIZES:
        for op in ("sum", "max"):
            python_choice = selector.choose(m, ringlet.size(), "float32", op)
            assert _core.auto_choice("float32", op, m) == python_choice


def test_calibration_round_trips_through_the_cache(quick_calibration, comm, size):
    params = ringlet.calibrate()
    if size == 1:
        assert params.source.startswith("one rank")
        return
    assert params.alpha > 0 and params.beta > 0 and set(params.gamma) >= {"float32", "bfloat16"}
    assert params.corrections["ring"], "calibration timed the candidates"
    path = selector.cache_path(selector.calibration_key())
    if comm.rank == 0:
        saved = selector.Parameters.from_json(path.read_text(), source="test")
        assert saved.to_json() == params.to_json()
    again = selector.parameters()
    assert again.source == str(path), "the second call reads the cache"
    assert again.to_json() == params.to_json()


def test_calibration_stops_at_its_budget(quick_calibration, monkeypatch, comm, size):
    """The sizes stop where the time spent and the next size's expected time would pass the
    budget: every rank stops at the same size, and nothing is timed past it."""
    if size == 1:
        assert ringlet.calibrate().source.startswith("one rank")
        return
    # 3 runs of 1 GiB per candidate take seconds even in memory: past the 3 s budget.
    monkeypatch.setattr(selector, "CALIBRATION_SIZES", (8, 64, 4096))
    monkeypatch.setattr(selector, "LARGE_CALIBRATION_SIZE", 1 << 30)
    params = ringlet.calibrate()
    timed = [b for b, _ in params.corrections["ring"]]
    assert timed == [8, 64, 4096]
    assert all(other == timed for other in comm.allgather(timed))
    assert all([b for b, _ in points] == timed for points in params.corrections.values()
               if points)
    assert params.calibration_seconds < selector.CALIBRATION_BUDGET + 2
    # Larger messages keep the last measured correction.
    last = params.corrections["ring"][-1][1]
    assert selector.correction("ring", 1 << 30, params) == pytest.approx(last)


def test_corrupt_cache_is_recalibrated_with_a_warning(quick_calibration, comm, size):
    if size == 1:
        assert selector.parameters().source.startswith("one rank")
        return
    path = selector.cache_path(selector.calibration_key())
    if comm.rank == 0:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("{ this is not json")
    comm.Barrier()
    if comm.rank == 0:
        with pytest.warns(RuntimeWarning, match="unreadable calibration cache"):
            params = selector.parameters()
    else:
        params = selector.parameters()
    assert params.source.startswith("calibrated now")
    if comm.rank == 0:
        assert selector.Parameters.from_json(path.read_text(), "test").alpha == params.alpha


def test_stale_cache_is_ignored(quick_calibration, comm, size):
    if size == 1:
        return
    key = selector.calibration_key()
    path = selector.cache_path(key)
    stale = selector.Parameters(alpha=1.0, key={**key, "ringlet": "0.0.0"}, gamma={"float32": 1.0})
    if comm.rank == 0:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(stale.to_json())
    comm.Barrier()
    params = selector.parameters()
    assert params.source.startswith("calibrated now") and params.alpha != 1.0


@pytest.mark.parametrize(
    "bad", [f'{{"format": {selector.CACHE_FORMAT}, "alpha": -1}}', "[1, 2]", '{"format": 99}']
)
def test_invalid_parameters_are_rejected(bad):
    with pytest.raises((ValueError, TypeError)):
        selector.Parameters.from_json(bad, source="test")


def test_explain_prints_and_returns_each_candidate(capsys, size):
    explanation = ringlet.explain(1 << 20)
    printed = capsys.readouterr().out
    assert explanation.choice in [c.algorithm for c in explanation.candidates]
    assert {c.algorithm for c in explanation.candidates} == set(selector.ALGORITHMS)
    assert "allreduce of 1 MiB float32" in printed and f"on {size} ranks" in printed
    assert all(c.predicted_us >= 0 for c in explanation.candidates)
    # The simulator's prediction beside the model's: for what it can run, on this placement.
    simulated = {c.algorithm: c.simulated_us for c in explanation.candidates}
    assert "simulated us" in printed
    if size == 1:
        assert set(simulated.values()) == {None}
    else:
        assert simulated["ring"] is not None and simulated["ring"] > 0
        assert simulated["mpi"] is None  # MPI's own algorithm is not ringlet's to replay
        params = selector.parameters()
        again = selector.simulated_seconds("ring", 1 << 20, "float32", params,
                                           selector.layout(size))
        assert again is not None and again > 0

    import ml_dtypes

    half = ringlet.explain(np.zeros(1000, dtype=ml_dtypes.bfloat16), op="avg")
    assert half.nbytes == 2000 and half.dtype == "bfloat16"
    assert "mpi" not in [c.algorithm for c in half.candidates]
    with pytest.raises(TypeError, match="unsupported dtype"):
        ringlet.explain(100, dtype="complex64")


def test_explain_reads_the_cached_calibration(quick_calibration, monkeypatch, comm, size):
    """Before this process has calibrated, explain() uses the cache for this communicator."""
    if size == 1:
        assert ringlet.explain(1000).parameters.startswith("one rank")
        return
    monkeypatch.setenv("RINGLET_CACHE_DIR", f"{quick_calibration}/explain")  # empty so far
    path = selector.cache_path(selector.calibration_key())
    monkeypatch.setattr(selector, "_params", None)  # as in a fresh process
    assert ringlet.explain(1000).parameters.startswith("built-in defaults (no cached")
    ringlet.calibrate()  # writes the cache (rank 0)
    comm.Barrier()
    cached = selector.Parameters.from_json(path.read_text(), source="test") if comm.rank == 0 \
        else None
    monkeypatch.setattr(selector, "_params", None)
    explanation = ringlet.explain(1000)
    assert explanation.parameters == str(path)
    if comm.rank == 0:
        assert explanation.candidates[0].model_us == pytest.approx(
            selector.model_seconds(explanation.candidates[0].algorithm, 1000, size, "float32",
                                   cached) * 1e6)


def test_explain_agrees_with_what_auto_runs(comm, size):
    x = np.ones(100_000, dtype=np.float32)
    ringlet.allreduce(x)  # make sure the table exists
    choice = ringlet.explain(x).choice
    assert ran(lambda: ringlet.allreduce(x)) == ("ring" if size == 1 else choice)
    MPI.COMM_WORLD.Barrier()


def test_pieces_between_nodes_replace_whole_messages_only_when_clearly_faster():
    pick_limit, WHOLE_MESSAGES = selector.pick_limit, selector.WHOLE_MESSAGES
    whole = 10.0
    just_enough = whole * selector.PIECES_GAIN * 0.99
    assert pick_limit({WHOLE_MESSAGES: whole, 32768: just_enough, 16384: whole}) == 32768
    # A tie, or a gain below the threshold, keeps whole messages.
    assert pick_limit({WHOLE_MESSAGES: whole, 32768: whole * 0.95}) == WHOLE_MESSAGES
    # The fastest of the pieces wins; whole messages may well be the fastest.
    assert pick_limit({WHOLE_MESSAGES: whole, 32768: 7.0, 16384: 6.0}) == 16384
    assert pick_limit({WHOLE_MESSAGES: 5.0, 32768: 7.0}) == WHOLE_MESSAGES
    # Only the user's limit timed: it stays.
    assert pick_limit({4096: 3.0}) == 4096
