"""Rank program for tests/mpi/test_debug_log.py: init, one allreduce checked against the sum."""

import numpy as np

import denseccl
from tests.support.checker import Checker

comm = denseccl.init("mpi")
check = Checker("debug_log", comm.rank, comm.size)
x = np.full((3, 4), comm.rank + 1, np.float32).T
comm.allreduce(x)
check.check((x == comm.size * (comm.size + 1) // 2).all(), f"allreduce gave {x.ravel()}")
comm.close()
check.done()
