"""Rank program: a peer process exits (no MPI_Finalize) while the others still call.

Under mpiexec's default the launcher then ends the whole job. With ``-disable-auto-cleanup`` the
survivor goes on: its call raises CollectiveTimeoutError after the timeout, its next call
CommunicatorBrokenError; it never returns a result.

usage: mpiexec [-disable-auto-cleanup] -n 2 python peer_exits.py TIMEOUT
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np

import denseccl
from tests.support.checker import Checker


def main() -> None:
    seconds = float(sys.argv[1])
    comm = denseccl.init(backend="mpi", timeout=seconds)
    check = Checker("peer_exits", comm.rank, comm.size)
    comm.barrier()
    if comm.rank == 1:
        os._exit(0)
    x = np.ones(1000)
    started = time.monotonic()
    try:
        comm.allreduce(x)
        check.fail("returned although the peer had exited")
    except denseccl.CollectiveTimeoutError:
        check.check(time.monotonic() - started < seconds + 5, "timed out late")
    try:
        comm.allreduce(x)
        check.fail("a later call returned")
    except denseccl.CommunicatorBrokenError:
        pass
    check.check(np.all(x == 1.0), "the survivor's array changed")
    print(f"[peer_exits] rank 1/{comm.size}: OK (1 checks)", flush=True)  # for the exited rank
    check.finish(hard_exit=True)


if __name__ == "__main__":
    main()
