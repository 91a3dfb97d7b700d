"""The NCCL transport's CUDA side, thin over CuPy's own objects, and what happens when work does
not complete.

- :class:`CudaStreams`: an event recorded after each call (a ``cupy.cuda.Event`` recorded on the
  call's stream, which ``cupy.cuda.Stream.from_external`` wraps), whether it has completed
  (``cudaEventQuery``'s status through ``cupy.cuda.runtime.eventQuery``: CuPy's ``Event.done``
  reads a sticky CUDA error as "not done yet", which would turn it into a timeout or a hang), a
  stream made to wait for it (``Stream.wait_event``) and whether a stream is
  being captured into a CUDA graph (``Stream.is_capturing``). The ``cupy`` module is passed in,
  so the CPU tests run this very code on a fake whose API is checked against the installed CuPy.
- :class:`NCCLPending`: :meth:`~NCCLPending.wait` makes the caller's *current* stream wait for
  the call's event (no host synchronisation; nothing when the call ran on that stream);
  :meth:`~NCCLPending.synchronize` blocks the host, polling the event and
  ``ncclCommGetAsyncError``, and aborts the communicator when the deadline passes.
- :class:`Watchdog`: one daemon thread per transport, as in torch's ProcessGroupNCCL: a call
  still unfinished ``timeout`` seconds after it was enqueued, or an asynchronous NCCL error,
  aborts the communicator, and every later call raises.

A call enqueued while its stream is being captured into a CUDA graph runs only when the graph
is replayed: it gets no watchdog entry and its event is never queried (querying an event
recorded during capture is an error), as ProcessGroupNCCL does under capture. In CUDA's default
(global) capture mode any event query, from any thread, invalidates a capture in progress, so
once a call has seen a capture on a device, no watchdog of that device queries an event until
that capture has ended (``cudaStreamIsCapturing`` itself is allowed during a capture). torch's
CUDAGraph closes the other half for ProcessGroupNCCL, waiting before a capture begins until the
watchdog has retired the eager work; here :meth:`Watchdog.wait_idle` (the transport's
``wait_idle``) is that wait, for the caller to make before it begins a capture.
"""

from __future__ import annotations

import collections
import importlib
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Deque, Dict, Optional, Set, Tuple

from ... import config
from ...errors import ArgumentError, CollectiveTimeoutError
from ...streams import StreamRef, current_stream_pointer
from ..base import Pending
from ...wait import deadline_after, wait_until

if TYPE_CHECKING:
    from .transport import NCCLTransport

CUDA_SUCCESS, CUDA_NOT_READY = 0, 600  # cudaError_t of cudaEventQuery: done, still running
CUDA_CAPTURE_IMPLICIT = 906  # cudaErrorStreamCaptureImplicit: the legacy stream during another's capture
CUDA_CAPTURE_ERRORS = range(900, 909)  # cudaErrorStreamCaptureUnsupported .. cudaErrorStreamCaptureWrongThread


#: (id of the cupy module, device) -> (that module, the streams seen capturing there whose capture
#: may still run): process-wide, since a capture is invalidated by a query from any thread
_CAPTURES: Dict[Tuple[int, int], Tuple[Any, Set[int]]] = {}
_CAPTURES_LOCK = threading.Lock()


class _Handle:
    """A raw ``cudaStream_t`` offered through the CUDA stream protocol (``__cuda_stream__``)."""

    __slots__ = ("pointer",)

    def __init__(self, pointer: int) -> None:
        self.pointer = pointer

    def __cuda_stream__(self) -> Tuple[int, int]:
        return (0, self.pointer)


class CudaStreams:
    """The CUDA calls the transport makes, each one CuPy call on CuPy's objects, on ``device``."""

    def __init__(
        self, device: int, cupy: Any = None, current: Callable[[str, int], int] = current_stream_pointer
    ) -> None:
        self._cupy = importlib.import_module("cupy") if cupy is None else cupy  # device transport only
        self._current = current  # (library, device) -> that library's current stream there
        self.device = device
        self._streams: Dict[int, Any] = {}
        with _CAPTURES_LOCK:
            self._captures = _CAPTURES.setdefault((id(self._cupy), device), (self._cupy, set()))[1]

    def stream(self, pointer: int) -> Any:
        """CuPy's view of the stream ``pointer`` (which it does not own), made once per handle."""
        found = self._streams.get(pointer)
        if found is None:
            cuda = self._cupy.cuda
            if hasattr(cuda.Stream, "from_external"):  # CuPy >= 14
                found = cuda.Stream.from_external(_Handle(pointer))
            else:
                found = cuda.ExternalStream(pointer, self.device)
            if len(self._streams) >= 256:  # streams come and go: keep the cache bounded
                self._streams.clear()
            self._streams[pointer] = found
        return found

    def record(self, pointer: int) -> Any:
        """A new event recorded on stream ``pointer`` after the work enqueued there so far."""
        with self._cupy.cuda.Device(self.device):  # stream 0 is the legacy stream of the current device
            event = self._cupy.cuda.Event(block=False, disable_timing=True)
            event.record(self.stream(pointer))
        return event

    def done(self, event: Any) -> bool:
        """Whether the work before ``event`` has completed; raises CuPy's ``CUDARuntimeError``
        for an error (e.g. an illegal address, sticky). The capture rules' refusals
        (cudaErrorStreamCapture*) are no answer and no error of the work: "not done yet"."""
        runtime = self._cupy.cuda.runtime
        status = runtime.eventQuery(event.ptr)
        if status == CUDA_SUCCESS:
            return True
        if status == CUDA_NOT_READY or status in CUDA_CAPTURE_ERRORS:
            return False
        raise runtime.CUDARuntimeError(status)

    def wait(self, pointer: int, event: Any) -> None:
        """Make stream ``pointer`` wait for ``event`` (no host synchronisation)."""
        with self._cupy.cuda.Device(self.device):
            self.stream(pointer).wait_event(event)

    def capturing(self, pointer: int) -> bool:
        """Whether stream ``pointer`` is being captured into a CUDA graph now. CuPy's answer
        raises where the question has none: an invalidated capture, or the legacy stream while
        another stream captures (cudaErrorStreamCaptureImplicit); both become an ArgumentError that
        says what to do, raised before anything is enqueued (the communicator stays usable)."""
        with self._cupy.cuda.Device(self.device):
            try:
                found = bool(self.stream(pointer).is_capturing())
            except RuntimeError as error:
                if getattr(error, "status", None) == CUDA_CAPTURE_IMPLICIT:
                    raise ArgumentError(
                        f"stream {pointer:#x} is the legacy default stream, which cannot be used while another stream "
                        f"is captured into a CUDA graph ({error}); run the collective on a non-default stream "
                        "(stream=, or the capturing stream) or after the capture"
                    ) from error
                if "invalidated" not in str(error):
                    raise
                raise ArgumentError(
                    f"the capture of stream {pointer:#x} into a CUDA graph was invalidated by an earlier error "
                    f"({error}); end it (end_capture) and capture again. Nothing was enqueued"
                ) from error
        if found:
            with _CAPTURES_LOCK:
                self._captures.add(pointer)
        return found

    def capture_in_progress(self) -> bool:
        """Whether a capture that a call on this device has seen is still running (any
        thread's, any communicator's); captures found ended are forgotten. Never raises: a
        stream whose capture cannot be asked about (invalidated, not yet ended) still counts."""
        with _CAPTURES_LOCK:
            streams = list(self._captures)
        if not streams:
            return False
        ended = set()
        for pointer in streams:
            try:
                with self._cupy.cuda.Device(self.device):
                    if not self.stream(pointer).is_capturing():
                        ended.add(pointer)
            except Exception:  # noqa: BLE001 - an invalidated capture still runs until it is ended
                continue
        with _CAPTURES_LOCK:
            self._captures.difference_update(ended)
        return len(ended) < len(streams)

    def current(self, ref: StreamRef) -> int:
        return self._current(ref.library, ref.device)

    def default_stream(self) -> StreamRef:
        return StreamRef(self._current("cupy", self.device), "cupy", self.device)

    def compute_capability(self) -> int:
        """The device's compute capability as major * 10 + minor (90 for sm90)."""
        return int(self._cupy.cuda.Device(self.device).compute_capability)

    def bind_thread(self) -> None:
        """Make this device current in the calling thread (the watchdog's)."""
        self._cupy.cuda.Device(self.device).use()

    def scratch(self, nbytes: int) -> Any:
        """Device memory of ``nbytes`` (an object with ``.ptr``; freed when dropped)."""
        with self._cupy.cuda.Device(self.device):
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
        self._entries: Deque[_Entry] = collections.deque()
        self._condition = threading.Condition()
        self._thread: Optional[threading.Thread] = None
        self._stopped = False

    def begin(self, what: str) -> _Entry:
        """Track a collective about to be enqueued (its enqueue may block, e.g. while NCCL
        connects to a peer that never comes: that counts against the deadline too)."""
        entry = _Entry(what, deadline_after(self.timeout))
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
        """Wait (at most ``timeout`` s) until every watched call has been seen complete and
        retired, so that the watchdog makes no more event queries; whether it got there. Made
        before a CUDA graph capture begins (CUDA's global capture mode forbids queries)."""
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


# -- the pending call ----------------------------------------------------------------------------


class NCCLPending(Pending):
    """An enqueued NCCL call and the event recorded after it on its ``stream``.

    A call captured into a CUDA graph (``captured``) has nothing to wait for on the host: it runs
    when the graph is replayed. Its event belongs to the capture; ``wait`` joins the caller's
    current stream to it while the capture lasts, and nothing ever queries it."""

    __slots__ = ("_transport", "_event", "stream", "_host", "captured")

    def __init__(
        self, transport: "NCCLTransport", event: Any, stream: StreamRef, host: bool = False, captured: bool = False
    ) -> None:
        self._transport = transport
        self._event = event
        self.stream = stream
        self._host = host  # barrier: wait() blocks the host
        self.captured = captured

    def test(self) -> bool:
        return self.captured or self._finished()

    def _finished(self) -> bool:
        """Whether the call completed or the communicator failed; a CUDA error while asking
        (a sticky error of the context) aborts the communicator and counts as its failure."""
        transport = self._transport
        if transport._failure is not None:
            return True
        try:
            return bool(transport.events.done(self._event))
        except Exception as error:  # noqa: BLE001 - CuPy raises CUDARuntimeError
            transport.abort(f"checking NCCL work failed: {type(error).__name__}: {error}", timed_out=False)
            return True

    def wait(self, deadline: Optional[float]) -> None:
        """Make the caller's current stream wait for the call (free when the call ran there)."""
        if self._host and not self.captured:
            self.synchronize(deadline)
            return
        transport = self._transport
        transport.raise_if_failed()
        events = transport.events
        current = events.current(self.stream)
        if current == self.stream.pointer:
            return
        if self.captured and not events.capturing(self.stream.pointer):
            return  # the capture has ended: the graph's replays order themselves
        events.wait(current, self._event)

    def synchronize(self, deadline: Optional[float]) -> None:
        """Block the host until the call has completed; past ``deadline`` abort the
        communicator and raise :class:`CollectiveTimeoutError`. A captured call only orders
        the current stream (blocking the host during a capture would invalidate it)."""
        if self.captured:
            self._host = False
            self.wait(deadline)
            return
        transport = self._transport

        def finished() -> bool:
            if self._finished():
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


__all__ = ["CudaStreams", "NCCLPending", "Watchdog"]
