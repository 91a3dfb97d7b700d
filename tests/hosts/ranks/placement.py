"""Rank program: which agreement path each communicator takes across simulated hosts, and
collectives, mismatches and splits within and across hosts.

usage: placement.py HOSTS PER_HOST   (ranks i*PER_HOST ... (i+1)*PER_HOST-1 on host h<i>)

Every rank checks that it runs where the launcher was told to put it and that MPI sees one node
per host; then, on the world communicator, a split within each host and a split across hosts
(one rank of each host per group): the shared-memory board exactly where every member shares a
host (and there is more than one member), the MPI allreduce otherwise; an allreduce, an
allgather and a reduce-scatter on permuted layouts against NumPy; a mismatch that raises on
every member with buffers untouched, then a correct call on the same communicator.
"""

from __future__ import annotations

import socket
import sys

import numpy as np
from mpi4py import MPI

import denseccl
from tests.support.checker import Checker

hosts, per_host = int(sys.argv[1]), int(sys.argv[2])
comm = denseccl.init(backend="mpi")
rank, size = comm.rank, comm.size
check = Checker("placement", rank, size)
host = rank // per_host
check.check(size == hosts * per_host, f"world size {size}, expected {hosts} x {per_host}")
check.check(socket.gethostname() == f"h{host}", f"rank {rank} runs on {socket.gethostname()}, expected h{host}")
node = MPI.COMM_WORLD.Split_type(MPI.COMM_TYPE_SHARED, key=rank)
check.check(node.Get_size() == per_host, f"MPI's node has {node.Get_size()} ranks, expected {per_host}")
node.Free()


def permuted(world_ranks: list, me: int, seed: int) -> tuple:
    """A (2, 3, 4) array in the (2, 0, 1) layout for every member, and the NumPy sum of all."""
    inputs = [np.random.default_rng([seed, r]).standard_normal((3, 4, 2)).transpose(2, 0, 1) for r in world_ranks]
    mine = inputs[world_ranks.index(me)].copy(order="K")
    return mine, inputs


def exercise(name: str, group: denseccl.Communicator, members: list, expect_board: bool, seed: int) -> None:
    check.check(group.size == len(members), f"{name}: size {group.size}, expected {len(members)}")
    check.check(group.rank == members.index(rank), f"{name}: rank {group.rank}, expected {members.index(rank)}")
    board = group.control.board is not None
    check.check(board == expect_board, f"{name}: board in use {board}, expected {expect_board} (members {members})")
    x, inputs = permuted(members, rank, seed)
    strides = x.strides
    got = group.allreduce(x)
    check.check(got is x and x.strides == strides, f"{name}: allreduce not in place on the input's layout")
    check.check(np.allclose(x, sum(inputs)), f"{name}: allreduce differs from NumPy")
    x, inputs = permuted(members, rank, seed + 1)
    stacked = group.allgather(x)
    check.check(all(np.array_equal(stacked[r], inputs[r]) for r in range(len(members))), f"{name}: allgather differs")
    block = group.reduce_scatter(np.stack([x * (r + 1) for r in range(len(members))]))
    want = sum(a * (members.index(rank) + 1) for a in inputs)
    check.check(np.allclose(block, want), f"{name}: reduce_scatter differs from NumPy")
    if len(members) < 2:
        return
    deviant = len(members) - 1  # the last member passes another layout: every member raises
    y = np.arange(12, dtype=np.float32).reshape(3, 4)
    y = y.T.copy().T if group.rank == deviant else y
    before = y.copy()
    try:
        group.allreduce(y)
        check.fail(f"{name}: a layout mismatch raised nothing")
    except denseccl.MismatchError as error:
        check.check("mismatch" in str(error), f"{name}: the error does not say mismatch: {error}")
    check.check(np.array_equal(y, before), f"{name}: a buffer was written before the mismatch error")
    z = np.full((5,), float(group.rank))
    group.allreduce(z, "max")
    check.check(np.array_equal(z, np.full((5,), float(len(members) - 1))), f"{name}: unusable after the mismatch")


world = list(range(size))
exercise("world", comm, world, expect_board=hosts == 1 and size > 1, seed=1)
within_members = [r for r in world if r // per_host == host]
within = comm.split(host, key=rank)
exercise("within a host", within, within_members, expect_board=per_host > 1, seed=2)
across_members = [r for r in world if r % per_host == rank % per_host]
across = comm.split(rank % per_host, key=rank)
exercise("across hosts", across, across_members, expect_board=hosts == 1 and len(across_members) > 1, seed=3)
for group in (across, within):
    group.close()
comm.barrier()
comm.close()
check.finish()
