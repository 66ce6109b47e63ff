"""The benchmarks, briefly: each runs as `make bench-train` and docs/performance.md run it, and
reports what RESULTS.md quotes. Plain pytest; each test launches its own `mpirun -n 2` job.
Timings are not checked (a shared machine cannot), only that the numbers exist and that the work
is right.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def mpirun(*args: str, env: dict[str, str] | None = None,
           timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["mpirun", "-n", "2", sys.executable, *args], cwd=ROOT, text=True,
                          capture_output=True, timeout=timeout, env={**os.environ, **(env or {})})


def test_train_bench_reports_every_path_and_matches_ddp(tmp_path):
    out, plot = tmp_path / "train.json", tmp_path / "train.png"
    job = mpirun("benchmarks/train_bench.py", "--rounds", "1", "--steps", "2", "--warmup", "1",
                 "--variant", "one-bucket=buckets=64M", "--variant", "sleeping=spin=0,sleep=100",
                 "--json", str(out), "--plot", str(plot))
    assert job.returncode == 0, job.stdout + job.stderr  # 1: parameters differ from DDP's
    results = json.loads(out.read_text())
    assert set(results["models"]) == {"mlp", "convnet"}
    assert results["models"]["mlp"]["parameters"] == 9_579_274  # the MLP the issue names
    for model in results["models"].values():
        assert model["equal_to_ddp"] and model["equal_across_ranks"]
        paths = model["paths"]
        assert set(paths) == {"none", "ringlet", "ddp", "ringlet:one-bucket", "ringlet:sleeping"}
        for row in paths.values():
            assert row["step"] >= row["compute"] > 0 and row["update"] > 0
        assert paths["ringlet"]["collectives"] > 0 and paths["none"]["collectives"] == 0
    assert plot.read_bytes().startswith(b"\x89PNG")
    assert "| ringlet |" in job.stdout and "| ddp |" in job.stdout


def test_fusion_bench_compares_fused_flat_and_per_array():
    job = mpirun("benchmarks/fusion_bench.py", "--rounds", "2")
    assert job.returncode == 0, job.stdout + job.stderr
    ways = [line.split("median")[0].strip() for line in job.stdout.splitlines()
            if "median" in line and "x flat" in line]
    assert ways == ["average_gradients (fused)", "one flat allreduce", "one allreduce per array"]


def test_timeline_prints_a_step_summary_when_the_script_ends(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        "import torch, ringlet.hvd.torch as hvd\n"
        "hvd.init(); torch.manual_seed(0)\n"
        "model = torch.nn.Linear(64, 8)\n"
        "opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))\n"
        "for _ in range(3):\n"
        "    opt.zero_grad(); model(torch.randn(4, 64)).sum().backward(); opt.step()\n"
    )
    job = mpirun(str(script), env={"RINGLET_TIMELINE": str(tmp_path / "trace.json")})
    assert job.returncode == 0, job.stderr
    assert "ringlet timeline, rank 0: median of 3 steps" in job.stderr
    for rank in (0, 1):
        events = json.loads((tmp_path / f"trace.{rank}.json").read_text())["traceEvents"]
        assert sum(e["name"] == "synchronize" for e in events) == 3


def test_block_pieces_bench_checks_every_way_and_reports_it():
    job = mpirun("benchmarks/block_pieces_bench.py", "--rounds", "2")
    assert job.returncode == 0, job.stdout + job.stderr  # a way that garbles bytes fails
    rows = [line.split("|")[1].strip() for line in job.stdout.splitlines()
            if line.startswith("| ") and "ms" in line]
    ways = ["contiguous (reference)", "one message per piece", "hindexed, built per call",
            "hindexed, cached", "pack + unpack"]
    assert rows == ways * 2  # two lists of arrays


def test_reduce_bench_times_every_algorithm_and_prints_the_models_prediction():
    job = mpirun("benchmarks/reduce_bench.py", "--sizes", "8,64K", "--rounds", "2",
                 "--warmup", "1", "--markdown")
    assert job.returncode == 0, job.stdout + job.stderr  # 1: a wrong result on the root
    rows = [line.split("|")[1:-1] for line in job.stdout.splitlines()
            if line.startswith("| ") and " us " in line]
    names = {row[1].strip() for row in rows}
    assert names == {"binomial", "k_chain", "reduce_scatter_gather", "mpi", "auto", "native"}
    assert len(rows) == 2 * len(names)
    predicted = [row for row in rows if row[1].strip() not in ("auto", "native")]
    assert all(row[3].strip().endswith("us") for row in predicted)


def test_simulator_validation_puts_predictions_beside_measurements(tmp_path):
    rows = tmp_path / "rows.jsonl"
    job = mpirun("benchmarks/simulator_validation.py", "--sizes", "64K,256K", "--reps", "2",
                 "--label", "one-node", "--json", str(rows))
    assert job.returncode == 0, job.stdout + job.stderr
    records = [json.loads(line) for line in rows.read_text().splitlines()]
    assert {r["algorithm"] for r in records} == {"ring", "halving_doubling", "two_tier"}
    assert len(records) == 6
    assert all(r["measured_s"] > 0 and r["predicted_s"] > 0 for r in records)
    # The node's memory bandwidth is measured at each size, and shown beside it.
    assert all(r["memory_bytes_per_s"] > 0 for r in records)
    # MPI's own allreduce beside, measured in the same rounds.
    assert all(r["native_s"] > 0 for r in records)
    assert "| one-node | 0 MiB |" not in job.stdout  # sizes below 1 MiB print in KiB
    assert job.stdout.count("| one-node | 64 KiB |") == 3
    assert job.stdout.count("| one-node | 256 KiB |") == 3
    assert all(line.split("|")[3].strip().endswith("GB/s")
               for line in job.stdout.splitlines() if line.startswith("| one-node |"))


def test_simulator_validation_summary_puts_every_runs_ratio_side_by_side(tmp_path):
    rows = tmp_path / "rows.jsonl"
    record = {"placement": "block", "size": 1 << 20, "algorithm": "ring", "measured_s": 1.0,
              "memory_bytes_per_s": 1e10}
    lines = [dict(record, run="2026-01-01T00:00:00", predicted_s=1.2),
             dict(record, run="2026-01-01T00:01:00", predicted_s=0.7),
             dict(record, run="2026-01-01T00:00:00", algorithm="two_tier", predicted_s=0.9)]
    rows.write_text("".join(json.dumps(line) + "\n" for line in lines))
    job = subprocess.run([sys.executable, "benchmarks/simulator_validation.py", "--summary",
                          str(rows)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert job.returncode == 0, job.stdout + job.stderr
    assert "| block | 1 MiB | ring | 1.20 | **0.70** |" in job.stdout
    assert "| block | 1 MiB | two_tier | 0.90 |  |" in job.stdout
    assert "2 of 3 within 25%" in job.stdout


def test_reduce_bench_times_reduce_scatter_too():
    job = mpirun("benchmarks/reduce_bench.py", "--collective", "reduce_scatter", "--sizes",
                 "64K", "--rounds", "2", "--warmup", "1", "--markdown")
    assert job.returncode == 0, job.stdout + job.stderr  # 1: a wrong block on some rank
    names = {line.split("|")[2].strip() for line in job.stdout.splitlines()
             if line.startswith("| ") and " us " in line}
    assert names == {"ring", "recursive_halving", "priority_halving", "auto", "native"}


def test_compare_builds_takes_medians_of_ratios_measured_in_one_run(tmp_path):
    """Two builds' runs, interleaved: per row the median over the pairs of each build's ratio
    to what was measured beside it, and after / before."""
    def bench(path: Path, ring: float, auto: float) -> Path:
        path.write_text("size_bytes,candidate,x_native\n"
                        f"8,ring,{ring}\n8,auto,{auto}\n1024,ring,2.0\n")
        return path

    runs = [bench(tmp_path / "b1.csv", 1.0, 0.9), bench(tmp_path / "a1.csv", 1.1, 0.9),
            bench(tmp_path / "b2.csv", 1.0, 1.1), bench(tmp_path / "a2.csv", 1.3, 1.1)]
    job = subprocess.run([sys.executable, "benchmarks/compare_builds.py", "--bench",
                          *map(str, runs)], cwd=ROOT, text=True, capture_output=True, timeout=60)
    assert job.returncode == 0, job.stderr
    rows = {tuple(cell.strip() for cell in line.split("|")[1:3]): line.split("|")[5].strip()
            for line in job.stdout.splitlines() if line.startswith("| 8 ")}
    assert rows == {("8", "ring"): "1.200", ("8", "auto"): "1.000"}
    assert "median of after / before over 3 rows: 1.000" in job.stdout

    cluster = tmp_path / "before.jsonl", tmp_path / "after.jsonl"
    for path, seconds in zip(cluster, (0.3, 0.2)):
        path.write_text(json.dumps({"label": "block", "bound_s": 0.1,
                                    "medians_s": {"ring": seconds}}) + "\n")
    job = subprocess.run([sys.executable, "benchmarks/compare_builds.py", "--cluster",
                          *map(str, cluster)], cwd=ROOT, text=True, capture_output=True,
                         timeout=60)
    assert job.returncode == 0, job.stderr
    assert "| block | ring | 3.000 | 2.000 | 0.667 |" in job.stdout
    odd = subprocess.run([sys.executable, "benchmarks/compare_builds.py", "--bench",
                          str(runs[0])], cwd=ROOT, text=True, capture_output=True, timeout=60)
    assert odd.returncode != 0 and "pairs" in odd.stderr


@pytest.mark.heavy
def test_jax_bench_times_ringlet_inside_jit_and_checks_the_training_step(tmp_path):
    # mpi4jax is built by make bench-jax only; without it the benchmark says so and goes on.
    for mode in ("argument", "computed"):
        out = tmp_path / f"{mode}.json"
        job = mpirun("benchmarks/jax_bench.py", "--candidates", "ringlet,mpi4jax",
                     "--sizes", "8,64K", "--time-budget", "0.1", "--min-rounds", "2",
                     "--train-rounds", "1", "--train-steps", "2", "--input", mode,
                     "--json", str(out), timeout=600)
        assert job.returncode == 0, job.stdout + job.stderr
        results = json.loads(out.read_text())
        assert [row["bytes"] for row in results["allreduce"]] == [8, 65536]
        for row in results["allreduce"]:
            assert row["correct"] and row["median_us"]["ringlet"] > 0
            assert ("mpi4jax" in row["median_us"]) == ("ringlet_over_mpi4jax" in row)
        train = results["train"]
        assert train["gradients_averaged_right"] and train["equal_across_ranks"]
        assert train["median_us"]["ringlet"] > 0
        assert train["one_allreduce_call_us"]["one allreduce"] > 0
        assert "ringlet" in train["communication_over_one_allreduce"]


def test_hvd_matching_bench_compares_name_and_order(tmp_path):
    out = tmp_path / "matching.json"
    job = mpirun("benchmarks/hvd_matching_bench.py", "--rounds", "2", "--calls", "20",
                 "--bursts", "2", "--names", "8", "--json", str(out))
    assert job.returncode == 0, job.stdout + job.stderr
    results = json.loads(out.read_text())
    assert results["ranks"] == 2 and results["rounds"] == 2
    for matching in ("order", "name"):
        assert results[matching]["latency_us"] > 0 and results[matching]["ops_per_s"] > 0
        assert f"| {matching} |" in job.stdout


def test_small_group_bench_compares_average_gradients_with_one_allreduce(tmp_path):
    out = tmp_path / "small.json"
    job = mpirun("benchmarks/small_group_bench.py", "--rounds", "2", "--calls", "10",
                 "--load", "1", "--json", str(out))
    assert job.returncode == 0, job.stdout + job.stderr
    results = json.loads(out.read_text())
    assert results["ranks"] == 2 and results["load"] == 1
    cases = {(row["arrays"], row["bytes"]) for row in results["rows"]}
    assert cases == {(n, b) for n in (2, 4, 8, 16) for b in (64, 4096)}
    for row in results["rows"]:
        assert row["group_us"] > 0 and row["one_us"] > 0 and len(row["ratios"]) == 2
        assert f"| {row['arrays']} x {row['bytes']} |" in job.stdout


def test_elastic_commit_bench_times_steps_with_and_without_commits_under_the_driver():
    job = subprocess.run(
        [sys.executable, "-m", "ringlet.run", "-np", "2", "--min-np", "2", "-H", "localhost:2",
         sys.executable, "benchmarks/elastic_commit_bench.py", "--model", "convnet",
         "--rounds", "1", "--steps", "2"],
        cwd=ROOT, text=True, capture_output=True, timeout=300, env=os.environ)
    assert job.returncode == 0, job.stdout + job.stderr
    line = next(s for s in job.stdout.splitlines() if s.startswith("convnet, 2 ranks"))
    assert "with save" in line and "with commit" in line and "ratio" in line, line
