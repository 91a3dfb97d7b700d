"""The MPI library as a provider of the board's page (denseccl/board/): a shared window.

Why MPI provides it under an MPI launch: the library already knows which ranks share a node
(``Split_type(COMM_TYPE_SHARED)``), makes the page without any file of ours (nothing is left
behind when a job is killed) and orders it with ``Win.Sync``, a memory barrier in the unified
memory model (as mpi4py's ``util/sync.py`` does). The board, the doorbells and the crowded
judgement themselves are backend-neutral; this module only hands them a page and a fence, and
gathers the host's placements over MPI.
"""

from __future__ import annotations

import contextlib
from typing import Any, List, Optional

from mpi4py import MPI

from ...board.board import Board, page_bytes, usable_here
from ...board.cores import judge, local_placement
from ...board.doorbell import WORDS, Doorbells, futex_call
from ...wait import WAITING

#: windows given up (doorbells replaced by a larger host's, closed boards): ``Win.Free`` is
#: collective, so they live until the process ends
RETIRED: List[Any] = []


class WindowOwner:
    """The MPI window behind a board's or doorbells' page (board.Owner)."""

    def __init__(self, window: Any) -> None:
        self.window = window

    def close(self) -> None:
        with contextlib.suppress(Exception):  # MPI already finalized: nothing left to release
            self.window.Unlock_all()
        RETIRED.append(self.window)

    def retire(self) -> None:
        RETIRED.append(self.window)


def shared_window(node: Any, nbytes: int, unit: int) -> Any:
    """An MPI shared window of ``nbytes`` (in units of ``unit`` bytes), all of it on the first
    rank of ``node`` (an mpi4py communicator of one host), zeroed before anyone reads it, in a
    passive-target epoch that lasts the window's life (what ``Win.Sync`` needs). None on every
    rank where the MPI library cannot make one in the unified memory model (loads and stores
    would not see the window's public copy). Collective over ``node``."""
    try:
        window: Any = MPI.Win.Allocate_shared(nbytes if node.Get_rank() == 0 else 0, unit, comm=node)
    except MPI.Exception:
        window = None
    if not node.allreduce(window is not None and window.model == MPI.WIN_UNIFIED, op=MPI.LAND):
        if window is not None:
            RETIRED.append(window)
        return None
    window.Lock_all(MPI.MODE_NOCHECK)
    if node.Get_rank() == 0:
        memory, _ = window.Shared_query(0)
        view = memoryview(memory).cast("B")
        view[:nbytes] = bytes(nbytes)
        view.release()
    window.Sync()
    node.Barrier()
    window.Sync()
    return window


def open_board(comm: Any, crowded: bool) -> Optional[Board]:
    """A board for the mpi4py communicator ``comm`` (collective over ``comm``), or None where
    its ranks do not all share this host's memory or boards are off. ``crowded``: whether the
    host's ranks share cores (recorded in ``wait.WAITING`` when judged)."""
    rank, size = comm.Get_rank(), comm.Get_size()
    node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=rank)
    try:
        if not comm.allreduce(node.Get_size() == size and usable_here(), op=MPI.LAND):
            return None
        window = shared_window(node, page_bytes(size), 8)
    finally:
        node.Free()  # the window keeps what it needs of it
    if window is None:
        return None
    memory, _ = window.Shared_query(0)
    board = Board(memory, rank, size, crowded, window.Sync, WindowOwner(window))
    board.progress = comm.Iprobe  # any MPI call progresses every request of this process
    return board


def open_doorbells(node: Any) -> Optional[Doorbells]:
    """Doorbells for the ranks of ``node``, an mpi4py communicator of one host (collective);
    None where this system has no futex or the MPI library no shared window."""
    futex = futex_call()
    size = node.Get_size()
    if not node.allreduce(futex is not None, op=MPI.LAND):
        return None
    window = shared_window(node, size * WORDS * 4, 4)
    if window is None:
        return None
    memory, _ = window.Shared_query(0)
    owner = WindowOwner(window)
    return Doorbells(memory, memory.address, node.Get_rank(), size, futex, window.Sync, owner)  # type: ignore[arg-type]


def host_crowded(comm: Any) -> bool:
    """Collective over the mpi4py communicator ``comm``: whether its ranks on this host are
    crowded (board/cores.py ``judge``, the same answer on every rank); recorded in this
    process's wait policy (``wait.WAITING``) with the host's doorbells where they are."""
    node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
    try:
        found = judge(node.allgather(local_placement()))
        doorbells = open_doorbells(node) if found and node.Get_size() > 1 else None
    finally:
        node.Free()
    if doorbells is not None:  # one MPI set at a time: a window cannot be freed alone, its use can
        for earlier in _NOTED:
            WAITING.forget(earlier)
        _NOTED[:] = [doorbells]
    WAITING.note(found, doorbells)
    return found


#: the doorbells host_crowded noted last
_NOTED: List[Doorbells] = []


__all__ = ["RETIRED", "WindowOwner", "host_crowded", "open_board", "open_doorbells", "shared_window"]
