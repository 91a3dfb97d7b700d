"""Rank program: a task of an srun step (or of a batch job's step) runs denseccl's collectives on
permuted layouts and checks each against NumPy built from every rank's input.

usage: srun ... python job.py BACKEND [forever]

``BACKEND`` is the backend ``denseccl.init()`` must choose by itself ("mpi" under a PMI, "gloo"
without one). The rank and size must be srun's (``SLURM_PROCID``, ``SLURM_STEP_NUM_TASKS``).
``forever``: after one checked round, say "looping" and allreduce until killed (scancel).
"""

from __future__ import annotations

import os
import socket
import sys

import numpy as np

import denseccl
from tests.support.checker import Checker

backend, mode = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "once"
rank, size = int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_STEP_NUM_TASKS"])
check = Checker(f"slurm-{backend}", rank, size)
comm = denseccl.init()
check.check((comm.backend, comm.rank, comm.size) == (backend, rank, size),
            f"denseccl.init() gave {comm.backend} rank {comm.rank} of {comm.size} on {socket.gethostname()}, "
            f"expected {backend} rank {rank} of {size}")


def inputs(seed: int) -> list:
    """Every rank's (2, 3, 4) input in the (2, 0, 1) layout."""
    return [np.random.default_rng([seed, r]).standard_normal((3, 4, 2)).transpose(2, 0, 1) for r in range(size)]


everyone = inputs(1)
x = everyone[rank].copy(order="K")
comm.allreduce(x)
check.check(x.strides == everyone[rank].strides and np.allclose(x, sum(everyone)), "allreduce differs from NumPy")
everyone = inputs(2)
stacked = comm.allgather(everyone[rank].copy(order="K"))
check.check(all(np.array_equal(stacked[r], everyone[r]) for r in range(size)), "allgather differs from NumPy")
block = comm.reduce_scatter(np.stack([everyone[rank] * (r + 1) for r in range(size)]))
check.check(np.allclose(block, sum(everyone) * (rank + 1)), "reduce_scatter differs from NumPy")
y = everyone[rank].copy(order="K")
comm.broadcast(y, root=size - 1)
check.check(np.array_equal(y, everyone[size - 1]), "broadcast differs from the root's input")
z = np.asfortranarray(np.full((3, 5), float(rank)))
comm.reduce(z, root=0, op="max")
check.check(rank != 0 or np.array_equal(z, np.full((3, 5), float(size - 1))), "reduce(max) differs from NumPy")
if mode == "forever":
    print(f"looping rank {rank}", flush=True)
    big = np.ones(1 << 20, dtype=np.float32)
    while True:
        comm.allreduce(big)
comm.close()
check.finish()
