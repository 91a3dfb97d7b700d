"""Rank program: what a rank decides about the cores it shares, and that it still computes.

Usage: pinning.py EXPECT_CROWDED(0|1) EXPECT_YIELDING(0|1) [MASKS]

EXPECT_YIELDING: what the process's wait policy should say (DENSECCL_WAIT may override what
was detected).

MASKS (optional), e.g. ``0/0,1``: rank r pins itself to the r-th ``/``-separated core list
before MPI starts (what ``taskset`` or Slurm's ``--cpu-bind`` would do to it, per rank).

Checks, on every rank: the communicator's control channel, its board (when it has one) and a
split of it say crowded exactly when expected, the wait policy gives the core up when expected, and
crowded ranks sleep on doorbells (a rank waiting for a late peer uses well under half of the
time on its CPU); the board's
page is not a file of ours (no ``denseccl`` mapping in /proc/self/maps); a few allreduces on
the plan path and the full path give the NumPy sum of every rank's input.
"""

from __future__ import annotations

import os
import sys
import time

expect_crowded, expect_yielding = sys.argv[1] == "1", sys.argv[2] == "1"
if len(sys.argv) > 3:
    masks = sys.argv[3].split("/")
    mine = masks[int(os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0")))]
    os.sched_setaffinity(0, {int(core) for core in mine.split(",")})

import numpy as np  # noqa: E402 - after pinning, as a launcher would have pinned

import denseccl  # noqa: E402
from denseccl.wait import WAITING  # noqa: E402
from denseccl.channel.doorbell import futex_call  # noqa: E402
from tests.support.checker import Checker  # noqa: E402

comm = denseccl.init("mpi")
rank, size = comm.rank, comm.size
checker = Checker("pinning", rank, size)
control = comm.control
checker.check(
    control.crowded is expect_crowded,
    f"control.crowded is {control.crowded}, expected {expect_crowded} (affinity {sorted(os.sched_getaffinity(0))})",
)
checker.check(
    WAITING.crowded is expect_yielding, f"the wait policy says crowded={WAITING.crowded}, expected {expect_yielding}"
)
if (
    expect_crowded
    and expect_yielding
    and futex_call() is not None
    and os.environ.get("DENSECCL_WAIT", "auto") == "auto"
):
    checker.check(
        WAITING.doorbells is not None and WAITING.doorbells.size == size, "crowded ranks have no doorbells to sleep on"
    )
if not expect_crowded or os.environ.get("DENSECCL_WAIT", "auto") != "auto":
    checker.check(WAITING.doorbells is None, "doorbells on a host whose ranks have a core each")
if control.board is not None:
    checker.check(control.board.crowded is expect_crowded, f"board.crowded is {control.board.crowded}")
sub = comm.split(0, rank)
checker.check(sub.control.crowded is expect_crowded, f"the split says crowded={sub.control.crowded}")
with open("/proc/self/maps") as maps:
    ours = [line.strip() for line in maps if "denseccl" in line and "/dev/shm" in line]
checker.check(not ours, f"a file of ours is mapped: {ours}")

for group in (comm, sub):
    for step in range(50):  # repeats of one geometry: the plan path after the first call
        x = np.full(1024, float(group.rank + 1 + step), np.float32)
        group.allreduce(x)
        want = sum(float(r + 1 + step) for r in range(group.size))
        checker.check(np.array_equal(x, np.full(1024, want, np.float32)), f"step {step}: wrong sum {x[:3]}")
    y = np.full((3, 4), float(group.rank), np.float64).T  # the full path
    got = group.allreduce(y, op="max")
    checker.check(got is y and np.array_equal(y, np.full((4, 3), float(group.size - 1))), "wrong max")

# A crowded rank whose peer comes late sleeps on its doorbell after a few yields: its core is
# free for the peer (and anything else) while it waits, instead of spinning through yields.
if WAITING.doorbells is not None:
    x = np.ones(1024, np.float32)
    comm.allreduce(x)  # the plan exists: the next call is a replay
    late = 1.0
    if rank == size - 1:
        time.sleep(late)
    began_cpu, began = time.process_time(), time.monotonic()
    x[:] = rank + 1
    comm.allreduce(x)
    used, waited = time.process_time() - began_cpu, time.monotonic() - began
    checker.check(np.array_equal(x, np.full(1024, size * (size + 1) / 2, np.float32)), f"late peer: wrong sum {x[:3]}")
    if rank != size - 1:
        checker.check(used < 0.5 * waited, f"waiting {waited:.2f} s for a late peer took {used:.2f} s of CPU")

sub.close()
comm.close()
checker.finish()
