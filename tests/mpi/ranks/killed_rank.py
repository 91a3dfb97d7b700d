"""Rank program for tests/mpi/test_segments.py: a job whose last rank is killed.

Every rank prints the MPICH segments it maps (``MAPS [names]``) and its summary; rank 0 then
makes a file named like another job's segment (the path given: a job that started and ended
while this one ran); then the last rank kills itself with SIGKILL, the launcher ends the job,
and what the ranks mapped stays in /dev/shm for the runner to remove.

usage: mpiexec -n N python killed_rank.py UNRELATED_PATH
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

from mpi4py import MPI

from tests.support.checker import Checker
from tests.support.segments import SEGMENT, mapped_segments

world = MPI.COMM_WORLD
check = Checker("killed_rank", world.rank, world.size)
mapped = sorted(name for name in mapped_segments("self") if SEGMENT.match(name))
check.check(mapped, "this rank maps no MPICH segment")
print("MAPS " + json.dumps(mapped), flush=True)
world.Barrier()
if world.rank == 0:
    Path(sys.argv[1]).write_bytes(bytes(4096))
check.report()
world.Barrier()
if world.rank == world.size - 1:
    os.kill(os.getpid(), signal.SIGKILL)
time.sleep(60)  # the launcher ends the job first
print("NOT ENDED", flush=True)
