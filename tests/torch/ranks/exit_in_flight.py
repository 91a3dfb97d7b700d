"""Exit with an asynchronous collective never waited on and no destroy_process_group: the
progress thread completes it before MPI is finalized, and the process exits cleanly (it used to
die with heap corruption when MPI wrote into a freed tensor). Run with mpiexec -n N."""

import torch
import torch.distributed as dist

import denseccl.torch as dt
from tests.support.checker import Checker

dt.init_process_group()
x = torch.ones(100_000)
work = dist.all_reduce(x, async_op=True)
Checker("torch-exit-in-flight", dist.get_rank(), dist.get_world_size()).report()  # the verdict is the exit status
