"""Rank program: DENSECCL_DEBUG=TRACE says which agreement path each communicator took (INFO)
and logs one line per call with its descriptor and time (TRACE), replays included."""

from __future__ import annotations

import numpy as np

import denseccl
from tests.support.checker import Checker

comm = denseccl.init(backend="mpi")
check = Checker("logging", comm.rank, comm.size)
x = np.ones((3, 4), np.float32).T
for _ in range(3):  # the first call takes the full path, the others replay its plan
    comm.allreduce(x)
check.check(float(x[0, 0]) == comm.size**3, f"allreduce result {x[0, 0]}")
comm.barrier()
comm.close()
check.finish()
