"""Rank program: collectives on a communicator and a split of it, ITERATIONS times then a
clean exit with the summary of its checks, or (0) until killed (at most ten minutes). Prints
"ready" once both have run.

usage: mpiexec -n N python busy.py ITERATIONS
"""

from __future__ import annotations

import sys
import time

import numpy as np

import denseccl
from tests.support.checker import Checker

iterations = int(sys.argv[1]) or None
comm = denseccl.init(backend="mpi", timeout=30)
check = Checker("busy", comm.rank, comm.size)
sub = comm.split(0, comm.rank)
x = np.ones(1024, np.float32)
started = time.monotonic()
announced = False
step = 0
while (step < iterations) if iterations else (time.monotonic() - started < 600):
    step += 1
    for group in (comm, sub):
        x[:] = 1
        group.allreduce(x)
        check.check(np.all(x == group.size), f"step {step}: allreduce on {group.size} ranks gave {x[:4]}")
    if not announced:
        print("ready", flush=True)
        announced = True
sub.close()
comm.close()
check.done()
