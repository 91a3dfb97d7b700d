"""Work: a collective started with ``async_op=True``; Orphans: the Works dropped before they
completed, which their communicator completes instead of freeing memory under a running request."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, List, Optional, Tuple

from .config import Seconds, seconds
from .transports.base import Pending, abandon

if TYPE_CHECKING:
    from .communicator import Communicator

class Work:
    """A collective started with ``async_op=True``. ``wait()`` returns its result.

    A Work dropped before it has completed is adopted by its communicator, with the buffers
    its transfer uses, and completed there: by a later call on the communicator, or by
    ``close()``. Its result (an average's division included) is then written as if it had
    been waited for."""

    __slots__ = ("_communicator", "_pending", "_result", "_keep", "_done")

    def __init__(self, communicator: "Communicator", pending: Pending, result: Any, keep: Any) -> None:
        self._communicator = communicator
        self._pending = pending
        self._result = result
        self._keep = keep  # the buffers the transfer reads and writes
        self._done = False

    def wait(self, timeout: Seconds = None) -> Any:
        """Block until the collective has completed and return its result array.
        ``timeout`` (seconds or a ``datetime.timedelta``) defaults to the communicator's. On a device transport (NCCL)
        this does not block the host: it makes the caller's current stream wait for the
        collective, as torch's ``Work.wait()`` does; use :meth:`synchronize` to block."""
        self._communicator._wait(self._pending, seconds(timeout, "timeout"))
        self._done, self._keep = True, None
        return self._result

    def synchronize(self, timeout: Seconds = None) -> Any:
        """Block the host until the collective has completed (on the device too) and return
        its result; :class:`CollectiveTimeoutError` after ``timeout`` seconds (default: the
        communicator's), which also aborts a device communicator."""
        self._communicator._synchronize(self._pending, seconds(timeout, "timeout"))
        self._done, self._keep = True, None
        return self._result

    def is_completed(self) -> bool:
        """True once the collective has completed; never blocks. A failure seen while polling
        (e.g. in the host step after the transfer) marks the communicator broken, as wait() does."""
        if not self._done and self._communicator._guard(self._pending.test):
            self._done = True
        return self._done

    @property
    def result(self) -> Any:
        """The result array (valid once the work has completed)."""
        return self._result

    def __del__(self) -> None:
        if not self._done:  # nobody can wait for it any more: its communicator will
            self._communicator._orphans.adopt(self._pending, (self._keep, self._result))


class Orphans:
    """A communicator's adopted requests with the buffers they use, oldest first. Only the
    communicator holds them (their Works are gone), so no other thread tests them meanwhile."""

    def __init__(self, communicator: "Communicator") -> None:
        self._communicator = communicator
        self._entries: List[Tuple[Pending, Any]] = []

    def __len__(self) -> int:
        return len(self._entries)

    def adopt(self, pending: Pending, keep: Any) -> None:
        """Keep a dropped Work's request and buffers until the request has completed."""
        if self._communicator._broken is None:
            self._entries.append((pending, keep))
        else:  # it may never complete: its memory must outlive any late access by the library
            abandon(pending, keep)

    def poll(self) -> None:
        """Complete the requests that have finished, without blocking. A failure belongs to
        the dropped Work, not to the caller: the communicator is marked broken, and its next
        call says so."""
        try:
            self._complete(None)
        except Exception:  # noqa: BLE001 - recorded by the communicator's _guard
            pass

    def wait(self, deadline: Optional[float]) -> None:
        """Complete every request, waiting until ``deadline`` (close())."""
        self._complete(deadline)

    def _complete(self, deadline: Optional[float]) -> None:
        communicator = self._communicator
        entries, self._entries = self._entries, []
        try:
            while entries and communicator._broken is None:
                pending, _ = entries[0]
                if deadline is None:
                    if not communicator._guard(pending.test):
                        break  # still running: a later call polls it again
                else:
                    communicator._guard(pending.wait, deadline)
                entries.pop(0)
        finally:
            if communicator._broken is None:
                self._entries.extend(entries)
            else:
                abandon(entries)
