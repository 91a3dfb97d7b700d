"""destroy_process_group while a point-to-point receive is still in flight (its sender never
sends): the receive is given up on, and the MPI communicators it may still use are kept, never
freed (MPI_Comm_free with a request active on the communicator: Open MPI 5 crashes at the next
MPI call when that request is a nonblocking collective; with a receive, as here, it copes).
Every rank must still run an MPI allreduce afterwards and get the right sum, and the abandoned
receive must not write. Run with mpiexec -n 2."""

import torch
import torch.distributed as dist
from mpi4py import MPI

import denseccl.torch as dt
from tests.support.checker import Checker

dt.init_process_group()
rank, size = dist.get_rank(), dist.get_world_size()
check = Checker("torch-shutdown-in-flight", rank, size)
inbox = torch.zeros(1000)
if rank == 0:
    pending = dist.irecv(inbox, src=1)  # rank 1 never sends
dist.destroy_process_group()
total = MPI.COMM_WORLD.allreduce(rank + 1)
check.check(total == size * (size + 1) // 2, f"MPI allreduce after the shutdown: {total}")
check.check(bool((inbox == 0).all()), "the abandoned receive wrote into its buffer")
check.done()
