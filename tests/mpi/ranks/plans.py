"""Rank program: repeated calls (prepared calls, denseccl/flow.py) behave exactly like
first calls: right results on every layout and op, and every rank raises on a mismatch, a
read-only input or a changed geometry after a plan exists; the communicator stays usable."""

from __future__ import annotations

import numpy as np

import denseccl
from tests.support.checker import Checker

comm = denseccl.init()
rank, size = comm.rank, comm.size
check = Checker("plans", rank, size)


def layouts(shape=(2, 3, 4, 5), dtype=np.float32):
    base = np.empty(shape, dtype)
    yield "contiguous", base
    yield "channels_last", np.empty((2, 4, 5, 3), dtype).transpose(0, 3, 1, 2)
    yield "reversed", np.empty(shape, dtype)[::-1, :, ::-1, :]
    yield "transposed", np.empty(shape[::-1], dtype).T


def values(r, shape, salt=0):
    return ((np.arange(int(np.prod(shape))).reshape(shape) * 3 + r * 7 + salt) % 11 - 5).astype(np.float64)


for checking in (True, False):
    comm.check = checking
    for name, x in layouts():
        for op, combine in (("sum", np.add), ("max", np.maximum), ("avg", None), ("prod", np.multiply)):
            for it in range(3):  # first call plans, the next ones replay
                x[...] = values(rank, x.shape, it)
                got = comm.allreduce(x, op)
                check.check(got is x, f"{name} {op}: allreduce returned another object")
                stack = np.stack([values(r, x.shape, it) for r in range(size)])
                want = stack.mean(0) if op == "avg" else combine.reduce(stack, 0)
                check.check(np.allclose(x, want), f"{name} {op} call {it}: {x.ravel()[:6]} != {want.ravel()[:6]}")
        for root in range(size):
            for it in range(3):
                x[...] = values(rank, x.shape, it)
                comm.reduce(x, root, "sum")
                want = sum(values(r, x.shape, it) for r in range(size)) if rank == root else values(rank, x.shape, it)
                check.check(np.array_equal(x, want), f"{name} reduce to {root}, call {it}")
                x[...] = values(rank, x.shape, it)
                comm.broadcast(x, root)
                check.check(np.array_equal(x, values(root, x.shape, it)), f"{name} broadcast from {root}, call {it}")
    for dtype in (np.float16, np.int32):
        x = np.empty((4, 6), dtype).T
        for it in range(3):
            x[...] = values(rank, x.shape, it)
            comm.allreduce(x)
            check.check(
                np.array_equal(x, sum(values(r, x.shape, it) for r in range(size))), f"{dtype.__name__} call {it}"
            )
check.check(comm.flow.calls, "repeated calls left no plan")

# after a plan exists, disagreement still raises on every rank and the communicator survives
comm.check = True
x = np.zeros((3, 8), np.float32)
comm.allreduce(x, "sum")
comm.allreduce(x, "max")
check.raises(
    "different ops after planning",
    denseccl.MismatchError,
    lambda: comm.allreduce(x, "sum" if rank == 0 else "max"),
    "op",
)

y = np.zeros((3, 8), np.float32)
if rank == 0:
    y.flags.writeable = False
check.raises(
    "a read-only input after planning",
    denseccl.LayoutError if rank == 0 else denseccl.MismatchError,
    lambda: comm.allreduce(y),
)

z = np.zeros((3, 8), np.float32) if rank else np.zeros((8, 3), np.float32).T
check.raises("different layouts after planning", denseccl.MismatchError, lambda: comm.allreduce(z), "layout")

for _ in range(2):
    x[...] = rank + 1
    comm.allreduce(x)
    check.check(np.all(x == size * (size + 1) / 2), "the communicator after the errors")

# plain CPU torch tensors replay plans too; a conjugated or negated view of the same geometry,
# or a tensor subclass, takes the full path (and is refused or served by it)
import torch  # noqa: E402

torch_keys = {key for key in comm.flow.calls if len(key) > 1 and key[1] == "torch"}
for name, x in layouts():
    t = torch.from_numpy(x) if name != "reversed" else torch.empty(2, 3, 4, 5)  # torch has no negative strides
    for it in range(3):
        t.copy_(torch.from_numpy(values(rank, tuple(t.shape), it)))
        check.check(comm.allreduce(t, "sum") is t, f"torch {name}: allreduce returned another object")
        want = torch.from_numpy(sum(values(r, tuple(t.shape), it) for r in range(size))).float()
        check.check(torch.equal(t, want), f"torch {name} allreduce, call {it}")
        for root in range(size):
            t.copy_(torch.from_numpy(values(rank, tuple(t.shape), it)))
            check.check(comm.reduce(t, root, "max") is t, f"torch {name}: reduce returned another object")
            want = (
                np.maximum.reduce([values(r, tuple(t.shape), it) for r in range(size)])
                if rank == root
                else values(rank, tuple(t.shape), it)
            )
            check.check(torch.equal(t, torch.from_numpy(want).float()), f"torch {name} reduce to {root}, call {it}")
            t.copy_(torch.from_numpy(values(rank, tuple(t.shape), it)))
            check.check(comm.broadcast(t, root) is t, f"torch {name}: broadcast returned another object")
            want = torch.from_numpy(values(root, tuple(t.shape), it)).float()
            check.check(torch.equal(t, want), f"torch {name} broadcast from {root}, call {it}")
check.check(
    {key for key in comm.flow.calls if len(key) > 1 and key[1] == "torch"} - torch_keys, "torch tensors left no plan"
)

# torch replays of the layout corner cases: 0-d, odd strides on size-1 dims (two tensors of one
# layout key with different strides there), empty
weight = torch.empty(4, 3, 1, 1)
odd = torch.empty_strided((4, 3, 1, 1), (3, 1, 7, 5))
for t in (torch.empty(()), weight, odd, torch.empty(0, 3)):
    for it in range(3):
        t.fill_(rank + 1 + it)
        check.check(comm.allreduce(t) is t, f"torch {tuple(t.shape)}: allreduce returned another object")
        check.check(
            bool((t == sum(r + 1 + it for r in range(size))).all()), f"torch {tuple(t.shape)} {t.stride()}, call {it}"
        )
mixed = weight if rank % 2 else odd  # size-1 strides differ across ranks: the same layout
for it in range(3):
    mixed.fill_(rank + it)
    comm.allreduce(mixed)
    check.check(bool((mixed == sum(r + it for r in range(size))).all()), f"mixed size-1 strides, call {it}")

c = torch.zeros(3, 2, dtype=torch.complex64)
comm.allreduce(c)  # plans this geometry
comm.allreduce(c)
check.raises(
    "a conjugated view after planning",
    denseccl.LayoutError if rank == 0 else denseccl.MismatchError,
    lambda: comm.allreduce(c.conj() if rank == 0 else c),
    "conjugate" if rank == 0 else "",
)
p = torch.nn.Parameter(torch.full((3, 2), float(rank + 1)), requires_grad=False)
for _ in range(2):
    p.fill_(rank + 1)
    check.check(comm.allreduce(p) is p and bool((p == size * (size + 1) / 2).all()), "a Parameter")
comm.close()
check.done()
