"""A channels-last pipeline's step on the denseccl backend against gloo, which needs row-major
tensors at every stage boundary: ``.contiguous()`` before the send, back to channels-last after
the receive, and a hook that makes the gradient sent back row-major too. Two stages of
convolutions, GPipe, alternating rounds in one job::

    torchrun --standalone --nproc-per-node 2 examples/bench_pipeline.py [--batch 32] [--channels 64] [--side 56]

Prints the median step time of each (ms) and their ratio.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any, Dict, List

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed import pipelining as pp

import denseccl.torch  # noqa: F401 - registers the backend


class Stage(nn.Module):
    """Two 3x3 convolutions, channels-last; ``boundary`` adds what gloo needs at the edges."""

    def __init__(self, channels: int, boundary: bool, seed: int) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.body = nn.Sequential(nn.Conv2d(channels, channels, 3, padding=1), nn.ReLU(),
                                  nn.Conv2d(channels, channels, 3, padding=1))
        self.body.to(memory_format=torch.channels_last)
        self.boundary = boundary

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.boundary:
            if x.requires_grad:  # the gradient sent back must be row-major too
                x.register_hook(lambda grad: grad.contiguous())
            x = x.contiguous(memory_format=torch.channels_last)
        y = self.body(x)
        return y.contiguous() if self.boundary else y


def schedule(group: Any, boundary: bool, rank: int, channels: int, microbatches: int) -> Any:
    stage = pp.PipelineStage(Stage(channels, boundary, rank), rank, 2, torch.device("cpu"), group=group)
    return pp.ScheduleGPipe(stage, n_microbatches=microbatches, loss_fn=lambda out, target: out.float().mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--channels", type=int, default=64)
    parser.add_argument("--side", type=int, default=56)
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    dist.init_process_group("denseccl")
    rank = dist.get_rank()
    gloo = dist.new_group([0, 1], backend="gloo")
    x = torch.randn(args.batch, args.channels, args.side, args.side).contiguous(memory_format=torch.channels_last)
    runs = {
        "denseccl": schedule(None, False, rank, args.channels, args.microbatches),
        "gloo + .contiguous()": schedule(gloo, True, rank, args.channels, args.microbatches),
    }
    times: Dict[str, List[float]] = {name: [] for name in runs}
    for round_ in range(args.rounds + 1):
        for name, run in runs.items():
            dist.barrier()
            began = time.perf_counter()
            run.step(x, target=x) if rank == 0 else run.step(target=x)
            dist.barrier()
            if round_:  # the first round warms up
                times[name].append(time.perf_counter() - began)
    if rank == 0:
        mib = x.numel() * x.element_size() / args.microbatches / 2**20
        print(f"GPipe, 2 stages, {args.microbatches} microbatches of {mib:.1f} MiB channels-last activations "
              f"(batch {args.batch}, {args.channels} channels, {args.side}x{args.side}), median of {args.rounds}:")
        for name, values in times.items():
            print(f"  {name:24} {1000 * statistics.median(values):8.1f} ms per step")
        ratio = statistics.median(times["gloo + .contiguous()"]) / statistics.median(times["denseccl"])
        print(f"  gloo / denseccl: {ratio:.2f}x")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
