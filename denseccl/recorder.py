"""The flight recorder: a bounded ring of each communicator's last calls, written to a file when a
call times out (or a peer gave up), and on request.

Every call that takes part in the agreement step is numbered in order (its sequence, the same on
every rank of a communicator whose ranks make the same calls) and recorded with its descriptor
and the time its agreement step began; a failure marks the call it belongs to. A call is
``started`` until it is known to have ended: a synchronous call once its caller made the next
call or asked for a dump, an ``async_op`` call once its Work completed. The cost per call is one
append of ``(sequence, descriptor, start)`` to a bounded deque; nothing is formatted until a
dump. ``python -m denseccl.trace_summary DIR`` reads every rank's dumps (docs/debugging.md).
"""

from __future__ import annotations

import collections
import itertools
import json
import os
import socket
import time
import weakref
from typing import Any, Callable, Deque, Dict, List, Optional, Set, Tuple

from . import config, log
from .errors import CollectiveTimeoutError, CommunicatorBrokenError

#: the format written into every dump, checked by the reader
FORMAT = "denseccl-trace/1"

_numbers = itertools.count()
#: every live recorder of this process, for :func:`dump_all`
_live: "weakref.WeakSet[Recorder]" = weakref.WeakSet()


class Recorder:
    """The last ``capacity`` calls of one communicator (rank ``rank`` of ``size``). ``number``
    tells this process's communicators apart: the n-th one created (the same on every rank that
    creates the same communicators in the same order)."""

    __slots__ = (
        "rank", "size", "backend", "number", "capacity", "ring", "sequence", "failures", "unfinished", "dumped",
        "__weakref__",
    )

    def __init__(self, rank: int, size: int, backend: str, capacity: int) -> None:
        self.rank, self.size, self.backend = rank, size, backend
        self.number = next(_numbers)
        self.capacity = capacity
        #: ``(sequence, descriptor, time.monotonic() when its agreement step began)`` of the last calls
        self.ring: Deque[Tuple[int, Any, float]] = collections.deque(maxlen=capacity)
        #: hands out the sequences, 0 first
        self.sequence: Callable[[], int] = itertools.count().__next__
        #: sequence -> (error text, time.monotonic) of the calls that failed (only those in the ring)
        self.failures: Dict[int, Tuple[str, float]] = {}
        #: the sequences of calls started with async_op=True whose Work has not completed
        self.unfinished: Set[int] = set()
        #: the path of the dump written on failure, once written (one per communicator)
        self.dumped: Optional[str] = None
        _live.add(self)

    def record(self, descriptor: Any) -> None:
        """The next call begins its agreement step with ``descriptor``."""
        self.ring.append((self.sequence(), descriptor, time.monotonic()))

    @property
    def count(self) -> int:
        """The calls recorded so far (the next call's sequence)."""
        ring = self.ring
        return ring[-1][0] + 1 if ring else 0

    def refused(self, descriptor: Any, error: BaseException) -> None:
        """A call whose input failed validation on this rank (it still joins the agreement)."""
        self.record(descriptor)
        self._mark(self.count - 1, error)

    def began_async(self) -> int:
        """The call recorded last was started with ``async_op=True``: it is under way until
        :meth:`ended`. Its sequence."""
        seq = self.count - 1
        self.unfinished.add(seq)
        if len(self.unfinished) > self.capacity:  # Works that are never waited for
            self.unfinished.discard(min(self.unfinished))
        return seq

    def ended(self, seq: int) -> None:
        """The Work of call ``seq`` completed (or was dropped: its communicator completes it)."""
        self.unfinished.discard(seq)

    def failed(self, error: BaseException) -> None:
        """The call under way failed with ``error``: the latest call while it has no Work and
        has not failed yet (its agreement step or start failed), else the oldest Work still in
        flight. A timeout, or a peer that gave up, writes the dump (once)."""
        latest = self.count - 1
        works = self.unfinished and (latest in self.unfinished or latest in self.failures)
        self._mark(min(self.unfinished) if works else latest, error)
        if isinstance(error, (CollectiveTimeoutError, CommunicatorBrokenError)):
            self.broke(str(error))

    def _mark(self, seq: int, error: BaseException) -> None:
        if seq >= 0 and seq not in self.failures:
            self.failures[seq] = (f"{type(error).__name__}: {error}", time.monotonic())
            if len(self.failures) > self.capacity:
                self.failures.pop(min(self.failures))
        self.unfinished.discard(seq)

    def broke(self, reason: str) -> None:
        """The communicator became unusable: write the dump, once, where the settings say."""
        if self.dumped is None and self.count:
            try:
                self.dumped = self.dump(reason=f"failure: {reason}")
                log.warning("denseccl rank %d: flight recorder dump written to %s", self.rank, self.dumped)
            except OSError as error:
                self.dumped = ""
                log.warning("denseccl rank %d: could not write the flight recorder dump: %s", self.rank, error)

    # -- dumps ---------------------------------------------------------------------------------

    def entries(self) -> List[Dict[str, Any]]:
        """The calls in the ring, oldest first, as plain data (wall-clock times in seconds)."""
        offset = time.time() - time.monotonic()
        calls = []
        for seq, descriptor, started in self.ring.copy():  # one step: another thread may append meanwhile
            entry: Dict[str, Any] = dict(seq=seq, **descriptor.fields())
            entry["started"] = started + offset
            failure = self.failures.get(seq)
            if failure is not None:
                entry.update(state="failed", error=failure[0], failed=failure[1] + offset)
            else:
                entry["state"] = "started" if seq in self.unfinished else "completed"
            calls.append(entry)
        return calls

    def snapshot(self, reason: str) -> Dict[str, Any]:
        """The whole dump as plain data."""
        calls = self.entries()
        return {
            "format": FORMAT, "rank": self.rank, "size": self.size, "communicator": self.number,
            "backend": self.backend, "host": socket.gethostname(), "pid": os.getpid(), "reason": reason,
            "written": time.time(), "capacity": self.capacity, "recorded": calls[-1]["seq"] + 1 if calls else 0,
            "calls": calls,
        }

    def dump(self, directory: Optional[str] = None, reason: str = "on request") -> str:
        """Write the ring to ``directory`` (default ``DENSECCL_TRACE_DIR``) as
        ``comm<number>-rank<rank>.json`` and return its path."""
        folder = directory or config.trace_dir()
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, f"comm{self.number}-rank{self.rank}.json")
        text = json.dumps(self.snapshot(reason), indent=1)
        partial = f"{path}.{os.getpid()}.tmp"
        with open(partial, "w") as handle:
            handle.write(text)
        os.replace(partial, path)  # a reader never sees half a dump
        return path


def recorder_for(rank: int, size: int, backend: str) -> Optional[Recorder]:
    """A recorder for a new communicator, or None when ``DENSECCL_TRACE_BUFFER`` is 0."""
    capacity = config.settings().trace_buffer
    return Recorder(rank, size, backend, capacity) if capacity else None


def dump_all(directory: Optional[str] = None) -> List[str]:
    """Dump every live communicator's recorder of this process (``denseccl.dump_traces``);
    the paths written."""
    return [recorder.dump(directory) for recorder in sorted(_live, key=lambda r: r.number) if recorder.count]


__all__ = ["FORMAT", "Recorder", "dump_all", "recorder_for"]
