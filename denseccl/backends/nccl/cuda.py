"""CUDA as the NCCL transport uses it: events, streams and captures, each one CuPy call on CuPy's
own objects, on one device (:class:`CudaStreams`).

Why it exists: every CUDA query the NCCL path makes goes through here, so the capture rules are
kept in one place (docs/nccl.md, "CUDA graphs"). The ``cupy`` module is passed in, so the CPU
tests run this code on strict fakes.

- Completion is read through ``cudaEventQuery``'s status (:meth:`CudaStreams.done`), since
  ``Event.done`` reads a sticky error as "not done"; a refusal by the capture rules is "not done
  yet", no error of the work.
- Captures: a stream seen capturing by a call is remembered process-wide per ``(cupy, device)``
  (a global-mode capture is invalidated by a query from any thread), and
  :meth:`CudaStreams.capture_in_progress` is the gate every poller asks before it queries an
  event: while a remembered capture still runs, nothing of that device is queried. A stream CUDA
  no longer knows counts as ended.
"""

from __future__ import annotations

import importlib
import threading
from typing import Any, Callable, Dict, Set, Tuple

from ...errors import ArgumentError
from ...streams import StreamRef, current_stream_pointer

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
        """Whether the work before ``event`` has completed; CuPy's ``CUDARuntimeError`` for an
        error (sticky). A refusal by the capture rules is no error of the work: "not done yet"."""
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
        """Whether stream ``pointer`` is being captured into a CUDA graph now. Where CuPy cannot
        answer (an invalidated capture; the legacy stream while another captures), an
        ArgumentError says what to do, before anything is enqueued."""
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
        thread's, any communicator's); captures found ended are forgotten, and so are streams
        that no longer exist (destroyed after their capture: CUDA then refuses the handle).
        Never raises: a capture that cannot be asked about (invalidated, not yet ended) still
        counts."""
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
            except Exception as error:  # noqa: BLE001 - CuPy raises RuntimeError or CUDARuntimeError
                if not _capture_still_runs(error):
                    ended.add(pointer)
                    self._streams.pop(pointer, None)  # a new stream may get this handle
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


def _capture_still_runs(error: BaseException) -> bool:
    """Whether ``Stream.is_capturing`` raising ``error`` leaves the capture running: an
    invalidated capture (CuPy's RuntimeError, which has no status) runs until it is ended, and
    a capture error (cudaErrorStreamCapture*) is about a capture. Any other status (e.g.
    cudaErrorInvalidResourceHandle) says the stream itself is gone, and its capture with it."""
    status = getattr(error, "status", None)
    if status is None:
        return "invalidated" in str(error)
    return status in CUDA_CAPTURE_ERRORS


__all__ = ["CudaStreams"]
