"""The one flow of a collective: validate -> agree -> start -> complete.

A :class:`~denseccl.communicator.Communicator` method validates its inputs into a descriptor
and a start (a transport call with its arguments), then hands them to :meth:`Flow.run`, which
agrees, starts and completes. The plan replay (plans.py) is built by :meth:`Flow.plan` and goes
through the same steps with what cannot change between calls bound once; a Work (work.py)
completes through :meth:`Flow.wait`. docs/design.md draws the whole picture.

This class is also the interface for code built on the core (the torch adapter, work.py,
plans.py), so that none of it needs another module's private names:

- :meth:`fail`: raise a local failure on every rank (joins the agreement as invalid);
- :meth:`covered`: one agreement for several calls;
- :attr:`broken`, :meth:`usable`: the broken state;
- :meth:`wait`, :meth:`settle`, :meth:`test`, :meth:`adopt`: waiting, and dropped Works.

Memory: a started transfer may touch the caller's arrays and the transport's temporaries until
it completes, and MPI cannot cancel it. So every wait that ends other than by completion (a
timeout, a peer that gave up, an interrupt) hands the transfer with what it uses to
:func:`~denseccl.transports.base.abandon`, which keeps them for the process's life; and the
Works dropped before completion (:attr:`orphans`) are abandoned whole if the flow goes away
first. What a transfer can still touch includes its communicator: :meth:`close` releases the
transport and control channel only when no Work is in flight and nothing was abandoned, and
otherwise retires them (``Transport.retire``: the MPI communicators are never freed). Nothing
a transfer can still touch is ever freed.
"""

from __future__ import annotations

import contextlib
import time
import weakref
from typing import Any, Callable, Dict, Iterator, List, NoReturn, Optional, Tuple, TypeVar

from . import log, streams
from .agreement import Descriptor, agree, digest, disagree
from .errors import CollectiveTimeoutError, CommunicatorBrokenError, DenseCCLError, peer_gave_up_error
from .plans import Requests, compile_plan
from .recorder import recorder_for
from .transports.base import (
    DONE, UNPLANNED, WAITING, ControlChannel, Pending, Transport, abandon, deadline_after, wait_until,
)
from .work import Work

T = TypeVar("T")
#: polls of a transfer before a wait computes its deadline and watches for a peer that gave up
SPINS = 64
#: a transfer's test: True once it has completed (never blocks)
Test = Callable[[], bool]
#: the "a peer gave up" flag of a closed channel, which brings no news
CLOSED = (0,)


class Flow:
    """What every call of one communicator shares: the transport, the control channel, the
    policy (``check``, ``timeout``, ``on_timeout``), the broken state, the plans and the
    Works dropped in flight."""

    def __init__(
        self, transport: Transport, control: ControlChannel, *, check: bool, timeout: Optional[float], on_timeout: str
    ) -> None:
        self.transport = transport
        self.control = control
        self.rank: int = transport.rank
        self.size: int = transport.size
        self.check = check
        self.timeout = timeout if timeout and timeout > 0 else None
        #: "raise" or "abort" (config.ON_TIMEOUT)
        self.on_timeout = on_timeout
        #: why the communicator is unusable, or None
        self.broken: Optional[str] = None
        #: replays of repeated calls, by plan key (plans.py)
        self.plans: Dict[Any, Callable[[Any], Any]] = {}
        #: the plans' persistent requests (plans.Requests)
        self.requests = Requests()
        #: the transfers of Works dropped before they completed, with what they use, oldest first
        self.orphans: List[Tuple[Pending, Any]] = []
        #: one entry per Work handed out that has neither completed nor been dropped (work.py
        #: appends and pops them: atomic, and the torch adapter completes Works in a thread)
        self.unfinished: List[bool] = []
        #: a transfer of this communicator was abandoned: it may never complete
        self.abandoned = False
        self._all_equal, self._gave_up = control.fast_path()
        #: the flight recorder of this communicator's calls (recorder.py), or None
        self.recorder = recorder_for(self.rank, self.size, transport.name)
        weakref.finalize(self, _release_at_end, self.orphans, self.unfinished, self.requests)

    # -- the flow ----------------------------------------------------------------------------

    def run(
        self, descriptor: Descriptor, start: Optional[Callable[..., Pending]], args: Tuple[Any, ...],
        result: Any, keep: Any, async_op: bool, stream: Any = None,
    ) -> Any:
        """Agree on ``descriptor``, start ``start(*args)`` (None: nothing to move) and complete
        it: return ``result`` once done, or a Work for it with ``async_op``. ``keep``: the
        buffers the transfer reads and writes; on a device transport they are recorded on
        ``stream``, the one the transfer runs on."""
        began = time.perf_counter() if log.tracing() else 0.0
        self.agree(descriptor)
        pending = DONE if start is None else self.start(start, *args)
        if self.transport.device_memory:
            streams.record_stream(stream, keep)
        if self.orphans:
            self.poll_orphans()
        if async_op:
            outcome: Any = Work(self, pending, result, keep)
        else:
            self.wait(pending, keep)
            outcome = result
        if began:
            elapsed = (time.perf_counter() - began) * 1e6
            log.trace("%s%s: %.1f us", descriptor.describe(), " (started)" if async_op else "", elapsed)
        return outcome

    def plan(self, descriptor: Descriptor, buffer: Any, call: Tuple[Any, ...]) -> Optional[Callable[[Any], Any]]:
        """The replay of a call that just ran on ``buffer`` (plans.py), or None where the
        transport wants the full path each time. ``call``: ``(collective, count, dtype, op,
        root)`` as ``Transport.in_place`` takes them."""
        start = self.transport.in_place(*call)
        if start is None:
            return None
        return compile_plan(self, descriptor, buffer, start, self.transport.persistent(*call))

    def usable(self) -> None:
        """Raise :class:`CommunicatorBrokenError` if the communicator cannot be used."""
        reason = self.state()
        if reason is not None:
            raise CommunicatorBrokenError(
                f"this communicator is unusable ({reason}); create a new one with denseccl.init()"
            )

    def state(self) -> Optional[str]:
        """Why the communicator is unusable (its own timeout, a peer that gave up, a transport
        failure such as a device watchdog's verdict, closed), or None."""
        if self.broken is None:
            failure = self.transport.failure()
            if failure is None and self._gave_up[0]:
                failure = f"rank {self.control.peer_gave_up()} gave up on a collective (it timed out)"
                if self.recorder:
                    self.recorder.broke(failure)
            self.broken = failure
        return self.broken

    def deadline(self, timeout: Optional[float] = None) -> Optional[float]:
        return deadline_after(self.timeout if timeout is None else timeout)

    def agree(self, descriptor: Descriptor, value: Optional[int] = None) -> None:
        """The agreement step (when checking and there are peers); ``value``: the descriptor's
        digest when the caller has it."""
        if self.recorder:
            self.recorder.record(descriptor)
        if self.check and self.size > 1:
            try:  # agreement.agree, with the channel's own all_equal
                value = digest(descriptor) if value is None else value
                if not self._all_equal(value, False, self.deadline(), UNPLANNED):
                    disagree(self.control, descriptor, self.deadline())
            except Exception as error:
                self.note_failure(error)
                raise

    def fail(self, collective: str, error: BaseException) -> NoReturn:
        """Raise ``error`` after taking part in the agreement as invalid, so that every peer
        raises too (a MismatchError naming this rank's problem) instead of waiting."""
        if self.recorder:
            self.recorder.refused(Descriptor(collective), error)
        if self.check and self.size > 1:
            try:
                agree(self.control, Descriptor(collective), self.deadline(), error)
            except Exception as raised:
                if raised is not error:  # the local error itself leaves the communicator usable
                    self.note_failure(raised)
                raise
        raise error

    @contextlib.contextmanager
    def covered(self, descriptor: Descriptor) -> Iterator[None]:
        """Agree once on ``descriptor`` for a composite call (torch's coalesced allreduce: one
        descriptor for all its tensors); the collectives issued inside are covered by it and
        skip their own agreement step. They run on buffers the caller built from the agreed
        inputs, so they cannot disagree."""
        self.agree(descriptor)
        check, self.check = self.check, False
        try:
            yield
        finally:
            self.check = check

    def start(self, step: Callable[..., T], *args: Any) -> T:
        """Start a transfer (or another library call); a failure of the library breaks the
        communicator."""
        try:
            return step(*args)
        except Exception as error:
            self.note_failure(error)
            raise

    # -- completing --------------------------------------------------------------------------

    def wait(self, pending: Pending, keep: Any, timeout: Optional[float] = None, synchronize: bool = False) -> None:
        """Complete ``pending`` (``timeout`` seconds, default the communicator's). A device
        transport's wait orders the caller's stream after it, ``synchronize`` blocks the host;
        a host transport's polls its test, unless its wait blocks in the library (gloo)."""
        if not self.transport.device_memory and not pending.blocks:
            self.settle(pending.test, (pending, keep), timeout)
            return
        try:
            (pending.synchronize if synchronize else pending.wait)(self.deadline(timeout))
            self._after()
        except BaseException as error:
            self._abandon(error, pending, keep)
            raise

    def settle(self, test: Test, keep: Any, timeout: Optional[float] = None) -> None:
        """Poll ``test`` until the transfer has completed; raise if a peer gave up on it or
        the timeout passes, keeping ``keep`` (the transfer and what it uses) alive then."""
        try:
            if not WAITING.poll(test, SPINS):  # a small call is done before a deadline is worth computing
                wait_until(test, self.deadline(timeout), "the collective", watch=self._watch)
            if self._gave_up[0]:
                self._after()
        except BaseException as error:
            self._abandon(error, test, keep)
            raise

    def test(self, pending: Pending, keep: Any) -> bool:
        """Whether ``pending`` has completed; never blocks. A failure seen here breaks the
        communicator and is raised, as :meth:`wait` does."""
        try:
            if not pending.test():
                return False
            self._after()
        except BaseException as error:
            self._abandon(error, pending, keep)
            raise
        return True

    def _watch(self) -> None:
        """Between the polls of a wait: a peer that gave up makes it hopeless."""
        if self._gave_up[0]:
            self._after()

    def _after(self) -> None:
        """A completed call may still have paired with one a peer gave up on: then it fails."""
        if self._gave_up[0]:
            raise peer_gave_up_error(self.control.peer_gave_up())

    def _abandon(self, error: BaseException, *things: Any) -> None:
        self._keep(*things)  # first: whatever follows must not free what the transfer may touch
        self.note_failure(error)

    def _keep(self, *things: Any, _abandon: Callable[..., None] = abandon) -> None:
        """Abandon a transfer with what it uses (it may never complete; its communicator too is
        then kept at :meth:`close`). ``_abandon`` is bound here: a Work dropped while the
        interpreter clears the modules at exit gets here too."""
        self.abandoned = True
        _abandon(*things)

    def note_failure(self, error: BaseException) -> None:
        """Mark the communicator broken after a timeout, a peer that gave up, a transport
        failure or an interrupted wait (not after a local or agreement error, which leave it
        usable). After a timeout this rank gives up: it tells its peers, and with
        ``on_timeout="abort"`` ends the whole job."""
        if self.recorder:
            self.recorder.failed(error)
        if isinstance(error, CollectiveTimeoutError):
            first = self.broken is None
            self.broken = self.broken or f"timed out: {error}"
            if first:
                self._give_up(error)
        elif isinstance(error, CommunicatorBrokenError):
            self.broken = self.broken or str(error)
        elif not isinstance(error, Exception):  # its transfer was left running: nothing may reuse the state
            self.broken = self.broken or f"interrupted while waiting ({type(error).__name__})"
        elif not isinstance(error, DenseCCLError):
            self.broken = self.broken or f"transport failure: {type(error).__name__}: {error}"

    def _give_up(self, error: BaseException) -> None:
        try:
            self.control.give_up()
        except Exception as failure:  # noqa: BLE001 - telling the peers is best effort
            log.warning("could not tell the peers that rank %d gave up: %s", self.rank, failure)
        if self.on_timeout == "abort":
            self.control.abort(
                f"denseccl rank {self.rank}: {error}\n"
                "denseccl: aborting the whole job (DENSECCL_ON_TIMEOUT=abort / denseccl.init(on_timeout='abort'))"
            )

    # -- Works dropped in flight -------------------------------------------------------------

    def adopt(self, pending: Pending, keep: Any) -> None:
        """Keep a dropped Work's transfer and buffers until it has completed (a later call or
        close() completes it, its host step included)."""
        if self.broken is None:
            self.orphans.append((pending, keep))
        else:  # it may never complete
            self._keep(pending, keep)

    def poll_orphans(self) -> None:
        """Complete the dropped Works' transfers that have finished, without blocking. A
        failure belongs to the dropped Work, not to the caller: the communicator is marked
        broken, and its next call says so."""
        with contextlib.suppress(Exception):
            self._complete_orphans(None)

    def _complete_orphans(self, deadline: Optional[float]) -> None:
        entries = self.orphans
        try:
            while entries and self.broken is None:
                pending, keep = entries[0]
                if deadline is None:
                    if not self.test(pending, keep):
                        break  # still running: a later call polls it again
                else:
                    self.wait(pending, keep, max(deadline - time.monotonic(), 0.0))
                entries.pop(0)
        finally:
            if self.broken is not None and entries:
                self._keep(list(entries))
                entries.clear()

    def close(self) -> None:
        """Complete the dropped Works (within the timeout), then release the transport and the
        control channel. Whatever did not complete is kept alive: where a Work is still in
        flight (dropped or not) or a transfer was abandoned, the transport and control channel
        are retired instead (their communicators are kept for the process's life)."""
        if self.broken == "closed":
            return
        try:
            if self.broken is None:
                self._complete_orphans(self.deadline())
        finally:
            if self.orphans:
                self._keep(list(self.orphans))
                self.orphans.clear()
            self.broken = "closed"
            self.requests.release(keep=bool(self.abandoned or self.unfinished))
            if self.abandoned or self.unfinished:
                self.transport.retire()
                self.control.retire()
            else:
                self.transport.close()
                self.control.close()
                self._gave_up = CLOSED  # its Works have all completed: waiting again reads no channel


def _release_at_end(orphans: List[Tuple[Pending, Any]], unfinished: List[bool], requests: Requests) -> None:
    """A flow went away, or the interpreter exits (before it clears the modules, and before
    MPI is finalized): free the plans' persistent requests (MPI reports those still allocated
    at finalization), and keep the dropped Works still in flight for the process's life. MPI
    still moves their data when it is finalized, after the interpreter has cleared everything,
    so the list itself is kept: Works dropped while the modules are cleared join it
    (Flow.adopt)."""
    requests.release(keep=bool(orphans or unfinished))
    if orphans or unfinished:
        abandon(orphans)


__all__ = ["Flow", "Test"]
