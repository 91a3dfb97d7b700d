"""torch.distributed.pipelining on the denseccl backend, 2 ranks under torchrun (or mpiexec):
every schedule of the installed torch, on models whose activations are row-major, column-major,
permuted or channels-last, three optimizer steps each, against a single-process run of the same
microbatches (losses, the last stage's outputs, every parameter after the steps). The layout of
each activation that arrives at a stage is checked: a pass means that layout crossed the stage
boundary as it was made (gloo refuses such tensors: "input tensor has to be contiguous").
Stages are built by hand, and for the schedules of one stage per rank also traced
(``pipeline()``), whose losses over the three steps are checked (they depend on every
parameter after each step).

usage: pipelining.py [SCHEDULE ...]   (default: every schedule)
"""

from __future__ import annotations

import sys
from typing import Any, Callable, Dict, List, Tuple

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed import pipelining as pp

import denseccl.torch  # noqa: F401 - registers the backend
from tests.support.checker import Checker
from tests.torch.ranks.common import init

MICROBATCHES = 4
STEPS = 3

def laid(order: Tuple[int, ...]) -> Callable[[torch.Tensor], torch.Tensor]:
    """A copy of a tensor whose dims lie in memory in ``order`` (outermost first): a tensor of its
    own, not a view (the zero-bubble schedules detach stage outputs in place)."""

    def lay(t: torch.Tensor) -> torch.Tensor:
        strides = [0] * t.dim()
        step = 1
        for dim in reversed(order):
            strides[dim], step = step, step * t.shape[dim]
        return torch.empty_strided(t.shape, strides, dtype=t.dtype).copy_(t)

    return lay


#: layout name -> how a block lays out its output
LAYOUTS: Dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "row-major": laid((0, 1)),
    "column-major": laid((1, 0)),
    "permuted": laid((2, 0, 1)),
    "channels-last": laid((0, 2, 3, 1)),
}
#: the strides an activation of each layout has, for its shape (what must arrive)
EXPECTED: Dict[str, Callable[[torch.Size], Tuple[int, ...]]] = {
    name: (lambda shape, lay=lay: lay(torch.empty(shape)).stride()) for name, lay in LAYOUTS.items()
}


class Block(nn.Module):
    """One stage's layer; its output takes the layout under test."""

    def __init__(self, layout: str, seed: int) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.layout = layout
        if layout == "channels-last":
            self.layer: nn.Module = nn.Conv2d(3, 3, 3, padding=1)
        elif layout == "permuted":
            self.layer = nn.Linear(6, 6)
        else:
            self.layer = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return LAYOUTS[self.layout](torch.tanh(self.layer(x)))


def batch(layout: str) -> Tuple[torch.Tensor, torch.Tensor]:
    """The whole batch (inputs and targets) every rank can rebuild."""
    generator = torch.Generator().manual_seed(7)
    shape = {"channels-last": (8, 3, 4, 4), "permuted": (8, 5, 6)}.get(layout, (8, 8))
    x = LAYOUTS[layout](torch.randn(shape, generator=generator))
    return x, torch.randn(shape, generator=generator)


def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return ((output - target) ** 2).mean()


def blocks(layout: str, count: int) -> List[Block]:
    return [Block(layout, 100 + i) for i in range(count)]


def reference(layout: str, count: int) -> Tuple[List[float], List[torch.Tensor], List[Block]]:
    """The same model and microbatches on one process: per step the mean microbatch loss, the
    outputs of the last step, and the parameters after the steps."""
    model = blocks(layout, count)
    chain = nn.Sequential(*model)
    optimizer = torch.optim.SGD(chain.parameters(), lr=0.1)
    x, y = batch(layout)
    losses, outputs = [], []
    for _ in range(STEPS):
        optimizer.zero_grad()
        outputs = []
        total = 0.0
        for xs, ys in zip(x.chunk(MICROBATCHES), y.chunk(MICROBATCHES)):
            out = chain(xs)
            loss = loss_fn(out, ys) / MICROBATCHES
            loss.backward()
            total += float(loss) * MICROBATCHES
            outputs.append(out.detach())
        losses.append(total / MICROBATCHES)
        optimizer.step()
    return losses, outputs, model


def watch(stage: Any) -> List[Tuple[int, ...]]:
    """The strides of every input the stage's module is given."""
    seen: List[Tuple[int, ...]] = []
    stage.submod.register_forward_pre_hook(lambda module, args: seen.append(tuple(args[0].stride())))
    return seen


def run(check: Checker, rank: int, size: int, schedule: Any, layout: str, traced: bool = False) -> None:
    name = f"{schedule.__name__} {layout}{' traced' if traced else ''}"
    looped = schedule.__name__ in ("ScheduleInterleaved1F1B", "ScheduleLoopedBFS", "ScheduleInterleavedZeroBubble",
                                   "ScheduleZBVZeroBubble", "ScheduleDualPipeV")
    per_rank = 2 if looped else 1
    count = size * per_rank
    vshape = schedule.__name__ in ("ScheduleZBVZeroBubble", "ScheduleDualPipeV")
    if vshape:  # rank r holds stages r and count - 1 - r
        mine = [rank, count - 1 - rank]
    else:
        mine = [rank + size * i for i in range(per_rank)]
    model = blocks(layout, count)
    ref_losses, ref_outputs, ref_model = reference(layout, count)
    x, y = batch(layout)
    if traced:
        pipe = pp.pipeline(nn.Sequential(*model), mb_args=(x.chunk(MICROBATCHES)[0],),
                           split_spec={str(i): pp.SplitPoint.BEGINNING for i in range(1, count)})
        stages = [pipe.build_stage(rank, torch.device("cpu"))]
    else:
        stages = [pp.PipelineStage(model[i], i, count, torch.device("cpu")) for i in mine]
    seen = {i: watch(stage) for i, stage in zip(mine, stages)}
    optimizer = torch.optim.SGD([p for stage in stages for p in stage.submod.parameters()], lr=0.1)
    kwargs: Dict[str, Any] = {"n_microbatches": MICROBATCHES, "loss_fn": loss_fn}
    runner = schedule(stages if looped else stages[0], **kwargs)
    last = count - 1
    for step in range(STEPS):
        optimizer.zero_grad()
        losses: List[torch.Tensor] = []
        holds_first, holds_last = 0 in mine, last in mine
        args = (x,) if holds_first else ()
        out = runner.step(*args, target=y if holds_last else None, losses=losses if holds_last else None)
        optimizer.step()
        if holds_last:
            got = sum(float(loss) for loss in losses) / len(losses)
            check.check(abs(got - ref_losses[step]) < 1e-5, f"{name}: step {step} loss {got} != {ref_losses[step]}")
            if step == STEPS - 1 and out is not None:
                want = torch.cat(ref_outputs)
                check.check(torch.allclose(out, want, atol=1e-5), f"{name}: the last stage's outputs differ")
    for i in mine:
        for (pname, got), want in zip(model[i].named_parameters(), ref_model[i].parameters()):
            traced or check.check(torch.allclose(got, want, atol=1e-5), f"{name}: stage {i} {pname} after the steps")
        if i > 0:  # what arrived from the previous stage kept the sender's layout
            strides = set(seen[i])
            want_strides = EXPECTED[layout](torch.Size(batch(layout)[0].chunk(MICROBATCHES)[0].shape))
            check.check(strides == {want_strides}, f"{name}: stage {i} received strides {strides}, sent {want_strides}")
    dist.barrier()


def main() -> None:
    init()
    rank, size = dist.get_rank(), dist.get_world_size()
    check = Checker("pipelining", rank, size)
    names = sys.argv[1:] or [n for n in dir(pp) if n.startswith("Schedule")]
    for schedule_name in names:
        schedule = getattr(pp, schedule_name)
        one_stage = schedule_name in ("ScheduleGPipe", "Schedule1F1B")
        for layout in LAYOUTS:
            for traced in (False, True) if one_stage else (False,):
                try:
                    run(check, rank, size, schedule, layout, traced)
                except Exception as error:
                    check.fail(f"{schedule_name} {layout} traced={traced}: {type(error).__name__}: {error}")
                    raise
    dist.destroy_process_group()
    check.done()


if __name__ == "__main__":
    main()
