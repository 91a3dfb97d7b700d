"""The time of a DDP training step of a channels-last ResNet-18 (torchvision's, or a small
channels-last conv net when torchvision is absent) on torch's own NCCL backend and on denseccl's,
one after the other in the same ranks, and how long the host spends in ``backward()`` (DDP's
``finalize_backward`` waits there for the buckets' futures: with stream-ordered futures the host
returns before the GPU finishes). tests/gpu/run.sh runs it after the two-rank probe.

usage: python tests/gpu/ddp_step.py MODE   (MODE from two_ranks.py: hostid, plain, or no: one rank)
Prints one "INFO ddp BACKEND: ..." line per backend, or "FAIL ddp BACKEND: ...".
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

STEPS, WARMUP, BATCH = 10, 3, 32


def model(torch: Any) -> Any:
    """ResNet-18, or (no torchvision) a small conv net of the same kind of layers."""
    try:
        import torchvision

        return torchvision.models.resnet18(num_classes=100), "resnet18"
    except ImportError:
        nn = torch.nn
        layers = [nn.Conv2d(3, 64, 7, 2, 3), nn.BatchNorm2d(64), nn.ReLU()]
        for cin, cout in ((64, 64), (64, 128), (128, 256), (256, 512)):
            layers += [nn.Conv2d(cin, cout, 3, 2, 1), nn.BatchNorm2d(cout), nn.ReLU(), nn.Conv2d(cout, cout, 3, 1, 1)]
        layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, 100)]
        return nn.Sequential(*layers), "conv net (no torchvision)"


def step_times(torch: Any, backend: str, rank: int, size: int, store: str) -> str:
    import torch.distributed as dist

    if backend == "denseccl":
        import denseccl.torch  # noqa: F401 - registers the backend
    dist.init_process_group(backend, init_method=f"file://{store}", rank=rank, world_size=size)
    try:
        device = torch.device("cuda", 0)
        torch.manual_seed(0)
        net, name = model(torch)
        net = net.to(device, memory_format=torch.channels_last)
        ddp = torch.nn.parallel.DistributedDataParallel(net, device_ids=[0])
        optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01)
        x = torch.randn(BATCH, 3, 224, 224, device=device).to(memory_format=torch.channels_last)
        target = torch.randint(0, 100, (BATCH,), device=device)
        host_backward = 0.0
        for i in range(WARMUP + STEPS):
            if i == WARMUP:
                torch.cuda.synchronize()
                started, host_backward = time.perf_counter(), 0.0
            loss = torch.nn.functional.cross_entropy(ddp(x), target)
            optimizer.zero_grad(set_to_none=True)
            before = time.perf_counter()
            loss.backward()
            host_backward += time.perf_counter() - before
            optimizer.step()
        torch.cuda.synchronize()
        per_step = (time.perf_counter() - started) / STEPS * 1e3
        return (f"{per_step:.1f} ms/step, host in backward() {host_backward / STEPS * 1e3:.1f} ms/step "
                f"({name}, channels-last, batch {BATCH}, {size} rank(s))")  # fmt: skip
    finally:
        dist.destroy_process_group()


def rank_main(rank: int, size: int, mode: str, folder: str) -> None:
    if mode == "hostid":
        os.environ.update(NCCL_HOSTID=f"denseccl-rank{rank}", NCCL_SOCKET_IFNAME="lo", NCCL_IB_DISABLE="1")
    import torch

    for backend in ("nccl", "denseccl"):
        try:
            line = f"INFO ddp {backend}: {step_times(torch, backend, rank, size, f'{folder}/{backend}')}"
        except Exception as error:  # noqa: BLE001 - reported, the other backend still runs
            line = f"FAIL ddp {backend}: {type(error).__name__}: {error}"
        if rank == 0:
            print(line, flush=True)


def main() -> None:
    mode = sys.argv[1] if len(sys.argv) > 1 else "no"
    import torch
    import torch.multiprocessing as mp

    if not torch.cuda.is_available():
        print("SKIP ddp: torch has no CUDA here", flush=True)
        return
    size = 1 if mode == "no" else 2
    with tempfile.TemporaryDirectory() as folder:
        mp.spawn(rank_main, args=(size, mode, folder), nprocs=size, join=True)


if __name__ == "__main__":
    main()
