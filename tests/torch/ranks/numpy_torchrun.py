"""denseccl.init() for NumPy arrays under torchrun (env:// variables, no MPI launcher): the
gloo engine moves the spans, denseccl keeps the layout rule, the agreement and the errors.
Every result against a NumPy reference of all ranks' inputs. Run with torchrun."""

from __future__ import annotations

import numpy as np
from tests.support.checker import Checker

import denseccl

comm = denseccl.init()
rank, size = comm.rank, comm.size
check = Checker("numpy-torchrun", rank, size)
check.check(comm.backend == "gloo", f"backend gloo ({comm.backend})")


def data(seed: int, r: int, shape, dtype) -> np.ndarray:
    generator = np.random.default_rng(seed * 1009 + r)
    return (generator.integers(-5, 6, size=shape) + (r + 1)).astype(dtype)


def equal(what, got, want, tol=1e-6):
    check.check(
        got.shape == want.shape and np.allclose(got.astype(np.float64), want.astype(np.float64), rtol=tol, atol=tol),
        f"{what}: got {got} want {want}",
    )


layouts = {
    "row-major": lambda a: np.ascontiguousarray(a),
    "fortran": lambda a: np.asfortranarray(a),
    "reversed": lambda a: np.ascontiguousarray(a[::-1, ::-1])[::-1, ::-1],
    "permuted": lambda a: np.ascontiguousarray(a.transpose(2, 0, 1)).transpose(1, 2, 0),
}
for seed, (name, make) in enumerate(layouts.items()):
    for dtype, ops in (
        (np.float32, ("sum", "prod", "min", "max", "avg")),
        (np.int32, ("sum", "avg")),
        (np.float16, ("sum",)),
        (np.bool_, ("sum", "prod")),
    ):
        for op in ops:
            shape = (3, 4, 2)
            x = make(data(seed, rank, shape, dtype))
            strides = x.strides
            comm.allreduce(x, op)
            stack = np.stack([data(seed, r, shape, dtype).astype(np.float64) for r in range(size)])
            want = {
                "sum": stack.sum(0),
                "prod": stack.prod(0),
                "min": stack.min(0),
                "max": stack.max(0),
                "avg": stack.sum(0) / size,
            }[op]
            if dtype == np.int32 and op == "avg":
                want = np.trunc(want)
            if dtype == np.bool_:
                want = {"sum": stack.any(0), "prod": stack.all(0)}[op].astype(np.float64)
            equal(f"allreduce {op} {np.dtype(dtype).name} {name}", x, want, tol=1e-2 if dtype == np.float16 else 1e-5)
            check.check(x.strides == strides, f"allreduce keeps strides {name}")

x = np.asfortranarray(data(20, rank, (3, 5), np.float64))
out = np.empty_like(x)
comm.allreduce(x, denseccl.PreMulSum(0.5), out=out)
equal("out-of-place premul_sum", out, 0.5 * sum(data(20, r, (3, 5), np.float64) for r in range(size)))
equal("... input untouched", x, data(20, rank, (3, 5), np.float64))
y = np.asfortranarray(data(21, rank, (3, 5), np.float32))
comm.reduce(y, root=size - 1, op="sum")
want = (
    sum(data(21, r, (3, 5), np.float32).astype(np.float64) for r in range(size))
    if rank == size - 1
    else data(21, rank, (3, 5), np.float32)
)
equal("reduce (a non-root input is only read)", y, want)
z = data(22, rank, (4, 3), np.int16).T
comm.broadcast(z, root=1)
equal("broadcast int16 (moved as bytes) transposed", z, data(22, 1, (4, 3), np.int16).T)
g = comm.allgather(np.asfortranarray(data(23, rank, (2, 3), np.uint32)))
equal("allgather uint32 fortran", g, np.stack([data(23, r, (2, 3), np.uint32) for r in range(size)]))
stacked = np.stack([np.asfortranarray(data(24 + j, rank, (2, 3), np.float32)) for j in range(size)])
block = comm.reduce_scatter(stacked, "max")
equal("reduce_scatter max", block, np.stack([data(24 + rank, r, (2, 3), np.float32) for r in range(size)]).max(0))

bad = np.ones((3, 4)) if rank == 0 else np.ones((4, 3)).T
try:
    comm.allreduce(bad)
    check.check(False, "layout mismatch raises")
except denseccl.MismatchError as error:
    check.check("mismatch" in str(error), "mismatch message names the layouts")
try:
    comm.allreduce(np.ones(4, np.int16))
    check.check(False, "int16 reduction refused")
except (denseccl.ArgumentError, denseccl.MismatchError) as error:
    check.check("int16" in str(error) or "mismatch" in str(error), f"int16 reduction refused with the reason: {error}")
half = comm.split(rank % 2, key=-rank)
v = np.full(3, rank, np.int64)
half.allreduce(v)
equal("split by parity (reversed order)", v, np.full(3, sum(r for r in range(size) if r % 2 == rank % 2)))

# gloo's own threads move the data: a waiter blocks in gloo's Work.wait instead of polling the
# work's test (a polling waiter took their cores: 1.4x slower than gloo at 64 MiB on 2 cores)
from denseccl.backends.gloo.transport import GlooPending  # noqa: E402

polls = [0]
polled_test = GlooPending.test


def counted(self):
    polls[0] += 1
    return polled_test(self)


GlooPending.test = counted
large = np.asfortranarray(data(30, rank, (512, 2048), np.float32))
comm.allreduce(large)
equal(
    "a 4 MiB allreduce through gloo",
    large,
    sum(data(30, r, (512, 2048), np.float32).astype(np.float64) for r in range(size)),
)
check.check(polls[0] == 0, f"the waiter blocked in gloo ({polls[0]} polls of the work)")
GlooPending.test = polled_test

comm.barrier()
comm.close()
check.done()
