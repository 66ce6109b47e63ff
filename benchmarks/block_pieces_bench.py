"""How a block that spans several arrays is best sent between two ranks: one message per piece
(what ringlet's transport does), one message with an MPI derived datatype
(`MPI_Type_create_hindexed` over the pieces' addresses), or packed into one buffer and unpacked;
against one contiguous message of the same bytes.

    mpirun -n 2 python benchmarks/block_pieces_bench.py [--rounds 30]

Each rank sends half of a list of arrays (the block spans array boundaries, as a ring block at
N=2 does) to the other and receives the other half, with Sendrecv semantics; the ways alternate
within each round, a barrier before each, the slowest rank's time; medians. Two lists: the
benchmark MLP's gradients (10 arrays, 36.5 MiB), and 200 arrays of 4-64 KiB (6.5 MiB).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np
from mpi4py import MPI

MLP = [(2048, 1024), (2048,), (2048, 2048), (2048,), (1280, 2048), (1280,), (512, 1280), (512,),
       (10, 512), (10,)]


def block_pieces(arrays: list[np.ndarray], first_half: bool) -> list[np.ndarray]:
    """Byte views of the first or second half of the arrays' concatenation."""
    half = sum(a.nbytes for a in arrays) // 2  # equal halves (an odd last byte stays home)
    lo, hi = (0, half) if first_half else (half, 2 * half)
    pieces, offset = [], 0
    for a in arrays:
        flat = a.reshape(-1).view(np.uint8)
        start, end = max(lo - offset, 0), min(hi - offset, flat.nbytes)
        if start < end:
            pieces.append(flat[start:end])
        offset += flat.nbytes
    return pieces


def hindexed(pieces: list[np.ndarray]) -> MPI.Datatype:
    """A datatype covering the pieces at their absolute addresses (used with MPI.BOTTOM)."""
    lengths = [p.nbytes for p in pieces]
    addresses = [MPI.Get_address(p) for p in pieces]
    datatype = MPI.BYTE.Create_hindexed(lengths, addresses)
    datatype.Commit()
    return datatype


def ways(comm: MPI.Comm, arrays: list[np.ndarray]) -> dict[str, Callable[[], None]]:
    peer = 1 - comm.rank
    send = block_pieces(arrays, comm.rank == 0)
    recv = block_pieces(arrays, comm.rank == 1)
    nbytes = sum(p.nbytes for p in send)
    flat_send, flat_recv = np.ones(nbytes, np.uint8), np.empty(nbytes, np.uint8)
    scratch_send, scratch_recv = np.empty(nbytes, np.uint8), np.empty(nbytes, np.uint8)
    cached = (hindexed(send), hindexed(recv))

    def contiguous() -> None:
        comm.Sendrecv(flat_send, peer, recvbuf=flat_recv, source=peer)

    def messages() -> None:
        requests = [comm.Irecv(p, peer, tag=i) for i, p in enumerate(recv)]
        requests += [comm.Isend(p, peer, tag=i) for i, p in enumerate(send)]
        MPI.Request.Waitall(requests)

    def datatype(fresh: bool) -> Callable[[], None]:
        def run() -> None:
            types = (hindexed(send), hindexed(recv)) if fresh else cached
            comm.Sendrecv([MPI.BOTTOM, 1, types[0]], peer,
                          recvbuf=[MPI.BOTTOM, 1, types[1]], source=peer)
            if fresh:
                for t in types:
                    t.Free()
        return run

    def pack() -> None:
        offset = 0
        for p in send:
            scratch_send[offset:offset + p.nbytes] = p
            offset += p.nbytes
        comm.Sendrecv(scratch_send, peer, recvbuf=scratch_recv, source=peer)
        offset = 0
        for p in recv:
            p[:] = scratch_recv[offset:offset + p.nbytes]
            offset += p.nbytes

    return {"contiguous (reference)": contiguous, "one message per piece": messages,
            "hindexed, built per call": datatype(True), "hindexed, cached": datatype(False),
            "pack + unpack": pack}


def pattern(nbytes: int, rank: int) -> np.ndarray:
    """What ``rank`` sends: distinct per position and per rank."""
    return (np.arange(nbytes, dtype=np.uint64) % 251).astype(np.uint8) ^ np.uint8(rank + 1)


def check(comm: MPI.Comm, arrays: list[np.ndarray], way: Callable[[], None]) -> None:
    """After ``way`` this rank's received half holds exactly what the peer sent."""
    for a in arrays:
        a.reshape(-1).view(np.uint8)[:] = 0
    send = block_pieces(arrays, comm.rank == 0)
    data, offset = pattern(sum(p.nbytes for p in send), comm.rank), 0
    for p in send:
        p[:] = data[offset:offset + p.nbytes]
        offset += p.nbytes
    way()
    got = np.concatenate(block_pieces(arrays, comm.rank == 1))
    assert np.array_equal(got, pattern(got.nbytes, 1 - comm.rank)), "wrong bytes received"


def measure(comm: MPI.Comm, name: str, arrays: list[np.ndarray], rounds: int) -> None:
    candidates = ways(comm, arrays)
    for key, way in candidates.items():
        if key != "contiguous (reference)":  # it sends its own buffers
            check(comm, arrays, way)
        way()
    times: dict[str, list[float]] = {k: [] for k in candidates}
    for _ in range(rounds):
        for key, way in candidates.items():
            comm.Barrier()
            start = time.perf_counter()
            way()
            times[key].append(comm.allreduce(time.perf_counter() - start, op=MPI.MAX))
    if comm.rank == 0:
        total = sum(a.nbytes for a in arrays)
        pieces = len(block_pieces(arrays, True))
        print(f"\n{name}: {len(arrays)} arrays, {total / 2**20:.1f} MiB; a block of "
              f"{total / 2**21:.1f} MiB in {pieces} pieces each way; median of {rounds}")
        print("| way | median | min | / contiguous |")
        print("|---|---|---|---|")
        reference = statistics.median(times["contiguous (reference)"])
        for key, samples in times.items():
            median = statistics.median(samples)
            print(f"| {key} | {median * 1e3:.3f} ms | {min(samples) * 1e3:.3f} ms | "
                  f"{median / reference:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    if comm.size != 2:
        raise SystemExit("block_pieces_bench runs on exactly 2 ranks")
    mlp = [np.ones(shape, np.float32) for shape in MLP]
    rng = np.random.default_rng(0)
    small = [np.ones(int(n), np.uint8) for n in rng.integers(4 << 10, 64 << 10, 200)]
    measure(comm, "MLP gradients", mlp, args.rounds)
    measure(comm, "200 small arrays", small, args.rounds)


if __name__ == "__main__":
    main()
