"""A program that calls denseccl.init() under torchrun and ends without close(): every call's
result against a NumPy reference, then the interpreter exits with the communicator open. The
verdict is also the exit status: gloo's threads must not be left releasing Python objects
while the interpreter finalizes (that aborted the process: "terminate called without an active
exception"). ``p2p``: the torch backend's send/recv and all_to_all on the gloo engine, and no
destroy_process_group. Run with torchrun."""

from __future__ import annotations

import sys

import numpy as np
from tests.support.checker import Checker

if sys.argv[1:] == ["p2p"]:
    import torch
    import torch.distributed as dist

    import denseccl.torch

    dist.init_process_group("denseccl")
    rank, size = dist.get_rank(), dist.get_world_size()
    check = Checker("exit-without-close-p2p", rank, size)
    out = torch.empty(size, dtype=torch.float32)
    dist.all_to_all_single(out, torch.arange(size, dtype=torch.float32) + 10 * rank)
    check.check(out.tolist() == [10.0 * r + rank for r in range(size)], f"all_to_all_single gave {out}")
    peer = (rank + 1) % size
    got = torch.empty(3)
    requests = [dist.isend(torch.full((3,), float(rank)), peer), dist.irecv(got, (rank - 1) % size)]
    for request in requests:
        request.wait()
    check.check(got.tolist() == [float((rank - 1) % size)] * 3, f"recv gave {got}")
    check.done()
    last = torch.full((5,), rank + 1.0)
    dist.all_reduce(last)  # the last call right before the interpreter finalizes (see below)
    sys.exit(0 if last.tolist() == [size * (size + 1) / 2] * 5 else 3)

import denseccl

comm = denseccl.init()
rank, size = comm.rank, comm.size
check = Checker("exit-without-close", rank, size)
inputs = [np.arange(12, dtype=np.float32).reshape(3, 4) * (r + 1) for r in range(size)]
x = np.asfortranarray(inputs[rank])
comm.allreduce(x)
check.check(np.array_equal(x, sum(inputs)), f"allreduce gave {x}")
gathered = np.empty((size, 3, 4), np.float32)
comm.allgather(np.ascontiguousarray(inputs[rank]), out=gathered)
check.check(np.array_equal(gathered, np.stack(inputs)), f"allgather gave {gathered}")
part = np.empty(3, np.float64)
comm.reduce_scatter(np.full((size, 3), rank + 1.0), out=part)
check.check(np.array_equal(part, np.full(3, size * (size + 1) / 2)), f"reduce_scatter gave {part}")
check.done()
# the last call right before the interpreter finalizes, with no output in between (writing it
# would let gloo's threads take the GIL in time): its verdict is the exit status
last = np.full(5, rank + 1.0)
comm.allreduce(last)
sys.exit(0 if np.array_equal(last, np.full(5, size * (size + 1) / 2)) else 3)
