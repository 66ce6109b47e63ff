"""Reporting for allreduce_bench.py (rank 0 only, no MPI): derived metrics, tables, CSV, plot;
and parse_size, for the size arguments of allreduce_bench.py and jax_bench.py.

The benchmark hands over one ``SizeResult`` per message size; ``derive_rows`` turns them into
one flat row (a dict) per (size, candidate) with every derived column, and the writers below
render those rows as a text table, Markdown tables, a CSV file and a PNG plot.
"""

from __future__ import annotations

import argparse
import csv
import math
from dataclasses import dataclass
from pathlib import Path

FLOAT32_AUTO = "auto@float32"
"""Runs "auto" on float32 arrays of the same element count (--compare-float32)."""

GB = 1e9
US = 1e6
NAN = float("nan")

CSV_COLUMNS = (
    "date",
    "hostname",
    "mpi_library",
    "n_ranks",
    "dtype",
    "op",
    "size_bytes",
    "candidate",
    "candidate_dtype",
    "count",
    "bytes",
    "iterations",
    "median_us",
    "min_us",
    "algbw_gbs",
    "busbw_gbs",
    "x_native",
    "x_bound",
    "bound_us",
    "p2p_bw_gbs",
    "floor_us",
    "x_floor",
    "copy_bw_gbs",
    "best",
    "auto_picked",
    "picked_by_auto",
    "auto_over_best",
    "x_float32",
)


@dataclass
class Meta:
    """What the whole run shares; printed in headers and repeated in every CSV row."""

    n_ranks: int
    dtype: str
    op: str
    date: str
    hostname: str
    mpi_library: str
    p2p_bandwidth: float
    """MPI point-to-point bandwidth in bytes/s per direction (Sendrecv between ring neighbours)."""
    p2p_bytes: int
    algorithms: tuple[str, ...]
    """The algorithms "auto" chooses among: the best of these is the selector's target."""


@dataclass
class Timing:
    """One candidate at one message size; times are the max over ranks, in seconds."""

    candidate: str
    dtype: str
    count: int
    nbytes: int
    median: float
    minimum: float
    picked: str = ""
    """For "auto" candidates: the algorithm the selector said it runs ("" if unknown)."""


@dataclass
class SizeResult:
    size: int
    """The message size in bytes of the benchmark's dtype (the row group)."""
    iterations: int
    timings: list[Timing]
    p2p_bandwidth: float = NAN
    """B measured at this size (NaN: use the run's B)."""
    copy_bandwidth: float = NAN
    """memcpy bytes/s measured at this size, every rank copying at once."""


# ---------------------------------------------------------------------------------------------
# Derived metrics


def bus_factor(n_ranks: int) -> float:
    """2(N-1)/N: the share of the message each rank must send (and receive) at the least."""
    return 2 * (n_ranks - 1) / n_ranks


def bound_seconds(nbytes: int, meta: Meta, bandwidth: float = NAN) -> float:
    """The bandwidth lower bound 2(N-1)/N * m / B (Patarasuk & Yuan 2009, Lemma 5), with B
    measured at this size when given."""
    b = meta.p2p_bandwidth if math.isnan(bandwidth) else bandwidth
    return bus_factor(meta.n_ranks) * nbytes / b


def floor_seconds(nbytes: int, n_ranks: int, copy_bandwidth: float) -> float:
    """The memory-traffic floor on one node: (2 - 1/N)m loaded and m stored per rank, at the
    memcpy rate C (a copied byte is one load and one store): (3 - 1/N)/2 * m / C."""
    if math.isnan(copy_bandwidth) or n_ranks < 2:
        return NAN
    return (3 - 1 / n_ranks) / 2 * nbytes / copy_bandwidth


def ratio(numerator: float, denominator: float) -> float:
    if math.isnan(numerator) or math.isnan(denominator) or denominator <= 0:
        return NAN
    return numerator / denominator


def best_algorithm(timings: list[Timing], algorithms: tuple[str, ...]) -> Timing | None:
    """The fastest (median) candidate among the algorithms "auto" could have picked."""
    eligible = [t for t in timings if t.candidate in algorithms]
    return min(eligible, key=lambda t: t.median) if eligible else None


def median_of(timing: Timing | None) -> float:
    return timing.median if timing is not None else NAN


def derive_rows(results: list[SizeResult], meta: Meta) -> list[dict]:
    """One dict per (size, candidate) with every column of CSV_COLUMNS."""
    return [row for result in results for row in size_rows(result, meta)]


def size_rows(result: SizeResult, meta: Meta) -> list[dict]:
    by_name = {t.candidate: t for t in result.timings}
    native = median_of(by_name.get("native"))
    best = best_algorithm(result.timings, meta.algorithms)
    auto = by_name.get("auto")
    auto_picked = auto.picked if auto is not None else ""
    per_size = {
        "auto_over_best": ratio(median_of(auto), median_of(best)),
        "x_float32": ratio(median_of(auto), median_of(by_name.get(FLOAT32_AUTO))),
    }
    rows = []
    for t in result.timings:
        bound = bound_seconds(t.nbytes, meta, result.p2p_bandwidth)
        floor = floor_seconds(t.nbytes, meta.n_ranks, result.copy_bandwidth)
        p2p = meta.p2p_bandwidth if math.isnan(result.p2p_bandwidth) else result.p2p_bandwidth
        algbw = t.nbytes / t.median / GB
        rows.append(
            {
                "date": meta.date,
                "hostname": meta.hostname,
                "mpi_library": meta.mpi_library,
                "n_ranks": meta.n_ranks,
                "dtype": meta.dtype,
                "op": meta.op,
                "size_bytes": result.size,
                "candidate": t.candidate,
                "candidate_dtype": t.dtype,
                "count": t.count,
                "bytes": t.nbytes,
                "iterations": result.iterations,
                "median_us": t.median * US,
                "min_us": t.minimum * US,
                "algbw_gbs": algbw,
                "busbw_gbs": algbw * bus_factor(meta.n_ranks),
                "x_native": ratio(t.median, native),
                "x_bound": ratio(t.median, bound),
                "bound_us": bound * US,
                "p2p_bw_gbs": p2p / GB,
                "floor_us": floor * US,
                "x_floor": ratio(t.median, floor),
                "copy_bw_gbs": result.copy_bandwidth / GB,
                "best": best is not None and t is best,
                "auto_picked": t.picked,
                "picked_by_auto": t.candidate == auto_picked,
                **per_size,
            }
        )
    return rows


# ---------------------------------------------------------------------------------------------
# Formatting helpers


def size_label(nbytes: int) -> str:
    """8 -> "8", 2048 -> "2K", 3 * 2**20 -> "3M" (binary units, like the command line)."""
    for suffix, unit in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if nbytes >= unit and nbytes % unit == 0:
            return f"{nbytes // unit}{suffix}"
    return str(nbytes)


def number(value: float, digits: int = 2) -> str:
    return "-" if math.isnan(value) else f"{value:.{digits}f}"


def small_number(value: float) -> str:
    """Like number() but with two significant digits below 0.1 (bounds of tiny messages)."""
    return number(value) if math.isnan(value) or value >= 0.1 else f"{value:.2g}"


def note(row: dict) -> str:
    """Marks for the table: the best algorithm, auto's pick, and what auto ran."""
    marks = []
    if row["best"]:
        marks.append("*best")
    if row["picked_by_auto"]:
        marks.append("<auto")
    if row["auto_picked"]:
        marks.append(f"-> {row['auto_picked']}")
    return " ".join(marks)


TABLE_COLUMNS = (
    # (header, right-aligned, cell)
    ("size", True, lambda r: size_label(r["size_bytes"])),
    ("candidate", False, lambda r: r["candidate"]),
    ("iters", True, lambda r: str(r["iterations"])),
    ("median us", True, lambda r: number(r["median_us"])),
    ("min us", True, lambda r: number(r["min_us"])),
    ("algbw GB/s", True, lambda r: number(r["algbw_gbs"], 3)),
    ("busbw GB/s", True, lambda r: number(r["busbw_gbs"], 3)),
    ("x/native", True, lambda r: number(r["x_native"])),
    ("x/bound", True, lambda r: number(r["x_bound"])),
    ("x/floor", True, lambda r: number(r["x_floor"])),
    ("note", False, note),
)


def group_by_size(rows: list[dict]) -> list[list[dict]]:
    groups: dict[int, list[dict]] = {}
    for row in rows:
        groups.setdefault(row["size_bytes"], []).append(row)
    return list(groups.values())


def summary(group: list[dict], meta: Meta) -> dict:
    """Per-size facts: the best algorithm, auto's pick and its accuracy, the float32 ratio."""
    first = group[0]
    best = next((r["candidate"] for r in group if r["best"]), "")
    auto = next((r for r in group if r["candidate"] == "auto"), None)
    return {
        "size": size_label(first["size_bytes"]),
        "bound_us": first["bound_us"],
        "floor_us": first["floor_us"],
        "p2p_bw_gbs": first["p2p_bw_gbs"],
        "native_us": next((r["median_us"] for r in group if r["candidate"] == "native"), NAN),
        "best": best,
        "best_us": next((r["median_us"] for r in group if r["best"]), NAN),
        "auto_picked": auto["auto_picked"] if auto is not None else "",
        "auto_us": auto["median_us"] if auto is not None else NAN,
        "auto_over_best": first["auto_over_best"],
        "x_float32": first["x_float32"],
    }


def header_lines(meta: Meta) -> list[str]:
    return [
        f"ringlet allreduce benchmark: N={meta.n_ranks}, dtype={meta.dtype}, op={meta.op}, "
        f"{meta.date}, {meta.hostname}",
        f"MPI: {meta.mpi_library}",
        f"p2p bandwidth B = {meta.p2p_bandwidth / GB:.3f} GB/s per direction "
        f"(Sendrecv of {size_label(meta.p2p_bytes)} bytes between ring neighbours, median)",
        "bound = 2(N-1)/N * m / B (Patarasuk & Yuan, Lemma 5), B measured at each size; "
        "floor = (3 - 1/N)/2 * m / C, C the memcpy rate at each size (the memory traffic of one "
        "node); times are the max over ranks; x/native, x/bound and x/floor divide the median",
    ]


# ---------------------------------------------------------------------------------------------
# Text and Markdown tables


def text_table(rows: list[dict], meta: Meta) -> str:
    cells = [[cell(r) for _, _, cell in TABLE_COLUMNS] for r in rows]
    widths = [len(header) for header, _, _ in TABLE_COLUMNS]
    for line in cells:
        widths = [max(w, len(c)) for w, c in zip(widths, line)]

    def render(line: list[str]) -> str:
        parts = [
            c.rjust(w) if right else c.ljust(w)
            for c, w, (_, right, _) in zip(line, widths, TABLE_COLUMNS)
        ]
        return "  ".join(parts).rstrip()

    out = [f"# {line}" for line in header_lines(meta)]
    out.append(render([header for header, _, _ in TABLE_COLUMNS]))
    index = 0
    for group in group_by_size(rows):
        out.extend(render(line) for line in cells[index : index + len(group)])
        index += len(group)
        out.append(" " * (widths[0] + 2) + summary_line(summary(group, meta), meta))
    return "\n".join(out)


def summary_line(facts: dict, meta: Meta) -> str:
    parts = [f"-> bound {small_number(facts['bound_us'])} us"]
    if facts["best"]:
        parts.append(f"best {facts['best']}")
    if facts["auto_picked"]:
        parts.append(f"auto picked {facts['auto_picked']}")
    if not math.isnan(facts["auto_over_best"]):
        parts.append(f"auto/best = {number(facts['auto_over_best'])}")
    if not math.isnan(facts["x_float32"]):
        parts.append(f"{meta.dtype}/float32 (auto) = {number(facts['x_float32'])}")
    return ", ".join(parts)


def markdown_table(headers: list[str], lines: list[list[str]], right: list[bool]) -> str:
    align = ["---:" if r else ":---" for r in right]
    out = ["| " + " | ".join(headers) + " |", "| " + " | ".join(align) + " |"]
    out.extend("| " + " | ".join(line) + " |" for line in lines)
    return "\n".join(out)


def markdown(rows: list[dict], meta: Meta) -> str:
    """A per-size summary table and the full table, ready to paste into RESULTS.md."""
    facts = [summary(group, meta) for group in group_by_size(rows)]
    compare = any(not math.isnan(f["x_float32"]) for f in facts)
    summary_columns = [
        ("size", True, lambda f: f["size"]),
        ("B GB/s", True, lambda f: number(f["p2p_bw_gbs"])),
        ("bound us", True, lambda f: small_number(f["bound_us"])),
        ("floor us", True, lambda f: small_number(f["floor_us"])),
        ("native us", True, lambda f: number(f["native_us"])),
        ("best", False, lambda f: f["best"] or "-"),
        ("best us", True, lambda f: number(f["best_us"])),
        ("auto picked", False, lambda f: f["auto_picked"] or "-"),
        ("auto us", True, lambda f: number(f["auto_us"])),
        ("auto/best", True, lambda f: number(f["auto_over_best"])),
    ]
    if compare:
        summary_columns.append((f"{meta.dtype}/float32", True, lambda f: number(f["x_float32"])))
    parts = [
        "\n".join(f"<!-- {line} -->" for line in header_lines(meta)),
        markdown_table(
            [h for h, _, _ in summary_columns],
            [[cell(f) for _, _, cell in summary_columns] for f in facts],
            [r for _, r, _ in summary_columns],
        ),
        markdown_table(
            [h for h, _, _ in TABLE_COLUMNS],
            [[cell(r) for _, _, cell in TABLE_COLUMNS] for r in rows],
            [r for _, r, _ in TABLE_COLUMNS],
        ),
    ]
    return "\n\n".join(parts)


# ---------------------------------------------------------------------------------------------
# Files


def write_csv(rows: list[dict], path: Path) -> None:
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=CSV_COLUMNS)
        writer.writeheader()
        for row in rows:
            writer.writerow({key: csv_value(row[key]) for key in CSV_COLUMNS})


def csv_value(value: object) -> object:
    if isinstance(value, float):
        return "" if math.isnan(value) else f"{value:.6g}"
    if isinstance(value, bool):
        return int(value)
    return value


def series(rows: list[dict], key: str) -> dict[str, tuple[list[int], list[float]]]:
    """candidate -> (sizes, values) for one column, skipping missing values."""
    lines: dict[str, tuple[list[int], list[float]]] = {}
    for row in rows:
        if math.isnan(row[key]):
            continue
        sizes, values = lines.setdefault(row["candidate"], ([], []))
        sizes.append(row["size_bytes"])
        values.append(row[key])
    return lines


def write_plot(rows: list[dict], meta: Meta, path: Path) -> None:
    """Median time vs size (log-log) with the bound; below it the ratio to native (or bound),
    and with --compare-float32 the 16-bit / float32 ratio of auto."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    has_native = any(r["candidate"] == "native" for r in rows)
    compare = any(not math.isnan(r["x_float32"]) for r in rows)
    heights = [3, 2, 1.3] if compare else [3, 2]
    figure, axes = plt.subplots(
        len(heights),
        1,
        figsize=(10, 4.2 * sum(heights) / 2.5),
        sharex=True,
        gridspec_kw={"height_ratios": heights},
    )
    styles = line_styles(list(dict.fromkeys(r["candidate"] for r in rows)))
    plot_times(axes[0], rows, meta, styles)
    plot_ratios(axes[1], rows, "x_native" if has_native else "x_bound", styles)
    if compare:
        plot_float32_ratio(axes[2], rows, meta)
    label_sizes(axes[-1], sorted({r["size_bytes"] for r in rows}), meta)
    for axis in axes:
        axis.grid(True, which="both", alpha=0.3)
    figure.suptitle(
        f"ringlet allreduce: N={meta.n_ranks}, {meta.dtype}, op={meta.op}, "
        f"{meta.date[:16].replace('T', ' ')}\n{meta.hostname}, {meta.mpi_library.split(',')[0]}",
        fontsize=11,
    )
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def plot_times(axis, rows: list[dict], meta: Meta, styles: dict[str, dict]) -> None:
    for name, (sizes, values) in series(rows, "median_us").items():
        axis.plot(sizes, values, label=name, **styles[name])
    if meta.n_ranks > 1:
        per_size = {r["size_bytes"]: r["bound_us"] for r in rows}
        sizes = sorted(per_size)
        bounds = [per_size[s] for s in sizes]
        axis.plot(sizes, bounds, "k--", linewidth=1.2, label="bound 2(N-1)/N·m/B")
    axis.set_yscale("log")
    fastest = min(r["median_us"] for r in rows)
    axis.set_ylim(bottom=fastest / 4)  # the bound of tiny messages would flatten the rest
    axis.set_ylabel("median time per allreduce (µs)")
    axis.legend(fontsize=8, ncol=2)


def plot_ratios(axis, rows: list[dict], key: str, styles: dict[str, dict]) -> None:
    for name, (sizes, values) in series(rows, key).items():
        axis.plot(sizes, values, label=name, **styles[name])
    axis.axhline(1.0, color="gray", linewidth=0.8)
    axis.set_yscale("log")
    axis.set_ylabel("median / native" if key == "x_native" else "median / bound")
    label_ratio_ticks(axis)


def plot_float32_ratio(axis, rows: list[dict], meta: Meta) -> None:
    sizes, ratios = series(rows, "x_float32")["auto"]
    axis.plot(sizes, ratios, "o-", color="tab:purple", label="auto")
    axis.axhline(0.6, color="gray", linestyle=":", label="target 0.6")
    axis.set_ylabel(f"{meta.dtype} / float32")
    axis.legend(fontsize=8)


def label_sizes(axis, sizes: list[int], meta: Meta) -> None:
    axis.set_xscale("log", base=2)
    axis.set_xticks(sizes)
    axis.set_xticklabels([size_label(s) for s in sizes], rotation=45)
    axis.set_xlabel(f"message size (bytes of {meta.dtype})")


def label_ratio_ticks(axis) -> None:
    """Ticks at 1, 2 and 5 times powers of ten on a log axis, labelled as plain numbers."""
    from matplotlib.ticker import FixedLocator, FormatStrFormatter, NullFormatter

    low, high = axis.get_ylim()
    ticks = [m * 10.0**e for e in range(-4, 8) for m in (1, 2, 5) if low <= m * 10.0**e <= high]
    axis.yaxis.set_major_locator(FixedLocator(ticks))
    axis.yaxis.set_major_formatter(FormatStrFormatter("%g"))
    axis.yaxis.set_minor_formatter(NullFormatter())


def line_styles(names: list[str]) -> dict[str, dict]:
    """Fixed looks for auto and native, the tab10 colours with markers for the rest."""
    markers = "os^vD<>ph*"
    styles = {}
    others = [n for n in names if n not in ("auto", "native")]
    for index, name in enumerate(others):
        styles[name] = {
            "color": f"C{index % 10}",
            "marker": markers[index % len(markers)],
            "markersize": 4,
            "linewidth": 1.2,
        }
    styles["auto"] = {"color": "black", "marker": "x", "linestyle": ":", "linewidth": 1.6}
    styles["native"] = {"color": "gray", "marker": "s", "linewidth": 2.2, "alpha": 0.6}
    return styles


SIZE_SUFFIXES = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    """Bytes from "4096", "4K", "16M" or "1G" (binary units; "16MB" and "16MiB" work too)."""
    value = text.strip().upper().removesuffix("B").removesuffix("I")
    scale = SIZE_SUFFIXES.get(value[-1:], 1)
    digits = value[:-1] if value[-1:] in SIZE_SUFFIXES else value
    try:
        size = int(digits) * scale
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (try 8, 4K, 16M, 1G)") from None
    if size < 1:
        raise argparse.ArgumentTypeError(f"size must be positive: {text!r}")
    return size
