"""Rank program: objects dropped in every order while work is in flight (issue: fault containment).

Each ORDER drops a Work, its arrays and its communicator in one order, with the peer (rank 1)
joining the collective only later, so the transfer is still running when the objects go; then
the job keeps using MPI (another communicator), allocates over the memory that was freed, and
checks every result. ``exit`` leaves the interpreter with work in flight; ``exit-global``
too, with the Work and its array in a module global, which lives until the interpreter clears
the modules (MPI is finalized after that, and still moves the data then).

Closing is a drop too: ``comm-only`` closes (rank 1) or just drops (rank 0) the communicator
and nothing else; ``close-then-wait`` closes it on both ranks with the Work in flight, then
waits for the Work (its result must be right: the transfer was started before the close);
``close-times-out`` has rank 1 stop (SIGSTOP) right after it posted, while rank 0 drops its
Work and closes: the close times out on the dropped Work (CollectiveTimeoutError), and rank 1,
resumed, must not complete the call its peer abandoned. Under Open MPI, freeing a
communicator with a transfer still running on it ended the job in a segmentation fault.

usage: mpiexec -n 2 python drops.py ORDER
ORDER: work-first | array-first | comm-first | comm-only | close-then-wait | close-times-out | exit
       | exit-global
"""

from __future__ import annotations

import gc
import os
import signal
import sys
import time

import numpy as np

import denseccl
from tests.support.checker import Checker
from tests.mpi.ranks.faults import PauseAfterPost

COUNT = 1 << 20
#: the communicator's timeout in ``close-times-out`` (seconds)
TIMEOUT = 2.0
#: what ``exit-global`` leaves behind
LEFT = None


def main() -> None:
    order = sys.argv[1]
    other = denseccl.init(backend="mpi")
    rank, size = other.rank, other.size
    check = Checker(f"drops-{order}", rank, size)
    pids = other.allgather(np.array([os.getpid()], np.int64))[:, 0].tolist()
    for rounds in range(3):
        comm = denseccl.init(backend="mpi", timeout=TIMEOUT if order == "close-times-out" else None)
        x = np.full(COUNT, rank + 1.0)
        if order == "close-times-out" and rank == 1:
            comm.transport.comm = pause = PauseAfterPost(comm.transport.comm)
            pause.armed = True  # stopped until rank 0 has given up
        elif rank == 1:
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
        elif order == "close-then-wait":
            comm.close()
            result = work.wait()
            check.check(result is x and bool(np.all(x == 1.5)), f"round {rounds}: waited after close: {x[:3]}")
            del comm, work, x
        elif order == "close-times-out" and rank == 0:
            del work  # dropped in flight: close waits for it
            close_times_out(check, comm, pids[1])
            del comm, x
        elif order == "close-times-out":
            wait_resumed(check, comm, work)
            del comm, work, x
        elif order in ("exit", "exit-global"):
            print(f"[drops-{order}] rank {rank}/{size}: OK (1 checks)", flush=True)
            if order == "exit-global":
                global LEFT  # the point: a Work that lives until the modules are cleared
                LEFT = (work, x)
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


def close_times_out(check: Checker, comm: denseccl.Communicator, stopped: int) -> None:
    """Rank 0: close while the peer (pid ``stopped``) is stopped, then resume it."""
    started = time.monotonic()
    try:
        comm.close()
        check.fail("close completed a Work whose peer was stopped")
    except denseccl.CollectiveTimeoutError:
        check.check(time.monotonic() - started < TIMEOUT + 10, "close timed out late")
    os.kill(stopped, signal.SIGCONT)


def wait_resumed(check: Checker, comm: denseccl.Communicator, work: denseccl.Work) -> None:
    """Rank 1, resumed: its call paired with the one rank 0 abandoned, so it must fail."""
    try:
        work.wait()
        check.fail("the resumed rank completed a call its peer had abandoned")
    except denseccl.CommunicatorBrokenError as error:
        check.check("gave up" in str(error), f"resumed rank: {error}")
    comm.close()


if __name__ == "__main__":
    main()
