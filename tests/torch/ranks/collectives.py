"""Every torch.distributed collective over the denseccl backend, on every layout, against
references computed with plain torch from all ranks' inputs. Run with mpiexec -n N (N >= 2)."""

from __future__ import annotations

import itertools

import torch
import torch.distributed as dist
from common import LAYOUTS, like, make, values
from tests.support.checker import Checker

import denseccl
import denseccl.torch as dt

dt.init_process_group()
rank, size = dist.get_rank(), dist.get_world_size()
pg = dist.group.WORLD
check = Checker("torch-collectives", rank, size)
check.check(dist.get_backend() == "denseccl", "backend name")
check.check(isinstance(pg, dt.ProcessGroupDenseCCL), "process group type")

F32, F64, I32 = torch.float32, torch.float64, torch.int32
seeds = itertools.count(1)


def everyone(seed, layout, dtype):
    shape = LAYOUTS[layout][0]
    return [values(seed, r, shape, dtype) for r in range(size)]


def reference(op, inputs):
    stacked = torch.stack([x.double() if x.dtype.is_floating_point else x.long() for x in inputs])
    if op == "sum":
        out = stacked.sum(0)
    elif op == "prod":
        out = stacked.prod(0)
    elif op == "min":
        out = stacked.min(0).values if stacked.dim() > 1 or stacked.numel() else stacked.sum(0)
    elif op == "max":
        out = stacked.max(0).values if stacked.dim() > 1 or stacked.numel() else stacked.sum(0)
    elif op == "avg":
        total = stacked.sum(0)
        out = total / size if inputs[0].dtype.is_floating_point else torch.div(total, size, rounding_mode="trunc")
    else:  # premul_sum with factor 0.25
        out = (stacked * 0.25).sum(0)
    return out.to(inputs[0].dtype)


def min_max(stacked, op):
    return stacked.amin(0) if op == "min" else stacked.amax(0)


def torch_op(op):
    return {
        "sum": dist.ReduceOp.SUM,
        "prod": dist.ReduceOp.PRODUCT,
        "min": dist.ReduceOp.MIN,
        "max": dist.ReduceOp.MAX,
        "avg": dist.ReduceOp.AVG,
        "premul": dist._make_nccl_premul_sum(0.25),
    }[op]


def ref(op, inputs):
    if op in ("min", "max"):
        stacked = torch.stack(inputs)
        return min_max(stacked, op) if stacked.numel() else inputs[0].clone()
    return reference(op, inputs)


# -- all_reduce: every layout, op, sync and async ------------------------------------------------
for layout in LAYOUTS:
    for dtype, ops in (
        (F32, ("sum", "prod", "min", "max", "avg", "premul")),
        (F64, ("sum",)),
        (I32, ("sum", "max", "avg")),
    ):
        for op in ops:
            seed = next(seeds)
            x = make(layout, dtype, seed, rank)
            strides = x.stride()
            async_op = op in ("sum", "max")
            work = dist.all_reduce(x, op=torch_op(op), async_op=async_op)
            if async_op:
                if op == "max":
                    work.get_future().wait()  # completed by the progress thread alone
                    check.check(work.is_completed(), f"is_completed after future, {layout}")
                else:
                    work.wait()
            check.equal(
                f"all_reduce {op} {dtype} {layout}",
                x,
                ref(op, everyone(seed, layout, dtype)),
                strides=strides,
                tol=1e-5,
            )

# a future's value and then-callbacks
seed = next(seeds)
x = make("transposed", F32, seed, rank)
future = dist.all_reduce(x, async_op=True).get_future().then(lambda f: f.value()[0] * 2)
check.equal("future.then", future.wait(), 2 * ref("sum", everyone(seed, "transposed", F32)))

# -- reduce and broadcast --------------------------------------------------------------------
for layout in ("transposed", "channels-last", "permuted", "size-1 strides", "0-d"):
    root = size - 1
    seed = next(seeds)
    x = make(layout, F32, seed, rank)
    original = x.clone()
    strides = x.stride()
    dist.reduce(x, dst=root, op=dist.ReduceOp.SUM)
    want = ref("sum", everyone(seed, layout, F32)) if rank == root else original
    check.equal(f"reduce {layout}", x, want, strides=strides, tol=1e-5)
    seed = next(seeds)
    x = make(layout, F64, seed, rank)
    dist.broadcast(x, src=1, async_op=True).wait()
    check.equal(f"broadcast {layout}", x, everyone(seed, layout, F64)[1], strides=strides)

# -- all_gather into a list: each output keeps its own layout --------------------------------
for layout in ("row-major", "transposed", "channels-last", "permuted", "empty"):
    seed = next(seeds)
    x = make(layout, F32, seed, rank)
    outs = []
    for r in range(size):
        other = list(LAYOUTS)[r % 4]
        shape = LAYOUTS[layout][0]
        if LAYOUTS[other][0] == shape:
            outs.append(LAYOUTS[other][1](shape, F32))
        else:
            outs.append(torch.empty(shape[::-1]).permute(*reversed(range(len(shape)))) if shape else torch.empty(()))
    strides = [o.stride() for o in outs]
    dist.all_gather(outs, x)
    for r, out in enumerate(outs):
        check.equal(f"all_gather {layout} block {r}", out, everyone(seed, layout, F32)[r], strides=strides[r])

# -- all_gather_into_tensor: direct (dim 0 outermost) and staged ------------------------------
stats = lambda: pg.staged_operations  # noqa: E731


def gather_case(name, inp, out, want_staged):
    before = stats()
    strides = out.stride()
    dist.all_gather_into_tensor(out, inp)
    return strides, stats() - before == int(want_staged)


seed = next(seeds)
inputs = [values(seed, r, (2, 3), F32) for r in range(size)]
concat = torch.cat(inputs)
cases = [
    ("contiguous", like(torch.empty(2, 3), inputs[rank]), torch.empty(2 * size, 3), False),
    ("stacked shape", like(torch.empty(2, 3), inputs[rank]), torch.empty(size, 2, 3), False),
    ("transposed output", like(torch.empty(2, 3), inputs[rank]), torch.empty(3, 2 * size).t(), True),
    ("transposed input", like(torch.empty(3, 2).t(), inputs[rank]), torch.empty(2 * size, 3), True),
]
for name, inp, out, staged in cases:
    strides, as_planned = gather_case(name, inp, out, staged)
    want = concat if out.shape[0] == 2 * size else concat.view(size, 2, 3)
    check.equal(f"all_gather_into_tensor {name}", out, want, strides=strides)
    check.check(as_planned, f"all_gather_into_tensor {name}: staged={staged}")
# channels-last input and output: dim 0 is outermost, so the blocks are spans (no staging)
seed = next(seeds)
inputs = [values(seed, r, (2, 3, 4, 5), F32) for r in range(size)]
inp = like(torch.empty(2, 3, 4, 5).to(memory_format=torch.channels_last), inputs[rank])
out = torch.empty(2 * size, 3, 4, 5).to(memory_format=torch.channels_last)
strides, as_planned = gather_case("channels-last", inp, out, False)
check.equal("all_gather_into_tensor channels-last", out, torch.cat(inputs), strides=strides)
check.check(as_planned, "all_gather_into_tensor channels-last is direct")
# in place: the input is the output's own block (FSDP's pattern)
seed = next(seeds)
inputs = [values(seed, r, (4,), F32) for r in range(size)]
out = torch.empty(4 * size)
out[4 * rank : 4 * rank + 4].copy_(inputs[rank])
dist.all_gather_into_tensor(out, out[4 * rank : 4 * rank + 4])
check.equal("all_gather_into_tensor in place", out, torch.cat(inputs))

# -- reduce_scatter_tensor: direct and staged ------------------------------------------------
for op in ("sum", "avg", "premul"):
    seed = next(seeds)
    full = [values(seed, r, (2 * size, 3), F32) for r in range(size)]
    want = ref(op, full)[2 * rank : 2 * rank + 2]
    for name, inp, out, staged in (
        ("contiguous", like(torch.empty(2 * size, 3), full[rank]), torch.empty(2, 3), False),
        ("stacked shape", like(torch.empty(size, 2, 3), full[rank].view(size, 2, 3)), torch.empty(2, 3), False),
        ("transposed input", like(torch.empty(3, 2 * size).t(), full[rank]), torch.empty(3, 2).t(), True),
        ("transposed output", like(torch.empty(2 * size, 3), full[rank]), torch.empty(3, 2).t(), True),
    ):
        before = stats()
        strides = out.stride()
        dist.reduce_scatter_tensor(out, inp, op=torch_op(op))
        check.equal(f"reduce_scatter_tensor {op} {name}", out, want, strides=strides, tol=1e-5)
        check.check(stats() - before == int(staged), f"reduce_scatter_tensor {name}: staged={staged}")
seed = next(seeds)
full = [values(seed, r, (2 * size, 3, 4, 5), F64) for r in range(size)]
inp = like(torch.empty(2 * size, 3, 4, 5).to(memory_format=torch.channels_last), full[rank])
out = torch.empty(2, 3, 4, 5).to(memory_format=torch.channels_last)
before = stats()
dist.reduce_scatter_tensor(out, inp)
check.equal("reduce_scatter_tensor channels-last", out, ref("sum", full)[2 * rank : 2 * rank + 2], strides=out.stride())
check.check(stats() == before, "reduce_scatter_tensor channels-last is direct")
# output aliasing the input's own block
seed = next(seeds)
full = [values(seed, r, (3 * size,), F32) for r in range(size)]
inp = full[rank].clone()
dist.reduce_scatter_tensor(inp[3 * rank : 3 * rank + 3], inp)
check.equal("reduce_scatter_tensor in place", inp[3 * rank : 3 * rank + 3], ref("sum", full)[3 * rank : 3 * rank + 3])

# -- reduce_scatter with lists ---------------------------------------------------------------
seed = next(seeds)
pieces = {r: [values(seed * 31 + j, r, (3, 5), F32) for j in range(size)] for r in range(size)}
inputs = [like(torch.empty(5, 3).t() if j % 2 else torch.empty(3, 5), pieces[rank][j]) for j in range(size)]
out = torch.empty(5, 3).t()
dist.reduce_scatter(out, inputs, op=dist.ReduceOp.MAX)
check.equal("reduce_scatter list", out, torch.stack([pieces[r][rank] for r in range(size)]).amax(0), strides=(1, 3))

# -- coalesced: all_reduce_coalesced and the coalescing manager ------------------------------
seed = next(seeds)
tensors = [
    make(layout, dtype, seed + k, rank)
    for k, (layout, dtype) in enumerate((("transposed", F32), ("channels-last", F64), ("permuted", F32), ("0-d", F32)))
]
strides = [t.stride() for t in tensors]
import denseccl.agreement as communicator_module  # noqa: E402 - counts the agreement steps below

agreed = []
real_agree = communicator_module.digest  # agree digests the descriptor of each step given no digest
communicator_module.digest = lambda descriptor: (agreed.append(descriptor.collective), real_agree(descriptor))[1]
try:
    with dist._coalescing_manager(async_ops=True) as manager:
        for t in tensors:
            dist.all_reduce(t)
    manager.wait()
finally:
    communicator_module.digest = real_agree
check.check(
    agreed == ["allreduce_coalesced"], f"one agreement step covers a coalesced all_reduce (two buckets): {agreed}"
)
for k, (t, (layout, dtype)) in enumerate(
    zip(tensors, (("transposed", F32), ("channels-last", F64), ("permuted", F32), ("0-d", F32)))
):
    check.equal(
        f"coalesced all_reduce {layout}", t, ref("sum", everyone(seed + k, layout, dtype)), strides=strides[k], tol=1e-5
    )
seed = next(seeds)
pairs = []
with dist._coalescing_manager():
    for k in range(3):
        inp = like(torch.empty(2, 3), values(seed + k, rank, (2, 3), F32))
        out = torch.empty(2 * size, 3)
        pairs.append((out, seed + k))
        dist.all_gather_into_tensor(out, inp)
for out, s in pairs:
    check.equal("coalesced all_gather_into_tensor", out, torch.cat([values(s, r, (2, 3), F32) for r in range(size)]))
seed = next(seeds)
pairs = []
with dist._coalescing_manager():
    for k in range(2):
        full = like(torch.empty(2 * size, 3), values(seed + k, rank, (2 * size, 3), F32))
        out = torch.empty(2, 3)
        pairs.append((out, seed + k))
        dist.reduce_scatter_tensor(out, full)
for out, s in pairs:
    want = ref("sum", [values(s, r, (2 * size, 3), F32) for r in range(size)])[2 * rank : 2 * rank + 2]
    check.equal("coalesced reduce_scatter_tensor", out, want, tol=1e-5)

# -- errors: gapped tensors and layouts that differ across ranks ----------------------------
gapped = torch.arange(10.0)[::2]
check.raises(
    "gapped tensor on every rank",
    denseccl.LayoutError,
    lambda: dist.all_reduce(gapped),
    "not non-overlapping and dense",
)
x = torch.ones(6)[::2] if rank == 0 else torch.ones(3)
error = check.raises(
    "gapped tensor on rank 0", (denseccl.LayoutError, denseccl.MismatchError), lambda: dist.all_reduce(x)
)
check.check(
    isinstance(error, denseccl.LayoutError if rank == 0 else denseccl.MismatchError),
    f"rank 0 gets LayoutError, others MismatchError ({type(error).__name__})",
)
x = make("row-major" if rank == 0 else "transposed", F32, 99, rank)
kept = x.clone()
check.raises("layout mismatch all_reduce", denseccl.MismatchError, lambda: dist.all_reduce(x), "mismatch")
check.equal("mismatch leaves the tensor", x, kept)
inp = like(torch.empty(2, 3) if rank == 0 else torch.empty(3, 2).t(), values(5, rank, (2, 3), F32))
out = torch.full((2 * size, 3), -1.0)
check.raises(
    "layout mismatch all_gather_into_tensor",
    denseccl.MismatchError,
    lambda: dist.all_gather_into_tensor(out, inp),
    "mismatch",
)
check.check(bool((out == -1).all()), "mismatch leaves the output")
inp = like(torch.empty(2 * size, 3) if rank == 0 else torch.empty(3, 2 * size).t(), values(6, rank, (2 * size, 3), F32))
out = torch.full((2, 3), -1.0)
check.raises(
    "layout mismatch reduce_scatter_tensor",
    denseccl.MismatchError,
    lambda: dist.reduce_scatter_tensor(out, inp),
    "mismatch",
)
check.check(bool((out == -1).all()), "mismatch leaves the reduce_scatter output")
pair = [make("channels-last", F32, 8, rank), make("row-major" if rank == 0 else "transposed", F32, 9, rank)]
kept = [t.clone() for t in pair]
check.raises(
    "layout mismatch in all_reduce_coalesced",
    denseccl.MismatchError,
    lambda: pg.allreduce_coalesced(pair).wait(),
    "mismatch",
)
check.check(all(torch.equal(a, b) for a, b in zip(pair, kept)), "coalesced mismatch leaves the tensors")
pair = [torch.ones(4), torch.ones(8)[::2] if rank == 0 else torch.ones(4)]
error = check.raises(
    "gapped tensor in all_reduce_coalesced on rank 0",
    (denseccl.LayoutError, denseccl.MismatchError),
    lambda: pg.allreduce_coalesced(pair).wait(),
)
check.check(
    isinstance(error, denseccl.LayoutError if rank == 0 else denseccl.MismatchError),
    f"coalesced: rank 0 LayoutError, others MismatchError ({type(error).__name__})",
)
check.raises(
    "unsupported op",
    denseccl.OpError,
    lambda: dist.all_reduce(torch.ones(2, dtype=torch.int32), op=dist.ReduceOp.BAND),
    "not supported",
)
outs = [torch.empty(2) for _ in range(size + (rank == 0))]
error = check.raises(
    "all_gather list with one tensor too many on rank 0",
    (denseccl.ArgumentError, denseccl.MismatchError),
    lambda: dist.all_gather(outs, torch.ones(2)),
)
check.check(
    isinstance(error, denseccl.ArgumentError if rank == 0 else denseccl.MismatchError),
    f"list length: rank 0 ArgumentError, others MismatchError ({type(error).__name__})",
)
outs = [torch.empty(2) for _ in range(size)] if rank else [torch.empty(3) for _ in range(size)]
check.raises(
    "all_gather list with wrong shapes on rank 0",
    (denseccl.LayoutError, denseccl.MismatchError),
    lambda: dist.all_gather(outs, torch.ones(2)),
)
# the group is still usable
x = make("channels-last", F32, 7, rank)
dist.all_reduce(x)
check.equal("usable after errors", x, ref("sum", everyone(7, "channels-last", F32)), tol=1e-5)

# -- all-to-all, point-to-point, gather, scatter, objects ------------------------------------
splits_in = [(rank + j) % 3 + 1 for j in range(size)]
splits_out = [(r + rank) % 3 + 1 for r in range(size)]
rows = {r: values(40 + r, r, (sum((r + j) % 3 + 1 for j in range(size)), 4), F32) for r in range(size)}
inp = like(torch.empty(4, rows[rank].shape[0]).t(), rows[rank])
out = torch.empty(4, sum(splits_out)).t()
dist.all_to_all_single(out, inp, splits_out, splits_in)
want = []
for r in range(size):
    start = sum((r + j) % 3 + 1 for j in range(rank))
    want.append(rows[r][start : start + (r + rank) % 3 + 1])
check.equal("all_to_all_single uneven, transposed", out, torch.cat(want), strides=out.stride())
# rows that lie alike on every rank (dim 0 outermost, the row's dims swapped): the spans move as
# they lie; one rank whose output lies otherwise makes every rank stage them row-major
for mixed in (False, True):
    seed = next(seeds)
    blocks = {r: values(seed, r, (2 * size, 4, 5), F32) for r in range(size)}
    inp = like(torch.empty(2 * size, 5, 4).transpose(1, 2), blocks[rank])
    out = torch.empty(2 * size, 4, 5) if mixed and rank == 0 else torch.empty(2 * size, 5, 4).transpose(1, 2)
    dist.all_to_all_single(out, inp)
    want = torch.cat([blocks[r][2 * rank : 2 * rank + 2] for r in range(size)])
    check.equal(f"all_to_all_single rows swapped alike (one rank row-major: {mixed})", out, want, strides=out.stride())
seed = next(seeds)
ins = [values(seed + rank * size + j, rank, (2, j + 1), F32) for j in range(size)]
outs = [torch.empty(2, rank + 1) for _ in range(size)]
dist.all_to_all(outs, ins)
for r in range(size):
    check.equal(f"all_to_all from {r}", outs[r], values(seed + r * size + rank, r, (2, rank + 1), F32))

seed = next(seeds)
if rank == 0:
    dist.send(make("transposed", F32, seed, 0), dst=1)
    dist.send(make("channels-last", F64, seed, 0), dst=1, tag=3)
elif rank == 1:
    x = make("row-major", F32, 0, 1)
    dist.recv(x, src=0)
    check.equal("send transposed -> recv row-major", x, values(seed, 0, (3, 5), F32), strides=(5, 1))
    y = make("permuted", F64, 0, 1)
    source = dist.recv(y, tag=3)  # from any source
    check.equal("recv from any source", y, values(seed, 0, (2, 3, 4, 5), F64), strides=y.stride())
    check.check(source == 0, f"recv any source reports rank 0 (got {source})")
# receive buffers as torch.distributed.pipelining makes them: the sender's strides, a leaf that
# requires grad (a copy into it under autograd raised "a leaf Variable that requires grad")
seed = next(seeds)
if rank == 0:
    dist.send(values(seed, 0, (2, 4), F32), dst=1, tag=7)
    dist.send(values(seed + 1, 0, (2, 3, 4, 5), F32).contiguous(memory_format=torch.channels_last), dst=1, tag=8)
elif rank == 1:
    leaf = torch.empty_strided((2, 4), (1, 2)).requires_grad_(True)
    dist.recv(leaf, src=0, tag=7)
    check.equal("recv into a column-major leaf that requires grad", leaf.detach(), values(seed, 0, (2, 4), F32),
                strides=(1, 2))
    image = torch.empty((2, 3, 4, 5), memory_format=torch.channels_last).requires_grad_(True)
    work = dist.irecv(image, src=0, tag=8)
    work.wait()
    check.equal("irecv into a channels-last leaf that requires grad", image.detach(),
                values(seed + 1, 0, (2, 3, 4, 5), F32), strides=image.stride())
    check.check(image.requires_grad and image.is_leaf and image.grad_fn is None, "the leaf is still a leaf")
ops = []
right, left = (rank + 1) % size, (rank - 1) % size
outgoing = make("channels-last", F32, seed + 1, rank)
incoming = make("permuted", F32, 0, rank)
ops = [dist.P2POp(dist.isend, outgoing, right), dist.P2POp(dist.irecv, incoming, left)]
for work in dist.batch_isend_irecv(ops):
    work.wait()
check.equal("batch_isend_irecv ring", incoming, values(seed + 1, left, (2, 3, 4, 5), F32))

seed = next(seeds)
x = make("transposed", F32, seed, rank)
gathered = [torch.empty(3, 5) for _ in range(size)] if rank == 0 else None
dist.gather(x, gathered, dst=0)
if rank == 0:
    for r in range(size):
        check.equal(f"gather block {r}", gathered[r], values(seed, r, (3, 5), F32))
seed = next(seeds)
out = make("transposed", F32, 0, rank)
pieces = [values(seed, r, (3, 5), F32) for r in range(size)] if rank == 0 else None
dist.scatter(out, pieces, src=0)
check.equal("scatter", out, values(seed, rank, (3, 5), F32), strides=out.stride())

objects = [None] * size
dist.all_gather_object(objects, {"rank": rank})
check.check(objects == [{"rank": r} for r in range(size)], "all_gather_object")
message = [f"from {rank}"]
dist.broadcast_object_list(message, src=0)
check.check(message == ["from 0"], "broadcast_object_list")

# -- subgroups map to MPI sub-communicators --------------------------------------------------
members = list(range(1, size))
sub = dist.new_group(members, backend="denseccl")
if rank in members:
    x = make("channels-last", F32, 77, rank)
    dist.all_reduce(x, group=sub)
    check.equal("subgroup all_reduce", x, ref("sum", [values(77, r, (2, 3, 4, 5), F32) for r in members]), tol=1e-5)
    y = make("transposed", F32, 78, rank)
    dist.broadcast(y, group_src=0, group=sub)
    check.equal("subgroup broadcast from group rank 0", y, values(78, members[0], (3, 5), F32))

# -- DDP-like bursts: async bfloat16 all_reduces of 2 MiB, issued after compute of a different
# length on each rank, completed by the progress thread; every result checked ----------------
import random  # noqa: E402
import time  # noqa: E402

jitter = random.Random(rank)
for iteration in range(30):
    a = torch.full((1 << 20,), rank + 1.0, dtype=torch.bfloat16)
    b = torch.full((1 << 20,), 10.0 * (rank + 1), dtype=torch.bfloat16)
    first = dist.all_reduce(a, async_op=True)
    until = time.perf_counter() + jitter.random() * 0.004
    while time.perf_counter() < until:
        pass
    second = dist.all_reduce(b, async_op=True)
    first.wait()
    second.wait()
    total = size * (size + 1) / 2
    if not (bool((a == total).all()) and bool((b == 10 * total).all())):
        check.check(False, f"async bfloat16 burst {iteration}: {a.unique().tolist()[:3]} {b.unique().tolist()[:3]}")
        break
else:
    check.check(True, "async bfloat16 bursts")

dist.barrier()
dist.barrier(async_op=True).wait()
dist.destroy_process_group()
check.done()
