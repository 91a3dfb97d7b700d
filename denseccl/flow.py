"""The flow: every collective, first or repeated, runs :meth:`Flow.run` on a validated
:class:`Call`: broken check -> agreement (agreement.agree, the only entry to it) -> start ->
the wait (wait.py), or a :class:`Work`, which completes through :meth:`Flow.wait`.

A call is validated in one pass (communicator.py) and handed over in one piece
(:meth:`Flow.submit`); the flow chooses the transport's call for it. A synchronous in-place
call on a NumPy array or a :func:`plain_torch` tensor becomes, once per geometry, a Call bound
to the transport's prepared start (:meth:`Flow.prepare`), which repeated calls run
(:meth:`Flow.replay`); every other call gets the transport's call for this time only. A
started transfer may touch the caller's arrays, the transport's temporaries and its
communicator until it completes, and MPI cannot cancel it: what the flow stops waiting for is
abandoned, never freed (docs/design.md, "Keeping memory alive"). The flow is also the
interface for code built on the core, so that none of it needs private names.
"""

from __future__ import annotations

import contextlib
import sys
import time
import weakref
from typing import Any, Callable, ContextManager, Dict, Iterator, List, NoReturn, Optional, Tuple, TypeVar

import numpy as np

from . import config, log, streams
from .config import Seconds, seconds
from .agreement import Descriptor, agree, digest
from .arrays import Buffer, data_pointer
from .dtypes import DTYPES
from .errors import CollectiveTimeoutError, CommunicatorBrokenError, DenseCCLError, peer_gave_up_error
from .transport import DONE, Pending, Step, Transport, abandon
from .channel.base import ControlChannel
from .ops import Op
from .wait import Test, deadline_after, soon, wait_until
from .recorder import recorder_for

T = TypeVar("T")
_ndarray = np.ndarray
_monotonic = time.monotonic
#: the denseccl errors that break a communicator (the others are local or agreement errors)
_BREAKING = (CollectiveTimeoutError, CommunicatorBrokenError)
#: the "a peer gave up" flag of a closed channel, which brings no news
CLOSED = (0,)


#: what marks each agreement step for a profiler (:func:`trace_agreement`), or None
_agreement_range: Optional[Callable[[], Optional[ContextManager[Any]]]] = None


def trace_agreement(range_of: Optional[Callable[[], Optional[ContextManager[Any]]]]) -> None:
    """Let ``range_of()`` mark every agreement step (the torch adapter's profiler ranges, set
    when it is imported; None: nothing). It is called before each agreement and returns a
    context manager for the step to run in (while a profiler records), else None: that case is
    every call's, so it must cost next to nothing."""
    global _agreement_range
    _agreement_range = range_of


def _agree(*args: Any) -> None:
    """:func:`agreement.agree`, inside the profiler's range when one records."""
    ranged = _agreement_range
    span = None if ranged is None else ranged()
    if span is None:
        agree(*args)
        return
    with span:
        agree(*args)


def _nothing_lost(address: int) -> None:
    """A general call holds nothing that outlives its transfer."""


class Call:
    """One validated call for the flow. ``start(address)`` starts the transfer (after the
    agreement) and returns its test where ``tested`` (a host call waited for at once), else a
    :class:`Pending`. ``step``, ``lost``: the transport's (``base.Start``), for prepared
    calls. ``offset`` and ``pointer_of`` find the span of a later array of the same geometry
    (``pointer_of(x) + offset``)."""

    __slots__ = (
        "descriptor", "value", "start", "step", "lost", "tested", "offset", "pointer_of", "tracing", "repeated",
    )

    def __init__(
        self,
        descriptor: Descriptor,
        start: Callable[[int], Any],
        *,
        tested: bool = False,
        step: Optional[Step] = None,
        lost: Callable[[int], None] = _nothing_lost,
        offset: int = 0,
        pointer_of: Optional[Callable[[Any], int]] = None,
    ) -> None:
        self.descriptor = descriptor
        self.value = digest(descriptor)
        self.start = start
        self.tested = tested
        self.step = step
        self.lost = lost
        self.offset = offset
        self.pointer_of = pointer_of
        #: DENSECCL_DEBUG=TRACE when the call was prepared: the flow times it
        self.tracing = log.tracing()
        #: it has run before (a cache hit): the trace says so
        self.repeated = False


def _done(_address: int) -> Pending:
    return DONE


def plain_torch(x: Any) -> bool:
    """Whether ``x`` is a torch tensor whose calls are cached: exactly ``torch.Tensor`` (not a
    subclass), on the CPU, strided, with neither the conjugate nor the negative bit set."""
    torch = sys.modules.get("torch")
    return (
        torch is not None and type(x) is torch.Tensor and x.is_cpu and x.layout is torch.strided
        and not x.is_conj() and not x.is_neg()
    )


class Flow:
    """What every call of one communicator shares: the transport, the control channel, the
    policy (``check``, ``timeout``, ``on_timeout``), the broken state, the prepared calls and the
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
        #: the prepared calls of repeated geometries, by cache key (:meth:`replay`)
        self.calls: Dict[Any, Call] = {}
        #: the transfers of Works dropped before they completed, with what they use, oldest first
        self.orphans: List[Tuple[Pending, Any]] = []
        #: one entry per Work handed out that has neither completed nor been dropped (Work
        #: appends and pops them: atomic, and the torch adapter completes Works in a thread)
        self.unfinished: List[bool] = []
        #: a transfer of this communicator was abandoned: it may never complete
        self.abandoned = False
        self._gave_up = control.gave_up_flag()
        transport.hear(control)
        #: the flight recorder of this communicator's calls (recorder.py), or None; its job id
        #: is agreed here, with the peers that create this communicator
        self.recorder = recorder_for(self.rank, self.size, transport.name, control, self.deadline())
        weakref.finalize(self, _release_at_end, self.orphans, self.unfinished)

    # -- the flow ----------------------------------------------------------------------------

    def submit(
        self, key: Any, descriptor: Descriptor, source: Optional[Buffer] = None, target: Optional[Buffer] = None,
        op: Optional[Op] = None, async_op: bool = False, stream: Any = None,
    ) -> Any:
        """Run a call validated in one pass (its ``descriptor``, input ``source``, output
        ``target``, ``op``): the call prepared for ``key`` where the transport prepares one (the
        input is the output), else the transport's call made for this time only. Returns
        ``target``'s array (or its Work with ``async_op``)."""
        if source is None or target is None:  # a barrier
            fused = self.transport.once("barrier", 0, 0, 0, None)
            if fused is not None:
                return self.run(Call(descriptor, fused.start, step=fused.step), 0, None)
            return self.run(Call(descriptor, lambda _address: self.transport.barrier()), 0, None)
        call = self.prepare(key, descriptor, source, op) or self._once(descriptor, source, target, op, async_op, stream)
        keep = source if target is source else (source, target)
        return self.run(call, source.span_pointer, target.owner, keep, async_op, stream)

    def _once(
        self, descriptor: Descriptor, source: Buffer, target: Buffer, op: Any, async_op: bool, stream: Any
    ) -> Call:
        """The transport's call of ``descriptor.collective`` on the spans, for this time only.
        ``count`` is per rank: the stacked buffer of an allgather or a reduce-scatter holds
        ``size`` blocks of the other's layout."""
        collective, root, transport = descriptor.collective, descriptor.root or 0, self.transport
        count = (target if collective == "reduce_scatter" else source).layout.numel
        if not count:
            return Call(descriptor, _done)
        send, recv, dtype = source.span_pointer, target.span_pointer, DTYPES[source.layout.dtype]
        fused = transport.once(collective, send, recv, count, dtype, op, root)
        if fused is not None:  # its data moves in its agreement step (Transport.once)
            return Call(descriptor, fused.start, step=fused.step, lost=fused.lost)
        if collective == "allreduce":
            # waited for at once: the transport may split it into calls issued one after the other
            start = transport.allreduce if async_op else transport.allreduce_now
            return Call(descriptor, lambda _address: start(send, recv, count, dtype, op, stream))
        if collective == "reduce":
            return Call(descriptor, lambda _address: transport.reduce(send, recv, count, dtype, op, root, stream))
        if collective == "broadcast":
            return Call(descriptor, lambda _address: transport.broadcast(send, count, dtype, root, stream))
        if collective == "allgather":
            return Call(descriptor, lambda _address: transport.allgather(send, recv, count, dtype, stream))
        return Call(descriptor, lambda _address: transport.reduce_scatter(send, recv, count, dtype, op, stream))

    def run(
        self, call: Call, address: int, result: Any, keep: Any = None, async_op: bool = False, stream: Any = None
    ) -> Any:
        """The one path of every call: run ``call`` on the span at ``address`` and return
        ``result`` (or its Work with ``async_op``). ``keep``: the buffers the transfer reads and
        writes (default ``result``); on a device transport they are recorded on ``stream``, where
        it runs."""
        if self.broken is not None:
            self.usable()
        checked = self.check and self.size > 1
        recorder = self.recorder
        if recorder is not None:  # the record's clock read is the deadline's too
            record = recorder.record  # an attribute load, then a call: cheaper than a method call on a slot
            now = record(call.descriptor)
        else:
            now = _monotonic() if checked else 0.0
        began = time.perf_counter() if call.tracing else 0.0
        outcome = result
        # one handler for the whole call: an interrupt (any BaseException) anywhere from the
        # agreement to the end of the wait breaks the communicator on every rank (note_failure)
        try:
            if checked:
                timeout = self.timeout
                deadline = None if timeout is None else now + timeout
                ranged = _agreement_range
                span = None if ranged is None else ranged()
                if span is None:
                    agree(self.control, call.descriptor, deadline, None, call.value, call.step, address)
                else:
                    with span:
                        agree(self.control, call.descriptor, deadline, None, call.value, call.step, address)
            started = call.start(address)
            if self.orphans:
                self.poll_orphans()
            if call.tested:  # a host call waited for at once: ``started`` is its test
                if not soon(started) or self._gave_up[0]:  # a small call is done before a deadline is worth computing
                    try:
                        self.settle(started, result if keep is None else keep)
                    except BaseException:
                        call.lost(address)
                        raise
            else:
                if self.transport.device_memory:
                    streams.record_stream(stream, keep)
                if async_op:
                    outcome = Work(self, started, result, keep)
                else:
                    self.wait(started, keep)
        except BaseException as error:
            self.note_failure(error)  # a local or agreement error leaves it usable; anything else breaks it
            raise
        if began:
            elapsed = (time.perf_counter() - began) * 1e6
            how = " (started)" if async_op else " (repeated)" if call.repeated else ""
            call.repeated = True
            log.trace("%s%s: %.1f us", call.descriptor.describe(), how, elapsed)
        return outcome

    def replay(self, collective: str, x: Any, rest: Any, writes: bool) -> Tuple[Any, Any]:
        """Run the call prepared for ``collective`` with ``rest`` (op, root) on ``x``'s geometry,
        if there is one: ``(key, result)``. Else ``(key, None)``: ``key`` is where :meth:`prepare`
        keeps the call once validated, None for arrays whose calls are not cached (NumPy arrays
        and :func:`plain_torch` tensors are). A call that ``writes`` runs only
        on a writable NumPy array: a read-only one takes the validating path, which says so."""
        if type(x) is _ndarray:
            key: Any = (collective, x.shape, x.strides, x.dtype, rest)
            call = self.calls.get(key)
            if call is None or writes and not x.flags.writeable:
                return key, None
        elif plain_torch(x):
            key = (collective, "torch", x.shape, x.stride(), x.dtype, rest)
            call = self.calls.get(key)
            if call is None:
                return key, None
        else:
            return None, None
        return key, self.run(call, call.pointer_of(x) + call.offset, x)  # type: ignore[misc]

    def prepare(self, key: Any, descriptor: Descriptor, buffer: Buffer, op: Optional[Op]) -> Optional[Call]:
        """The in-place call on ``buffer`` that :meth:`replay` found no call for under ``key``,
        prepared by the transport and kept; None where it is not cached (no key, nothing to move,
        or the transport prepares no such call). Past :data:`config.PREPARED_CALLS` the cache
        starts over."""
        count = buffer.layout.numel
        if key is None or not count or self.transport.device_memory:
            return None
        dtype = DTYPES[buffer.layout.dtype]
        start = self.transport.prepare(descriptor.collective, count, dtype, op, descriptor.root or 0)
        if start is None:
            return None
        if len(self.calls) >= config.PREPARED_CALLS:
            self.calls.clear()
        pointer_of = data_pointer if buffer.library == "numpy" else type(buffer.owner).data_ptr
        call = self.calls[key] = Call(
            descriptor, start.start, tested=True, step=start.step, lost=start.lost,
            offset=buffer.span_pointer - buffer.pointer, pointer_of=pointer_of,
        )
        return call

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
                who = self.control.peer_gave_up()
                failure = f"rank {who} gave up on a collective (a timeout, an interrupt or a failure)"
                if self.recorder:
                    self.recorder.broke(failure)
            self.broken = failure
        return self.broken

    def deadline(self, timeout: Optional[float] = None) -> Optional[float]:
        return deadline_after(self.timeout if timeout is None else timeout)

    def agree(self, descriptor: Descriptor) -> None:
        """The agreement step on ``descriptor`` for a step that is not a call of the flow (a
        split, the torch adapter's composite calls)."""
        if self.recorder:
            self.recorder.record(descriptor)
        if self.check and self.size > 1:
            self.start(_agree, self.control, descriptor, self.deadline())

    def fail(self, collective: str, error: BaseException) -> NoReturn:
        """Raise ``error`` after taking part in the agreement as invalid, so that every peer
        raises too (a MismatchError naming this rank's problem) instead of waiting."""
        if self.recorder:
            self.recorder.refused(Descriptor(collective), error)
        if self.check and self.size > 1 and self.broken is None:  # broken: no peer waits in an agreement
            try:
                _agree(self.control, Descriptor(collective), self.deadline(), error)
            except BaseException as raised:
                if raised is not error:  # the local error itself leaves the communicator usable
                    self.note_failure(raised)
                raise
        raise error

    @contextlib.contextmanager
    def covered(self, descriptor: Descriptor) -> Iterator[None]:
        """Agree once on ``descriptor`` for a composite call (torch's coalesced allreduce); the
        collectives issued inside run on buffers built from the agreed inputs, so they skip
        their own agreement step."""
        self.agree(descriptor)
        check, self.check = self.check, False
        try:
            yield
        finally:
            self.check = check

    def start(self, step: Callable[..., T], *args: Any) -> T:
        """``step(*args)``: a transfer, the agreement or another library call, whose failure
        (other than a local or agreement error) breaks the communicator."""
        try:
            return step(*args)
        except BaseException as error:
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
            self.check_peers()
        except BaseException as error:
            self._abandon(error, pending, keep)
            raise

    def settle(self, test: Test, keep: Any, timeout: Optional[float] = None) -> None:
        """Poll ``test`` until the transfer has completed; raise if a peer gave up on it or
        the timeout passes, keeping ``keep`` (the transfer and what it uses) alive then."""
        try:
            if not soon(test):  # a small call is done before a deadline is worth computing
                wait_until(test, self.deadline(timeout), "the collective", watch=self.check_peers)
            self.check_peers()
        except BaseException as error:
            self._abandon(error, test, keep)
            raise

    def test(self, pending: Pending, keep: Any) -> bool:
        """Whether ``pending`` has completed; never blocks. A failure seen here breaks the
        communicator and is raised, as :meth:`wait` does."""
        try:
            if not pending.test():
                return False
            self.check_peers()
        except BaseException as error:
            self._abandon(error, pending, keep)
            raise
        return True

    def check_peers(self) -> None:
        """A completed call may still have paired with one a peer gave up on, and a wait for a
        peer that gave up is hopeless: then it fails (also the torch adapter's point-to-point
        waits, on the communicator they run beside)."""
        if self._gave_up[0]:
            raise peer_gave_up_error(self.control.peer_gave_up())

    def _abandon(self, error: BaseException, *things: Any) -> None:
        self._keep(*things)  # first: whatever follows must not free what the transfer may touch
        self.note_failure(error)

    def _keep(self, *things: Any, _abandon: Callable[..., None] = abandon) -> None:
        """Abandon a transfer with what it uses (its communicator too is then kept at
        :meth:`close`). ``_abandon`` is bound here: this runs while modules are cleared at exit."""
        self.abandoned = True
        _abandon(*things)

    def note_failure(self, error: BaseException) -> None:
        """Mark the communicator broken after anything but a local or agreement error (which
        leave it usable): a timeout, a peer that gave up, a transport failure, an interrupt
        (any ``BaseException`` that is not an ``Exception``: Ctrl-C, a test's timeout). The
        first failure gives up: the peers learn it through the channel's flag, so that their
        current or next call fails instead of pairing with a call this rank abandoned. With
        ``on_timeout="abort"`` a timeout ends the whole job."""
        if self.broken is not None:
            return  # the failure already noted (a wait's handler, then the call's), or closed
        if self.recorder:
            self.recorder.failed(error)
        if isinstance(error, DenseCCLError) and not isinstance(error, _BREAKING):
            return
        if isinstance(error, CollectiveTimeoutError):
            self.broken = f"timed out: {error}"
        elif isinstance(error, CommunicatorBrokenError):
            self.broken = str(error)
        elif not isinstance(error, Exception):  # its transfer was left running: nothing may reuse the state
            self.broken = f"interrupted while waiting ({type(error).__name__})"
        else:
            self.broken = f"transport failure: {type(error).__name__}: {error}"
        self._give_up(error)

    def _give_up(self, error: BaseException) -> None:
        try:
            self.control.give_up()
        except Exception as failure:  # noqa: BLE001 - telling the peers is best effort
            log.warning("could not tell the peers that rank %d gave up: %s", self.rank, failure)
        if self.on_timeout == "abort" and isinstance(error, CollectiveTimeoutError):
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
        control channel, or retire them where a Work is still in flight or a transfer was
        abandoned (their communicators are kept for the process's life)."""
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
            if self.abandoned or self.unfinished:
                self.transport.retire()
                self.control.retire()
            else:
                self.transport.close()
                self.control.close()
                self._gave_up = CLOSED  # its Works have all completed: waiting again reads no channel


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

    def __init__(self, flow: Flow, pending: Pending, result: Any, keep: Any) -> None:
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
        return self._wait(timeout, False)

    def synchronize(self, timeout: Seconds = None) -> Any:
        """Block the host until the collective has completed (on the device too) and return
        its result; :class:`CollectiveTimeoutError` after ``timeout`` seconds (default: the
        communicator's), which also aborts a device communicator."""
        return self._wait(timeout, True)

    def _wait(self, timeout: Seconds, synchronize: bool) -> Any:
        self._flow.wait(self._pending, (self._keep, self._result), seconds(timeout, "timeout"), synchronize)
        self._completed()
        return self._result

    def is_completed(self) -> bool:
        """True once the collective has completed; never blocks. A failure seen while polling
        (e.g. in the host step after the transfer) marks the communicator broken, as wait() does."""
        if not self._done and self._flow.test(self._pending, (self._keep, self._result)):
            self._completed()
        return self._done

    @property
    def watched(self) -> bool:
        """True where the transport times this collective out itself (NCCL's watchdog aborts the
        communicator; ``is_completed()`` then turns True and ``wait()`` raises). A poller with a
        deadline of its own (the torch adapter's progress thread) leaves the timeout to it, rather
        than calling ``wait()``, which on a device transport orders streams (refused while a CUDA
        graph capture runs) instead of timing out."""
        return self._pending.watched

    @property
    def stream_ordered(self) -> bool:
        """True where :meth:`wait` only makes the caller's current CUDA stream wait for the
        collective (an NCCL call other than a barrier), never the host: its result may be handed
        on, stream-ordered, before the device has run it (the torch adapter's futures do)."""
        return bool(getattr(self._pending, "stream_ordered", False))

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
            keep = (self._keep, self._result)
            self._completed()
            self._flow.adopt(self._pending, keep)


def _release_at_end(orphans: List[Tuple[Pending, Any]], unfinished: List[bool]) -> None:
    """A flow went away, or the interpreter exits: keep its dropped Works still in flight for
    the process's life, the list itself included, as Works dropped while the modules are
    cleared join it (Flow.adopt) and MPI moves their data until it is finalized."""
    if orphans or unfinished:
        abandon(orphans)


__all__ = ["Call", "Flow", "Test", "Work", "plain_torch", "trace_agreement"]
