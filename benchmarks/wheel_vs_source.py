"""Is an allreduce through the binary wheel as fast as through the build from source?

    python benchmarks/wheel_vs_source.py --source .venv/bin/python \\
        --wheel build/wheel-venvs/debian-openmpi/bin/python [--rounds 3] [--np 2]

Runs benchmarks/allreduce_bench.py (auto and MPI's own allreduce, in place, osu conventions)
at 8 B, 1 MiB and 64 MiB under `mpirun -n NP` with each interpreter in turn, ROUNDS times
alternating, so that the machine's slow spells hit both alike. Prints, per size, the median
over rounds of each build's median time, and the ratio wheel / source; MPI's own allreduce in
the same runs shows how much the machine moved between them.
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
SIZES = (8, 1 << 20, 64 << 20)


def one_run(python: str, size: int, np_: int, launcher: str, out: Path) -> dict[str, float]:
    """candidate -> median microseconds, from one allreduce_bench run at one size."""
    out.mkdir(parents=True, exist_ok=True)
    subprocess.run([launcher, "-n", str(np_), python, str(HERE / "allreduce_bench.py"),
                    "--algorithms", "auto,native", "--min-size", str(size), "--max-size",
                    str(size), "--time-budget", "2", "--out-dir", str(out), "--no-plot"],
                   check=True, stdout=subprocess.DEVNULL)
    (table,) = out.glob("*.csv")
    with table.open() as handle:
        return {row["candidate"]: float(row["median_us"]) for row in csv.DictReader(handle)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", required=True, help="python of the build from source")
    parser.add_argument("--wheel", required=True, help="python of a venv with the wheel")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--np", type=int, default=2)
    parser.add_argument("--launcher", default="mpirun")
    args = parser.parse_args()
    times: dict[tuple[str, int, str], list[float]] = {}
    with tempfile.TemporaryDirectory() as scratch:
        for round_ in range(args.rounds):
            for size in SIZES:
                # Alternate which build goes first, so neither always meets a warmer machine.
                builds = [("source", args.source), ("wheel", args.wheel)]
                for build, python in builds if round_ % 2 == 0 else builds[::-1]:
                    out = Path(scratch) / f"{build}-{size}-{round_}"
                    for candidate, micros in one_run(python, size, args.np, args.launcher,
                                                     out).items():
                        times.setdefault((build, size, candidate), []).append(micros)
                    print(f"round {round_ + 1}/{args.rounds} {size} B {build}", file=sys.stderr)
    print(f"N = {args.np}, float32 sum, in place; medians of {args.rounds} runs per build "
          "(each run's own median)\n")
    print("| size | source: auto (us) | wheel: auto (us) | wheel / source | "
          "MPI_Allreduce in the source runs (us) | in the wheel runs (us) |")
    print("|---|---|---|---|---|---|")
    for size in SIZES:
        median = {key: statistics.median(values) for key, values in times.items()
                  if key[1] == size}
        source, wheel = median[("source", size, "auto")], median[("wheel", size, "auto")]
        print(f"| {size:,} B | {source:.1f} | {wheel:.1f} | {wheel / source:.2f} | "
              f"{median[('source', size, 'native')]:.1f} | "
              f"{median[('wheel', size, 'native')]:.1f} |")


if __name__ == "__main__":
    os.environ.setdefault("OMPI_MCA_rmaps_base_oversubscribe", "1")
    main()
