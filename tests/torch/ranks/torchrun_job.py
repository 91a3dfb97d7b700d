"""What a torch user launching with torchrun (or mp.spawn) does, on CPU tensors over the
denseccl backend: channels-last and transposed collectives, object collectives, barrier, a
layout mismatch that raises on every rank (and leaves the group usable), and DDP on a
channels-last conv net against a single-process reference. Run with
``torchrun --standalone --nproc-per-node N torchrun_job.py``."""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
from common import Checker, like, values
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import denseccl
import denseccl.torch


def job(check: Checker) -> None:
    rank, size = dist.get_rank(), dist.get_world_size()
    pg = dist.group.WORLD
    check.true("backend is denseccl", dist.get_backend() == "denseccl")
    check.true("CPU tensors move over the gloo engine", pg.host_communicator.backend == "gloo")
    CL = torch.channels_last
    everyone = lambda seed, shape, dtype=torch.float32: [values(seed, r, shape, dtype) for r in range(size)]  # noqa: E731

    x = like(torch.empty(2, 3, 4, 5).to(memory_format=CL), values(1, rank, (2, 3, 4, 5), torch.float32))
    dist.all_reduce(x)
    check.equal(
        "all_reduce channels-last",
        x,
        torch.stack(everyone(1, (2, 3, 4, 5))).double().sum(0),
        strides=x.stride(),
        tol=1e-5,
    )
    t = like(torch.empty(5, 3).t(), values(2, rank, (3, 5), torch.float64))
    dist.all_reduce(t, op=dist.ReduceOp.MAX, async_op=True).wait()
    check.equal(
        "all_reduce max transposed (async)", t, torch.stack(everyone(2, (3, 5), torch.float64)).amax(0), strides=(1, 3)
    )
    t = like(torch.empty(5, 3).t(), values(3, rank, (3, 5), torch.float32))
    dist.all_reduce(t, op=dist.ReduceOp.AVG)
    check.equal(
        "all_reduce avg transposed", t, torch.stack(everyone(3, (3, 5))).double().mean(0), strides=(1, 3), tol=1e-5
    )
    b = like(torch.empty(2, 3, 4, 5).to(memory_format=CL), values(4, rank, (2, 3, 4, 5), torch.float32))
    dist.broadcast(b, src=size - 1)
    check.equal("broadcast channels-last", b, everyone(4, (2, 3, 4, 5))[size - 1], strides=b.stride())
    out = torch.empty(2 * size, 3, 4, 5).to(memory_format=CL)
    before = pg.staged_operations
    dist.all_gather_into_tensor(
        out, like(torch.empty(2, 3, 4, 5).to(memory_format=CL), values(5, rank, (2, 3, 4, 5), torch.float32))
    )
    check.equal("all_gather_into_tensor channels-last", out, torch.cat(everyone(5, (2, 3, 4, 5))), strides=out.stride())
    check.true("... with no staging copy", pg.staged_operations == before)
    block = torch.empty(3, 2).t()
    dist.reduce_scatter_tensor(block, like(torch.empty(3, 2 * size).t(), values(6, rank, (2 * size, 3), torch.float32)))
    check.equal(
        "reduce_scatter_tensor transposed",
        block,
        torch.stack(everyone(6, (2 * size, 3))).double().sum(0)[2 * rank : 2 * rank + 2],
        tol=1e-5,
    )
    gapped = torch.arange(10.0)[::2]  # gloo gives a wrong answer here with no error
    check.raises(
        "gapped tensor refused", denseccl.LayoutError, lambda: dist.all_reduce(gapped), "not non-overlapping and dense"
    )

    objects = [None] * size
    dist.all_gather_object(objects, {"rank": rank, "name": f"r{rank}"})
    check.true("all_gather_object", objects == [{"rank": r, "name": f"r{r}"} for r in range(size)])
    message = [f"from {rank}", rank]
    dist.broadcast_object_list(message, src=1)
    check.true("broadcast_object_list", message == ["from 1", 1])
    gathered = [None] * size if rank == 0 else None
    dist.gather_object(rank * 10, gathered, dst=0)
    check.true("gather_object", rank != 0 or gathered == [r * 10 for r in range(size)])
    dist.barrier()
    dist.barrier(async_op=True).wait()

    m = like(torch.empty(3, 4) if rank == 0 else torch.empty(4, 3).t(), values(7, rank, (3, 4), torch.float32))
    kept = m.clone()
    check.raises("layout mismatch raises on every rank", denseccl.MismatchError, lambda: dist.all_reduce(m), "mismatch")
    check.equal("mismatch leaves the tensor", m, kept)
    x = like(torch.empty(3, 4), values(8, rank, (3, 4), torch.float32))
    dist.all_reduce(x)
    check.equal("usable after the mismatch", x, torch.stack(everyone(8, (3, 4))).double().sum(0), tol=1e-5)

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 4, 3)).to(memory_format=CL)
    reference = copy.deepcopy(model)
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    batch = torch.randn(2 * size, 3, 8, 8, generator=torch.Generator().manual_seed(9)).to(memory_format=CL)
    for _ in range(3):
        opt.zero_grad()
        ddp(batch[2 * rank : 2 * rank + 2]).square().mean().backward()
        opt.step()
        ref_opt.zero_grad()
        sum(reference(batch[2 * r : 2 * r + 2]).square().mean() for r in range(size)).div(size).backward()
        ref_opt.step()
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        check.equal(f"DDP parameter {name}", p, q, tol=1e-5)
        check.true(
            f"DDP gradient of {name} keeps its parameter's strides", p.grad.stride() == p.stride() or p.dim() < 4
        )


if __name__ == "__main__":
    dist.init_process_group("denseccl")
    check = Checker(dist.get_rank())
    torch.set_num_threads(1)
    job(check)
    dist.destroy_process_group()
    check.done()
