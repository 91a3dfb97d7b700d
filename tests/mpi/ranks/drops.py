"""Rank program: objects dropped in every order while work is in flight (issue: fault containment).

Each ORDER drops a Work, its arrays and its communicator in one order, with the peer (rank 1)
joining the collective only later, so the transfer is still running when the objects go; then
the job keeps using MPI (another communicator), allocates over the memory that was freed, and
checks every result. ``exit`` leaves the interpreter with work in flight.

usage: mpiexec -n 2 python drops.py ORDER
ORDER: work-first | array-first | comm-first | comm-only | exit
"""

from __future__ import annotations

import gc
import sys
import time

import numpy as np

import denseccl
from tests.support.checker import Checker

COUNT = 1 << 20


def main() -> None:
    order = sys.argv[1]
    other = denseccl.init(backend="mpi")
    rank, size = other.rank, other.size
    check = Checker(f"drops-{order}", rank, size)
    for rounds in range(3):
        comm = denseccl.init(backend="mpi")
        x = np.full(COUNT, rank + 1.0)
        if rank == 1:
            time.sleep(0.3)  # the peer drops everything before this rank joins
        work = comm.allreduce(x, "avg", async_op=True)
        if order == "work-first":
            del work
            gc.collect()
            del x
            del comm
        elif order == "array-first":
            del x
            gc.collect()
            del work
            del comm
        elif order == "comm-first":
            del comm
            gc.collect()
            del x
            del work
        elif order == "comm-only":
            comm.close() if rank == 1 else None  # rank 0 never closes: the object just goes
            del comm, work, x
        elif order == "exit":
            print(f"[drops-exit] rank {rank}/{size}: OK (1 checks)", flush=True)
            sys.exit(0)  # interpreter exit with the allreduce in flight
        gc.collect()
        junk = [np.full(COUNT, 9.0) for _ in range(4)]  # likely over the freed memory
        y = np.full(1000, rank + 1.0)
        other.allreduce(y)  # MPI progress: the dropped transfer completes now
        time.sleep(0.1)
        other.barrier()
        check.check(y.tolist() == [3.0] * 1000, f"round {rounds}: other communicator {y[:3]}")
        check.check(all(np.all(j == 9.0) for j in junk), f"round {rounds}: memory allocated after the drop changed")
    check.finish(before_exit=other.close)


if __name__ == "__main__":
    main()
