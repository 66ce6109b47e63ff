"""Two builds of ringlet measured in one session, compared as ratios.

    python benchmarks/compare_builds.py --bench BEFORE.csv AFTER.csv [BEFORE2.csv AFTER2.csv ...]
    python benchmarks/compare_builds.py --cluster BEFORE.jsonl AFTER.jsonl

``--bench`` takes pairs of ``allreduce_bench.py`` CSVs (before, after; several pairs for runs
interleaved as before, after, before, after) and prints, per size and candidate, each build's
median time over MPI's own allreduce (``x_native``, measured in the same run, so that the
machine's slow spells cancel), the median over the pairs, and after / before. ``--cluster``
does the same for ``emulated_cluster_bench.py``'s JSON lines (each algorithm's median over the
host-link bound), per placement.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
from collections import defaultdict
from pathlib import Path


def bench_ratios(path: Path) -> dict[tuple[int, str], float]:
    with path.open() as f:
        return {(int(row["size_bytes"]), row["candidate"]): float(row["x_native"])
                for row in csv.DictReader(f)}


def cluster_ratios(path: Path) -> dict[tuple[str, str], float]:
    ratios = {}
    for line in path.read_text().splitlines():
        run = json.loads(line)
        for name, seconds in run["medians_s"].items():
            ratios[(run["label"], name)] = seconds / run["bound_s"]
    return ratios


def compare(pairs: list[tuple[dict, dict]], what: str) -> str:
    before: dict = defaultdict(list)
    after: dict = defaultdict(list)
    for old, new in pairs:
        for key in old.keys() & new.keys():
            before[key].append(old[key])
            after[key].append(new[key])
    lines = [f"| size / placement | candidate | before ({what}) | after ({what}) "
             "| after / before |", "|---|---|---|---|---|"]
    changes = []
    for key in sorted(before):
        b, a = statistics.median(before[key]), statistics.median(after[key])
        changes.append(a / b)
        lines.append(f"| {key[0]} | {key[1]} | {b:.3f} | {a:.3f} | {a / b:.3f} |")
    lines.append(f"\nmedian of after / before over {len(changes)} rows: "
                 f"{statistics.median(changes):.3f} (min {min(changes):.3f}, "
                 f"max {max(changes):.3f})")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--bench", nargs="+", type=Path, help="before/after CSV pairs")
    group.add_argument("--cluster", nargs="+", type=Path, help="before/after JSON-lines pairs")
    args = parser.parse_args()
    paths = args.bench or args.cluster
    if len(paths) % 2:
        parser.error("give the files in pairs: before, after")
    read = bench_ratios if args.bench else cluster_ratios
    pairs = [(read(paths[i]), read(paths[i + 1])) for i in range(0, len(paths), 2)]
    print(compare(pairs, "x native" if args.bench else "x bound"))


if __name__ == "__main__":
    main()
