"""Simulate a collective on a cluster of any size, with ringlet's own schedule code.

    python -m ringlet.simulate --hosts 64 --ranks-per-host 32 \\
        --inter 12.5GB/s,2us --intra 20GB/s,0.3us \\
        --collective allreduce --algorithm two_tier --size 64M [--placement block]
        [--reduce-rate 30GB/s] [--overhead 0us] [--memory 20GB/s]
        [--groups 8 --global 25GB/s,1us] [--half-duplex] [--json] [--plot out.png]

Every rank's part of the registered schedule runs in this process over a transport that
records its messages instead of moving them (the reductions only count their bytes), so what is
timed is exactly what the algorithm sends. The network model then plays the messages in
simulated time:

* each host has one link to the network, at the ``--inter`` bandwidth in each direction, and
  a message across hosts pays the ``--inter`` latency; ranks of one host exchange at the
  ``--intra`` bandwidth and latency, one message in and one out at a time per rank;
* a message reserves its sender's and its receiver's side, first come first served: messages
  that share a link take turns (contention), as in LogGP with G = 1/bandwidth and L = latency;
* each message costs ``--overhead`` of CPU at each end (LogGP's o), and combining costs one
  byte per ``--reduce-rate``;
* with ``--memory``, a host's ranks share its memory bandwidth (bytes of traffic per second,
  as every rank of a host copying at once measures it, counting three bytes per byte copied:
  the source read, the target read for ownership and written): a message inside a host moves
  three bytes per byte, and so does a combine (two operands read, one written), and they take
  turns on it. Without it, memory is not a limit;
* with ``--groups G``, the hosts form G groups of consecutive hosts, each group with one global
  link (``--global``) to the others, as in the two-tier direct networks (PERCS, Dragonfly) of
  Jain, Lau & Kale: a message between groups also takes its turn on both groups' global links,
  runs at the slower rate and pays both latencies;
* with ``--half-duplex``, a connection between two ranks on different hosts carries one
  direction at a time: two ranks exchanging both ways at once (halving-doubling's steps) get
  half the rate each, while a ring's two directions use different connections. Open MPI's TCP
  transport behaves so with whole messages (8 MiB between two hosts: 82 ms one way, 150 ms both
  ways at once), which is why ringlet sends pieces between nodes where calibration finds that
  faster; calibration's ``exchange_slowdown`` says which applies (above 1.5: half duplex).

It does not model the switch fabric beyond the hosts' links (a full-bisection network), or
protocol switches inside MPI (eager/rendezvous). Sizes take K/M/G suffixes (powers of 1024);
bandwidths are bytes per second with K/M/G prefixes (powers of 1000, e.g. 12.5GB/s; 10Gbit/s
also works); latencies take ns/us/ms/s.
``--algorithm all`` simulates every registered algorithm of the collective.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any

from . import _core

__all__ = [
    "COLLECTIVES",
    "COPY_TRAFFIC",
    "PLACEMENTS",
    "Result",
    "algorithms",
    "build_parser",
    "main",
    "parse_bandwidth",
    "parse_latency",
    "parse_link",
    "parse_size",
    "placement_labels",
    "plot",
    "simulate",
    "table",
]

COLLECTIVES = ("allreduce", "reduce", "broadcast", "allgather", "reduce_scatter")
PLACEMENTS = ("block", "round-robin")
COPY_TRAFFIC = 3
"""Bytes of memory traffic the model counts per byte copied inside a host (the source read,
the target read for ownership and written back), and so what a copy that measures
``--memory`` moves."""


def parse_size(text: str) -> int:
    """Bytes: a number with an optional K, M or G (powers of 1024; a trailing B or iB is fine)."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([KMG]?)(i?B)?\s*", str(text), re.IGNORECASE)
    if not match:
        raise ValueError(f"a size is a number of bytes with an optional K, M or G, got {text!r}")
    scale = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[match.group(2).upper()]
    return int(float(match.group(1)) * scale)


def parse_bandwidth(text: str) -> float:
    """Bytes per second: ``12.5GB/s``, ``800MB/s``, ``10Gbit/s`` (K/M/G: powers of 1000)."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[-+]?[0-9]+)?)\s*([KMG]?)(B|bit|b)/s\s*",
                         str(text), re.IGNORECASE)
    if not match:
        raise ValueError(f"a bandwidth is bytes per second such as 12.5GB/s or 10Gbit/s, "
                         f"got {text!r}")
    value = float(match.group(1)) * {"": 1, "K": 1e3, "M": 1e6, "G": 1e9}[match.group(2).upper()]
    unit = match.group(3)
    bits = unit.lower() == "bit" or unit == "b"  # Gb/s and Gbit/s are bits; GB/s bytes
    if value <= 0:
        raise ValueError(f"a bandwidth must be positive, got {text!r}")
    return value / 8 if bits else value


def parse_latency(text: str) -> float:
    """Seconds: ``2us``, ``0.3us``, ``500ns``, ``1ms``, ``1e-6`` (s if no unit)."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[-+]?[0-9]+)?)\s*(ns|us|µs|ms|s)?\s*",
                         str(text), re.IGNORECASE)
    if not match:
        raise ValueError(f"a latency is a time such as 2us, 500ns or 1ms, got {text!r}")
    unit = (match.group(2) or "s").lower()
    return float(match.group(1)) * {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0}[unit]


def parse_link(text: str) -> tuple[float, float]:
    """``BANDWIDTH,LATENCY``, e.g. ``12.5GB/s,2us``: (bytes per second, seconds)."""
    parts = str(text).split(",")
    if len(parts) != 2:
        raise ValueError(f"a link is BANDWIDTH,LATENCY such as 12.5GB/s,2us, got {text!r}")
    return parse_bandwidth(parts[0]), parse_latency(parts[1])


def placement_labels(hosts: int, ranks_per_host: int, placement: str) -> list[int]:
    """Each rank's host: consecutive ranks on one host (block), or dealt out in turn
    (round-robin, as ``mpirun --map-by node`` places them)."""
    if hosts < 1 or ranks_per_host < 1:
        raise ValueError(f"hosts and ranks per host must be at least 1, got {hosts} and "
                         f"{ranks_per_host}")
    if placement not in PLACEMENTS:
        raise ValueError(f"placement must be one of {PLACEMENTS}, got {placement!r}")
    ranks = hosts * ranks_per_host
    if placement == "block":
        return [r // ranks_per_host for r in range(ranks)]
    return [r % hosts for r in range(ranks)]


@dataclass
class Result:
    """One simulated collective."""

    algorithm: str
    predicted_s: float
    messages: int
    bytes: int
    max_link_bytes: int
    mean_link_bytes: float
    max_global_link_bytes: int
    bytes_within_hosts: int
    max_rank_bytes: int
    simulated_in_s: float


def simulate(collective: str, algorithm: str, *, hosts: int, ranks_per_host: int,
             size: int | str, inter: tuple[float, float] | str = "12.5GB/s,2us",
             intra: tuple[float, float] | str = "20GB/s,0.3us",
             reduce_rate: float | str = "30GB/s", overhead: float | str = 0.0,
             memory: float | str | None = None, groups: int = 1,
             global_link: tuple[float, float] | str = "25GB/s,1us", placement: str = "block",
             node_major: bool = True, half_duplex: bool = False) -> Result:
    """Simulate one ``collective`` of ``size`` bytes (float32, sum, root 0) with ``algorithm``
    on ``hosts`` x ``ranks_per_host`` ranks; see the module's description of the model."""
    if collective not in COLLECTIVES:
        raise ValueError(f"collective must be one of {COLLECTIVES}, got {collective!r}")
    nbytes = parse_size(size) if isinstance(size, str) else int(size)
    inter = parse_link(inter) if isinstance(inter, str) else inter
    intra = parse_link(intra) if isinstance(intra, str) else intra
    rate = parse_bandwidth(reduce_rate) if isinstance(reduce_rate, str) else reduce_rate
    cpu = parse_latency(overhead) if isinstance(overhead, str) else overhead
    shared = (float("inf") if memory is None
              else parse_bandwidth(memory) if isinstance(memory, str) else float(memory))
    wide = parse_link(global_link) if isinstance(global_link, str) else global_link
    if not 1 <= groups <= hosts:
        raise ValueError(f"groups must be between 1 and the {hosts} hosts, got {groups}")
    labels = placement_labels(hosts, ranks_per_host, placement)
    started = time.perf_counter()
    outcome = _core.simulate(
        collective, algorithm, labels, nbytes, intra, inter, 1.0 / rate, cpu, node_major,
        shared, groups, wide, half_duplex)
    seconds, sent, links = outcome.seconds, outcome.sent, outcome.link_bytes
    within, globals_ = outcome.bytes_within, outcome.group_bytes
    elapsed = time.perf_counter() - started
    loads = [load for link in links for load in link]
    return Result(
        algorithm=algorithm,
        predicted_s=seconds,
        messages=sum(m for m, _ in sent),
        bytes=sum(b for _, b in sent),
        max_link_bytes=max(loads, default=0),
        mean_link_bytes=sum(loads) / len(loads) if loads else 0.0,
        max_global_link_bytes=(max((load for link in globals_ for load in link), default=0)
                               if groups > 1 else 0),
        bytes_within_hosts=within,
        max_rank_bytes=max((b for _, b in sent), default=0),
        simulated_in_s=elapsed,
    )


def algorithms(collective: str) -> list[str]:
    """The registered algorithms of ``collective``."""
    if collective not in COLLECTIVES:
        raise ValueError(f"collective must be one of {COLLECTIVES}, got {collective!r}")
    return list(_core.simulated_algorithms(collective))


def _human_bytes(value: float) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if value >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value:.0f} B"


def _human_seconds(value: float) -> str:
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if value >= scale:
            return f"{value / scale:.4g} {unit}"
    return f"{value / 1e-9:.4g} ns"


def table(results: list[Result], skipped: dict[str, str]) -> str:
    header = ["algorithm", "predicted", "max link", "mean link", "max global", "messages",
              "simulated in"]
    rows = [[r.algorithm, _human_seconds(r.predicted_s), _human_bytes(r.max_link_bytes),
             _human_bytes(r.mean_link_bytes), _human_bytes(r.max_global_link_bytes),
             str(r.messages), f"{r.simulated_in_s:.2f} s"]
            for r in results]
    widths = [max(len(h), *(len(row[i]) for row in rows)) if rows else len(h)
              for i, h in enumerate(header)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths)) for row in rows]
    lines += [f"{name}: not simulated ({why})" for name, why in skipped.items()]
    return "\n".join(lines)


def plot(results: list[Result], path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r.algorithm for r in results]
    figure, (times, loads) = plt.subplots(1, 2, figsize=(11, 4))
    times.bar(names, [r.predicted_s * 1e3 for r in results], color="tab:blue")
    times.set_ylabel("predicted time (ms)")
    positions = range(len(results))
    loads.bar([p - 0.2 for p in positions], [r.max_link_bytes / 2**20 for r in results],
              width=0.4, label="max link")
    loads.bar([p + 0.2 for p in positions], [r.mean_link_bytes / 2**20 for r in results],
              width=0.4, label="mean link")
    loads.set_xticks(list(positions), names)
    loads.set_ylabel("bytes per host link (MiB)")
    loads.legend()
    for axis in (times, loads):
        axis.tick_params(axis="x", rotation=30)
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m ringlet.simulate", description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n".join(__doc__.splitlines()[6:]))
    parser.add_argument("--hosts", type=int, required=True)
    parser.add_argument("--ranks-per-host", type=int, default=1)
    parser.add_argument("--inter", default="12.5GB/s,2us", help="each host's link: BW,LATENCY")
    parser.add_argument("--intra", default="20GB/s,0.3us", help="inside a host: BW,LATENCY")
    parser.add_argument("--collective", default="allreduce", choices=COLLECTIVES)
    parser.add_argument("--algorithm", default="all", help="a registered algorithm, or all")
    parser.add_argument("--size", default="64M", help="message size: bytes, K/M/G suffixes")
    parser.add_argument("--placement", default="block", choices=PLACEMENTS)
    parser.add_argument("--rank-order", action="store_true",
                        help="rings in rank order, not node-major (to see what that costs)")
    parser.add_argument("--reduce-rate", default="30GB/s", help="bytes combined per second")
    parser.add_argument("--overhead", default="0us", help="CPU per message at each end")
    parser.add_argument("--memory", default=None,
                        help="each host's memory bandwidth, shared by its ranks, in bytes of "
                        "traffic (a copy moves 3 per byte) (default: no limit)")
    parser.add_argument("--groups", type=int, default=1,
                        help="groups of consecutive hosts with a global link each (default: 1)")
    parser.add_argument("--global", dest="global_link", default="25GB/s,1us",
                        help="each group's global link: BW,LATENCY (with --groups)")
    parser.add_argument("--half-duplex", action="store_true",
                        help="a connection between ranks on different hosts carries one "
                        "direction at a time (Open MPI over TCP)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--plot", metavar="PNG", help="draw the comparison into this file")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        inter, intra = parse_link(args.inter), parse_link(args.intra)
        rate, cpu = parse_bandwidth(args.reduce_rate), parse_latency(args.overhead)
        memory = None if args.memory is None else parse_bandwidth(args.memory)
        wide = parse_link(args.global_link)
        if not 1 <= args.groups <= args.hosts:
            raise ValueError(f"--groups must be between 1 and the {args.hosts} hosts")
        nbytes = parse_size(args.size)
        placement_labels(args.hosts, args.ranks_per_host, args.placement)
        registered = algorithms(args.collective)
        if args.algorithm != "all" and args.algorithm not in registered:
            raise ValueError(f"{args.collective} has no algorithm {args.algorithm!r}; "
                             f"accepted: all, {', '.join(registered)}")
    except ValueError as error:
        parser.error(str(error))
    names = registered if args.algorithm == "all" else [args.algorithm]
    results: list[Result] = []
    skipped: dict[str, str] = {}
    for name in names:
        try:
            results.append(simulate(
                args.collective, name, hosts=args.hosts, ranks_per_host=args.ranks_per_host,
                size=nbytes, inter=inter, intra=intra, reduce_rate=rate, overhead=cpu,
                memory=memory, groups=args.groups, global_link=wide,
                placement=args.placement, node_major=not args.rank_order,
                half_duplex=args.half_duplex))
        except (ValueError, _core.RingletError) as error:
            if args.algorithm != "all":
                print(f"error: {error}", file=sys.stderr)
                return 1
            skipped[name] = str(error).split(": ")[-1]
    title = (f"{args.collective} of {_human_bytes(nbytes)} on {args.hosts} hosts x "
             f"{args.ranks_per_host} ranks ({args.placement})")
    if args.json:
        best = min(results, key=lambda r: r.predicted_s)
        document: dict[str, Any] = {
            "collective": args.collective, "size": nbytes, "hosts": args.hosts,
            "ranks_per_host": args.ranks_per_host, "placement": args.placement,
            "inter": {"bandwidth": inter[0], "latency": inter[1]},
            "intra": {"bandwidth": intra[0], "latency": intra[1]},
            **asdict(best),
        }
        if args.algorithm == "all":
            document["rows"] = [asdict(r) for r in results]
            document["not_simulated"] = skipped
        print(json.dumps(document, indent=2))
    else:
        print(title)
        print(table(results, skipped))
    if args.plot:
        plot(results, args.plot, title)
    return 0


if __name__ == "__main__":
    sys.exit(main())
