"""The modern torch stack over the denseccl backend on the CPU, each result checked against a
reference that plain torch computes alone (from every rank's inputs, or a model trained in one
process with the same seed and data):

- both spellings of the single-tensor collectives (``all_gather_single`` /
  ``all_gather_into_tensor``, ``reduce_scatter_single`` / ``reduce_scatter_tensor``, and the
  private ``_all_gather_base`` / ``_reduce_scatter_base`` torch also deprecates), in the
  concatenated and stacked forms, on channels-last and permuted tensors, synchronous, async and
  coalesced, with the functional all_to_all_single; no deprecation besides the program's own
  calls of the old names, and no warning from denseccl's code;
- on 2 ranks: a 1-D DeviceMesh, DTensor (Shard on every dim of a channels-last tensor, even
  and uneven, resharding, Partial -> Replicate and -> Shard), tensor parallel
  (``ColwiseParallel`` / ``RowwiseParallel``) training, sequence parallel with
  ``loss_parallel``, and FSDP2 (``fully_shard``) training;
- on 4 ranks: a 2x2 DeviceMesh, DTensor on both mesh dims, HSDP (FSDP2 on the 2-D mesh), and
  FSDP2 over one mesh dim with tensor parallel over the other.

Run with mpiexec -n N or torchrun --nproc-per-node N, N = 2 or 4."""

from __future__ import annotations

import itertools
import os
import warnings

import torch
import torch.distributed as dist
from common import LAYOUTS, init, like, make, values
from tests.support.checker import Checker
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
from torch.distributed._functional_collectives import all_to_all_single
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    SequenceParallel,
    loss_parallel,
    parallelize_module,
)

import denseccl

# every warning from here on, whatever PYTHONWARNINGS says: the program's own calls of a
# deprecated spelling are accounted for, so another deprecation came from the backend's (or
# torch's) code
recorder = warnings.catch_warnings(record=True)
caught = recorder.__enter__()
warnings.simplefilter("always")
init()
rank, size = dist.get_rank(), dist.get_world_size()
check = Checker(f"torch-stack-{size}", rank, size)
torch.set_num_threads(1)
CL = torch.channels_last
seeds = itertools.count(1)
GATHERS = ("all_gather_single", "all_gather_into_tensor", "_all_gather_base")
SCATTERS = ("reduce_scatter_single", "reduce_scatter_tensor", "_reduce_scatter_base")
DEPRECATED = {name: names[0] for names in (GATHERS, SCATTERS) for name in names[1:]}  # old name -> successor
DEPRECATIONS = (DeprecationWarning, PendingDeprecationWarning, FutureWarning)
PACKAGE = os.path.dirname(denseccl.__file__)
own_warnings: list = []  # the FutureWarnings of the program's own deprecated calls


def warns(what: str, name: str, start: int) -> None:
    """The call of ``name`` that began when ``caught`` held ``start`` warnings warned only as
    torch deprecates ``name`` (once, naming its successor), or not at all for a current name."""
    new = [f"{w.category.__name__}: {w.message}" for w in caught[start:]]
    if name in DEPRECATED:
        own_warnings.extend(caught[start:])
        check.check(len(new) == 1 and "FutureWarning" in new[0] and DEPRECATED[name] in new[0],
                    f"{what}: one FutureWarning naming {DEPRECATED[name]}, got {new}")
    else:
        check.check(not new, f"{what}: warnings {new}")


# -- both spellings of the single-tensor collectives --------------------------------------

def in_order(shape, order) -> torch.Tensor:
    """An empty tensor of logical ``shape`` whose dims lie in memory in ``order`` (outermost first)."""
    physical = torch.empty(tuple(shape[d] for d in order))
    return physical.permute(*(order.index(d) for d in range(len(shape))))


def memory_order(layout: str) -> list:
    """The dims of ``layout``'s tensor, outermost in memory first."""
    block = LAYOUTS[layout][1](LAYOUTS[layout][0], torch.float32)
    return sorted(range(block.dim()), key=lambda d: -block.stride(d))


def stacked_output(layout: str, blocks: int) -> torch.Tensor:
    """(blocks, *shape) whose blocks have ``layout``'s memory order, dim 0 outermost."""
    shape = LAYOUTS[layout][0]
    return in_order((blocks, *shape), [0, *(1 + d for d in memory_order(layout))])


def concatenated(layout: str, blocks: int) -> torch.Tensor:
    """(blocks * d0, ...) in ``layout``'s memory order (dim 0 not outermost for "permuted")."""
    shape = LAYOUTS[layout][0]
    return in_order((blocks * shape[0], *shape[1:]), memory_order(layout))


def spellings() -> None:
    gathers = {name: getattr(dist, name) for name in GATHERS}
    scatters = {name: getattr(dist, name) for name in SCATTERS}
    for layout, form, async_op in itertools.product(("channels-last", "permuted"), ("concat", "stack"), (False, True)):
        shape = LAYOUTS[layout][0]
        out_of = stacked_output if form == "stack" else concatenated
        join = torch.stack if form == "stack" else torch.cat
        for name, call in gathers.items():
            what = f"{name} {layout} {form}{' async' if async_op else ''}"
            seed = next(seeds)
            out, inp, start = out_of(layout, size), make(layout, torch.float32, seed, rank), len(caught)
            work = call(out, inp, async_op=async_op)
            if async_op:
                work.wait()
            warns(what, name, start)
            want = join([values(seed, r, shape, torch.float32) for r in range(size)])
            check.equal(what, out, want, strides=out.stride())
        for name, call in scatters.items():
            what = f"{name} {layout} {form}{' async' if async_op else ''}"
            seed = next(seeds)
            inp = out_of(layout, size)
            full = torch.stack([values(seed, r, inp.shape, torch.float64) for r in range(size)])
            inp.copy_(full[rank])
            out, start = make(layout, torch.float32, 0, rank), len(caught)
            work = call(out, inp, async_op=async_op)
            if async_op:
                work.wait()
            warns(what, name, start)
            total = full.sum(0)
            want = total[rank] if form == "stack" else total[rank * shape[0] : (rank + 1) * shape[0]]
            check.equal(what, out, want, strides=out.stride(), tol=1e-5)

    # coalesced: torch's coalescing manager hands the backend one call for the whole batch
    seed = next(seeds)
    outs = [concatenated("channels-last", size), stacked_output("permuted", size)]
    ins = [make("channels-last", torch.float32, seed, rank), make("permuted", torch.float32, seed + 1, rank)]
    with dist._coalescing_manager(async_ops=True) as manager:
        for out, inp in zip(outs, ins):
            dist.all_gather_single(out, inp)
    manager.wait()
    shape = LAYOUTS["channels-last"][0]
    check.equal("coalesced all_gather_single, channels-last", outs[0],
                torch.cat([values(seed, r, shape, torch.float32) for r in range(size)]), strides=outs[0].stride())
    check.equal("coalesced all_gather_single, permuted", outs[1],
                torch.stack([values(seed + 1, r, shape, torch.float32) for r in range(size)]), strides=outs[1].stride())
    seed = next(seeds)
    ins = [concatenated("channels-last", size), stacked_output("permuted", size)]
    fulls = [torch.stack([values(seed + i, r, t.shape, torch.float64) for r in range(size)]) for i, t in enumerate(ins)]
    for t, full in zip(ins, fulls):
        t.copy_(full[rank])
    outs = [make("channels-last", torch.float32, 0, rank), make("permuted", torch.float32, 0, rank)]
    with dist._coalescing_manager(async_ops=True) as manager:
        for out, inp in zip(outs, ins):
            dist.reduce_scatter_single(out, inp)
    manager.wait()
    check.equal("coalesced reduce_scatter_single, channels-last", outs[0],
                fulls[0].sum(0)[2 * rank : 2 * rank + 2], strides=outs[0].stride(), tol=1e-5)
    check.equal("coalesced reduce_scatter_single, permuted", outs[1], fulls[1].sum(0)[rank],
                strides=outs[1].stride(), tol=1e-5)


# -- DeviceMesh and DTensor -----------------------------------------------------------------

def global_tensor(seed: int, shape) -> torch.Tensor:
    """The same channels-last tensor on every rank."""
    return like(torch.empty(shape).to(memory_format=CL), values(seed, 0, shape, torch.float32))


def chunk(t: torch.Tensor, dim: int, parts: int, index: int) -> torch.Tensor:
    """torch's sharding rule (``torch.chunk``; trailing ranks may get less, or nothing)."""
    pieces = torch.chunk(t, parts, dim)
    return pieces[index] if index < len(pieces) else t.narrow(dim, 0, 0)


def mesh_checks(mesh, name: str) -> None:
    for dim in range(mesh.ndim):
        group = mesh.get_group(dim)
        check.check(dist.get_backend(group) == "denseccl", f"{name} dim {dim}: backend {dist.get_backend(group)}")
        members = dist.get_process_group_ranks(group)
        check.check(rank in members and len(members) == mesh.size(dim), f"{name} dim {dim}: members {members}")
        x = torch.full((2, 3), float(rank + 1))
        dist.all_reduce(x, group=group)
        check.equal(f"{name} dim {dim}: all_reduce", x, torch.full((2, 3), float(sum(m + 1 for m in members))))


def dtensor_1d(mesh) -> None:
    for shape in ((4, 6, 2, 8), (3, 5, 3, 7)):  # even, then uneven on every dim
        seed = next(seeds)
        x = global_tensor(seed, shape)
        for dim in range(4):
            what = f"DTensor Shard({dim}) of channels-last {shape}"
            d = distribute_tensor(x, mesh, [Shard(dim)])
            check.equal(f"{what}: local shard", d.to_local(), chunk(x, dim, size, rank))
            check.equal(f"{what}: full_tensor", d.full_tensor(), x)
            check.equal(f"{what}: -> Replicate", d.redistribute(mesh, [Replicate()]).to_local(), x)
            other = (dim + 1) % 4
            check.equal(f"{what}: -> Shard({other})", d.redistribute(mesh, [Shard(other)]).to_local(),
                        chunk(x, other, size, rank))
            check.equal(f"{what}: sum()", d.sum().full_tensor(), x.double().sum(), tol=1e-4)
    seed = next(seeds)
    shape = (2, 4, 3, 6)
    local = like(torch.empty(shape).to(memory_format=CL), values(seed, rank, shape, torch.float32))
    total = torch.stack([values(seed, r, shape, torch.float64) for r in range(size)]).sum(0)
    partial = DTensor.from_local(local, mesh, [Partial()])
    check.equal("DTensor Partial -> Replicate", partial.redistribute(mesh, [Replicate()]).to_local(), total, tol=1e-5)
    for dim in range(4):
        check.equal(f"DTensor Partial -> Shard({dim})", partial.redistribute(mesh, [Shard(dim)]).to_local(),
                    chunk(total, dim, size, rank), tol=1e-5)
    averaged = DTensor.from_local(local, mesh, [Partial("avg")]).full_tensor()
    check.equal("DTensor Partial(avg) full_tensor", averaged, total / size, tol=1e-5)
    largest = DTensor.from_local(local, mesh, [Partial("max")]).full_tensor()
    every = torch.stack([values(seed, r, shape, torch.float32) for r in range(size)])
    check.equal("DTensor Partial(max) full_tensor", largest, every.amax(0), strides=largest.stride())


def dtensor_2d(mesh) -> None:
    coordinate = mesh.get_coordinate()
    seed = next(seeds)
    shape = (4, 6, 2, 5)
    x = global_tensor(seed, shape)
    for a, b in itertools.permutations(range(4), 2):
        what = f"DTensor [Shard({a}), Shard({b})] of channels-last {shape}"
        d = distribute_tensor(x, mesh, [Shard(a), Shard(b)])
        want = chunk(chunk(x, a, mesh.size(0), coordinate[0]), b, mesh.size(1), coordinate[1])
        check.equal(f"{what}: local shard", d.to_local(), want)
        check.equal(f"{what}: full_tensor", d.full_tensor(), x)
    d = distribute_tensor(x, mesh, [Shard(1), Shard(1)])
    check.equal("DTensor [Shard(1), Shard(1)]: full_tensor", d.full_tensor(), x)
    # partial sums over mesh dim 0, the same value along mesh dim 1 (Replicate)
    local = like(torch.empty(shape).to(memory_format=CL), values(seed + 1, coordinate[0], shape, torch.float32))
    partial = DTensor.from_local(local, mesh, [Partial(), Replicate()])
    total = torch.stack([values(seed + 1, i, shape, torch.float64) for i in range(mesh.size(0))]).sum(0)
    replicated = partial.redistribute(mesh, [Replicate(), Replicate()]).to_local()
    check.equal("DTensor [Partial, Replicate] -> Replicate", replicated, total, tol=1e-5)
    check.equal("DTensor [Partial, Replicate] -> [Shard(1), Shard(3)]",
                partial.redistribute(mesh, [Shard(1), Shard(3)]).to_local(),
                chunk(chunk(total, 1, mesh.size(0), coordinate[0]), 3, mesh.size(1), coordinate[1]), tol=1e-5)


# -- training: tensor parallel, FSDP2, both ----------------------------------------------------

class Net(nn.Module):
    """Three linear layers, the last in float64 (FSDP2 then shards parameters of two dtypes)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.up, self.down = nn.Linear(8, 16), nn.Linear(16, 8)
        self.head = nn.Linear(8, 4, dtype=torch.float64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.down(torch.relu(self.up(x)))).double())


PLAN = {"up": ColwiseParallel(), "down": RowwiseParallel(), "head": ColwiseParallel(output_layouts=Replicate())}
STEPS, BATCH = 3, 4


def train(model: nn.Module, slices: int = 1, index: int = 0) -> None:
    """SGD with momentum on the mean square of the outputs; the batch is cut into ``slices``
    and this rank trains on slice ``index`` (data parallel: the mean of the slices' means is
    the whole batch's)."""
    generator = torch.Generator().manual_seed(5)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    per = BATCH // slices
    for _ in range(STEPS):
        x = torch.randn(BATCH, 8, generator=generator)[index * per : (index + 1) * per]
        model(x).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()


def compare(what: str, model: nn.Module) -> None:
    """``model``'s parameters (DTensors or plain) equal those of the model trained alone."""
    reference = Net()
    train(reference)
    state = model.state_dict()
    for name, want in reference.state_dict().items():
        got = state[name].full_tensor() if isinstance(state[name], DTensor) else state[name]
        check.equal(f"{what}: {name} after {STEPS} steps", got, want, tol=1e-5)


def shard_layers(model: nn.Module, mesh) -> nn.Module:
    for layer in (model.up, model.down, model.head):
        fully_shard(layer, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def tensor_parallel(mesh) -> None:
    model = parallelize_module(Net(), mesh, PLAN)
    check.check(model.up.weight.placements == (Shard(0),), f"ColwiseParallel shards dim 0: {model.up.weight}")
    check.check(model.down.weight.placements == (Shard(1),), f"RowwiseParallel shards dim 1: {model.down.weight}")
    train(model)  # every rank sees the whole batch
    compare("tensor parallel", model)


class Block(nn.Module):
    """A transformer-style block on (batch, sequence, hidden) activations, with a classifier."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(1)
        self.norm, self.up, self.down = nn.LayerNorm(8), nn.Linear(8, 16), nn.Linear(16, 8)
        self.classify = nn.Linear(8, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classify(self.down(torch.relu(self.up(self.norm(x)))))


def sequence_and_loss_parallel(mesh) -> None:
    """Sequence parallel (activations sharded on dim 1, the sequence, outside the MLP) and a
    classifier whose logits stay sharded on the class dim under ``loss_parallel``: the loss and
    every gradient equal those of the block run alone."""
    plan = {
        "norm": SequenceParallel(),
        "up": ColwiseParallel(input_layouts=Shard(1)),
        "down": RowwiseParallel(output_layouts=Shard(1)),
        "classify": ColwiseParallel(input_layouts=Shard(1), use_local_output=False),
    }
    model, reference = parallelize_module(Block(), mesh, plan), Block()
    generator = torch.Generator().manual_seed(7)
    x = torch.randn(2, 2 * size, 8, generator=generator)
    target = torch.randint(0, 6, (2, 2 * size), generator=generator)
    logits = model(x.chunk(size, dim=1)[rank])
    check.check(logits.placements == (Shard(2),), f"loss_parallel logits are sharded on the classes: {logits}")
    with loss_parallel():
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), target.flatten())
        loss.backward()
    want = nn.functional.cross_entropy(reference(x).flatten(0, 1), target.flatten())
    want.backward()
    check.equal("sequence and loss parallel: loss", loss.full_tensor(), want, tol=1e-5)
    for name, param in reference.named_parameters():
        grad = model.get_parameter(name).grad
        check.equal(f"sequence and loss parallel: {name}.grad", grad.full_tensor(), param.grad, tol=1e-5)


def fsdp(mesh) -> None:
    group = mesh.get_group()
    staged = group.staged_operations
    model = shard_layers(Net(), mesh)
    check.check(model.up.weight.placements == (Shard(0),), f"FSDP2 shards dim 0: {model.up.weight}")
    train(model, size, rank)
    compare("FSDP2", model)
    moved = group.staged_operations - staged
    check.check(moved == 0, f"FSDP2's gathers and reduce-scatters move their buffers directly: {moved} staged")


def hsdp(mesh) -> None:
    """FSDP2 on a 2-D mesh: replicated over dim 0, sharded over dim 1 (gradients all-reduced
    across the replicas)."""
    model = shard_layers(Net(), mesh)
    check.check(model.up.weight.placements == (Replicate(), Shard(0)), f"HSDP placements: {model.up.weight}")
    train(model, size, rank)
    compare("HSDP (FSDP2, 2x2 mesh)", model)


def fsdp_and_tensor_parallel(mesh) -> None:
    dp = mesh["dp"]
    model = shard_layers(parallelize_module(Net(), mesh["tp"], PLAN), dp)
    check.check(model.up.weight.placements[1:] == (Shard(0),), f"FSDP2 x TP placements: {model.up.weight}")
    train(model, dp.size(), dp.get_local_rank())
    compare("FSDP2 x tensor parallel (2x2 mesh)", model)


def functional_all_to_all(mesh) -> None:
    """The functional all_to_all_single (DTensor's resharding collective off the CPU)."""
    seed = next(seeds)
    x = like(torch.empty(3, 2 * size).t(), values(seed, rank, (2 * size, 3), torch.float32))
    got = all_to_all_single(x, None, None, mesh).wait()
    want = torch.cat([values(seed, r, (2 * size, 3), torch.float32)[2 * rank : 2 * rank + 2] for r in range(size)])
    check.equal("functional all_to_all_single, transposed input", got, want)


spellings()
if size == 4:
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    mesh_checks(mesh, "2x2 mesh")
    dtensor_2d(mesh)
    hsdp(mesh)
    fsdp_and_tensor_parallel(mesh)
else:
    mesh = init_device_mesh("cpu", (size,), mesh_dim_names=("dp",))
    mesh_checks(mesh, "1-D mesh")
    dtensor_1d(mesh)
    functional_all_to_all(mesh)
    tensor_parallel(mesh)
    sequence_and_loss_parallel(mesh)
    fsdp(mesh)
dist.destroy_process_group()
unexpected = [
    f"{w.category.__name__} at {w.filename}:{w.lineno}: {w.message}"
    for w in caught
    if w not in own_warnings and (issubclass(w.category, DEPRECATIONS) or w.filename.startswith(PACKAGE))
]
check.check(not unexpected, f"deprecations besides the program's own calls', or warnings from denseccl: {unexpected}")
check.done()
