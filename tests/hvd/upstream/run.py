"""Run Horovod's own TensorFlow and PyTorch tests (vendored) against ringlet.

    python tests/hvd/upstream/run.py [--quick] [--files test_tensorflow.py ...]
        [--ranks 2] [--timeout 3600] [--summary build/horovod-upstream/summary] [pytest args]

Without --files: the three TensorFlow files; `--files test_torch.py`: Horovod's PyTorch file.
Each file runs as one `mpirun -n RANKS` job of pytest (tests/mpi_pytest.py: rank 0 on the terminal,
the other ranks' output in the reports directory), with the shim package (shim/: `horovod` ->
`ringlet.hvd`) on PYTHONPATH and this directory's pytest.ini, not the project's. Every rank
writes what happened to each test (_hvd_report.py); a test's outcome is the worst over the
ranks. Writes <summary>.json and <summary>.md: per file the counts, and every test that did not
pass, with its error.

Exits 1 if any test that is not in the exclusions (exclusions.toml, exclusions_torch.toml)
failed, erred, was skipped or did not run (its rank crashed or was killed), or if an excluded
test did not do what its entry expects (so that the lists stay true); else 0. The last line is
"N passed, N failed".

A TensorFlow file whose rank dies in a test starts again after that test. test_torch.py must
run as ONE job, as Horovod's CI runs it (a collective left behind by one test would meet the
next test's): a rank that dies in it (a hang ended by the per-test time limit, a crash), a job
ended by its time limit or a launcher's error code is a failure of the run whatever the
exclusions say; the rest is still run after it, only to report it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import tomllib

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path.insert(0, str(ROOT / "tests"))
from run_mpi_suite import Launcher, call  # noqa: E402 (the MPI suite's launcher and time limit)

from ringlet.hvd._negotiation import matching_from_environment  # noqa: E402 (RINGLET_HVD_MATCHING)

FILES = ["test_tensorflow.py", "test_tensorflow_process_sets.py", "test_tensorflow2_keras.py"]
TORCH_FILES = ["test_torch.py"]
WHOLE_FILE = set(TORCH_FILES)  # must run as one job: a restart is a failure of the run
EXCLUSIONS = [HERE / "exclusions.toml", HERE / "exclusions_torch.toml"]
CATEGORIES = {
    "gpu": "needs a GPU (ringlet reduces CPU tensors)",
    "removed-api": "uses a TensorFlow 1 or Keras 2 API that TensorFlow 2.21 / Keras 3 removed",
    "deliberate": "ringlet differs from Horovod on purpose (docs/guide/horovod.md)",
    "stack": "fails on TensorFlow 2.21 / NumPy 2 whatever the backend, for another reason",
    "missing": "a feature docs/guide/horovod.md's migration table lists as not supported",
    "timing": "asserts a timing that Horovod's coordinator happens to give, not a result",
    "rank-count": "its own reference cannot hold at this rank count whatever the backend",
}
# The quick slice (make test-horovod-tf-quick runs its first two files): every collective on
# CPU, gradients, a grouped and a sparse case, an error case, a Keras model, process sets (the
# tests that take more than 10 s each left out): 288 s at 2 ranks on the 2 shared cores, most
# of it starting the three jobs (importing TensorFlow, about a minute per job there).
QUICK = {
    "test_tensorflow.py": [
        "test_horovod_rank", "test_horovod_size", "test_horovod_rank_op", "test_horovod_size_op",
        "test_horovod_allreduce_cpu", "test_horovod_allreduce_cpu_prescale",
        "test_horovod_allreduce_indexed_slices_cpu", "test_horovod_allreduce_grad_cpu",
        "test_horovod_grouped_allreduce_grad_cpu", "test_horovod_allgather_grad_cpu",
        "test_horovod_broadcast_inplace_cpu", "test_horovod_broadcast_grad_cpu",
        "test_horovod_alltoall_cpu", "test_horovod_alltoall_grad_cpu",
        "test_horovod_alltoall_splits_error", "test_compression_fp16", "test_broadcast_object",
        "test_allgather_object", "test_horovod_reducescatter_grad_cpu",
        "test_model_parallel_model",
    ],
    # make test-horovod-quick: the four duplicate-name tests one after the other (a rank submits
    # an op before a barrier that another submits after it: name matching), and the usual
    # paths of every kind of collective, DistributedOptimizer and join.
    "test_torch.py": [
        "test_horovod_allreduce", "test_horovod_allreduce_async_fused",
        "test_horovod_allreduce_duplicate_name_error",
        "test_horovod_allgather_duplicate_name_error",
        "test_horovod_broadcast_duplicate_name_error",
        "test_horovod_reducescatter_duplicate_name_error",
        "test_horovod_grouped_allreduce", "test_horovod_allreduce_grad",
        "test_horovod_allgather", "test_horovod_grouped_allgather",
        "test_horovod_broadcast", "test_horovod_broadcast_inplace", "test_horovod_alltoall",
        "test_horovod_reducescatter", "test_duplicate_names", "test_force_allreduce",
        "test_horovod_join_allreduce", "test_horovod_join_allgather", "test_broadcast_object",
    ],
    "test_tensorflow_process_sets.py": [
        "test_horovod_size_op_process_set", "test_horovod_allreduce_cpu_process_sets",
        "test_horovod_allgather_cpu_process_sets", "test_horovod_broadcast_cpu_process_sets",
        "test_horovod_alltoall_cpu_process_sets", "test_distributed_gradient_tape_process_sets",
    ],
    "test_tensorflow2_keras.py": [
        "test_from_config", "test_broadcast_global_variables_callback_with_local_vars",
    ],
}


def load_exclusions(paths: list[Path], size: int, matching: str) -> dict[str, dict[str, Any]]:
    """test id (file::Class::name) -> its entry at `size` ranks under ringlet.hvd's `matching`
    (an entry with `ranks` or `matching` applies only there); every entry needs a category and
    a reason."""
    entries = [(path, entry) for path in paths
               for entry in tomllib.loads(path.read_text()).get("exclude", [])]
    excluded = {}
    for path, entry in entries:
        tests = entry.get("tests") or [entry.get("test")]
        if not all(tests) or not entry.get("reason") or entry.get("category") not in CATEGORIES:
            sys.exit(f"{path}: entry {entry} needs `test` (or `tests`), a `reason` and a "
                     f"`category` among {sorted(CATEGORIES)}")
        expect = entry.get("expect", "")
        if not (expect in ("skipped", "passed", "deselected")
                or expect.startswith(("failed:", "flaky:"))):
            sys.exit(f"{path}: {tests[0]}: expect is 'skipped', 'passed', 'deselected', "
                     "'failed: REGEX' or 'flaky: REGEX'")
        if expect == "deselected" and "ranks" not in entry:
            sys.exit(f"{path}: {tests[0]}: a deselected test needs `ranks`, where it cannot pass")
        if "ranks" in entry and size not in entry["ranks"]:
            continue
        if "matching" in entry and matching not in entry["matching"]:
            continue
        for test in tests:
            if test in excluded:
                sys.exit(f"{path}: {test} is listed twice")
            excluded[test] = entry
    return excluded


def read_rank(path: Path) -> dict[str, Any]:
    """One rank's events: what it collected, each test's reports, where it stopped."""
    rank: dict[str, Any] = {"collected": [], "tests": {}, "last_started": None, "finished": False}
    if not path.exists():
        return rank
    for line in path.read_text().splitlines():
        event = json.loads(line)
        if event["event"] == "collected":
            rank["collected"] = event["tests"]
        elif event["event"] == "start":
            rank["last_started"] = event["nodeid"]
        elif event["event"] == "report":
            rank["tests"].setdefault(event["nodeid"], []).append(event)
        elif event["event"] == "finish":
            rank["finished"] = True
    return rank


def outcome(reports: list[dict[str, Any]]) -> tuple[str, str]:
    """A test's outcome on one rank, and the text of its errors or skip reason.

    run_all_in_graph_and_eager_modes runs a test as two subtests, graph_mode and eager_mode;
    its last report (passed) says nothing then: a failed subtest makes it failed, one that
    passed (a test skipped in one mode by design) makes it passed, both skipped: skipped.
    """
    texts = [f"[{r['subtest'] or r['when']}] {r['text']}" for r in reports
             if r["outcome"] == "failed"]
    if any(r["outcome"] == "failed" and r["when"] != "call" for r in reports):
        return "error", "\n".join(texts)
    if texts:
        return "failed", "\n".join(texts)
    subtests = [r for r in reports if r["subtest"] is not None]
    calls = subtests or [r for r in reports if r["when"] == "call"]
    if any(r["outcome"] == "passed" for r in calls):
        return "passed", ""
    skips = sorted({r["text"] for r in calls if r["outcome"] == "skipped"})
    return "skipped", "; ".join(skips)


ERROR_LINE = re.compile(r"^(\w+\.)*\w*(Error|Exception|Exit|Timeout)\b|^Failed: ")


def short(text: str) -> str:
    """The exception lines of a failure (pytest's `E   ` lines naming an error), else its
    last line."""
    lines = [line[1:].strip() for line in text.splitlines() if line.startswith("E ")]
    lines = [line for line in lines if ERROR_LINE.match(line)] or text.strip().splitlines()[-1:]
    return " | ".join(dict.fromkeys(lines))[:500]


def judge(test: str, result: str, text: str, entry: dict[str, Any] | None) -> str | None:
    """None if this result is acceptable, else why not."""
    if entry is None:
        return None if result == "passed" else result
    expect = entry.get("expect", "")
    if expect in ("skipped", "passed"):
        return None if result == expect else f"excluded, expected {expect}, got {result}"
    if expect.startswith("flaky:") and result == "passed":  # a race in the test: either way
        return None
    pattern = expect.split(":", 1)[1].strip()
    if result in ("failed", "error") and re.search(pattern, text):
        return None
    return f"excluded, expected a failure matching {pattern!r}, got {result}"


def run_file(name: str, args: argparse.Namespace, launcher: Launcher, pytest_args: list[str],
             excluded: dict[str, dict[str, Any]], out: Path) -> dict[str, Any]:
    """Run one file's tests; when a rank dies in a test (pytest-timeout ends a rank stuck in a
    collective; a crash), start again after that test, up to --restarts times. For a WHOLE_FILE
    file every such death (and a launcher's code other than pytest's 0 or 1) is a problem."""
    reports = out / "reports" / args.summary.name / Path(name).stem
    shutil.rmtree(reports, ignore_errors=True)
    selection = [str(HERE / name)]
    if args.quick:
        cls = re.search(r"^class (\w+)\(", (HERE / name).read_text(), re.M)
        assert cls, name
        selection = [f"{HERE / name}::{cls.group(1)}::{test}" for test in QUICK[name]]
    # Tests that cannot pass at this rank count and would leave the ranks out of step are not
    # run (pytest's --deselect); the summary lists them.
    deselected = [test for test, entry in excluded.items()
                  if entry.get("expect") == "deselected" and test.startswith(f"{name}::")]
    pytest_args = [*pytest_args, *(f"--deselect={test}" for test in deselected)]  # node ids
    started = time.monotonic()
    collected: list[str] = []
    tests: list[dict[str, list[dict[str, Any]]]] = [{} for _ in range(args.ranks)]
    killed: dict[str, str] = {}  # test -> which ranks died in it
    codes = []
    job_problems = []  # WHOLE_FILE: why the file did not run as one job
    for attempt in range(args.restarts + 1):
        ranks, code = run_once(name, args, launcher, pytest_args, selection,
                               reports / f"run{attempt}", out)
        codes.append(code)
        collected = collected or next((r["collected"] for r in ranks if r["collected"]), [])
        for mine, rank in zip(tests, ranks):
            mine.update(rank["tests"])
        dead = {rank["last_started"] for rank in ranks
                if not rank["finished"] and rank["last_started"] is not None
                and not any(r["when"] == "teardown" for r in rank["tests"].get(
                    rank["last_started"], []))}
        for test in dead:
            killed[test] = ", ".join(str(i) for i, rank in enumerate(ranks)
                                     if rank["last_started"] == test and not rank["finished"])
        done = {t for t in collected
                if all(any(r["when"] == "teardown" for r in mine.get(t, [])) for mine in tests)}
        remaining = [t for t in collected if t not in done and t not in killed]
        if name in WHOLE_FILE:
            unfinished = [i for i, rank in enumerate(ranks) if not rank["finished"]]
            why = []
            if unfinished:
                where = "; ".join(f"{t.split('::')[-1]} (rank(s) {killed[t]})"
                                  for t in sorted(dead)) or "no test (before or after them)"
                why.append(f"rank(s) {unfinished} did not finish: died in {where}: a hang "
                           "ended by the per-test time limit, the job's time limit, or a crash")
            if code not in (0, 1):  # pytest's codes: all passed, some failed
                why.append(f"{launcher.command} exited with {code}")
            if why:
                job_problems.append({
                    "test": f"{name} (the job, run {attempt})", "outcome": "failed",
                    "why": "did not run as one job", "text": "; ".join(why),
                    "short": "; ".join(why)[:500]})
        if all(rank["finished"] for rank in ranks) or not remaining or not dead:
            break
        print(f"=== {name}: a rank died in {sorted(dead)}; starting again with the "
              f"{len(remaining)} tests after it"
              f"{' (only to report them: the run has failed)' if name in WHOLE_FILE else ''}",
              flush=True)
        selection = [str(HERE / t) for t in remaining]
    seconds = time.monotonic() - started

    counts: Counter[str] = Counter()
    problems: list[dict[str, Any]] = list(job_problems)
    excluded_results = []
    for nodeid in collected:
        test = nodeid.split("/")[-1]
        per_rank = []
        for index, mine in enumerate(tests):
            if nodeid in killed:
                per_rank.append((index, "not run", f"rank(s) {killed[nodeid]} died in it (the "
                                 "per-test time limit, or a crash: see the log)"))
            elif nodeid in mine:
                per_rank.append((index, *outcome(mine[nodeid])))
            else:
                per_rank.append((index, "not run", "never started"))
        order = ["error", "failed", "not run", "skipped", "passed"]
        result = min((r for _, r, _ in per_rank), key=order.index)
        text = "\n".join(f"rank {i}: {t}" for i, r, t in per_rank if r == result and t)
        entry = excluded.get(test)
        verdict = judge(test, result, text, entry)
        record = {"test": test, "outcome": result, "text": text, "short": short(text)}
        if entry is not None:
            counts[f"excluded ({entry['category']})"] += 1
            excluded_results.append({**record, "category": entry["category"],
                                     "reason": entry["reason"], "as_expected": verdict is None})
        else:
            counts[result] += 1
        if verdict is not None:
            problems.append({**record, "why": verdict})
    for test in deselected:
        entry = excluded[test]
        counts[f"excluded ({entry['category']})"] += 1
        excluded_results.append({"test": test, "outcome": "deselected", "text": "", "short": "",
                                 "category": entry["category"], "reason": entry["reason"],
                                 "as_expected": True})
    if not collected:
        problems.append({"test": name, "outcome": "not run", "why": "collected nothing",
                         "text": "", "short": f"{launcher.command} exited with {codes}"})
    print(f"=== {name}: {dict(counts)} in {seconds:.0f} s; {len(problems)} not as required",
          flush=True)
    return {"file": name, "seconds": round(seconds, 1), "exit_codes": codes,
            "counts": dict(counts), "problems": problems, "excluded": excluded_results}


def run_once(name: str, args: argparse.Namespace, launcher: Launcher, pytest_args: list[str],
             selection: list[str], reports: Path, out: Path) -> tuple[list[dict[str, Any]], int]:
    """One mpirun of pytest on `selection`; every rank's events, and the launcher's code."""
    reports.mkdir(parents=True)
    command = [*launcher.command_line(args.ranks, args.timeout), sys.executable,
               str(ROOT / "tests" / "mpi_pytest.py"), "-c", str(HERE / "pytest.ini"),
               "--rootdir", str(HERE), "-q", *pytest_args, *selection]
    env = {
        **launcher.environment,
        "RINGLET_TEST_REPORTS": str(reports),
        "RINGLET_CACHE_DIR": str(out / "cache"),
        "PYTHONPATH": os.pathsep.join(
            [str(HERE / "shim"), str(HERE), *([str(args.deps)] if args.deps.is_dir() else []),
             *filter(None, [os.environ.get("PYTHONPATH")])]),
    }
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    shown = command if len(selection) < 4 else [*command[:-len(selection)], "<tests>"]
    print(f"\n=== {name} at {args.ranks} ranks: {' '.join(shown)}", flush=True)
    code = call(command, env, args.timeout + 20)
    stem = Path(name).stem
    return [read_rank(reports / f"{stem}.rank{r}.jsonl") for r in range(args.ranks)], code


def markdown(summary: dict[str, Any]) -> str:
    quick = " (quick slice)" if summary["quick"] else ""
    lines = [f"# Horovod's tests at {summary['ranks']} ranks, ops matched by "
             f"{summary['matching']}",
             "", f"{summary['seconds']:.0f} s in all{quick}.",
             "", "| file | passed | failed | error | skipped | not run | excluded | seconds |",
             "|---|---|---|---|---|---|---|---|"]
    for f in summary["files"]:
        c = f["counts"]
        excl = sum(v for k, v in c.items() if k.startswith("excluded"))
        lines.append(f"| {f['file']} | {c.get('passed', 0)} | {c.get('failed', 0)} | "
                     f"{c.get('error', 0)} | {c.get('skipped', 0)} | {c.get('not run', 0)} | "
                     f"{excl} | {f['seconds']:.0f} |")
    for f in summary["files"]:
        if f["problems"]:
            lines += ["", f"## {f['file']}: not as required", ""]
            lines += [f"- `{p['test']}`: {p['why']}: {p['short']}" for p in f["problems"]]
    lines += ["", "## Excluded (exclusions*.toml)", ""]
    for f in summary["files"]:
        lines += [f"- `{e['test']}` ({e['category']}, {e['outcome']}"
                  f"{'' if e['as_expected'] else ', NOT as expected'}): {e['reason']}"
                  for e in f["excluded"]]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", nargs="*", default=FILES, choices=FILES + TORCH_FILES)
    parser.add_argument("--quick", action="store_true", help="only the QUICK slice")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=3600, help="seconds per mpirun")
    parser.add_argument("--restarts", type=int, default=5,
                        help="times to start again after a test in which a rank died")
    parser.add_argument("--launcher", default=os.environ.get("RINGLET_MPIRUN") or "mpirun")
    parser.add_argument("--exclusions", type=Path, nargs="+", default=EXCLUSIONS)
    parser.add_argument("--deps", type=Path, default=ROOT / "build" / "horovod-upstream" / "deps",
                        help="directory of the tests' own requirements (mock, parameterized)")
    parser.add_argument("--summary", type=Path,
                        default=ROOT / "build" / "horovod-upstream" / "summary",
                        help="writes SUMMARY.json and SUMMARY.md")
    args, pytest_args = parser.parse_known_args()
    for variable in ("OMPI_ALLOW_RUN_AS_ROOT", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM",
                     "OMPI_MCA_rmaps_base_oversubscribe"):
        os.environ.setdefault(variable, "1")
    matching = matching_from_environment()  # the ranks get this environment
    excluded = load_exclusions(args.exclusions, args.ranks, matching)
    launcher = Launcher(args.launcher)
    out = args.summary.parent
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    files = [run_file(name, args, launcher, pytest_args, excluded, out) for name in args.files]
    summary = {"ranks": args.ranks, "matching": matching, "quick": args.quick,
               "seconds": round(time.monotonic() - started, 1), "files": files}
    args.summary.with_suffix(".json").write_text(json.dumps(summary, indent=1) + "\n")
    args.summary.with_suffix(".md").write_text(markdown(summary))
    problems = [p for f in files for p in f["problems"]]
    passed = sum(f["counts"].get("passed", 0) for f in files)
    print(f"\nsummary: {args.summary.with_suffix('.md')}")
    for p in problems:
        print(f"NOT AS REQUIRED {p['test']}: {p['why']}: {p['short']}")
    print(f"{passed} passed, {len(problems)} failed")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
