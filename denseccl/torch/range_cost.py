"""What the backend's profiler ranges and dispatcher routes cost when no profiler runs
(docs/torch.md, Profiling): a 4 KiB float32 ``all_reduce`` and ``all_gather_into_tensor``
through the backend with the ranges and without them, and gloo's functional
``all_gather_into_tensor_out`` (which the routes see first) with the routes and without them,
in alternating rounds, each variant switched on or off on every rank at once (per call: the
mean of the ranks; the median and the best of the rounds)::

    mpiexec -n 2 python -m denseccl.torch.range_cost [--rounds 61] [--iters 100]
    torchrun --standalone --nproc-per-node 2 -m denseccl.torch.range_cost
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable, Dict, List, Tuple

import torch
import torch.distributed as dist

from .. import flow
from . import dispatcher, init_process_group, profiling
from .process_group import ProcessGroupDenseCCL
from .single_tensor import all_gather_single

_TRACED = {name: getattr(ProcessGroupDenseCCL, name) for name in profiling.RANGES
           if hasattr(ProcessGroupDenseCCL, name)}


def ranges(on: bool) -> None:
    """The group's methods with their ranges (as shipped) or without them."""
    for name, method in _TRACED.items():
        setattr(ProcessGroupDenseCCL, name, method if on else getattr(method, "__wrapped__", method))
    flow.trace_agreement(profiling.agreement_range if on else None)


def routes(on: bool) -> None:
    (dispatcher.install if on else lambda _cls: dispatcher.uninstall())(ProcessGroupDenseCCL)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=61)
    parser.add_argument("--iters", type=int, default=100)
    args = parser.parse_args()
    init_process_group("denseccl")
    torch.set_num_threads(1)
    gloo = dist.new_group(backend="gloo")
    size = dist.get_world_size()
    x, out = torch.ones(1024), torch.empty(size * 1024)
    functional = torch.ops._c10d_functional

    def gloo_out() -> object:
        return functional.wait_tensor(functional.all_gather_into_tensor_out(x, size, gloo.group_name, out=out))

    #: row -> (switch, whether on, the call)
    rows: Dict[str, Tuple[Callable[[bool], None], bool, Callable[[], object]]] = {
        "all_reduce, ranges": (ranges, True, lambda: dist.all_reduce(x)),
        "all_reduce, no ranges": (ranges, False, lambda: dist.all_reduce(x)),
        "all_gather, ranges": (ranges, True, lambda: all_gather_single(out, x)),
        "all_gather, no ranges": (ranges, False, lambda: all_gather_single(out, x)),
        "gloo gather_out, routes": (routes, True, gloo_out),
        "gloo gather_out, no routes": (routes, False, gloo_out),
    }
    names = list(rows)
    found: Dict[str, List[float]] = {name: [] for name in names}
    for k in range(args.rounds):
        for i in range(len(names)):
            name = names[(k + i) % len(names)]
            switch, on, call = rows[name]
            switch(on)
            for _ in range(5):  # warm-up
                call()
            dist.barrier(group=gloo)
            start = time.perf_counter()
            for _ in range(args.iters):
                call()
            mean = torch.tensor([(time.perf_counter() - start) / args.iters], dtype=torch.float64)
            dist.all_reduce(mean, group=gloo)
            found[name].append(float(mean) / size)
    ranges(True)
    routes(True)
    if dist.get_rank() == 0:
        medians = {name: statistics.median(values) * 1e6 for name, values in found.items()}
        best = {name: min(values) * 1e6 for name, values in found.items()}
        print(f"{size} ranks, 4 KiB float32, {args.rounds} alternating rounds of {args.iters} calls: per call (us), "
              "median and best round")
        for name in names:
            worst = max(found[name]) * 1e6
            print(f"  {name:28s} median {medians[name]:9.2f}   best {best[name]:9.2f}   worst {worst:.1f}")
        for a, b in (("all_reduce, ranges", "all_reduce, no ranges"), ("all_gather, ranges", "all_gather, no ranges"),
                     ("gloo gather_out, routes", "gloo gather_out, no routes")):
            print(f"  {a} / {b.split(', ')[-1]}: median {medians[a] / medians[b]:.3f}x, best {best[a] / best[b]:.3f}x")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
