"""Rank program: torch.distributed's denseccl backend across simulated hosts.

usage: torch_groups.py HOSTS PER_HOST SCENARIO...   (ranks i*PER_HOST ... on host h<i>)

Scenarios:
- world: the default group (rendezvous found without configuration: a TCPStore on the first
  host, told to the others over MPI); all_reduce, broadcast, all_gather_into_tensor and
  reduce_scatter_tensor on channels-last and transposed tensors against plain torch; a layout
  mismatch raising on every rank; the agreement path of the group's communicator.
- within: one subgroup per host (dist.new_group of that host's ranks), agreement on the board
  when it has more than one rank.
- across: one subgroup per local index (one rank of each host), agreement over MPI.
- ddp: DistributedDataParallel of a channels-last ConvNet for 3 steps against one process
  training on the whole batch; gradients keep their parameters' strides.
"""

from __future__ import annotations

import copy
import socket
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import denseccl
import denseccl.torch as dt
from tests.support.checker import Checker

hosts, per_host, scenarios = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
torch.set_num_threads(1)
dt.init_process_group()
rank, size = dist.get_rank(), dist.get_world_size()
check = Checker("torch-" + "-".join(scenarios), rank, size)
host = rank // per_host
check.check(socket.gethostname() == f"h{host}", f"rank {rank} on {socket.gethostname()}, expected h{host}")


def values(seed: int, r: int, shape: tuple) -> torch.Tensor:
    return torch.rand(shape, generator=torch.Generator().manual_seed(seed * 101 + r), dtype=torch.float64).float()


def channels_last(seed: int, r: int) -> torch.Tensor:
    return values(seed, r, (2, 3, 4, 5)).to(memory_format=torch.channels_last)


def uses_board(group: object) -> bool:
    if isinstance(group, dt.ProcessGroupDenseCCL):
        return group.host_communicator.control.board is not None
    backend = group._get_backend(torch.device("cpu"))  # type: ignore[attr-defined]
    assert isinstance(backend, dt.ProcessGroupDenseCCL), type(backend)
    return backend.host_communicator.control.board is not None


def exercise(name: str, group: object, members: list, expect_board: bool, seed: int) -> None:
    board = uses_board(group)
    check.check(board == expect_board, f"{name}: board in use {board}, expected {expect_board} (members {members})")
    x = channels_last(seed, rank)
    strides = x.stride()
    dist.all_reduce(x, group=group)
    want = sum(values(seed, r, (2, 3, 4, 5)) for r in members)
    check.check(torch.allclose(x, want, atol=1e-5) and x.stride() == strides, f"{name}: all_reduce differs from torch")
    y = values(seed + 1, rank, (5, 3)).t()  # transposed
    dist.broadcast(y, group_src=len(members) - 1, group=group)
    check.check(torch.equal(y, values(seed + 1, members[-1], (5, 3)).t()), f"{name}: broadcast from the last member")
    out = torch.empty(len(members) * 2, 3, 4, 5)
    dist.all_gather_into_tensor(out, values(seed + 2, rank, (2, 3, 4, 5)), group=group)
    want = torch.cat([values(seed + 2, r, (2, 3, 4, 5)) for r in members])
    check.check(torch.equal(out, want), f"{name}: all_gather_into_tensor")
    stacked = torch.cat([values(seed + 3, rank, (2, 6)) * (i + 1) for i in range(len(members))])
    block = torch.empty(2, 6)
    dist.reduce_scatter_tensor(block, stacked, group=group)
    want = sum(values(seed + 3, r, (2, 6)) for r in members) * (members.index(rank) + 1)
    check.check(torch.allclose(block, want, atol=1e-5), f"{name}: reduce_scatter_tensor differs from torch")
    if len(members) > 1:
        z = torch.zeros(3, 4) if members.index(rank) else torch.zeros(4, 3).t()  # another layout on one member
        try:
            dist.all_reduce(z, group=group)
            check.fail(f"{name}: a layout mismatch raised nothing")
        except denseccl.MismatchError as error:
            check.check("mismatch" in str(error), f"{name}: {error}")
        check.check(not z.any(), f"{name}: a buffer was written before the mismatch error")
    ones = torch.ones(7)
    dist.all_reduce(ones, group=group)
    check.check(torch.equal(ones, torch.full((7,), float(len(members)))), f"{name}: unusable after the mismatch")


def ddp() -> None:
    torch.manual_seed(5)
    model = nn.Sequential(nn.Conv2d(4, 8, 3), nn.ReLU(), nn.Conv2d(8, 4, 2)).to(memory_format=torch.channels_last)
    replica = torch.nn.parallel.DistributedDataParallel(copy.deepcopy(model), bucket_cap_mb=0.001)
    batch = torch.randn(2 * size, 4, 8, 8, generator=torch.Generator().manual_seed(9))
    batch = batch.to(memory_format=torch.channels_last)
    target = torch.randn(2 * size, 4, 5, 5, generator=torch.Generator().manual_seed(10))
    mine = slice(2 * rank, 2 * rank + 2)
    opt, opt_ddp = torch.optim.SGD(model.parameters(), lr=0.1), torch.optim.SGD(replica.parameters(), lr=0.1)
    for _ in range(3):
        F.mse_loss(model(batch), target).backward()
        F.mse_loss(replica(batch[mine]), target[mine]).backward()
        for (name, p), q in zip(model.named_parameters(), replica.module.parameters()):
            check.check(torch.allclose(q.grad, p.grad, atol=1e-5), f"ddp: gradient of {name} differs from one process")
            strides = f"ddp: gradient of {name} has strides {q.grad.stride()}, its parameter {q.stride()}"
            check.check(q.grad.stride() == q.stride(), strides)
        opt.step(), opt_ddp.step(), opt.zero_grad(), opt_ddp.zero_grad()
    flat = torch.cat([p.detach().flatten() for p in replica.parameters()])
    gathered = [torch.empty_like(flat) for _ in range(size)]
    dist.all_gather(gathered, flat)
    check.check(all(torch.equal(g, flat) for g in gathered), "ddp: parameters differ across ranks")


world = list(range(size))
if "world" in scenarios:
    exercise("world", dist.group.WORLD, world, expect_board=hosts == 1 and size > 1, seed=1)
if "within" in scenarios:  # every rank creates every group, in the same order
    groups = [dist.new_group([h * per_host + i for i in range(per_host)], backend="denseccl") for h in range(hosts)]
    members = [host * per_host + i for i in range(per_host)]
    exercise("within a host", groups[host], members, expect_board=per_host > 1, seed=2)
if "across" in scenarios:
    groups = [dist.new_group([h * per_host + i for h in range(hosts)], backend="denseccl") for i in range(per_host)]
    members = [h * per_host + rank % per_host for h in range(hosts)]
    exercise("across hosts", groups[rank % per_host], members, expect_board=hosts == 1, seed=3)
if "ddp" in scenarios:
    ddp()
dist.barrier()
dist.destroy_process_group()
check.finish()
