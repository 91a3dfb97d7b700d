"""Rank program: repeated calls (prepared calls, denseccl/calls.py) behave exactly like
first calls: right results on every layout and op, and every rank raises on a mismatch, a
read-only input or a changed geometry after a plan exists; the communicator stays usable."""

from __future__ import annotations

import numpy as np

import denseccl

comm = denseccl.init()
rank, size = comm.rank, comm.size


def layouts(shape=(2, 3, 4, 5), dtype=np.float32):
    base = np.empty(shape, dtype)
    yield "contiguous", base
    yield "channels_last", np.empty((2, 4, 5, 3), dtype).transpose(0, 3, 1, 2)
    yield "reversed", np.empty(shape, dtype)[::-1, :, ::-1, :]
    yield "transposed", np.empty(shape[::-1], dtype).T


def values(r, shape, salt=0):
    return ((np.arange(int(np.prod(shape))).reshape(shape) * 3 + r * 7 + salt) % 11 - 5).astype(np.float64)


for check in (True, False):
    comm.check = check
    for name, x in layouts():
        for op, combine in (("sum", np.add), ("max", np.maximum), ("avg", None), ("prod", np.multiply)):
            for it in range(3):  # first call plans, the next ones replay
                x[...] = values(rank, x.shape, it)
                got = comm.allreduce(x, op)
                assert got is x
                stack = np.stack([values(r, x.shape, it) for r in range(size)])
                want = stack.mean(0) if op == "avg" else combine.reduce(stack, 0)
                assert np.allclose(x, want), (name, op, it)
        for root in range(size):
            for it in range(3):
                x[...] = values(rank, x.shape, it)
                comm.reduce(x, root, "sum")
                want = sum(values(r, x.shape, it) for r in range(size)) if rank == root else values(rank, x.shape, it)
                assert np.array_equal(x, want), (name, "reduce", root, it)
                x[...] = values(rank, x.shape, it)
                comm.broadcast(x, root)
                assert np.array_equal(x, values(root, x.shape, it)), (name, "broadcast", root, it)
    for dtype in (np.float16, np.int32):
        x = np.empty((4, 6), dtype).T
        for it in range(3):
            x[...] = values(rank, x.shape, it)
            comm.allreduce(x)
            assert np.array_equal(x, sum(values(r, x.shape, it) for r in range(size))), dtype
assert comm.flow.calls, "repeated calls left no plan"

# after a plan exists, disagreement still raises on every rank and the communicator survives
comm.check = True
x = np.zeros((3, 8), np.float32)
comm.allreduce(x, "sum")
comm.allreduce(x, "max")
try:
    comm.allreduce(x, "sum" if rank == 0 else "max")
except denseccl.MismatchError as error:
    assert "op" in str(error)
else:
    raise AssertionError("no MismatchError for different ops after planning")

y = np.zeros((3, 8), np.float32)
if rank == 0:
    y.flags.writeable = False
try:
    comm.allreduce(y)
except denseccl.LayoutError:
    assert rank == 0
except denseccl.MismatchError:
    assert rank != 0
else:
    raise AssertionError("a read-only input after planning did not raise")

z = np.zeros((3, 8), np.float32) if rank else np.zeros((8, 3), np.float32).T
try:
    comm.allreduce(z)
except denseccl.MismatchError as error:
    assert "layout" in str(error)
else:
    raise AssertionError("different layouts after planning did not raise")

for _ in range(2):
    x[...] = rank + 1
    comm.allreduce(x)
    assert np.all(x == size * (size + 1) / 2)

# plain CPU torch tensors replay plans too; a conjugated or negated view of the same geometry,
# or a tensor subclass, takes the full path (and is refused or served by it)
import torch  # noqa: E402

torch_keys = {key for key in comm.flow.calls if len(key) > 1 and key[1] == "torch"}
for name, x in layouts():
    t = torch.from_numpy(x) if name != "reversed" else torch.empty(2, 3, 4, 5)  # torch has no negative strides
    for it in range(3):
        t.copy_(torch.from_numpy(values(rank, tuple(t.shape), it)))
        assert comm.allreduce(t, "sum") is t
        assert torch.equal(t, torch.from_numpy(sum(values(r, tuple(t.shape), it) for r in range(size))).float()), (
            name,
            it,
        )
        for root in range(size):
            t.copy_(torch.from_numpy(values(rank, tuple(t.shape), it)))
            assert comm.reduce(t, root, "max") is t
            want = (
                np.maximum.reduce([values(r, tuple(t.shape), it) for r in range(size)])
                if rank == root
                else values(rank, tuple(t.shape), it)
            )
            assert torch.equal(t, torch.from_numpy(want).float()), (name, "reduce", root, it)
            t.copy_(torch.from_numpy(values(rank, tuple(t.shape), it)))
            assert comm.broadcast(t, root) is t
            assert torch.equal(t, torch.from_numpy(values(root, tuple(t.shape), it)).float()), (
                name, "broadcast", root, it,
            )
assert {key for key in comm.flow.calls if len(key) > 1 and key[1] == "torch"} - torch_keys, "torch tensors left no plan"

# torch replays of the layout corner cases: 0-d, odd strides on size-1 dims (two tensors of one
# layout key with different strides there), empty
weight = torch.empty(4, 3, 1, 1)
odd = torch.empty_strided((4, 3, 1, 1), (3, 1, 7, 5))
for t in (torch.empty(()), weight, odd, torch.empty(0, 3)):
    for it in range(3):
        t.fill_(rank + 1 + it)
        assert comm.allreduce(t) is t
        assert bool((t == sum(r + 1 + it for r in range(size))).all()), (tuple(t.shape), t.stride(), it)
mixed = weight if rank % 2 else odd  # size-1 strides differ across ranks: the same layout
for it in range(3):
    mixed.fill_(rank + it)
    comm.allreduce(mixed)
    assert bool((mixed == sum(r + it for r in range(size))).all()), ("mixed size-1 strides", it)

c = torch.zeros(3, 2, dtype=torch.complex64)
comm.allreduce(c)  # plans this geometry
comm.allreduce(c)
try:
    comm.allreduce(c.conj() if rank == 0 else c)
except denseccl.LayoutError as error:
    assert rank == 0 and "conjugate" in str(error)
except denseccl.MismatchError:
    assert rank != 0
else:
    raise AssertionError("a conjugated view after planning did not raise")
p = torch.nn.Parameter(torch.full((3, 2), float(rank + 1)), requires_grad=False)
for _ in range(2):
    p.fill_(rank + 1)
    assert comm.allreduce(p) is p and bool((p == size * (size + 1) / 2).all())
comm.close()
print(f"rank {rank}: plans OK", flush=True)
