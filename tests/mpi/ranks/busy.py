"""Rank program: collectives on a communicator and a split of it, ITERATIONS times then a
clean exit, or (0) until killed (at most ten minutes). Prints "ready" once both have run.

usage: mpiexec -n N python busy.py ITERATIONS
"""

from __future__ import annotations

import sys
import time

import numpy as np

import denseccl

iterations = int(sys.argv[1]) or None
comm = denseccl.init(backend="mpi", timeout=30)
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
        assert np.all(x == group.size)
    if not announced:
        print("ready", flush=True)
        announced = True
sub.close()
comm.close()
print("done", flush=True)
