"""Rank program: the check="off" policy (no agreement step).

Collectives must still be correct. A bad input on one rank raises LayoutError there only, at
once; its peers wait in the transport until the timeout (CollectiveTimeoutError).

usage: mpiexec -n N python check_off.py kwarg|env TIMEOUT
  kwarg: init(check="off", timeout=TIMEOUT); env: DENSECCL_CHECK=off and DENSECCL_TIMEOUT set
  by the caller.
"""

from __future__ import annotations

import sys
import time

import numpy as np

import denseccl
from tests.support.checker import Checker


def main() -> None:
    how, seconds = sys.argv[1], float(sys.argv[2])
    from mpi4py import MPI

    # line the ranks up first: init's own deadline is the (short) timeout under test, and ranks
    # that start seconds apart on a loaded machine would time out there instead
    MPI.COMM_WORLD.Barrier()
    comm = (
        denseccl.init(backend="mpi", check="off", timeout=seconds) if how == "kwarg" else denseccl.init(backend="mpi")
    )
    lonely = denseccl.init(backend="mpi", check="off", timeout=seconds)
    final = denseccl.init(backend="mpi", check="always", timeout=120)
    rank, size = comm.rank, comm.size
    check = Checker(f"check_off-{how}", rank, size)
    check.check(comm.check is False, f"check is {comm.check}")
    check.check(comm.timeout == seconds, f"timeout is {comm.timeout}")

    def value(r, shape=(3, 4), dtype=np.float64):
        return (np.arange(int(np.prod(shape))).reshape(shape) * (r + 1) - 5).astype(dtype)

    # correct results without the check, on a transposed layout
    x = value(rank).T.copy().T
    comm.allreduce(x)
    check.check(np.array_equal(x, sum(value(r) for r in range(size))), "allreduce sum")
    y = value(rank, dtype=np.int32)[::-1]
    result = comm.reduce(y, 1 % size, "avg")
    if rank == 1 % size:
        total = sum(value(r, dtype=np.int64) for r in range(size))
        check.check(np.array_equal(result, (np.sign(total) * (np.abs(total) // size))[::-1]), "reduce avg (truncated)")
    g = comm.allgather(value(rank, (2, 3), np.int16).T)
    check.check(all(np.array_equal(g[r], value(r, (2, 3), np.int16).T) for r in range(size)), "allgather")
    stacked = np.stack([value(rank, (2,), np.float32) + b for b in range(size)])
    s = comm.reduce_scatter(stacked, "max")
    check.check(np.array_equal(s, value(size - 1, (2,), np.float32) + rank), "reduce_scatter max")
    b = value(rank, (5,), np.uint8)
    comm.broadcast(b, size - 1)
    check.check(np.array_equal(b, value(size - 1, (5,), np.uint8)), "broadcast")
    comm.barrier()

    # a bad input on the last rank: LayoutError there at once; the others time out
    bad = size - 1
    started = time.monotonic()
    try:
        if rank == bad:
            comm.allreduce(np.zeros((4, 6))[:, ::2])
        else:
            comm.allreduce(np.zeros((4, 3)))
        check.fail("no error")
    except denseccl.LayoutError as error:
        check.check(rank == bad, f"LayoutError on rank {rank}: {error}")
        check.check(time.monotonic() - started < min(1.5, 0.6 * seconds), "the local error was not immediate")
        check.check(comm.broken is None, "local error broke the communicator")
    except denseccl.CollectiveTimeoutError:
        elapsed = time.monotonic() - started
        check.check(rank != bad, "the bad rank timed out")
        check.check(seconds * 0.9 <= elapsed <= seconds + 5, f"timed out after {elapsed:.2f} s (timeout {seconds})")
        check.check(comm.broken is not None, "communicator not marked broken after a timeout")
    except denseccl.CommunicatorBrokenError as error:  # another waiter timed out first and told this rank
        check.check(rank != bad and size > 2 and "gave up" in str(error), f"rank {rank}: {error}")
        check.check(time.monotonic() - started <= seconds + 5, "the news that a peer gave up came late")
    except Exception as error:  # noqa: BLE001
        check.fail(f"raised {type(error).__name__}: {error}")

    # async without the check: the Work comes back at once; wait(timeout=) gives up on a peer
    # that never joins
    if rank != bad:
        x = np.ones(8)
        work = lonely.allreduce(x, async_op=True)
        check.check(
            isinstance(work, denseccl.Work) and not work.is_completed(), "async: Work already complete without the peer"
        )
        started = time.monotonic()
        try:
            work.wait(timeout=0.5)
            check.fail("Work.wait(timeout=0.5) returned without the peer")
        except denseccl.CollectiveTimeoutError:
            elapsed = time.monotonic() - started
            check.check(0.45 <= elapsed <= 4, f"Work.wait(timeout=0.5) gave up after {elapsed:.2f} s")
            check.check(lonely.broken is not None, "communicator not broken after Work.wait timed out")
        except denseccl.CommunicatorBrokenError as error:  # another waiter timed out first and told this rank
            check.check(size > 2 and "gave up" in str(error), f"Work.wait: {error}")

    check.finish(hard_exit=True, before_exit=final.barrier)


if __name__ == "__main__":
    main()
