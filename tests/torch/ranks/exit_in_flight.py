"""Exit with an asynchronous collective never waited on and no destroy_process_group: the
progress thread completes it before MPI is finalized, and the process exits cleanly (it used to
die with heap corruption when MPI wrote into a freed tensor). Run with mpiexec -n N."""

import torch
import torch.distributed as dist

import denseccl.torch as dt
from tests.support.checker import Checker

dt.init_process_group()
rank, size = dist.get_rank(), dist.get_world_size()
check = Checker("torch-exit-in-flight", rank, size)
y = torch.full((4,), float(rank + 1))
dist.all_reduce(y)  # the group works before the call left in flight
check.check(bool((y == size * (size + 1) / 2).all()), f"all_reduce gave {y}")
x = torch.ones(100_000)
work = dist.all_reduce(x, async_op=True)
check.report()  # the rest of the verdict is the exit status: a clean exit with work in flight
