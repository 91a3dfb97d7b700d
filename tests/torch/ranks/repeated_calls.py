"""A repeated synchronous all_reduce / reduce through the backend on one 64 MiB channels-last
tensor, as a training loop or a user's timing script makes it: each repeat returns the right
values and touches no new memory. The first page faults of a temporary as large as the tensor,
per call, cost more than the copy into it (issue 20: under mpiexec the backend's calls missed
the core's replayed plans, so MPICH allocated and faulted in a 64 MiB temporary on every call).
Run with mpiexec -n N or torchrun --nproc-per-node N."""

import resource

import torch
import torch.distributed as dist

from tests.support.checker import Checker
from tests.torch.ranks.common import init

#: 64 MiB of float32: above glibc's largest mmap threshold (32 MiB), so a temporary this size is
#: mapped afresh (and faulted in) on every call that allocates one
SHAPE = (4, 64, 256, 256)
#: repeated calls measured, after two that may set things up (the full path, then the plan)
REPEATS = 3


def minor_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def inputs(rank: int) -> torch.Tensor:
    """Rank ``rank``'s input, small integers (sums are exact in float32), channels-last."""
    flat = torch.arange(torch.Size(SHAPE).numel(), dtype=torch.float32).remainder_(7).add_(rank)
    return flat.view(SHAPE).to(memory_format=torch.channels_last)


def main() -> None:
    init()
    rank, size = dist.get_rank(), dist.get_world_size()
    check = Checker("torch-repeated-calls", rank, size)
    mine = inputs(rank)
    total = sum(inputs(r) for r in range(size))
    x = torch.empty_like(mine)  # channels-last, as mine
    pages = x.numel() * x.element_size() // resource.getpagesize()
    calls = {
        "all_reduce": (lambda: dist.all_reduce(x), total),
        "reduce to 0": (lambda: dist.reduce(x, dst=0), total if rank == 0 else mine),
        "reduce to last": (lambda: dist.reduce(x, dst=size - 1), total if rank == size - 1 else mine),
    }
    for name, (call, want) in calls.items():
        faulted = []
        for repeat in range(2 + REPEATS):
            x.copy_(mine)  # into pages touched before: no faults
            before = minor_faults()
            call()
            faulted.append(minor_faults() - before)
            check.equal(f"{name}, call {repeat + 1}", x, want, strides=mine.stride(), tol=0)
        repeated = faulted[2:]
        check.check(
            max(repeated) < pages // 16,
            f"{name}: repeated calls on one {pages}-page tensor faulted in {repeated} pages each "
            f"(first calls: {faulted[:2]}): a temporary allocated per call",
        )
    check.done()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
