"""Rank program: no in-place path allocates a temporary as large as its input.

tracemalloc sees every NumPy allocation; for each in-place collective (allreduce, reduce on the
root and elsewhere, broadcast) x dtype x op x layout on a 4 MiB array, the peak of what it traces
during the call must stay below 1/8 of the array (chunked scratch of the half kernels and
integer averaging excepted, which are fixed-size)."""

from __future__ import annotations

import tracemalloc

import numpy as np

import denseccl
from denseccl.backends.mpi import host_kernels
from tests.support.checker import Checker

comm = denseccl.init()
rank, size = comm.rank, comm.size
check = Checker("memcheck", rank, size)
NBYTES = 4 << 20
worst = 0.0


def arrays(dtype):
    count = NBYTES // np.dtype(dtype).itemsize
    yield "contiguous", np.ones(count, dtype)
    yield "channels_last", np.ones((4, 32, 32, count // 4096), dtype).transpose(0, 3, 1, 2)
    yield "reversed", np.ones((count // 64, 64), dtype)[::-1, ::-1]


def traced(call) -> int:
    tracemalloc.start()
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    call()
    peak = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    return peak


for kernels in ("numpy", "auto"):
    host_kernels.KERNELS = kernels
    for dtype in (np.float32, np.float16, np.int32, np.float64):
        ops = ["sum", "avg", "max", denseccl.PreMulSum(2)]
        for layout, x in arrays(dtype):
            for op in ops:
                for name, call in (
                    ("allreduce", lambda: comm.allreduce(x, op)),
                    ("reduce", lambda: comm.reduce(x, 0, op if not isinstance(op, denseccl.PreMulSum) else "sum")),
                    ("broadcast", lambda: comm.broadcast(x, 0)),
                ):
                    x[...] = 1
                    comm.barrier()
                    peak = traced(call)
                    worst = max(worst, peak / x.nbytes)
                    check.check(
                        peak < x.nbytes / 8,
                        f"{name} {np.dtype(dtype).name} {op} {layout}: traced {peak} B for a {x.nbytes} B array",
                    )
print(f"rank {rank}: worst peak {worst:.4f} of the array", flush=True)
comm.close()
check.finish()
