"""auto's decisions as the core makes them, its overrides, the calibration and its cache,
agreement across ranks, explain()."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from mpi4py import MPI

import ringlet
from ringlet import _core, calibration, selector

SIZES = [2**k for k in range(0, 31)]


def parameters(**values) -> str:
    """The model's parameters as the core reads them: ``values``, and the built-in ones for the
    rest."""
    return _core.check_parameters(json.dumps(values))


def model_seconds(nbytes: int, nodes: list[int], parameters_json: str,
                  dtype: str = "float32", op: str = "sum") -> dict[str, float]:
    """Each candidate's model time on ranks placed on ``nodes`` (a what-if), from the core."""
    rows = _core.explain(nbytes, dtype, op, parameters=parameters_json, nodes=nodes).candidates
    return {row.algorithm: row.model_seconds for row in rows}


def cheapest(nbytes: int, nodes: list[int], parameters_json: str, dtype: str = "float32",
             op: str = "sum") -> str:
    return _core.explain(nbytes, dtype, op, parameters=parameters_json, nodes=nodes).choice


@pytest.fixture
def fresh_table(monkeypatch):
    """auto's table rebuilt inside the test and again afterwards (env overrides apply then)."""
    calibration.uninstall()
    yield monkeypatch
    monkeypatch.undo()
    calibration.uninstall()


@pytest.fixture
def quick_calibration(monkeypatch, comm):
    """A cache directory of the test's own (the same path on every rank), and few sizes."""
    base = comm.bcast(os.environ.get("RINGLET_CACHE_DIR", "build/test-cache"), root=0)
    directory = os.path.join(base, f"selector-{comm.bcast(os.getpid(), root=0)}")
    monkeypatch.setenv("RINGLET_CACHE_DIR", directory)
    monkeypatch.setattr(calibration, "CALIBRATION_SIZES", (8, 4096, 65536))
    monkeypatch.setattr(calibration, "LARGE_CALIBRATION_SIZE", 262144)
    calibration.uninstall()
    yield directory
    monkeypatch.undo()
    calibration.uninstall()


def ran(algorithm_call) -> str:
    """The one algorithm a call ran, from the core's per-algorithm counters."""
    ringlet.reset_stats()
    algorithm_call()
    used = ringlet.stats()
    assert len(used) == 1 and next(iter(used.values()))["calls"] == 1, used
    return next(iter(used))


@pytest.mark.parametrize("ranks", [2, 3, 4, 5, 8, 16, 64])
def test_model_time_never_decreases_with_message_size(ranks):
    prices = parameters(gamma={"float32": 1 / 20e9})
    times = [model_seconds(m, [0] * ranks, prices) for m in SIZES]
    for algorithm in times[0]:
        series = [t[algorithm] for t in times]
        assert all(a <= b for a, b in zip(series, series[1:])), (algorithm, series)
        assert series[0] > 0, algorithm


def test_model_prefers_latency_optimal_small_and_bandwidth_optimal_large():
    prices = parameters(alpha=5e-6, beta=1e-9, gamma={"float32": 1e-10})
    one_node = [0] * 16
    # One meeting in shared memory beats log2(16) messages where the ranks share memory.
    assert cheapest(64, one_node, prices) in ("recursive_doubling", "mpi", "shm")
    assert cheapest(256 << 20, one_node, prices) in (
        "ring", "pipelined_ring", "halving_doubling", "mpi"
    )
    small, large = model_seconds(64, one_node, prices), model_seconds(256 << 20, one_node, prices)
    assert small["recursive_doubling"] < small["ring"]  # 4 rounds, not 30
    assert large["ring"] < large["recursive_doubling"]
    if "shm" in small:  # where this job's ranks share memory
        assert small["shm"] < small["recursive_doubling"]  # 1 meeting, not 4 messages


BLOCK_4X2 = [0, 0, 1, 1, 2, 2, 3, 3]
ROUND_ROBIN_4X2 = [0, 1, 2, 3, 0, 1, 2, 3]


@pytest.mark.parametrize("nodes", [BLOCK_4X2, ROUND_ROBIN_4X2, [0, 0, 0, 1]])
def test_across_nodes_the_model_prices_each_nodes_link(nodes):
    """A 1 Gbit/s network under 20 GB/s nodes: the two tiers send the node's result once over
    each link (the bound, 2(H-1)/H m), the node-major ring a block per step, and a schedule
    that ignores nodes sends every rank's traffic over its node's link."""
    beta_across = 8 / 1e9
    prices = parameters(alpha=1e-6, beta=1 / 20e9, gamma={"float32": 1 / 20e9},
                        alpha_across=50e-6, beta_across=beta_across)
    m, hosts = 16 << 20, len(set(nodes))
    model = model_seconds(m, nodes, prices)
    bound = 2 * (hosts - 1) / hosts * m * beta_across
    assert bound <= model["two_tier"] < 1.1 * bound, model
    assert model["two_tier"] < model["ring"] < model["halving_doubling"], model
    # On one node there is no link: the two tiers are the ring.
    one = model_seconds(m, [0] * len(nodes), prices)
    assert one["two_tier"] == one["ring"]


def test_the_model_prices_the_communicators_own_placement(comm, size):
    node_comm = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.rank)
    leaders = comm.allgather(node_comm.allreduce(comm.rank, op=MPI.MIN))
    node_comm.Free()
    firsts = list(dict.fromkeys(leaders))
    nodes = [firsts.index(leader) for leader in leaders]
    assert _core.nodes(0) == nodes
    prices = parameters(alpha_across=1e-3)
    # Without a placement the core prices the communicator's, the same as naming it.
    own = _core.explain(1 << 20, "float32", "sum", parameters=prices)
    named = _core.explain(1 << 20, "float32", "sum", parameters=prices, nodes=nodes)
    assert own.candidates and own == named


def test_sixteen_bit_floats_and_float_min_max_never_go_to_mpi():
    prices = parameters(alpha=1e-7)  # an MPI allreduce would win small messages
    candidates = lambda dtype, op="sum": set(model_seconds(8, [0] * 4, prices, dtype, op))  # noqa: E731
    for dtype in ("float16", "bfloat16"):
        for op in ringlet.OPS:
            assert "mpi" not in candidates(dtype, op)
    for dtype in ("float32", "float64", "float16", "bfloat16"):
        for op in ("min", "max"):
            assert "mpi" not in candidates(dtype, op)
    assert "mpi" in candidates("int64", "min")


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
    with pytest.raises(ValueError, match=r'unknown algorithm .tree.'):
        ringlet.allreduce(np.ones(4, dtype=np.float32))


def test_an_empty_environment_value_overrides_nothing(fresh_table, size):
    fresh_table.setenv("RINGLET_AUTO_TABLE", "")
    fresh_table.setenv("RINGLET_ALGORITHM", " ")
    x = np.ones(1000, dtype=np.float32)
    np.testing.assert_array_equal(ringlet.allreduce(x), x * size)
    assert ringlet.explain(x).reason != selector.REASONS["environment"]


def test_explain_says_what_every_collective_runs(size):
    for collective in ("broadcast", "reduce", "allgather", "reduce_scatter", "alltoall"):
        explained = _core.explain(1 << 16, "float32", "sum", collective=collective)
        names = [row.algorithm for row in explained.candidates]
        assert explained.basis == "model" and explained.choice in names, (collective, names)
    # alltoall's auto is the first registered (its sizes differ between ranks: nothing priced).
    assert _core.explain(8, "float32", "sum", collective="alltoall").choice == \
        _core.algorithms("alltoall")[0]


def test_every_rank_makes_the_same_choices(comm):
    x = np.ones(3, dtype=np.float64)
    ringlet.allreduce(x)  # installs the parameters (calibrating or loading the cache)
    mine = _core.installed_parameters()
    assert mine is not None and all(other == mine for other in comm.allgather(mine))
    choices = [_core.explain(m, "bfloat16", "sum").choice for m in SIZES]
    assert all(other == choices for other in comm.allgather(choices))
    # What explain() reports is what a call runs.
    for m in (8, 4096, 1 << 20):
        for op in ("sum", "max"):
            y = np.ones(max(m // 4, 1), dtype=np.float32)
            choice = _core.explain(y.nbytes, "float32", op).choice
            assert ran(lambda y=y, op=op: ringlet.allreduce(y, op, algorithm="auto")) == choice


def test_calibration_round_trips_through_the_cache(quick_calibration, comm, size):
    found = ringlet.calibrate()
    if size == 1:
        assert found.source.startswith("one rank")
        return
    model = found.model()
    assert model["alpha"] > 0 and model["beta"] > 0
    assert set(model["gamma"]) >= {"float32", "bfloat16"}
    assert model["corrections"]["ring"], "calibration timed the candidates"
    assert _core.installed_parameters() == found.parameters, "calibrate() installs its result"
    path = calibration.cache_path(calibration.calibration_key())
    if comm.rank == 0:
        saved = calibration.Calibration.from_json(path.read_text(), source="test")
        assert saved.to_json() == found.to_json()
    again = calibration.parameters()
    assert again.source == str(path), "the second call reads the cache"
    assert again.to_json() == found.to_json()


def test_calibration_stops_at_its_budget(quick_calibration, monkeypatch, comm, size):
    """The sizes stop where the time spent and the next size's expected time would pass the
    budget: every rank stops at the same size, and nothing is timed past it."""
    if size == 1:
        assert ringlet.calibrate().source.startswith("one rank")
        return
    # 3 runs of 1 GiB per candidate take seconds even in memory: past the 3 s budget.
    monkeypatch.setattr(calibration, "CALIBRATION_SIZES", (8, 64, 4096))
    monkeypatch.setattr(calibration, "LARGE_CALIBRATION_SIZE", 1 << 30)
    found = ringlet.calibrate()
    corrections = found.model()["corrections"]
    timed = [b for b, _ in corrections["ring"]]
    assert timed == [8, 64, 4096]
    assert all(other == timed for other in comm.allgather(timed))
    assert all([b for b, _ in points] == timed for points in corrections.values() if points)
    assert found.calibration_seconds < calibration.CALIBRATION_BUDGET + 2
    # Larger messages keep the last measured correction.
    last = corrections["ring"][-1][1]
    rows = _core.explain(1 << 30, "float32", "sum", parameters=found.parameters).candidates
    assert {row.algorithm: row.correction for row in rows}["ring"] == pytest.approx(last)


def test_corrupt_cache_is_recalibrated_with_a_warning(quick_calibration, comm, size):
    if size == 1:
        assert calibration.parameters().source.startswith("one rank")
        return
    path = calibration.cache_path(calibration.calibration_key())
    if comm.rank == 0:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("{ this is not json")
    comm.Barrier()
    if comm.rank == 0:
        with pytest.warns(RuntimeWarning, match="unreadable calibration cache"):
            found = calibration.parameters()
    else:
        found = calibration.parameters()
    assert found.source.startswith("calibrated now")
    if comm.rank == 0:
        saved = calibration.Calibration.from_json(path.read_text(), "test")
        assert saved.parameters == found.parameters


def test_stale_cache_is_ignored(quick_calibration, comm, size):
    if size == 1:
        return
    key = calibration.calibration_key()
    path = calibration.cache_path(key)
    stale = calibration.Calibration(parameters(alpha=1.0, gamma={"float32": 1.0}),
                                    key={**key, "ringlet": "0.0.0"})
    if comm.rank == 0:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(stale.to_json())
    comm.Barrier()
    found = calibration.parameters()
    assert found.source.startswith("calibrated now") and found.model()["alpha"] != 1.0


@pytest.mark.parametrize("bad", [
    f'{{"format": {calibration.CACHE_FORMAT}, "key": {{}}, "parameters": {{"alpha": -1}}}}',
    f'{{"format": {calibration.CACHE_FORMAT}, "key": {{}}, "parameters": {{"beta": "x"}}}}',
    f'{{"format": {calibration.CACHE_FORMAT}, "key": {{}}, "parameters": [1, 2]}}',
    f'{{"format": {calibration.CACHE_FORMAT}, "parameters": {{}}}}',
    "[1, 2]", '{"format": 99}',
])
def test_invalid_parameters_are_rejected(bad):
    with pytest.raises((ValueError, TypeError)):
        calibration.Calibration.from_json(bad, source="test")


def test_the_core_names_an_invalid_parameter():
    with pytest.raises(ValueError, match="alpha must be a positive number"):
        _core.check_parameters('{"alpha": -1}')
    with pytest.raises(ValueError, match="complex64"):
        _core.check_parameters('{"gamma": {"complex64": 1e-9}}')
    with pytest.raises(ValueError, match="across_message_bytes"):
        _core.install_parameters('{"across_message_bytes": 0}')


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
    path = calibration.cache_path(calibration.calibration_key())
    assert _core.installed_parameters() is None, "the fixture cleared them: as a fresh process"
    assert ringlet.explain(1000).parameters.startswith("built-in defaults (no cached")
    ringlet.calibrate()  # writes the cache (rank 0)
    comm.Barrier()
    cached = calibration.Calibration.from_json(path.read_text(), source="test") \
        if comm.rank == 0 else None
    calibration.uninstall()
    explanation = ringlet.explain(1000)
    assert explanation.parameters == str(path)
    if comm.rank == 0:
        expected = model_seconds(1000, _core.nodes(0), cached.parameters)
        assert {c.algorithm: c.model_us for c in explanation.candidates} == pytest.approx(
            {name: seconds * 1e6 for name, seconds in expected.items()})


def test_explain_agrees_with_what_auto_runs(comm, size):
    x = np.ones(100_000, dtype=np.float32)
    ringlet.allreduce(x)  # make sure the table exists
    choice = ringlet.explain(x).choice
    assert ran(lambda: ringlet.allreduce(x)) == ("ring" if size == 1 else choice)
    MPI.COMM_WORLD.Barrier()


def test_pieces_between_nodes_replace_whole_messages_only_when_clearly_faster():
    whole_messages, *pieces = _core.message_limit_options()
    assert whole_messages == 2**31 - 1 and pieces, "whole messages first, then pieces"
    choose = _core.choose_message_limit
    assert choose([(whole_messages, 10.0), (pieces[0], 8.9), (pieces[-1], 10.0)]) == pieces[0]
    # A tie, or a gain below the threshold, keeps whole messages.
    assert choose([(whole_messages, 10.0), (pieces[0], 9.5)]) == whole_messages
    # The fastest of the pieces wins; whole messages may well be the fastest.
    assert choose([(whole_messages, 10.0), (32768, 7.0), (16384, 6.0)]) == 16384
    assert choose([(whole_messages, 5.0), (32768, 7.0)]) == whole_messages
    # Only the user's limit timed: it stays.
    assert choose([(4096, 3.0)]) == 4096
    with pytest.raises(ValueError):
        choose([])
