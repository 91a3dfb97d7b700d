"""Rank program: a float32 allreduce (16 MiB unless told) within a host and across hosts,
denseccl and raw mpi4py side by side, in alternating rounds of one run.

usage: allreduce_pairs.py ROUNDS ITERS [BYTES]   (2 hosts x 2 ranks: 0, 1 on h0; 2, 3 on h1)

Two pairs of ranks, (0, 1) on one host and (0, 2) on two, run in turn while the other ranks
wait without spinning (a polled Ibarrier with sleeps), so the pair under test has the cores.
Each round times every (pair, library) once, in an order that alternates between rounds; rank 0
prints the median time of each and the ratios. Every result is checked against the exact sum;
each rank ends with its summary (tests/support/checker.py).
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import numpy as np
from mpi4py import MPI

import denseccl
from tests.support.checker import Checker

rounds, iters = int(sys.argv[1]), int(sys.argv[2])
nbytes = int(sys.argv[3]) if len(sys.argv) > 3 else 16 << 20
world = MPI.COMM_WORLD
rank = world.Get_rank()
assert world.Get_size() == 4, "run on 2 hosts x 2 ranks"
check = Checker("allreduce_pairs", rank, 4)
PAIRS = {"within a host": (0, 1), "across hosts": (0, 2)}
raw = {name: world.Split(0 if rank in pair else MPI.UNDEFINED, rank) for name, pair in PAIRS.items()}
dense = {name: denseccl.init(backend="mpi", comm=comm) if comm != MPI.COMM_NULL else None for name, comm in raw.items()}
x = np.empty(nbytes // 4, dtype=np.float32)


def quiet_barrier() -> None:
    request = world.Ibarrier()
    while not request.Test():
        time.sleep(0.0005)


def timed(pair: str, library: str) -> float:
    """Mean seconds per allreduce on the pair's rank 0 (NaN elsewhere)."""
    quiet_barrier()
    if rank not in PAIRS[pair]:
        return float("nan")
    comm, group = raw[pair], dense[pair]
    member = comm.Get_rank()

    def once() -> None:
        x.fill(member + 1)
        if library == "mpi4py":
            comm.Allreduce(MPI.IN_PLACE, x)
        else:
            group.allreduce(x)

    once()  # warm-up
    check.check(x[0] == 3 and x[-1] == 3, f"{pair} {library} warm-up: {x[0]}, {x[-1]}")
    comm.Barrier()
    started = time.perf_counter()
    for _ in range(iters):
        once()
    elapsed = (time.perf_counter() - started) / iters
    check.check(np.all(x == 3), f"{pair} {library}: not the exact sum")
    return elapsed


runs = [(pair, library) for pair in PAIRS for library in ("denseccl", "mpi4py")]
times = {run: [] for run in runs}
for number in range(rounds):
    order = runs if number % 2 == 0 else runs[::-1]
    for run in order:
        times[run].append(timed(*run))
quiet_barrier()
if rank == 0:
    median = {run: statistics.median(values) * 1e6 for run, values in times.items()}
    print(f"float32 allreduce of {nbytes} B, 2 ranks, median of {rounds} rounds of {iters} calls")
    for pair in PAIRS:
        d, m = median[(pair, "denseccl")], median[(pair, "mpi4py")]
        print(f"{pair:>14}: denseccl {d:10.1f} us   mpi4py {m:10.1f} us   denseccl/mpi4py {d / m:5.2f}")
    for library in ("denseccl", "mpi4py"):
        ratio = median[("across hosts", library)] / median[("within a host", library)]
        print(f"{library:>14}: across/within {ratio:5.2f}")
    print("JSON " + json.dumps({f"{pair}|{library}": ms for (pair, library), ms in median.items()}), flush=True)
for group in dense.values():
    if group is not None:
        group.close()
whole = denseccl.init(backend="mpi", comm=world)  # every rank, the one in no pair too, checks one sum
y = np.full(4, rank + 1.0)
whole.allreduce(y)
check.check(np.all(y == 10), f"allreduce over the 4 ranks gave {y}")
whole.close()
check.done()
