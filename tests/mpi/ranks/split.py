"""Rank program: Communicator.split on the MPI transport.

Even and odd ranks form two sub-communicators ranked by key = -rank (so in reverse order); the
last rank passes color=None and gets None. Each sub-communicator reduces, checks agreement
(a mismatch inside it raises on all its ranks) and splits again; the parent stays usable.

usage: mpiexec -n N python split.py
"""

from __future__ import annotations


import numpy as np

import denseccl


def main() -> None:
    comm = denseccl.init(backend="mpi", timeout=30)
    rank, size = comm.rank, comm.size
    color = None if rank == size - 1 else rank % 2
    part = comm.split(color, key=-rank)
    if color is None:
        assert part is None, part
    else:
        members = sorted((r for r in range(size - 1) if r % 2 == color), reverse=True)
        assert (part.size, part.rank, part.backend) == (len(members), members.index(rank), "mpi"), (
            part.size,
            part.rank,
        )
        x = np.full((3, 2), float(rank)).T  # a transposed layout
        part.allreduce(x, "sum")
        assert np.all(x == sum(members)), x
        gathered = part.allgather(np.array([rank], np.int64))
        assert gathered[:, 0].tolist() == members, gathered
        if part.size > 1:
            odd = np.zeros((2, 3)) if part.rank == 1 else np.zeros((2, 2))
            try:
                part.allreduce(odd)
            except denseccl.MismatchError as error:
                assert "shape" in str(error), str(error)
            else:
                raise AssertionError("no MismatchError in the sub-communicator")
            part.allreduce(np.zeros((2, 2)))  # still usable after the mismatch
        single = part.split(part.rank, 0)  # every rank alone
        assert single.size == 1 and single.rank == 0
        single.close()
        part.close()
    y = np.ones(4)
    comm.allreduce(y)  # the parent still works
    assert np.all(y == size), y
    comm.close()
    print(f"rank {rank}: split ok", flush=True)


if __name__ == "__main__":
    main()  # a failed assert exits non-zero with its traceback
