"""init_process_group("denseccl") with no other argument (rank, size and store from MPI), with
tcp:// and env://; denseccl.torch.init_process_group with torch's arguments and a timeout as a
timedelta or seconds; a torch rank that is not the MPI rank (a clear error on every rank).
Run with mpiexec -n 2."""

from __future__ import annotations

import datetime
import os
import socket

import torch
import torch.distributed as dist
from common import Checker
from mpi4py import MPI

import denseccl
import denseccl.torch as dt

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
    lambda: dist.init_process_group(
        "denseccl", init_method=f"tcp://127.0.0.1:{port}", rank=size - 1 - rank, world_size=size
    ),
    "mpi rank",
)
print(f"rank {rank}: {error}", flush=True)

# no argument but the backend: rank, world size and the store from MPI (env:// falls back to it)
dist.init_process_group("denseccl")
allreduce_works("no arguments under mpiexec")
dist.destroy_process_group()

# denseccl.torch.init_process_group takes dist.init_process_group's arguments, backend first;
# timeout as a timedelta or as seconds
dt.init_process_group("denseccl", timeout=datetime.timedelta(seconds=50))
allreduce_works("dt.init_process_group(backend, timeout=timedelta)")
check.true("the group's timeout is the timedelta's", dist.group.WORLD.host_communicator.timeout == 50)
dist.destroy_process_group()
dt.init_process_group(timeout=45)
allreduce_works("dt.init_process_group(timeout=seconds)")
x = torch.ones(3)
work = dist.all_reduce(x, async_op=True)
check.true("torch Work.wait(timeout=timedelta)", work.wait(timeout=datetime.timedelta(seconds=30)))
dist.destroy_process_group()

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
