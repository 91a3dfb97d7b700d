"""An enqueued NCCL call (:class:`NCCLPending`): testing it, ordering the caller's stream after it,
blocking the host for it.

Why it exists: every poller of NCCL work (the flow's dropped Works, ``Work.is_completed``, the
torch adapter's progress thread) asks here, so the rules for asking are in one place: a call
captured into a CUDA graph is never queried; while a capture seen on the device runs, an eager
call is "not done yet" (the device's capture gate, :meth:`.cuda.CudaStreams.capture_in_progress`);
a CUDA error while asking aborts the communicator; past a host wait's deadline the communicator
is aborted and :class:`CollectiveTimeoutError` raised. What it needs of its transport is
:class:`Owner`.
"""

from __future__ import annotations

from typing import Any, Optional, Protocol

from ...errors import CollectiveTimeoutError
from ...streams import StreamRef
from ...wait import wait_until
from ...transport import Pending
from .cuda import CudaStreams


class Owner(Protocol):
    """What a pending call asks of the transport it ran on (:class:`.transport.NCCLTransport`)."""

    events: CudaStreams

    def failure(self) -> Optional[str]:
        """Why the communicator failed (aborted by a verdict), or None."""

    def raise_if_failed(self) -> None:
        """Raise the failure's error, if any."""

    def async_error(self) -> Optional[str]:
        """NCCL's asynchronous error of the communicator as text, or None."""

    def abort(self, reason: str, timed_out: bool = False) -> None:
        """Abort the communicator for ``reason`` (the first reason wins)."""


class NCCLPending(Pending):
    """An enqueued NCCL call and the event recorded after it on its ``stream``. A call captured
    into a CUDA graph (``captured``) runs when the graph is replayed: nothing waits for it on the
    host or queries its event; ``wait`` joins the current stream to it while the capture lasts."""

    __slots__ = ("_transport", "_event", "stream", "_host", "captured")

    watched = True  # the watchdog aborts at the timeout; during a capture only it may judge (it waits)

    def __init__(
        self, transport: Owner, event: Any, stream: StreamRef, host: bool = False, captured: bool = False
    ) -> None:
        self._transport = transport
        self._event = event
        self.stream = stream
        self._host = host  # barrier: wait() blocks the host
        self.captured = captured

    @property
    def stream_ordered(self) -> bool:
        """Whether :meth:`wait` only orders the current stream (every call but a barrier's)."""
        return not self._host or self.captured

    def test(self) -> bool:
        return self.captured or self._finished()

    def _finished(self) -> bool:
        """Whether the call completed or the communicator failed; a CUDA error while asking
        (sticky) aborts the communicator. While a capture seen on the device runs, "not yet":
        in global capture mode the query would invalidate it (every poller asks here: the
        flow's orphans, ``Work.is_completed``, the torch adapter's progress thread)."""
        transport = self._transport
        if transport.failure() is not None:
            return True
        try:
            if transport.events.capture_in_progress():
                return False
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


__all__ = ["NCCLPending", "Owner"]
