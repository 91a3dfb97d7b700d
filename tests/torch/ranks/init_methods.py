"""init_process_group("denseccl") with tcp:// and env://, and a torch rank that is not the MPI
rank (a clear error on every rank). Run with mpiexec -n 2."""

from __future__ import annotations

import os
import socket

import torch
import torch.distributed as dist
from common import Checker
from mpi4py import MPI

import denseccl
import denseccl.torch  # noqa: F401 - registers the backend

world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()
check = Checker(rank)


def free_port() -> int:
    if rank == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    else:
        port = None
    return world.bcast(port, root=0)


def allreduce_works(what: str) -> None:
    x = torch.empty(4, 3).t()  # transposed
    x.fill_(rank + 1)
    dist.all_reduce(x)
    check.equal(what, x, torch.full((3, 4), float(size * (size + 1) // 2)), strides=(1, 3))


# torch ranks permuted against MPI ranks: every rank refuses, naming both ranks
port = free_port()
error = check.raises(
    "torch rank != MPI rank",
    denseccl.DenseCCLError,
    lambda: dist.init_process_group("denseccl", init_method=f"tcp://127.0.0.1:{port}", rank=size - 1 - rank, world_size=size),
    "mpi rank",
)
print(f"rank {rank}: {error}", flush=True)

port = free_port()
dist.init_process_group("denseccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size)
allreduce_works("tcp://")
dist.destroy_process_group()

port = free_port()
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(size))
dist.init_process_group("denseccl", init_method="env://")
allreduce_works("env://")
dist.destroy_process_group()

check.done()
