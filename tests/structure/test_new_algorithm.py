"""Adding an algorithm is one file plus one registration line, and nothing else: a copy of the
project gets `examples/new_algorithm/direct.rs` as `src/schedules/allreduce/direct.rs` and one
line in the ALLREDUCE registry of `src/schedules/mod.rs` (the registry declares the file's
module: the collective folders have no `mod.rs`); built, the new algorithm appears in
`ringlet.ALGORITHMS`, reduces correctly under mpirun, is a candidate in `explain()`, and runs in
the benchmark; the copy's exhaustive, property and simulator tests run it, and the docs'
algorithm table generator gives it a row. Plain pytest (it builds and launches jobs itself)."""

from __future__ import annotations

import difflib
import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest

# Slow (about 40 s: it builds a copy of the crate): make test runs it, make check does not.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
REGISTRY = "src/schedules/mod.rs"
LAST_ALLREDUCE_ENTRY = "        native_mpi::Mpi,\n"
NEW_FILE = "src/schedules/allreduce/direct.rs"
# The docs page whose algorithm table tests/core/readme.rs generates.
ALGORITHM_TABLE = "docs/guide/algorithms.md"


def copy_project(into: Path) -> None:
    for name in ("Cargo.toml", "Cargo.lock", "build.rs", ALGORITHM_TABLE):
        (into / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, into / name)
    for name in ("src", "python", "benches", "tests"):
        shutil.copytree(ROOT / name, into / name,
                        ignore=shutil.ignore_patterns("*.so", "__pycache__", "*.xml"))


def add_the_algorithm(tree: Path) -> None:
    shutil.copy2(ROOT / "examples/new_algorithm/direct.rs", tree / NEW_FILE)
    registry = tree / REGISTRY
    text = registry.read_text()
    assert text.count(LAST_ALLREDUCE_ENTRY) == 1
    registry.write_text(text.replace(LAST_ALLREDUCE_ENTRY,
                                      LAST_ALLREDUCE_ENTRY + "        direct::Direct,\n"))


def changed_lines(before: str, after: str) -> list[str]:
    diff = difflib.unified_diff(before.splitlines(), after.splitlines(), lineterm="", n=0)
    return [line for line in diff if line[:1] in "+-" and line[:3] not in ("+++", "---")]


# The copy's own crate compiles unoptimized: this test proves that the registration reaches every
# walk, and the walks take the quick rank counts (the walks themselves are tests/core's). The
# crate and its test binary build in about 20 s instead of 70 s at the test profile's opt-level 2;
# the dependencies, which the override leaves alone, come from `cargo test`'s build.
COPY_OPT_LEVEL = ["--config", "profile.test.package.ringlet.opt-level=0"]


@pytest.mark.timeout(1800)
def test_one_file_and_one_line_make_a_new_algorithm(tmp_path):
    tree = tmp_path / "ringlet"
    tree.mkdir()
    copy_project(tree)
    add_the_algorithm(tree)

    # Nothing else changed: one new file, one added line.
    new = sorted(p.relative_to(tree).as_posix() for p in (tree / "src").rglob("*")
                 if p.is_file() and not (ROOT / p.relative_to(tree)).exists())
    assert new == [NEW_FILE]
    edits = changed_lines((ROOT / REGISTRY).read_text(), (tree / REGISTRY).read_text())
    assert edits == ["+        direct::Direct,"]

    # Build the extension from the copy and install it into the copy's package. The test
    # profile, in make's target directory, finds every dependency built by `cargo test`
    # already: only the copy's own crate compiles (its artifacts are keyed by its path).
    target = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "build" / "new-algorithm-target"))
    env = {**os.environ, "CARGO_TARGET_DIR": str(target)}
    build = subprocess.run(["cargo", "build", *COPY_OPT_LEVEL, "--lib", "--profile", "test",
                            "--quiet"], cwd=tree, env=env, text=True, capture_output=True,
                           timeout=1200)
    assert build.returncode == 0, build.stderr
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    shutil.copy2(target / "debug" / "lib_core.so", tree / "python/ringlet" / f"_core{suffix}")

    script = tmp_path / "check.py"
    script.write_text(textwrap.dedent("""
        import numpy as np
        import ringlet
        assert "direct" in ringlet.ALGORITHMS, ringlet.ALGORITHMS
        assert "direct" in ringlet.algorithms("allreduce", dtype="bfloat16")
        rank, size = ringlet.rank(), ringlet.size()
        x = np.arange(1000, dtype=np.float32) * (rank + 1)
        y = ringlet.allreduce(x, "sum", algorithm="direct")
        assert np.array_equal(y, np.arange(1000, dtype=np.float32) * size * (size + 1) / 2)
        explanation = ringlet.explain(4096)
        assert "direct" in [c.algorithm for c in explanation.candidates]
        print("checked on rank", rank)
    """))
    run_env = {**os.environ, "PYTHONPATH": str(tree / "python"),
               "RINGLET_CACHE_DIR": str(tmp_path / "cache")}
    checked = subprocess.run(["mpirun", "-n", "2", sys.executable, str(script)], cwd=tmp_path,
                             env=run_env, text=True, capture_output=True, timeout=300)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "direct" in checked.stdout  # explain() printed it
    assert checked.stdout.count("checked on rank") == 2

    bench = subprocess.run(
        ["mpirun", "-n", "2", sys.executable, str(ROOT / "benchmarks/allreduce_bench.py"),
         "--max-size", "512", "--bw-size", "64K", "--time-budget", "0.05", "--min-iterations", "3",
         "--warmup", "1", "--no-plot", "--out-dir", str(tmp_path / "bench")],
        cwd=tmp_path, env=run_env, text=True, capture_output=True, timeout=300,
    )
    assert bench.returncode == 0, bench.stdout + bench.stderr
    rows = [line.split() for line in bench.stdout.splitlines()]
    assert any(len(row) > 2 and row[1] == "direct" for row in rows), bench.stdout

    # The Rust tests walk the registries: in the copy, with no other edit, the exhaustive and
    # property tests (tests/core/schedules.rs, properties.rs) and the simulator's test run
    # `direct` (narrowed to it by RINGLET_TEST_ALGORITHMS; each prints what it covered), and
    # tests/core/readme.rs, blessed, gives the docs' table a `direct` row. Same target directory
    # and profile as the build above: only the one test binary compiles.
    rust_tests = subprocess.run(
        ["cargo", "test", *COPY_OPT_LEVEL, "--quiet", "--test", "core", "--",
         "schedules::every_schedule_is_exact", "properties::any_schedule",
         "simulate::recorded_traffic", "readme::the_docs_algorithm_table", "--nocapture"],
        cwd=tree, env={**env, "RINGLET_TEST_ALGORITHMS": "direct", "RINGLET_BLESS": "1",
                           "RINGLET_TEST_WALK": "quick"},
        text=True, capture_output=True, timeout=1800,
    )
    report = rust_tests.stdout + rust_tests.stderr
    assert rust_tests.returncode == 0, report
    for covered in ("exhaustive, part 1 covered allreduce: direct (",
                    "exhaustive, part 2 covered allreduce: direct (",
                    "property covered allreduce: direct (",
                    "simulator covered: allreduce direct ("):
        assert covered in report, f"missing {covered!r}:\n{report}"
    # Five tests ran (the exhaustive test is in two parts), the table's among them.
    assert "test result: ok. 5 passed" in report, report
    table = changed_lines((ROOT / ALGORITHM_TABLE).read_text(),
                          (tree / ALGORITHM_TABLE).read_text())
    assert len(table) == 1 and table[0].startswith("+| `direct` | every rank sends"), table
