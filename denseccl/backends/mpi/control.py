"""The MPI backend's control channel: :class:`MPIControl`, the agreement's round on a duplicate
of the job's communicator; :func:`open_control` wraps it in the host's shared-memory board
(denseccl/channel/shared.py), as every launch's round is wrapped.

Why a channel of its own beside the transport: the agreement step runs before every checked
call, and on its own duplicate of the job's communicator it never queues behind a large
transfer. It also carries the news that a rank gave up on a call (a timeout, an interrupt) as a
message to every peer (the board, as a flag in its page). A rank checks for it after each
collective and while it waits, so that no call completes by pairing with one a peer abandoned.
"""

from __future__ import annotations

import os
import struct
import sys
import time
from typing import Any, NoReturn, Optional, Sequence

import numpy as np
from mpi4py import MPI

from ... import config
from ...errors import CommunicatorBrokenError, peer_gave_up_error
from ...channel.base import DIFFERENT, MIXED_TAGS, SAME, UNPLANNED, ControlChannel
from ...channel.shared import open_shared
from ...wait import wait_until
from ...transport import abandon

_SEVEN = struct.Struct("=7q")
#: the tag of the "I gave up" message on a control communicator (agreement traffic is collective only)
GAVE_UP_TAG = 0x6A7E


class MPIControl(ControlChannel):
    """Agreement traffic on its own duplicate of the job's communicator (which it owns)."""

    def __init__(self, comm: Any) -> None:
        self.comm = comm
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        #: MPI moves this rank's nonblocking transfers only inside MPI calls: a board's wait calls this
        self.progress = comm.Iprobe
        self._sequence = 0
        # The agreement's [digest, -digest, invalid, sequence, -sequence, tag, -tag] (negations:
        # one MAX gives both extremes; the sequence catches a rank that skipped or abandoned a
        # call, the tag pairs persistent requests, persistent.py) travels in one prebuilt message.
        self._seven = bytearray(_SEVEN.size)
        self._seven_message = [self._seven, 7, MPI.INT64_T]
        self._iallreduce = comm.Iallreduce
        self._iprobe = comm.Iprobe
        self._status = MPI.Status()
        self._gave_up: Optional[int] = None
        #: a request on ``comm`` was abandoned (it may never complete): the communicator is kept
        self._abandoned = False

    def path(self) -> str:
        return f"MPI allreduce on the control communicator ({self.size} ranks)"

    def all_equal(self, value: int, invalid: bool, deadline: Optional[float], tag: int = UNPLANNED) -> int:
        """Equal digests, none invalid, and the same call sequence on every rank; and whether
        the tags are equal too: board.SAME, board.MIXED_TAGS or board.DIFFERENT (falsy)."""
        sequence = self._sequence = self._sequence + 1
        buffer = self._seven
        _SEVEN.pack_into(buffer, 0, value, -value, 1 if invalid else 0, sequence, -sequence, tag, -tag)
        request = self._iallreduce(MPI.IN_PLACE, self._seven_message, MPI.MAX)
        if not request.Test():
            self._wait(request, (buffer, self._seven_message), deadline)
        highest, negated_lowest, any_invalid, latest, negated_earliest, top_tag, negated_bottom_tag = (
            _SEVEN.unpack_from(buffer)
        )
        if latest != sequence or negated_earliest != -sequence:
            raise CommunicatorBrokenError(
                f"the agreement paired call {sequence} of this rank with calls {-negated_earliest}..{latest} of its "
                "peers: a rank skipped or abandoned a call; this communicator is unusable"
            )
        if highest != value or negated_lowest != -value or any_invalid:
            return DIFFERENT
        return SAME if top_tag == -negated_bottom_tag else MIXED_TAGS

    def allreduce_max(self, values: Sequence[int], deadline: Optional[float]) -> Sequence[int]:
        buffer = np.array(values, np.int64)
        self._wait(self._iallreduce(MPI.IN_PLACE, [buffer, len(values), MPI.INT64_T], MPI.MAX), buffer, deadline)
        return buffer.tolist()

    def allgather_bytes(self, data: bytes, deadline: Optional[float]) -> Sequence[bytes]:
        lengths: np.ndarray = np.zeros(self.size, np.int64)
        lengths[self.rank] = len(data)
        self._wait(self.comm.Iallgather(MPI.IN_PLACE, [lengths, MPI.INT64_T]), lengths, deadline)
        offsets = np.concatenate(([0], np.cumsum(lengths)[:-1]))
        gathered = np.zeros(int(lengths.sum()), np.uint8)
        source = np.frombuffer(data, np.uint8)
        request = self.comm.Iallgatherv([source, MPI.BYTE], [gathered, (lengths, offsets), MPI.BYTE])
        self._wait(request, (source, gathered, lengths, offsets), deadline)
        raw = gathered.tobytes()
        return [raw[o : o + n] for o, n in zip(offsets.tolist(), lengths.tolist())]

    def _wait(self, request: Any, keep: Any, deadline: Optional[float]) -> None:
        """Wait for ``request``; if the wait ends otherwise, the request and what it uses are
        kept for the process's life (MPI cannot cancel it)."""
        test = request.Test

        def done() -> bool:
            if test():
                return True
            rank = self._note()  # MPI's notes, on a board's channel too
            if rank is not None:
                raise peer_gave_up_error(rank)
            return False

        try:
            wait_until(done, deadline, "the agreement step")
        except BaseException:
            self._abandoned = True
            abandon(request, keep)
            raise

    def give_up(self) -> None:
        note = np.array([self.rank], np.int64)
        peers = [peer for peer in range(self.size) if peer != self.rank]
        requests = [self.comm.Isend([note, MPI.INT64_T], peer, GAVE_UP_TAG) for peer in peers]
        self._abandoned = True
        abandon(requests, note)
        # MPI moves a message only inside MPI calls: push the notes out now (a stopped or dead
        # peer cannot take them, so the push is bounded; a later MPI call here moves them on)
        pushed_by = time.monotonic() + config.NOTE_PUSH_SECONDS
        while not MPI.Request.Testall(requests) and time.monotonic() < pushed_by:
            os.sched_yield()

    def peer_gave_up(self) -> Optional[int]:
        return self._note()

    def _note(self) -> Optional[int]:
        """The rank whose "gave up" note arrived on this communicator, or None."""
        if self._gave_up is None and self._iprobe(MPI.ANY_SOURCE, GAVE_UP_TAG, self._status):
            self._gave_up = self._status.Get_source()
        return self._gave_up

    def abort(self, message: str) -> NoReturn:
        print(message, flush=True, file=sys.stderr)
        time.sleep(config.ABORT_PRINT_SECONDS)  # the launcher forwards the message before it kills
        MPI.COMM_WORLD.Abort(1)
        os._exit(1)  # MPI_Abort may return before the launcher has ended this process

    def split(self, color: Optional[int], key: int, deadline: Optional[float]) -> Optional[ControlChannel]:
        part = split_comm(self.comm, color, key)
        return None if part is None else open_control(part)

    def close(self) -> None:
        (retire_comm if self._abandoned else free_comm)(self.comm)

    def retire(self) -> None:
        retire_comm(self.comm)


def split_comm(comm: Any, color: Optional[int], key: int) -> Any:
    """``comm.Split`` with ``None`` for "no color": the new communicator, or None where this rank
    passed no color. Collective over ``comm``."""
    part = comm.Split(MPI.UNDEFINED if color is None else color, key)
    return None if part == MPI.COMM_NULL else part


def free_comm(comm: Any) -> None:
    """Free an owned communicator, unless MPI is already finalized (nothing left to free).
    Only when no request on it may still be active: see :func:`retire_comm`."""
    if comm != MPI.COMM_NULL and not MPI.Is_finalized():
        comm.Free()


def retire_comm(comm: Any) -> None:
    """Give up an owned communicator on which a request may still be active: it is never freed,
    and lives until MPI is finalized. MPI lets ``MPI_Comm_free`` mark such a communicator
    (pending operations complete normally), but Open MPI 5 then frees what the request still
    uses, and the next MPI call that progresses it (on any communicator) ends in a
    segmentation fault."""
    abandon(comm)


def open_control(comm: Any) -> ControlChannel:
    """The control channel for the mpi4py communicator ``comm`` (which it then owns; collective
    over ``comm``): its round wrapped in the host's board where every rank shares one host,
    MPI's own round across hosts (the library's allreduce is hierarchical already)."""
    return open_shared(MPIControl(comm), None, across_hosts=False)


__all__ = ["GAVE_UP_TAG", "MPIControl", "free_comm", "open_control", "retire_comm", "split_comm"]
