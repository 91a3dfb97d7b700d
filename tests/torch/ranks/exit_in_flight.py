"""Exit with an asynchronous collective never waited on and no destroy_process_group: the
progress thread completes it before MPI is finalized, and the process exits cleanly (it used to
die with heap corruption when MPI wrote into a freed tensor). Run with mpiexec -n N."""

import torch
import torch.distributed as dist

import denseccl.torch as dt

dt.init_process_group()
x = torch.ones(100_000)
work = dist.all_reduce(x, async_op=True)
print(f"rank {dist.get_rank()}: 1 checks passed", flush=True)
