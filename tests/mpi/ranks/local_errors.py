"""Rank program: local errors that are not LayoutErrors, and split with an invalid argument on
one rank. Every rank must raise (the local error on the rank that made it, MismatchError on the
others), nobody may wait for a peer, and the communicator must stay usable on every rank.

usage: mpiexec -n N python local_errors.py
"""

from __future__ import annotations

import numpy as np

import denseccl
from tests.support.checker import Checker


class Unreadable:
    """An object whose array interface fails with an error that is not denseccl's."""

    @property
    def __array_interface__(self):  # type: ignore[no-untyped-def]
        raise RuntimeError("cannot expose this buffer")


def usable(check: Checker, comm) -> None:  # type: ignore[no-untyped-def]
    check.check(comm.broken is None, f"broken: {comm.broken}")
    y = np.ones(3)
    comm.allreduce(y)
    check.check(np.all(y == comm.size), f"allreduce afterwards gave {y}")


def main() -> None:
    comm = denseccl.init(backend="mpi", timeout=20)
    rank, deviant = comm.rank, comm.size - 1
    check = Checker("local_errors", rank, comm.size)
    # the deviant rank raises its local error, the others MismatchError
    expected = denseccl.LayoutError if rank == deviant else denseccl.MismatchError
    # the object's own error becomes a LayoutError naming it (tests/mpi/test_protocol_errors.py)
    check.raises(
        "an unreadable array on the last rank",
        expected,
        lambda: comm.allreduce(Unreadable() if rank == deviant else np.zeros(3)),
    )
    usable(check, comm)
    expected = denseccl.ArgumentError if rank == deviant else denseccl.MismatchError
    check.raises("split colour -1 on the last rank", expected, lambda: comm.split(-1 if rank == deviant else 0))
    usable(check, comm)
    part = comm.split(0, key=rank)  # a valid split still works afterwards
    check.check(part is not None and part.size == comm.size and part.rank == rank, "a valid split afterwards")
    if part is not None:
        usable(check, part)
        part.close()
    comm.close()
    check.done()


if __name__ == "__main__":
    main()
