"""DDP on a channels-last ConvNet over the denseccl backend (CPU).

    launch/run -n 2 python examples/torch_ddp_example.py

Each rank trains on its slice of a global batch. At the end the script checks, and prints:
- that the parameters are bit-identical on every rank,
- that they match training the same model in one process on the whole batch,
- that every gradient kept its parameter's channels-last strides (the Gradient Layout Contract).
It exits non-zero if any check fails.
"""

from __future__ import annotations

import copy
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import denseccl.torch


def convnet() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(16, 32, 3, padding=1, stride=2),
        nn.ReLU(),
        nn.Conv2d(32, 8, 1),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, 10),
    ).to(memory_format=torch.channels_last)


def main() -> int:
    denseccl.torch.init_process_group()  # rank and world size from mpiexec; rendezvous over MPI
    rank, size = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)

    model = convnet()
    reference = copy.deepcopy(model)  # trained in this process on the whole batch
    ddp = DDP(model)  # the default process group: the denseccl backend
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    ref_optimizer = torch.optim.SGD(reference.parameters(), lr=0.05, momentum=0.9)

    data = torch.Generator().manual_seed(42)
    per_rank = 4
    for step in range(5):
        images = torch.randn(per_rank * size, 3, 16, 16, generator=data).contiguous(memory_format=torch.channels_last)
        labels = torch.randint(0, 10, (per_rank * size,), generator=data)
        mine = slice(rank * per_rank, (rank + 1) * per_rank)
        loss = F.cross_entropy(ddp(images[mine]), labels[mine])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        ref_optimizer.zero_grad()
        F.cross_entropy(reference(images), labels).backward()
        ref_optimizer.step()
        losses = torch.tensor([loss.item()])
        dist.all_reduce(losses, op=dist.ReduceOp.AVG)
        if rank == 0:
            print(f"step {step}: mean loss over ranks {losses.item():.4f}", flush=True)

    # same parameters everywhere: gather every rank's flattened parameters
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    gathered = [torch.empty_like(flat) for _ in range(size)]
    dist.all_gather(gathered, flat)
    identical = all(torch.equal(g, gathered[0]) for g in gathered)
    difference = max((p - q).abs().max().item() for p, q in zip(model.parameters(), reference.parameters()))
    violations = denseccl.torch.grad_layout_violations(model)
    weight = model[0].weight
    ok = identical and difference < 1e-4 and not violations
    if rank == 0:
        print(f"parameters identical on all {size} ranks: {identical}")
        print(f"max |DDP - single-process| parameter difference: {difference:.2e}")
        print(
            f"conv weight strides {weight.stride()}, grad strides {weight.grad.stride()}; "
            f"contract violations: {len(violations)}"
        )
        print("OK" if ok else "FAILED", flush=True)
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
