"""Rank program: repeated calls run on persistent MPI requests (backends/mpi/persistent.py, Requests)
that the ranks set up together, decided in the agreement step. Every way the ranks' caches can
differ must still give NumPy's result on every rank: arrays reused on some ranks and fresh on
others, more arrays than the cache holds (evicted in a different order per rank), one rank on the
full path (an ndarray subclass) while its peers replay, reduce and broadcast from every root, the
check turned off and on again. The ranks' tag counters must stay equal (they number the collective
set-ups), and requests must actually be used and reused. argv[1]: "mixed" (the full schedule)."""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

import denseccl
from denseccl.backends.mpi.transport import has_persistent
from denseccl.config import PERSISTENT_REQUESTS as REQUESTS
from tests.support.checker import Checker

comm = denseccl.init()
rank, size = comm.rank, comm.size
checker = Checker("persistent", rank, size)
requests = comm.transport.requests
#: the MPI library has persistent collectives (MPI 4; else plans start nonblocking ones)
persistent = has_persistent()


class Sub(np.ndarray):
    """Same geometry, not a plain ndarray: plans do not replay it, the full path runs."""


def values(r: int, shape: tuple, step: int) -> np.ndarray:
    return ((np.arange(int(np.prod(shape))).reshape(shape) * 5 + r * 3 + step) % 13 - 6).astype(np.float64)


def allreduce_check(x: np.ndarray, step: int, what: str) -> None:
    x[...] = values(rank, x.shape, step)
    got = comm.allreduce(x)
    want = sum(values(r, x.shape, step) for r in range(size))
    checker.check(got is x and np.array_equal(np.asarray(x), want), f"{what}, step {step}: wrong sum")


def tags_agree(what: str) -> None:
    every = MPI.COMM_WORLD.allgather(requests.tags)
    checker.check(len(set(every)) == 1, f"{what}: the ranks' tag counters differ: {every}")


shape = (3, 5, 4)
channels_last = lambda: np.empty((3, 4, 5), np.float32).transpose(0, 2, 1)  # noqa: E731

# 1. one array on every rank: set up once, then reused
x = channels_last()
for step in range(6):
    allreduce_check(x, step, "one array")
tags_agree("one array")
checker.check(not persistent or requests.entries, f"one array: no persistent request set up ({requests.tags})")
used = requests.tags

# 2. rank 0 alternates two arrays, rank 1 takes a fresh one each call, the others keep one
pair = [channels_last(), channels_last()]
kept = channels_last()
for step in range(12):
    if rank == 0:
        target = pair[step % 2]
    elif rank == 1:
        target = channels_last()
    else:
        target = kept
    allreduce_check(target, step, "divergent arrays")
tags_agree("divergent arrays")

# 3. more arrays than the cache holds, used in a different order per rank
many = [channels_last() for _ in range(REQUESTS + 6)]
order = list(range(len(many))) if rank % 2 == 0 else list(reversed(range(len(many))))
for sweep in range(2):
    for step, index in enumerate(order):
        allreduce_check(many[index], sweep * 1000 + step, f"many arrays, sweep {sweep}")
tags_agree("many arrays")
checker.check(len(requests.entries) <= REQUESTS, f"the cache holds {len(requests.entries)} > {REQUESTS} requests")

# 4. one rank on the full path (a subclass: no plan), the others replay
y = channels_last()
for step in range(4):
    allreduce_check(y, step, "replay before")
for step in range(4):
    target = y.view(Sub) if rank == size - 1 else y
    allreduce_check(target, 100 + step, "one rank on the full path")
for step in range(4):
    allreduce_check(y, 200 + step, "replay after")
tags_agree("full path")

# 5. reduce and broadcast from every root, on reused and fresh arrays
z = np.empty(shape, np.float64)[::-1]
for root in range(size):
    for step in range(4):
        target = z if step % 2 or rank else np.empty(shape, np.float64)[::-1]
        target[...] = values(rank, shape, step)
        comm.reduce(target, root, "max")
        want = values(rank, shape, step)
        if rank == root:
            want = np.maximum.reduce([values(r, shape, step) for r in range(size)])
        checker.check(np.array_equal(target, want), f"reduce root {root} step {step}")
        target[...] = values(rank, shape, step + 50)
        comm.broadcast(target, root)
        checker.check(np.array_equal(target, values(root, shape, step + 50)), f"broadcast root {root} step {step}")
tags_agree("reduce and broadcast")

# 6. the check off (no agreement: nonblocking collectives), then on again (requests resume)
comm.check = False
before = requests.tags
for step in range(4):
    allreduce_check(x, 300 + step, "check off")
checker.check(requests.tags == before, "the check off set up persistent requests: nothing decided them together")
comm.check = True
for step in range(4):
    allreduce_check(x, 400 + step, "check on again")
tags_agree("check on again")

# 7. a mismatch is still everyone's MismatchError, and the requests survive it
w = np.zeros((4, 4), np.float32)
for _ in range(2):
    comm.allreduce(w)
checker.raises("different ops", denseccl.MismatchError, lambda: comm.allreduce(w, "sum" if rank else "max"), "op")
allreduce_check(w, 7, "after a mismatch")
tags_agree("after a mismatch")
checker.check(not persistent or requests.tags > used, "no request was set up after the first")

comm.close()
checker.check(not requests.entries, "close left persistent requests allocated")
checker.done()
