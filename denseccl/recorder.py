"""The flight recorder: a bounded ring of each communicator's last calls, written to a file when a
call times out (or a peer gave up), and on request. On by default (``DENSECCL_TRACE_BUFFER``).

Every call that takes part in the agreement step is numbered in order (its sequence, the same on
every rank of a communicator whose ranks make the same calls) and recorded with its descriptor
and the time its agreement step began; a failure marks the call it belongs to. A call is
``started`` until it is known to have ended: a synchronous call once its caller made the next
call or asked for a dump, an ``async_op`` call once its Work completed.

The cost per call is what makes it fit to stay on: two stores into lists made once (the
descriptor, by reference, and the time the flow reads anyway for the agreement's deadline)
at an index computed from the count, and the count's increment. Nothing is allocated, copied
or formatted until a dump. The record and that clock read are one call into the compiled
``denseccl._ring`` (setup.py), about as costly as the clock read alone; where it was not built,
:class:`PythonRing` does the same in Python, about 120 ns more (docs/debugging.md has the
figures). Dumps go into a folder per job (trace_files.py); ``python -m denseccl.trace_summary
DIR`` reads every rank's dumps.
"""

from __future__ import annotations

import itertools
from array import array
import json
import os
import socket
import time
import weakref
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

from . import config, log, trace_files
from .errors import CollectiveTimeoutError, CommunicatorBrokenError, DenseCCLError

#: the format written into every dump, checked by the reader
FORMAT = "denseccl-trace/1"

_numbers = itertools.count()
#: every live recorder of this process, for :func:`dump_all`
_live: "weakref.WeakSet[Recorder]" = weakref.WeakSet()


class PythonRing:
    """The record of ``denseccl._ring.Ring`` in Python, where that was not built: ``record(d)``
    stores ``d`` and ``time.monotonic()`` as the next call into ``calls`` (a list) and
    ``times`` (an ``array('d')`` of the same length) and returns that time; ``count`` calls
    have been recorded."""

    __slots__ = ("calls", "times", "length", "count")

    def __init__(self, calls: List[Any], times: "array[float]") -> None:
        if not calls or len(calls) != len(times):
            raise ValueError("a ring needs a list and an array of the same length, at least 1")
        self.calls, self.times, self.length, self.count = calls, times, len(calls), 0

    def record(self, descriptor: Any) -> float:
        n = self.count
        slot = n % self.length
        now = time.monotonic()
        self.calls[slot] = descriptor
        self.times[slot] = now
        self.count = n + 1
        return now


def ring_type() -> Any:
    """The ring the recorders of this process use: the compiled one when built."""
    try:
        from ._ring import Ring  # noqa: PLC0415 - optional compiled module

        return Ring
    except ImportError:
        return PythonRing


def describe() -> str:
    """One line for the environment report: whether the recorder is on, its size, its ring."""
    capacity = config.settings().trace_buffer
    if not capacity:
        return "off (DENSECCL_TRACE_BUFFER=0)"
    ring = "compiled (denseccl._ring)" if ring_type() is not PythonRing else (
        "in Python (denseccl._ring not built: about 120 ns more per call)"
    )
    return f"on: the last {capacity} calls of each communicator (DENSECCL_TRACE_BUFFER); record {ring}"


class Recorder:
    """The last ``capacity`` calls of one communicator (rank ``rank`` of ``size``). ``number``
    tells this process's communicators apart: the n-th one created (the same on every rank that
    creates the same communicators in the same order). ``job``: the id of the job's dump
    folder, the same on every rank (trace_files.py).

    The ring: call ``seq`` is at index ``seq % length`` of :attr:`calls` (its descriptor) and
    :attr:`times` (``time.monotonic()`` when its agreement step began); :attr:`count` calls have
    been recorded. ``record(descriptor)`` records the next call and returns the time it read (the
    caller's "now"). A recording thread writes both slots before it counts the call, so a dump
    taken meanwhile (:meth:`entries`) can tell which slots hold which call; the one slot more
    than ``capacity`` is the one such a call may be writing."""

    __slots__ = (
        "rank", "size", "backend", "number", "job", "capacity", "length", "calls", "times", "ring", "record",
        "failures", "unfinished", "dumped", "__weakref__",
    )
    #: record the next call: ``record(descriptor) -> time.monotonic()`` (the ring's own method)
    record: Callable[[Any], float]

    def __init__(self, rank: int, size: int, backend: str, capacity: int, job: Optional[str] = None) -> None:
        if capacity < 1:
            raise ValueError(f"a flight recorder keeps at least one call, not {capacity}")
        self.rank, self.size, self.backend = rank, size, backend
        self.number = next(_numbers)
        self.job = job or trace_files.local_job()
        self.capacity = capacity
        self.length = capacity + 1
        #: the descriptors of the last calls, by ``seq % length`` (made once, never resized)
        self.calls: List[Any] = [None] * self.length
        #: when each of them began its agreement step (``time.monotonic()``), alike: doubles,
        #: not float objects (a ring of float objects kept alive costs each call a cold one)
        self.times = array("d", bytes(8 * self.length))
        #: what records into them (compiled, or :class:`PythonRing`)
        self.ring = ring_type()(self.calls, self.times)
        self.record = self.ring.record
        #: sequence -> (error text, time.monotonic) of the calls that failed (only those in the ring)
        self.failures: Dict[int, Tuple[str, float]] = {}
        #: the sequences of calls started with async_op=True whose Work has not completed
        self.unfinished: Set[int] = set()
        #: the path of the dump written on failure, once written (one per communicator)
        self.dumped: Optional[str] = None
        _live.add(self)

    @property
    def count(self) -> int:
        """The calls recorded so far: the next call's sequence (public: the communicator's call
        number)."""
        return int(self.ring.count)

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
        """The communicator became unusable: write the dump, once, where the settings say; a
        folder that is not safe is refused with a warning (nothing is written)."""
        if self.dumped is None and self.count:
            try:
                self.dumped = self.dump(reason=f"failure: {reason}")
                log.warning("denseccl rank %d: flight recorder dump written to %s", self.rank, self.dumped)
            except (OSError, DenseCCLError) as error:
                self.dumped = ""
                log.warning("denseccl rank %d: flight recorder dump not written: %s", self.rank, error)

    # -- dumps ---------------------------------------------------------------------------------

    def entries(self) -> List[Dict[str, Any]]:
        """The calls in the ring, oldest first, as plain data (wall-clock times in seconds)."""
        offset = time.time() - time.monotonic()
        first = self.count
        calls, times = self.calls[:], self.times[:]  # each one step: another thread may record meanwhile
        last = self.count  # the slots of calls first..last may hold newer calls than those counted first
        entries = []
        for seq in range(max(0, last + 1 - self.length), first):
            slot = seq % self.length
            entry: Dict[str, Any] = dict(seq=seq, **calls[slot].fields())
            entry["started"] = times[slot] + offset
            failure = self.failures.get(seq)
            if failure is not None:
                entry.update(state="failed", error=failure[0], failed=failure[1] + offset)
            else:
                entry["state"] = "started" if seq in self.unfinished else "completed"
            entries.append(entry)
        return entries

    def snapshot(self, reason: str) -> Dict[str, Any]:
        """The whole dump as plain data."""
        calls = self.entries()
        return {
            "format": FORMAT, "rank": self.rank, "size": self.size, "communicator": self.number, "job": self.job,
            "backend": self.backend, "host": socket.gethostname(), "pid": os.getpid(), "reason": reason,
            "written": time.time(), "capacity": self.capacity, "recorded": calls[-1]["seq"] + 1 if calls else 0,
            "calls": calls,
        }

    def folder(self, directory: Optional[str] = None) -> str:
        """The folder this recorder's dumps go to: its job's, in ``directory`` (default
        ``DENSECCL_TRACE_DIR``, else the per-user default)."""
        return trace_files.job_folder(directory, self.job)

    def dump(self, directory: Optional[str] = None, reason: str = "on request") -> str:
        """Write the ring as ``comm<number>-rank<rank>.json`` into its job's folder in
        ``directory`` (see :meth:`folder`) and return its path. A folder that another user could
        read or redirect raises :class:`trace_files.UnsafeFolder` (a DenseCCLError); nothing
        is written then."""
        text = json.dumps(self.snapshot(reason), indent=1)
        name = f"comm{self.number}-rank{self.rank}.json"
        fd, folder = trace_files.open_job_folder(directory, self.job)
        try:
            trace_files.write(fd, name, text)
        finally:
            os.close(fd)
        return os.path.join(folder, name)


def recorder_for(rank: int, size: int, backend: str, control: Any, deadline: Optional[float]) -> Optional[Recorder]:
    """A recorder for a new communicator, or None when ``DENSECCL_TRACE_BUFFER`` is 0. Its job id
    is agreed over ``control`` (collective: every rank of the new communicator calls this)."""
    capacity = config.settings().trace_buffer
    if not capacity:
        return None
    return Recorder(rank, size, backend, capacity, trace_files.agree_job(control, size, deadline))


def dump_all(directory: Optional[str] = None) -> List[str]:
    """Dump every live communicator's recorder of this process (``denseccl.dump_traces``);
    the paths written. A dump that cannot be written is skipped with a warning (this may run
    in a signal handler)."""
    written = []
    for recorder in sorted(_live, key=lambda r: r.number):
        if recorder.count:
            try:
                written.append(recorder.dump(directory))
            except (OSError, DenseCCLError) as error:
                log.warning("denseccl rank %d: flight recorder dump not written: %s", recorder.rank, error)
    return written


__all__ = ["FORMAT", "PythonRing", "Recorder", "describe", "dump_all", "recorder_for", "ring_type"]
