"""Rank program: a late rank must not agree with the entry of a call its peer gave up on.

Rank 1 stops itself (SIGSTOP) just before its next call; rank 0 makes that call and times out
in the agreement step, then resumes rank 1 (SIGCONT). Rank 1's call must fail at once with
CommunicatorBrokenError (before the fix it agreed with rank 0's stale entry, started its
transfer and waited out its whole timeout). Then the peers' other communicator still works.

usage: mpiexec -n 2 python stale.py TIMEOUT
"""

from __future__ import annotations

import os
import signal
import sys
import time

import numpy as np

import denseccl
from tests.support.checker import Checker


def main() -> None:
    seconds = float(sys.argv[1])
    comm = denseccl.init(backend="mpi", timeout=seconds)
    final = denseccl.init(backend="mpi", timeout=120)
    rank, size = comm.rank, comm.size
    check = Checker("stale", rank, size)
    pids = final.allgather(np.array([os.getpid()], np.int64))[:, 0].tolist()
    x = np.full(1000, rank + 1.0)
    comm.allreduce(x)  # one good call first: the entries of call 1 are everyone's
    check.check(x.tolist() == [3.0] * 1000, "first call")
    final.barrier()
    if rank == 1:
        os.kill(os.getpid(), signal.SIGSTOP)
        started = time.monotonic()
        try:
            comm.allreduce(x)
            check.fail("the late rank completed a call its peer had given up on")
        except denseccl.CommunicatorBrokenError as error:
            check.check("gave up" in str(error), f"late rank: message {error}")
        except Exception as error:  # noqa: BLE001
            check.fail(f"late rank raised {type(error).__name__}: {error}")
        elapsed = time.monotonic() - started
        check.check(elapsed < seconds / 2, f"the late rank took {elapsed:.2f} s to fail (timeout {seconds} s)")
        check.check(x.tolist() == [3.0] * 1000, "the late rank's array changed")
    else:
        try:
            comm.allreduce(x)
            check.fail("rank 0 completed a call its peer never made")
        except denseccl.CollectiveTimeoutError:
            pass
        os.kill(pids[1], signal.SIGCONT)
    y = np.full(3, rank + 1)
    final.allreduce(y)
    check.check(y.tolist() == [3, 3, 3], f"the other communicator: {y}")
    check.finish(hard_exit=True, before_exit=final.barrier)


if __name__ == "__main__":
    main()
