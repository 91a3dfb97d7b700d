"""Speed through torch.distributed: the denseccl backend against the direct denseccl call and
against gloo, on the same tensors, in alternating rounds (medians); docs/torch.md (Speed) has
the figures. Run under either launcher (the backend then uses MPI or the gloo engine)::

    mpiexec -n 2 python -m denseccl.torch.bench [--mib 64] [--rounds 7] [--iters 5]
    torchrun --standalone --nproc-per-node 2 -m denseccl.torch.bench

Rows, each a 64 MiB float32 channels-last allreduce unless said otherwise: ``direct`` (the
group's own denseccl communicator), ``backend`` (``dist.all_reduce``), ``gloo`` (a gloo group
of the same ranks), ``gloo-contiguous`` (gloo on a row-major tensor, its best case),
``*-transposed`` (a transposed 2-D tensor), ``*-gather`` (all_gather_single into a channels-last
output), ``*-scatter`` (reduce_scatter_single of a flat input, ``mib`` per rank's output),
``*-barrier`` (no data; ``direct-*``: the group's own communicator for these three too),
``*-distinct`` (a tensor of its own per call) and ``*-fresh`` (a tensor made inside the
timed loop). A round is a barrier, then ``iters`` calls (the mean per call, averaged over
ranks); ``faults``: minor page faults per call, the most of any rank (docs/torch.md says why).
"""

from __future__ import annotations

import argparse
import functools
import resource
import statistics
import time
from typing import Callable, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist

from ..config import launched_by_mpi
from . import init_process_group
from .single_tensor import all_gather_single, reduce_scatter_single


def _channels_last(numel: int) -> torch.Tensor:
    side = int(round((numel // 64) ** 0.5))
    return torch.ones(1, 64, side, numel // (64 * side)).to(memory_format=torch.channels_last)


def _over_ranks(seconds: float, faults: int, group: dist.ProcessGroup) -> Tuple[float, int]:
    """The mean of the ranks' seconds and the most page faults of any rank."""
    mean, most = torch.tensor([seconds], dtype=torch.float64), torch.tensor([faults], dtype=torch.float64)
    dist.all_reduce(mean, group=group)
    dist.all_reduce(most, group=group, op=dist.ReduceOp.MAX)
    return float(mean) / dist.get_world_size(), int(most)


def _repeated(step: Callable[[], object], n: int) -> List[Callable[[], object]]:
    return [step] * n


def _minor_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


#: a row: given n, the n calls of one timed round (what they run on is made before the timing)
Calls = Callable[[int], List[Callable[[], object]]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mib", type=float, default=64.0)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--iters", type=int, default=5)
    args = parser.parse_args()
    init_process_group("denseccl")
    torch.set_num_threads(1)
    rank = dist.get_rank()
    gloo = dist.new_group(backend="gloo")
    direct = dist.group.WORLD.host_communicator  # type: ignore[attr-defined]
    numel = int(args.mib * (1 << 20)) // 4
    side = int(round(numel**0.5))
    cl, flat, square = _channels_last(numel), torch.ones(numel), torch.ones(side, side).t()
    gathered = torch.empty(dist.get_world_size() * cl.shape[0], *cl.shape[1:]).to(memory_format=torch.channels_last)
    small = cl.new_ones(cl.shape).to(memory_format=torch.channels_last)
    whole, part = torch.ones(dist.get_world_size() * numel), torch.empty(numel)

    def distinct(group: Optional[dist.ProcessGroup]) -> Calls:
        def calls(n: int) -> List[Callable[[], object]]:
            tensors = [_channels_last(numel) for _ in range(n)]
            return [functools.partial(dist.all_reduce, t, group=group) for t in tensors]

        return calls

    steps: Dict[str, Callable[[], object]] = {
        "direct": lambda: direct.allreduce(cl),
        "backend": lambda: dist.all_reduce(cl),
        "gloo": lambda: dist.all_reduce(cl, group=gloo),
        "gloo-contiguous": lambda: dist.all_reduce(flat, group=gloo),
        "backend-transposed": lambda: dist.all_reduce(square),
        "gloo-transposed": lambda: dist.all_reduce(square, group=gloo),
        "backend-gather": lambda: all_gather_single(gathered, small),
        "gloo-gather": lambda: all_gather_single(gathered, small, group=gloo),
        "backend-scatter": lambda: reduce_scatter_single(part, whole),
        "gloo-scatter": lambda: reduce_scatter_single(part, whole, group=gloo),
        "direct-scatter": lambda: direct.reduce_scatter(whole.view(dist.get_world_size(), numel), out=part),
        "direct-gather": lambda: direct.allgather(small, out=gathered.view(dist.get_world_size(), *small.shape)),
        "direct-barrier": lambda: direct.barrier(),
        "backend-barrier": lambda: dist.barrier(),
        "gloo-barrier": lambda: dist.barrier(group=gloo),
        "backend-fresh": lambda: dist.all_reduce(torch.ones(cl.shape).to(memory_format=torch.channels_last)),
        "gloo-fresh": lambda: dist.all_reduce(torch.ones(cl.shape).to(memory_format=torch.channels_last), group=gloo),
    }
    #: name -> the calls of one round, made before its timing starts
    rows: Dict[str, Calls] = {name: functools.partial(_repeated, step) for name, step in steps.items()}
    rows["backend-distinct"], rows["gloo-distinct"] = distinct(None), distinct(gloo)
    usable = {}
    for name, calls in rows.items():
        try:
            calls(1)[0]()
            usable[name] = calls
        except Exception as error:  # noqa: BLE001 - a contender that cannot run this layout says why
            if rank == 0:
                print(f"{name}: {type(error).__name__}: {str(error).splitlines()[0][:120]}", flush=True)
    names = list(usable)
    found: Dict[str, List[float]] = {name: [] for name in names}
    faults: Dict[str, List[int]] = {name: [] for name in names}
    for k in range(args.rounds):
        for i in range(len(names)):
            name = names[(k + i) % len(names)]
            usable[name](1)[0]()  # warm-up
            round_calls = usable[name](args.iters)
            dist.barrier(group=gloo)
            before, start = _minor_faults(), time.perf_counter()
            for call in round_calls:
                call()
            seconds, faulted = (time.perf_counter() - start) / args.iters, (_minor_faults() - before) // args.iters
            del round_calls
            seconds, faulted = _over_ranks(seconds, faulted, gloo)
            found[name].append(seconds)
            faults[name].append(faulted)
    if rank == 0:
        engine = "MPI" if launched_by_mpi() else "gloo engine"
        print(f"{dist.get_world_size()} ranks, {args.mib:g} MiB float32, backend's CPU engine: {engine}; "
              f"median of {args.rounds} alternating rounds of {args.iters} calls (ms; faults: pages per call)")
        medians = {name: statistics.median(values) * 1e3 for name, values in found.items()}
        for name, ms in medians.items():
            spread = f"{min(found[name]) * 1e3:.1f}-{max(found[name]) * 1e3:.1f}"
            print(f"  {name:20s} {ms:8.3f}   rounds {spread:15s} faults {statistics.median(faults[name]):7.0f}")
        pairs = (
            ("backend", "direct"), ("gloo", "backend"), ("gloo-contiguous", "backend"),
            ("gloo-transposed", "backend-transposed"), ("gloo-gather", "backend-gather"),
            ("gloo-scatter", "backend-scatter"), ("gloo-barrier", "backend-barrier"),
            ("gloo-gather", "direct-gather"), ("gloo-scatter", "direct-scatter"), ("gloo-barrier", "direct-barrier"),
            ("gloo-distinct", "backend-distinct"), ("gloo-fresh", "backend-fresh"), ("backend-fresh", "backend"),
        )
        for a, b in pairs:
            if a in medians and b in medians:
                print(f"  {a} / {b}: {medians[a] / medians[b]:.2f}x")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
