"""Rank program: Communicator.split on the MPI transport.

Even and odd ranks form two sub-communicators ranked by key = -rank (so in reverse order); the
last rank passes color=None and gets None. Each sub-communicator reduces, checks agreement
(a mismatch inside it raises on all its ranks) and splits again; the parent stays usable.

usage: mpiexec -n N python split.py
"""

from __future__ import annotations


import numpy as np

import denseccl
from tests.support.checker import Checker


def main() -> None:
    comm = denseccl.init(backend="mpi", timeout=30)
    rank, size = comm.rank, comm.size
    check = Checker("split", rank, size)
    color = None if rank == size - 1 else rank % 2
    part = comm.split(color, key=-rank)
    if color is None:
        check.check(part is None, f"color None gave {part}")
    else:
        members = sorted((r for r in range(size - 1) if r % 2 == color), reverse=True)
        got = (part.size, part.rank, part.backend)
        check.check(got == (len(members), members.index(rank), "mpi"), f"size, rank, backend {got}")
        x = np.full((3, 2), float(rank)).T  # a transposed layout
        part.allreduce(x, "sum")
        check.check(np.all(x == sum(members)), f"allreduce in the part gave {x.ravel()}")
        gathered = part.allgather(np.array([rank], np.int64))
        check.check(gathered[:, 0].tolist() == members, f"allgather in the part gave {gathered[:, 0]}")
        if part.size > 1:
            odd = np.zeros((2, 3)) if part.rank == 1 else np.zeros((2, 2))
            check.raises("a shape mismatch in the part", denseccl.MismatchError, lambda: part.allreduce(odd), "shape")
            part.allreduce(np.zeros((2, 2)))  # still usable after the mismatch
        single = part.split(part.rank, 0)  # every rank alone
        check.check(single.size == 1 and single.rank == 0, f"a part of one: size {single.size}, rank {single.rank}")
        single.close()
        part.close()
    y = np.ones(4)
    comm.allreduce(y)  # the parent still works
    check.check(np.all(y == size), f"the parent's allreduce gave {y}")
    comm.close()
    check.done()


if __name__ == "__main__":
    main()
