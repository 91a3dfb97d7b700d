"""Subgroups and device meshes of every shape over the denseccl backend: prefixes (the first k
ranks, which were mistaken for the world), suffixes, singletons, strided sets, overlapping
groups created in both orders, new_subgroups, 2-D and 3-D meshes, per-host groups. Every
result is checked against a reference built with plain torch from all members' inputs. Run
with mpiexec -n N or torchrun --nproc-per-node N (N >= 4)."""

from __future__ import annotations

import itertools
import socket
import zlib

import torch
import torch.distributed as dist
from common import Checker, init, like, values
from torch.distributed.device_mesh import init_device_mesh

init()
rank, size = dist.get_rank(), dist.get_world_size()
check = Checker(rank)
torch.set_num_threads(1)
CL = torch.channels_last


def exercise(name: str, group, members) -> None:
    """Collectives on ``group`` whose members are the global ranks ``members`` (group-rank order)."""
    members = list(members)
    if group is None or rank not in members:
        check.true(
            f"{name}: rank {rank} is not a member",
            group in (None, dist.GroupMember.NON_GROUP_MEMBER) or rank not in members,
        )
        return
    n = len(members)
    me = members.index(rank)
    seeds = itertools.count(zlib.crc32(name.encode()) % 100_000)  # the same on every member
    check.true(f"{name}: group rank {dist.get_rank(group)} == {me}", dist.get_rank(group) == me)
    check.true(f"{name}: group size {dist.get_world_size(group)} == {n}", dist.get_world_size(group) == n)
    seed = next(seeds)
    x = like(torch.empty(2, 3, 4, 5).to(memory_format=CL), values(seed, rank, (2, 3, 4, 5), torch.float32))
    dist.all_reduce(x, group=group)
    want = torch.stack([values(seed, r, (2, 3, 4, 5), torch.float64) for r in members]).sum(0)
    check.equal(f"{name}: all_reduce channels-last", x, want, strides=x.stride(), tol=1e-5)
    seed = next(seeds)
    src = n - 1
    y = like(torch.empty(5, 3).t(), values(seed, rank, (3, 5), torch.float64))
    dist.broadcast(y, group_src=src, group=group)
    check.equal(
        f"{name}: broadcast from group rank {src}", y, values(seed, members[src], (3, 5), torch.float64), strides=(1, 3)
    )
    seed = next(seeds)
    out = torch.empty(2 * n, 3)
    dist.all_gather_into_tensor(out, values(seed, rank, (2, 3), torch.float32), group=group)
    check.equal(
        f"{name}: all_gather_into_tensor", out, torch.cat([values(seed, r, (2, 3), torch.float32) for r in members])
    )
    seed = next(seeds)
    block = torch.empty(3, 2).t()
    dist.reduce_scatter_tensor(block, values(seed, rank, (2 * n, 3), torch.float32), group=group)
    full = torch.stack([values(seed, r, (2 * n, 3), torch.float64) for r in members]).sum(0)
    check.equal(f"{name}: reduce_scatter_tensor", block, full[2 * me : 2 * me + 2], tol=1e-5)
    seed = next(seeds)
    z = values(seed, rank, (4,), torch.int64)
    dist.reduce(z, group_dst=0, op=dist.ReduceOp.MAX, group=group)
    if me == 0:
        check.equal(
            f"{name}: reduce max to group rank 0",
            z,
            torch.stack([values(seed, r, (4,), torch.int64) for r in members]).amax(0),
        )
    objects = [None] * n
    dist.all_gather_object(objects, rank, group=group)
    check.true(f"{name}: all_gather_object {objects}", objects == members)
    dist.barrier(group=group)


def new(ranks):
    return dist.new_group(list(ranks), backend="denseccl")


# prefixes (the first k ranks: equal to [0..k-1], which the MPI mapping took for the world),
# suffixes, singletons, strided sets
for k in range(1, size + 1):
    exercise(f"prefix [0..{k - 1}]", new(range(k)), range(k))
for k in range(1, size):
    exercise(f"suffix [{k}..{size - 1}]", new(range(k, size)), range(k, size))
for r in range(size):
    exercise(f"singleton [{r}]", new([r]), [r])
for start, step in ((0, 2), (1, 2), (0, 3)):
    ranks = list(range(start, size, step))
    exercise(f"strided {ranks}", new(ranks), ranks)
ranks = [size - 1, 0, 1]  # torch orders members by global rank
exercise("unsorted [n-1, 0, 1]", new(ranks), sorted(ranks))

# overlapping groups, created in one order and used in the other, then created the other way
a_ranks, b_ranks = list(range(0, size - 1)), list(range(1, size))
a, b = new(a_ranks), new(b_ranks)
exercise("overlapping B (made second)", b, b_ranks)
exercise("overlapping A (made first)", a, a_ranks)
b2, a2 = new(b_ranks), new(a_ranks)
exercise("overlapping A (made second)", a2, a_ranks)
exercise("overlapping B (made first)", b2, b_ranks)
exercise("overlapping A again (first group still usable)", a, a_ranks)

# new_subgroups and new_subgroups_by_enumeration
group_size = 2 if size % 2 == 0 else size
mine, groups = dist.new_subgroups(group_size=group_size, backend="denseccl")
exercise(f"new_subgroups({group_size})", mine, [r for r in range(size) if r // group_size == rank // group_size])
lists = [list(range(0, size, 2)), list(range(1, size, 2))]
mine, groups = dist.new_subgroups_by_enumeration(lists, backend="denseccl")
exercise("new_subgroups_by_enumeration even/odd", mine, lists[rank % 2])

# per-host groups: the ranks of each host, and one rank per host
hosts = [None] * size
dist.all_gather_object(hosts, socket.gethostname())
by_host = [[r for r in range(size) if hosts[r] == h] for h in sorted(set(hosts))]
mine, _ = dist.new_subgroups_by_enumeration(by_host, backend="denseccl")
exercise("per-host group", mine, next(g for g in by_host if rank in g))
leaders = [g[0] for g in by_host]
exercise("one rank per host", new(leaders), leaders)

# device meshes: 2-D and 3-D, every dim's groups
shapes = [(2, size // 2), (size // 2, 2), (2, 1, size // 2)] if size % 2 == 0 else [(1, size), (size, 1, 1)]
if size % 8 == 0:
    shapes.append((2, 2, size // 4))
for shape in shapes:
    mesh = init_device_mesh("cpu", shape)
    grid = torch.arange(size).view(shape)
    coordinate = [int(c) for c in (grid == rank).nonzero()[0]]
    for dim in range(len(shape)):
        index = list(coordinate)
        index[dim] = slice(None)
        members = grid[tuple(index)].tolist()
        exercise(f"mesh {shape} dim {dim}", mesh.get_group(dim), members)

# the world, after all of that
exercise("world", dist.group.WORLD, range(size))
dist.destroy_process_group()
check.done()
