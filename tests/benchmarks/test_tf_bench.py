"""benchmarks/tf_bench.py (`make bench-tf`), briefly: one round of every job at a tiny size.
Timings are not checked (a shared machine cannot), only that every number exists and that the
work is right: every allreduce's result, the weights after training equal across the ranks and
between ringlet and MultiWorkerMirroredStrategy. Plain pytest; the benchmark is its own driver
and launches its `mpirun -n 2` jobs itself.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("tensorflow")
pytest.importorskip("keras")

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.heavy
def test_tf_bench_reports_every_variant_and_ringlet_trains_like_mwms(tmp_path):
    out = tmp_path / "tf.json"
    job = subprocess.run(
        [sys.executable, "benchmarks/tf_bench.py", "--rounds", "1", "--calls", "2", "--steps",
         "2", "--warmup", "1", "--gradient-mib", "1", "--widths", "64,128,10", "--markdown",
         "--json", str(out)],
        cwd=ROOT, text=True, capture_output=True, timeout=900)
    assert job.returncode == 0, job.stdout + job.stderr  # 1: a wrong result or weights differ
    summary = json.loads(out.read_text())

    allreduce = summary["allreduce"]
    assert set(allreduce["rows"]) == {"ringlet-graph", "ringlet-eager", "ringlet-numpy",
                                      "numpy_function", "copy", "mwms-ring", "mwms-auto"}
    assert all(allreduce["correct"].values()) and len(allreduce["correct"]) == 7
    assert allreduce["tensors"] == 20 and allreduce["bytes"] < 2 << 20  # scaled to ~1 MiB
    for row in allreduce["rows"].values():
        assert len(row["samples"]) == 2 and all(s > 0 for s in row["samples"])

    train = summary["train"]
    assert train["parameters"] == 64 * 128 + 128 + 128 * 10 + 10
    paths = set(train["rows"])
    assert {"none", "none-x2", "ringlet-tape", "mwms-ring", "mwms-auto"} <= paths
    assert paths <= {"none", "none-x2", "ringlet", "ringlet-tape", "mwms-ring", "mwms-auto"}
    for row in train["rows"].values():
        assert len(row["samples"]) == 2 and all(s > 0 for s in row["samples"])

    checks = summary["checks"]
    assert checks["weights_agree"] and checks["allreduce_correct"] and not checks["errors"]
    # Against ringlet's DistributedGradientTape path: MWMS's, and hvd.keras's when it exists.
    assert checks["reference"] == "ringlet-tape"
    assert set(checks["weight_difference"]) == paths - {"none", "none-x2", "ringlet-tape"}
    assert summary["round_orders"] == [["ringlet", "mwms-ring", "mwms-auto"]]
    assert {t["what"].split(" / ")[0] for t in summary["targets"]} >= {"ringlet-graph",
                                                                       "ringlet-eager"}
    rows = [line.split("|")[1].strip() for line in job.stdout.splitlines()
            if line.startswith("| ")]
    assert "ringlet `grouped_allreduce` in `tf.function`" in rows
    assert "MWMS `model.fit`, RING" in rows and "no communication, one process" in rows


def test_tf_bench_refuses_bad_options():
    job = subprocess.run([sys.executable, "benchmarks/tf_bench.py", "--widths", "64"],
                         cwd=ROOT, text=True, capture_output=True, timeout=120)
    assert job.returncode == 2 and "two or more positive layer widths" in job.stderr
    job = subprocess.run([sys.executable, "benchmarks/tf_bench.py", "--variants", "gloo"],
                         cwd=ROOT, text=True, capture_output=True, timeout=120)
    assert job.returncode == 2 and "unknown ['gloo']" in job.stderr


@pytest.mark.heavy
def test_tf_bench_profile_times_the_graph_ops_parts():
    job = subprocess.run(
        [sys.executable, "benchmarks/tf_bench.py", "--profile", "--calls", "2", "--steps", "2",
         "--warmup", "1", "--gradient-mib", "1", "--widths", "64,128,10", "--markdown"],
        cwd=ROOT, text=True, capture_output=True, timeout=600)
    assert job.returncode == 0, job.stdout + job.stderr
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:5]]
            for line in job.stdout.splitlines() if line.startswith("| ")}
    graph, eager, step = zip(*(rows[label] for label in
                               ("whole call / step", "the op's Python body")))
    assert all(float(value) > 0 for value in (*graph, step[0], step[1]))
    assert eager[1] == "-" and float(eager[0]) > 0  # eagerly there is no graph op's body
    reduced = rows["ringlet's grouped allreduce in it"]
    assert all(float(value) > 0 for value in reduced)  # graph, eager and the step all reduce


@pytest.mark.slow
def test_tf_graph_op_bench_compares_the_compiled_operation_with_numpy_function(tmp_path):
    out = tmp_path / "graph_op.json"
    job = subprocess.run(
        ["mpirun", "-n", "2", sys.executable, "benchmarks/tf_graph_op_bench.py", "--rounds",
         "2", "--calls", "2", "--gradient-mib", "0.5,0.01", "--json", str(out)],
        cwd=ROOT, text=True, capture_output=True, timeout=600)
    assert job.returncode == 0, job.stdout + job.stderr  # 1: a wrong result
    summary = json.loads(out.read_text())
    assert summary["ranks"] == 2 and [r["mib"] for r in summary["results"]] == [0.5, 0.01]
    for result in summary["results"]:
        assert result["correct"] and result["tensors"] == 20
        assert set(result["rounds_ms"]) == {"op captured", "numpy_function captured",
                                            "op computed", "numpy_function computed",
                                            "numpy in place"}
        for name, values in result["rounds_ms"].items():
            assert len(values) == 2 and all(v > 0 for v in values)
            assert f"| {name} |" in job.stdout
