"""Rank program: local errors that are not LayoutErrors, and split with an invalid argument on
one rank. Every rank must raise (the local error on the rank that made it, MismatchError on the
others), nobody may wait for a peer, and the communicator must stay usable on every rank.

usage: mpiexec -n N python local_errors.py
"""

from __future__ import annotations

import numpy as np

import denseccl


class Unreadable:
    """An object whose array interface fails with an error that is not denseccl's."""

    @property
    def __array_interface__(self):  # type: ignore[no-untyped-def]
        raise RuntimeError("cannot expose this buffer")


def expect(thunk, rank, deviant, local):  # type: ignore[no-untyped-def]
    try:
        thunk()
    except local if rank == deviant else denseccl.MismatchError:
        return
    except Exception as error:  # noqa: BLE001
        raise AssertionError(f"rank {rank} raised {type(error).__name__}: {error}") from None
    raise AssertionError(f"rank {rank} raised nothing")


def usable(comm) -> None:  # type: ignore[no-untyped-def]
    assert comm.broken is None, comm.broken
    y = np.ones(3)
    comm.allreduce(y)
    assert np.all(y == comm.size), y


def main() -> None:
    comm = denseccl.init(backend="mpi", timeout=20)
    rank, deviant = comm.rank, comm.size - 1
    # the object's own error becomes a LayoutError naming it (tests/mpi/test_protocol_errors.py)
    expect(
        lambda: comm.allreduce(Unreadable() if rank == deviant else np.zeros(3)), rank, deviant, denseccl.LayoutError
    )
    usable(comm)
    expect(lambda: comm.split(-1 if rank == deviant else 0), rank, deviant, denseccl.ArgumentError)
    usable(comm)
    part = comm.split(0, key=rank)  # a valid split still works afterwards
    assert part is not None and part.size == comm.size and part.rank == rank
    usable(part)
    part.close()
    comm.close()
    print(f"rank {rank}: local errors ok", flush=True)


if __name__ == "__main__":
    main()  # a failed assert exits non-zero with its traceback
