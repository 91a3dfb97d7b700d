"""Work: a collective started with ``async_op=True``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .config import Seconds, seconds
from .backends.base import Pending

if TYPE_CHECKING:
    from .flow import Flow


class Work:
    """A collective started with ``async_op=True``. ``wait()`` returns its result.

    A Work dropped before it has completed is adopted by its communicator's flow, with the
    buffers its transfer uses, and completed there: by a later call on the communicator, or by
    ``close()``. Its result (an average's division included) is then written as if it had
    been waited for. If the communicator goes away first, or breaks, the transfer and its
    buffers are kept for the process's life: nothing it may still touch is freed. Until it
    completes or is dropped it is counted in its flow's ``unfinished``: a communicator closed
    meanwhile keeps its library communicator, which the transfer uses."""

    __slots__ = ("_flow", "_pending", "_result", "_keep", "_done", "_seq")

    def __init__(self, flow: "Flow", pending: Pending, result: Any, keep: Any) -> None:
        self._flow = flow
        self._pending = pending
        self._result = result
        self._keep = keep  # the buffers the transfer reads and writes
        self._done = False
        flow.unfinished.append(True)
        self._seq = flow.recorder.began_async() if flow.recorder else -1

    def wait(self, timeout: Seconds = None) -> Any:
        """Block until the collective has completed and return its result array.
        ``timeout`` (seconds or a ``datetime.timedelta``) defaults to the communicator's. On a device transport (NCCL)
        this does not block the host: it makes the caller's current stream wait for the
        collective, as torch's ``Work.wait()`` does; use :meth:`synchronize` to block."""
        self._flow.wait(self._pending, (self._keep, self._result), seconds(timeout, "timeout"))
        self._completed()
        return self._result

    def synchronize(self, timeout: Seconds = None) -> Any:
        """Block the host until the collective has completed (on the device too) and return
        its result; :class:`CollectiveTimeoutError` after ``timeout`` seconds (default: the
        communicator's), which also aborts a device communicator."""
        self._flow.wait(self._pending, (self._keep, self._result), seconds(timeout, "timeout"), synchronize=True)
        self._completed()
        return self._result

    def is_completed(self) -> bool:
        """True once the collective has completed; never blocks. A failure seen while polling
        (e.g. in the host step after the transfer) marks the communicator broken, as wait() does."""
        if not self._done and self._flow.test(self._pending, (self._keep, self._result)):
            self._completed()
        return self._done

    def _completed(self) -> None:
        if not self._done:
            self._done, self._keep = True, None
            self._flow.unfinished.pop()
            if self._flow.recorder:
                self._flow.recorder.ended(self._seq)

    @property
    def result(self) -> Any:
        """The result array (valid once the work has completed)."""
        return self._result

    def __del__(self) -> None:
        if not self._done:  # nobody can wait for it any more: its communicator's flow will
            self._flow.unfinished.pop()
            if self._flow.recorder:
                self._flow.recorder.ended(self._seq)
            self._flow.adopt(self._pending, (self._keep, self._result))
