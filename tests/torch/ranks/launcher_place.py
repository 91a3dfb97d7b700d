"""``dist.init_process_group("denseccl")`` with MASTER_ADDR and MASTER_PORT exported but no RANK
or WORLD_SIZE, as cluster scripts launch: the rank and world size come from the launcher (MPI's
under mpiexec, SLURM_PROCID / SLURM_STEP_NUM_TASKS under srun), the store is the one at
MASTER_ADDR:MASTER_PORT. An all_reduce on a transposed tensor is checked against the sum of
every rank's input.

``srun-direct``: ``denseccl.init()`` without torch.distributed, on NumPy arrays (the gloo engine).

usage: mpiexec -n N python launcher_place.py mpi        (the test exports MASTER_ADDR/PORT)
       SLURM_PROCID=r SLURM_STEP_NUM_TASKS=N ... python launcher_place.py srun|srun-direct
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist

import denseccl.torch
from tests.support.checker import Checker

launcher = sys.argv[1]
if launcher == "mpi":
    from mpi4py import MPI

    rank, size = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
else:
    rank, size = int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_STEP_NUM_TASKS"])
check = Checker(f"launcher-place-{launcher}", rank, size)
check.check("RANK" not in os.environ and "WORLD_SIZE" not in os.environ, "the test must not set RANK/WORLD_SIZE")

if launcher == "srun-direct":
    import numpy as np

    import denseccl

    comm = denseccl.init()
    check.check((comm.backend, comm.rank, comm.size) == ("gloo", rank, size),
                f"denseccl.init() gave {comm.backend} rank {comm.rank} of {comm.size}")
    y = np.asfortranarray(np.arange(12.0).reshape(3, 4) * (rank + 1))
    comm.allreduce(y)
    check.check(np.array_equal(y, np.arange(12.0).reshape(3, 4) * (size * (size + 1) // 2)), f"allreduce gave {y}")
    comm.close()
    check.finish()

dist.init_process_group("denseccl")
place = (dist.get_rank(), dist.get_world_size())
check.check(place == (rank, size), f"torch says rank {place[0]} of {place[1]}")
store = dist.distributed_c10d._get_default_store()
while isinstance(store, dist.PrefixStore):
    store = store.underlying_store
check.check(getattr(store, "port", None) == int(os.environ["MASTER_PORT"]), "the store is not at MASTER_PORT")
x = torch.empty(4, 3).t()  # transposed: the layout is kept
x.copy_(torch.arange(12.0).reshape(3, 4) * (rank + 1))
dist.all_reduce(x)
want = torch.arange(12.0).reshape(3, 4) * (size * (size + 1) // 2)
check.equal("all_reduce", x, want, strides=(1, 3))
dist.destroy_process_group()
check.finish()
