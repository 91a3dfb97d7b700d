"""How the NCCL transport learns that its work completed, and what happens when it does not.

A call runs on the :class:`~denseccl.arrays.StreamRef` the communicator resolved (the array's
current stream unless ``stream=`` was given) and records a CUDA event after it
(:class:`CudaEvents`, CuPy's runtime; tests pass a fake). :meth:`NCCLPending.wait` makes the
caller's *current* stream wait for that event (no host synchronisation; nothing at all when the
call ran on the current stream); :meth:`NCCLPending.synchronize` blocks the host, polling the
event and ``ncclCommGetAsyncError`` until the deadline, and aborts the communicator
(``ncclCommAbort``) when it passes. A :class:`Watchdog` thread per transport does the same for
work nobody waits on: a collective still unfinished ``timeout`` seconds after it was enqueued,
or an asynchronous NCCL error, aborts the communicator, and every later call raises.
"""

from __future__ import annotations

import collections
import contextlib
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Deque, Optional, Tuple

from ..arrays import StreamRef, current_stream_pointer
from ..errors import CollectiveTimeoutError
from .base import Pending, wait_until

if TYPE_CHECKING:
    from .nccl import NCCLTransport

NOT_READY = 600  # cudaErrorNotReady

# -- the CUDA runtime calls the transport makes (a fake replaces this on the CPU) ----------------


class CudaEvents:
    """CUDA events, stream waits and a scratch buffer through CuPy's runtime bindings."""

    def __init__(self, device: int) -> None:
        import cupy  # noqa: PLC0415 - device transport only

        self._cupy = cupy
        self._runtime = cupy.cuda.runtime
        self.device = device

    def _on_device(self) -> Any:
        if self._runtime.getDevice() == self.device:
            return contextlib.nullcontext()
        return self._cupy.cuda.Device(self.device)

    def record(self, stream: int) -> Any:
        """A new event recorded on ``stream`` (after the work enqueued there so far)."""
        with self._on_device():  # stream 0 means the current device's legacy stream
            event = self._cupy.cuda.Event(block=False, disable_timing=True)
            self._runtime.eventRecord(event.ptr, stream)
        return event

    def done(self, event: Any) -> bool:
        status = self._runtime.eventQuery(event.ptr)
        if status == 0:
            return True
        if status != NOT_READY:
            self._runtime.check_status(status)
        return False

    def wait(self, stream: int, event: Any) -> None:
        """Make ``stream`` wait for ``event`` (no host synchronisation)."""
        with self._on_device():
            self._runtime.streamWaitEvent(stream, event.ptr, 0)

    def current(self, ref: StreamRef) -> int:
        return current_stream_pointer(ref.library, ref.device)

    def default_stream(self) -> StreamRef:
        return StreamRef(current_stream_pointer("cupy", self.device), "cupy", self.device)

    def compute_capability(self) -> int:
        """The device's compute capability as major * 10 + minor (90 for sm90)."""
        return int(self._cupy.cuda.Device(self.device).compute_capability)

    def bind_thread(self) -> None:
        """Make this device current in the calling thread (the watchdog's)."""
        self._runtime.setDevice(self.device)

    def scratch(self, nbytes: int) -> Any:
        """Device memory of ``nbytes`` (an object with ``.ptr``; freed when dropped)."""
        with self._on_device():
            return self._cupy.cuda.alloc(nbytes)


# -- the watchdog ----------------------------------------------------------------------------------


class _Entry:
    """One enqueued collective: armed with its event once the enqueue call has returned."""

    __slots__ = ("what", "deadline", "event", "cancelled")

    def __init__(self, what: str, deadline: Optional[float]) -> None:
        self.what = what
        self.deadline = deadline
        self.event: Any = None
        self.cancelled = False


class Watchdog:
    """Watches enqueued work from a daemon thread, as torch's ProcessGroupNCCL does.

    Entries complete in order on the oldest's stream, so only the oldest unfinished entry can be
    late; while any is in flight the thread also polls for asynchronous errors. On a verdict it
    calls ``on_failure(reason, timed_out)`` once and stops. With nothing in flight it sleeps on
    a condition and costs nothing.
    """

    def __init__(
        self,
        timeout: Optional[float],
        done: Callable[[Any], bool],
        async_error: Callable[[], Optional[str]],
        on_failure: Callable[[str, bool], None],
        interval: float = 0.02,
        on_start: Optional[Callable[[], None]] = None,
    ) -> None:
        self.timeout = timeout
        self._on_start = on_start
        self._done = done
        self._async_error = async_error
        self._on_failure = on_failure
        self._interval = interval
        self._entries: Deque[_Entry] = collections.deque()
        self._condition = threading.Condition()
        self._thread: Optional[threading.Thread] = None
        self._stopped = False

    def begin(self, what: str) -> _Entry:
        """Track a collective about to be enqueued (its enqueue may block, e.g. while NCCL
        connects to a peer that never comes: that counts against the deadline too)."""
        entry = _Entry(what, None if self.timeout is None else time.monotonic() + self.timeout)
        with self._condition:
            if self._stopped:
                return entry
            self._entries.append(entry)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="denseccl-nccl-watchdog", daemon=True)
                self._thread.start()
            self._condition.notify()
        return entry

    @staticmethod
    def arm(entry: _Entry, event: Any) -> None:
        entry.event = event

    @staticmethod
    def cancel(entry: _Entry) -> None:
        entry.cancelled = True

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
            verdict = self.check()
            if verdict is not None:
                with self._condition:
                    if self._stopped:
                        return
                    self._stopped = True
                self._on_failure(*verdict)
                return
            time.sleep(self._interval)

    def close(self) -> None:
        with self._condition:
            self._stopped = True
            self._condition.notify_all()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5.0)
        self._entries.clear()


# -- the pending call ----------------------------------------------------------------------------


class NCCLPending(Pending):
    """An enqueued NCCL call and the event recorded after it on its stream."""

    __slots__ = ("_transport", "_event", "_stream", "_host")

    def __init__(self, transport: "NCCLTransport", event: Any, stream: StreamRef, host: bool = False) -> None:
        self._transport = transport
        self._event = event
        self._stream = stream
        self._host = host  # barrier: wait() blocks the host

    def test(self) -> bool:
        transport = self._transport
        return transport._failure is not None or transport.events.done(self._event)

    def wait(self, deadline: Optional[float]) -> None:
        """Make the caller's current stream wait for the call (free when the call ran there)."""
        if self._host:
            self.synchronize(deadline)
            return
        transport = self._transport
        transport.raise_if_failed()
        current = transport.events.current(self._stream)
        if current != self._stream.pointer:
            transport.events.wait(current, self._event)

    def synchronize(self, deadline: Optional[float]) -> None:
        """Block the host until the call has completed; past ``deadline`` abort the
        communicator and raise :class:`CollectiveTimeoutError`."""
        transport = self._transport

        def finished() -> bool:
            if transport._failure is not None or transport.events.done(self._event):
                return True
            error = transport.async_error()
            if error:
                transport.abort(error, timed_out=False)
                return True
            return False

        try:
            wait_until(finished, deadline, "NCCL collective")
        except CollectiveTimeoutError as error:
            reason = f"{error} (the NCCL communicator was aborted with ncclCommAbort)"
            transport.abort(reason, timed_out=True)
            raise CollectiveTimeoutError(reason) from None
        transport.raise_if_failed()


__all__ = ["CudaEvents", "NCCLPending", "Watchdog"]
