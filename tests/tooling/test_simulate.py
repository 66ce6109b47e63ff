"""python -m ringlet.simulate: its parsing, its JSON and table, its plot, and that what it
reports follows from the schedules (plain pytest, no MPI job: the simulator runs in-process)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ringlet import simulate as sim

ROOT = Path(__file__).resolve().parents[2]


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ringlet.simulate", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize(("text", "value"), [("64M", 64 << 20), ("4096", 4096), ("1K", 1024),
                                             ("2GiB", 2 << 30), ("1.5K", 1536)])
def test_sizes(text, value):
    assert sim.parse_size(text) == value


@pytest.mark.parametrize(("text", "value"), [("12.5GB/s", 12.5e9), ("800MB/s", 800e6),
                                             ("10Gbit/s", 1.25e9), ("1Gb/s", 125e6),
                                             ("100B/s", 100.0)])
def test_bandwidths(text, value):
    assert sim.parse_bandwidth(text) == pytest.approx(value)


@pytest.mark.parametrize(("text", "value"), [("2us", 2e-6), ("0.3us", 0.3e-6), ("500ns", 5e-7),
                                             ("1ms", 1e-3), ("1e-6", 1e-6)])
def test_latencies(text, value):
    assert sim.parse_latency(text) == pytest.approx(value)


@pytest.mark.parametrize(("call", "text"), [
    (sim.parse_size, "64X"), (sim.parse_bandwidth, "12.5GB"), (sim.parse_latency, "2 weeks"),
    (sim.parse_link, "12.5GB/s"), (sim.parse_bandwidth, "0GB/s")])
def test_bad_units_say_what_is_accepted(call, text):
    with pytest.raises(ValueError, match=r"such as|a size is|must be positive"):
        call(text)


def test_placements():
    assert sim.placement_labels(2, 3, "block") == [0, 0, 0, 1, 1, 1]
    assert sim.placement_labels(2, 3, "round-robin") == [0, 1, 0, 1, 0, 1]
    with pytest.raises(ValueError, match="placement must be one of"):
        sim.placement_labels(2, 3, "scatter")
    with pytest.raises(ValueError, match="at least 1"):
        sim.placement_labels(0, 3, "block")


def test_the_json_of_one_algorithm_has_the_promised_fields():
    job = cli("--hosts", "4", "--ranks-per-host", "2", "--inter", "1Gbit/s,50us",
              "--collective", "allreduce", "--algorithm", "ring", "--size", "16M", "--json")
    assert job.returncode == 0, job.stderr
    result = json.loads(job.stdout)
    for key in ("predicted_s", "max_link_bytes", "mean_link_bytes", "messages"):
        assert key in result
    m, n = 16 << 20, 8
    assert result["messages"] == n * 2 * (n - 1)
    assert result["bytes"] == n * 2 * (n - 1) * m // n
    # In node-major order each of the ring's 2(N-1) steps of m/N crosses each host's link once.
    assert result["max_link_bytes"] == 2 * (n - 1) * m // n
    # At 125 MB/s the link time alone is at least the host-link bound 2(H-1)/H·m/B.
    assert result["predicted_s"] > 2 * 3 / 4 * m / 125e6


def test_all_algorithms_each_get_a_row_and_those_that_need_mpi_say_why():
    job = cli("--hosts", "2", "--ranks-per-host", "2", "--size", "1M", "--json")
    assert job.returncode == 0, job.stderr
    result = json.loads(job.stdout)
    names = {row["algorithm"] for row in result["rows"]}
    assert {"ring", "pipelined_ring", "halving_doubling", "recursive_doubling",
            "two_tier"} <= names
    assert set(result["not_simulated"]) == {"shm", "mpi"}
    assert "MPI communicator" in result["not_simulated"]["mpi"]
    assert result["predicted_s"] == min(row["predicted_s"] for row in result["rows"])


@pytest.mark.parametrize("collective", sim.COLLECTIVES)
def test_every_collective_prints_a_table(collective):
    job = cli("--hosts", "3", "--ranks-per-host", "2", "--collective", collective,
              "--size", "100K")
    assert job.returncode == 0, job.stderr
    lines = job.stdout.splitlines()
    assert lines[0].startswith(f"{collective} of 100 KiB on 3 hosts x 2 ranks")
    listed = [line.split()[0] for line in lines[2:] if "not simulated" not in line]
    assert set(listed) == set(sim.algorithms(collective)) - {"shm", "mpi"}


def test_the_plot_is_written(tmp_path):
    out = tmp_path / "compare.png"
    job = cli("--hosts", "4", "--ranks-per-host", "4", "--size", "4M", "--plot", str(out))
    assert job.returncode == 0, job.stderr
    assert out.read_bytes().startswith(b"\x89PNG")


def test_unknown_names_are_refused_with_the_accepted_ones():
    job = cli("--hosts", "2", "--algorithm", "tree")
    assert job.returncode == 2 and "accepted: all, ring" in job.stderr
    job = cli("--hosts", "2", "--inter", "fast")
    assert job.returncode == 2 and "BANDWIDTH,LATENCY" in job.stderr


def test_placement_and_node_major_order_show_in_the_link_load():
    common = {"hosts": 8, "ranks_per_host": 4, "size": "8M", "inter": "1GB/s,10us"}
    block = sim.simulate("allreduce", "ring", placement="block", **common)
    dealt = sim.simulate("allreduce", "ring", placement="round-robin", node_major=False,
                         **common)
    reordered = sim.simulate("allreduce", "ring", placement="round-robin", **common)
    assert dealt.max_link_bytes == 4 * block.max_link_bytes  # every step crosses every link
    assert reordered.max_link_bytes == block.max_link_bytes
    assert dealt.predicted_s > 3 * block.predicted_s
    tiered = sim.simulate("allreduce", "two_tier", placement="round-robin", **common)
    assert tiered.max_link_bytes < block.max_link_bytes


def test_groups_of_hosts_share_global_links():
    common = {"hosts": 8, "ranks_per_host": 2, "size": "8M", "inter": "10GB/s,1us"}
    flat = sim.simulate("allreduce", "ring", **common)
    grouped = sim.simulate("allreduce", "ring", groups=4, global_link="1GB/s,5us", **common)
    assert flat.max_global_link_bytes == 0
    # A node-major ring leaves each group once per step: 2(N-1) steps of m/N out of each.
    m, n = 8 << 20, 16
    assert grouped.max_global_link_bytes == 2 * (n - 1) * m // n
    assert grouped.predicted_s > 5 * flat.predicted_s  # the global links are 10x slower
    with pytest.raises(ValueError, match="groups must be between 1 and the 8 hosts"):
        sim.simulate("allreduce", "ring", groups=9, **common)
    job = cli("--hosts", "8", "--groups", "4", "--global", "1GB/s,5us", "--size", "1M",
              "--algorithm", "two_tier", "--json")
    assert job.returncode == 0, job.stderr
    assert json.loads(job.stdout)["max_global_link_bytes"] > 0


def test_half_duplex_connections_slow_pairwise_exchanges_not_the_ring():
    common = {"hosts": 4, "ranks_per_host": 1, "size": "16M", "inter": "125MB/s,20us"}
    for name, slower in (("halving_doubling", True), ("ring", False)):
        full = sim.simulate("allreduce", name, **common)
        half = sim.simulate("allreduce", name, half_duplex=True, **common)
        assert half.max_link_bytes == full.max_link_bytes  # the same bytes, at another pace
        if slower:  # every step exchanges both ways with one peer: twice the time on the wire
            assert half.predicted_s > 1.8 * full.predicted_s
        else:  # each direction of the ring has a connection of its own
            assert half.predicted_s == full.predicted_s
    job = cli("--hosts", "4", "--size", "16M", "--inter", "125MB/s,20us", "--algorithm",
              "halving_doubling", "--half-duplex", "--json")
    assert job.returncode == 0, job.stderr
    slow = json.loads(job.stdout)["predicted_s"]
    assert slow == pytest.approx(sim.simulate("allreduce", "halving_doubling", half_duplex=True,
                                              **common).predicted_s)


def test_memory_traffic_is_three_bytes_per_byte_copied_or_combined():
    """A ring allreduce of m bytes on one host of 2 ranks, bound by memory alone: each rank
    copies m/2 twice and combines m/2 once, 3 bytes of traffic per byte each, 9m in all
    (``COPY_TRAFFIC`` is what the validation's copy counts, so it must be the model's)."""
    m, memory = 64 << 20, 10e9
    result = sim.simulate("allreduce", "ring", hosts=1, ranks_per_host=2, size=m,
                          intra=(1e18, 0.0), reduce_rate=1e18, memory=memory)
    copied, combined = 2 * 2 * m // 2, 2 * m // 2
    expected = (sim.COPY_TRAFFIC * copied + 3 * combined) / memory
    assert result.predicted_s == pytest.approx(expected, rel=1e-9)
