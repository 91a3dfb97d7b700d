"""DDP step time of a channels-last ConvNet: the denseccl backend against gloo (CPU) and, when
a GPU is present, nccl.

    launch/run -n 2 python examples/bench_ddp.py [--rounds 5] [--steps 10] [--batch 8] [--width 64]

Every backend trains its own copy of the same model with DDP (default bucket size); rounds
alternate between the backends so that drifts in machine load hit all of them alike. A step
is forward + backward (where DDP reduces the gradients) + SGD step; its time is the slowest
rank's, averaged over a round. The table gives the median over rounds and the best round, and
the "no DDP" row (the same step without gradient reduction) shows what communication costs.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from typing import Dict, List

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import denseccl.torch


def convnet(width: int) -> nn.Module:
    torch.manual_seed(0)
    w = width
    return nn.Sequential(
        nn.Conv2d(3, w, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(w, 2 * w, 3, padding=1, stride=2),
        nn.ReLU(),
        nn.Conv2d(2 * w, 4 * w, 3, padding=1, stride=2),
        nn.ReLU(),
        nn.Conv2d(4 * w, 4 * w, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(4 * w, 10),
    ).to(memory_format=torch.channels_last)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=10, help="timed steps per round")
    parser.add_argument("--batch", type=int, default=8, help="images per rank")
    parser.add_argument("--image", type=int, default=32, help="image side")
    parser.add_argument("--width", type=int, default=64, help="channels of the first conv")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    args = parser.parse_args()

    denseccl.torch.init_process_group()
    rank, size = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(args.threads)
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")

    base = convnet(args.width).to(device)
    params = sum(p.numel() for p in base.parameters())
    groups: Dict[str, object] = {"denseccl": dist.group.WORLD, "gloo": dist.new_group(backend="gloo")}
    if cuda:
        groups["nccl"] = dist.new_group(backend="nccl")
    contenders = {"no DDP": copy.deepcopy(base)}
    for name, group in groups.items():
        contenders[name] = DDP(copy.deepcopy(base), process_group=group, device_ids=[device.index] if cuda else None)
    optimizers = {name: torch.optim.SGD(m.parameters(), lr=0.01) for name, m in contenders.items()}

    data = torch.Generator().manual_seed(rank)
    images = torch.randn(args.batch, 3, args.image, args.image, generator=data).to(
        device, memory_format=torch.channels_last
    )
    labels = torch.randint(0, 10, (args.batch,), generator=data).to(device)

    def step(name: str) -> None:
        model, optimizer = contenders[name], optimizers[name]
        optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(model(images), labels).backward()
        optimizer.step()

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    for name in contenders:  # warm-up: DDP's first iterations build and rebuild buckets
        for _ in range(3):
            step(name)
    sync()

    times: Dict[str, List[float]] = {name: [] for name in contenders}
    for _ in range(args.rounds):
        for name in contenders:
            dist.barrier()
            started = time.perf_counter()
            for _ in range(args.steps):
                step(name)
            sync()
            elapsed = torch.tensor([(time.perf_counter() - started) / args.steps], dtype=torch.float64)
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
            times[name].append(elapsed.item())

    if rank == 0:
        print(
            f"DDP step time, {size} ranks on {device.type}, channels-last ConvNet of {params / 1e6:.2f} M parameters "
            f"({params * 4 / 1e6:.1f} MB of float32 gradients), "
            f"batch {args.batch}x3x{args.image}x{args.image} per rank, "
            f"{args.threads} thread(s) per rank, {args.rounds} rounds x {args.steps} steps"
        )
        print(f"{'backend':<10} {'median (ms)':>12} {'best (ms)':>10} {'comm cost (ms)':>15}")
        floor = statistics.median(times["no DDP"])
        for name, values in times.items():
            median = statistics.median(values)
            cost = "" if name == "no DDP" else f"{(median - floor) * 1e3:15.2f}"
            print(f"{name:<10} {median * 1e3:12.2f} {min(values) * 1e3:10.2f} {cost}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
