"""Rank program: the ``abort`` answer to a timeout ends the whole job.

Rank 1 never calls (it sleeps); rank 0's allreduce times out. With DENSECCL_ON_TIMEOUT=abort
(or init(on_timeout="abort")) the job must end right then, through MPI_Abort, with the reason
on stderr; otherwise rank 0 would go on and print NOT ABORTED.

usage: mpiexec -n 2 python on_timeout.py env|kwarg TIMEOUT SLEEP
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np

import denseccl


def main() -> None:
    how, seconds, sleep = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
    comm = denseccl.init(backend="mpi", timeout=seconds, **({"on_timeout": "abort"} if how == "kwarg" else {}))
    comm.barrier()
    if comm.rank == 1:
        time.sleep(sleep)
        os._exit(0)
    try:
        comm.allreduce(np.ones(4))
    except denseccl.CollectiveTimeoutError as error:
        print(f"NOT ABORTED: {error}", flush=True)
    os._exit(0)


if __name__ == "__main__":
    main()
