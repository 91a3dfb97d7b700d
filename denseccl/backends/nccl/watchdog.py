"""The NCCL watchdog: one daemon thread per transport, as in torch's ProcessGroupNCCL, that gives
a verdict on the eager calls enqueued (late, or an asynchronous NCCL error) and hands it to the
transport, which aborts the communicator.

Why it exists: work nobody waits for must still time out, and a peer that is gone must not hang
the device forever. It knows nothing of CUDA or NCCL: it is given how to ask whether an event is
done, how to read the asynchronous error, and ``paused`` (the device's capture gate,
:meth:`.cuda.CudaStreams.capture_in_progress`): while a CUDA graph capture runs no event is
queried, so verdicts wait for the capture's end.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import time
from typing import Any, Callable, Deque, Optional, Tuple

from ... import config
from ...wait import deadline_after


@dataclasses.dataclass
class Entry:
    """One collective watched, as :meth:`Watchdog.begin` returns it: the caller sets ``event``
    (recorded after the call) once the enqueue has returned, or ``cancelled`` when it failed."""

    what: str
    deadline: Optional[float]
    event: Any = None
    cancelled: bool = False


class Watchdog:
    """Watches enqueued work from a daemon thread. Only the oldest unfinished entry can be late
    (entries complete in order); while any is in flight it also polls for asynchronous errors.
    On a verdict it calls ``on_failure(reason, timed_out)`` once and stops; with nothing in
    flight it sleeps on a condition."""

    def __init__(
        self,
        timeout: Optional[float],
        done: Callable[[Any], bool],
        async_error: Callable[[], Optional[str]],
        on_failure: Callable[[str, bool], None],
        interval: float = config.WATCHDOG_INTERVAL,
        on_start: Optional[Callable[[], None]] = None,
        paused: Optional[Callable[[], bool]] = None,
    ) -> None:
        self.timeout = timeout
        self._on_start = on_start
        self._paused = paused  # while true (a CUDA graph capture runs), no event is queried
        self._done = done
        self._async_error = async_error
        self._on_failure = on_failure
        self._interval = interval
        self._entries: Deque[Entry] = collections.deque()
        self._condition = threading.Condition()
        self._thread: Optional[threading.Thread] = None
        self._stopped = False

    def begin(self, what: str) -> Entry:
        """Track a collective about to be enqueued (its enqueue may block, e.g. while NCCL
        connects to a peer that never comes: that counts against the deadline too)."""
        entry = Entry(what, deadline_after(self.timeout))
        with self._condition:
            if self._stopped:
                return entry
            self._entries.append(entry)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="denseccl-nccl-watchdog", daemon=True)
                self._thread.start()
            self._condition.notify()
        return entry

    @property
    def in_flight(self) -> int:
        return len(self._entries)

    def check(self) -> Optional[Tuple[str, bool]]:
        """One look: drop finished entries; ``(reason, timed_out)`` if the oldest is late or
        NCCL reports an asynchronous error, else None."""
        entries = self._entries
        try:
            while entries:
                head = entries[0]
                if head.cancelled or (head.event is not None and self._done(head.event)):
                    entries.popleft()
                    continue
                break
            if not entries:
                return None
            head = entries[0]
            if head.deadline is not None and time.monotonic() > head.deadline:
                return (
                    f"NCCL {head.what} did not complete within {self.timeout:g} s (a peer never joined, crashed or "
                    "is stuck); the watchdog aborted the NCCL communicator",
                    True,
                )
            error = self._async_error()
        except Exception as failure:  # noqa: BLE001 - a CUDA error while polling ends the communicator too
            return f"checking NCCL work failed: {type(failure).__name__}: {failure}", False
        if error:
            return error, False
        return None

    def _run(self) -> None:
        if self._on_start is not None:
            try:
                self._on_start()
            except Exception as error:  # noqa: BLE001
                self._on_failure(f"the NCCL watchdog could not start: {type(error).__name__}: {error}", False)
                return
        while True:
            with self._condition:
                while not self._entries and not self._stopped:
                    self._condition.wait()
                if self._stopped:
                    return
            if self._paused is not None and self._paused():
                time.sleep(self._interval)  # verdicts wait for the capture's end: they need queries
                continue
            verdict = self.check()
            if verdict is not None:
                with self._condition:
                    if self._stopped:
                        return
                    self._stopped = True
                self._on_failure(*verdict)
                return
            time.sleep(self._interval)

    def wait_idle(self, timeout: float) -> bool:
        """The transport's :meth:`~NCCLTransport.wait_idle`."""
        deadline = time.monotonic() + timeout
        while self._entries and not self._stopped and time.monotonic() < deadline:
            time.sleep(self._interval)
        return not self._entries or self._stopped

    def close(self) -> None:
        with self._condition:
            self._stopped = True
            self._condition.notify_all()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5.0)
        self._entries.clear()


__all__ = ["Entry", "Watchdog"]
