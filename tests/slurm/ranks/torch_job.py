"""Rank program: ``init_process_group("denseccl")`` in a task of an srun step, with whatever the
launch exported (RANK / WORLD_SIZE or not, MASTER_ADDR or not, torchrun's variables), then
all_reduce, all_gather_into_tensor and broadcast on a transposed tensor, checked against the
sum or copy of every rank's input.

usage: srun ... python torch_job.py [zero]

The expected rank and size are RANK / WORLD_SIZE where set (torchrun, a script's exports), else
srun's. ``zero``: nothing was exported, so the store must be on the step's first node at the
port derived from the job and step ids (denseccl/backends/slurm.py).
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist

import denseccl.torch
from denseccl.backends.slurm import srun_address
from tests.support.checker import Checker

rank = int(os.environ.get("RANK") or os.environ["SLURM_PROCID"])
size = int(os.environ.get("WORLD_SIZE") or os.environ["SLURM_STEP_NUM_TASKS"])
zero = sys.argv[1:] == ["zero"]
check = Checker("slurm-torch" + ("-zero" if zero else ""), rank, size)
denseccl.torch.init_process_group()
check.check((dist.get_rank(), dist.get_world_size()) == (rank, size),
            f"torch says rank {dist.get_rank()} of {dist.get_world_size()}, expected {rank} of {size}")
if zero:
    check.check(not os.environ.get("MASTER_ADDR") and not os.environ.get("MASTER_PORT"), "MASTER_* must not be set")
    store = dist.distributed_c10d._get_default_store()
    while isinstance(store, dist.PrefixStore):
        store = store.underlying_store
    check.check((store.host, store.port) == srun_address(os.environ), f"the store is at {store.host}:{store.port}")
x = torch.empty(4, 3).t()  # transposed: the layout is kept
x.copy_(torch.arange(12.0).reshape(3, 4) * (rank + 1))
dist.all_reduce(x)
check.equal("all_reduce", x, torch.arange(12.0).reshape(3, 4) * (size * (size + 1) // 2), strides=(1, 3))
gathered = torch.empty(size * 3, 4)
dist.all_gather_into_tensor(gathered, torch.full((3, 4), float(rank)))
check.equal("all_gather_into_tensor", gathered, torch.arange(size).repeat_interleave(3)[:, None].float().expand(-1, 4))
y = torch.full((2, 5), float(rank)).t()
dist.broadcast(y, src=size - 1)
check.equal("broadcast", y, torch.full((5, 2), float(size - 1)), strides=(1, 5))
dist.destroy_process_group()
check.finish()
