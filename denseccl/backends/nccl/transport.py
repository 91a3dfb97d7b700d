"""The NCCL transport: one ``cupy.cuda.nccl`` call per collective on a device span and a CUDA
stream, and the life of the NCCL communicator it owns.

Why it exists: this module is the NCCL path once a communicator runs, the only place that
enqueues device work or frees an NCCL communicator, so the rules that keep that safe are read
together here (docs/nccl.md says what users see of them). Its helpers each have one job:
:mod:`.cuda` (events, streams, the capture gate), :mod:`.watchdog` (verdicts on eager calls),
:mod:`.pending` (the enqueued call and its waits), :mod:`.tables` (what each NCCL version can do).

- What NCCL lacks is mapped onto what it has, never by an extra pass over the data (the tables
  are :mod:`.tables`'): complex as pairs of reals, bool as uint8 with sum/prod as max/min,
  ``PreMulSum`` as NCCL's own op made once per ``(factor, dtype)``, bytes for what NCCL cannot
  reduce; with one rank fp8 avg runs as a sum (NCCL has no one-rank fp8 scaling).
- Each call records an event after it on its stream (:class:`.pending.NCCLPending` orders the
  caller's stream or blocks the host on it) and gets a watchdog entry, unless its stream is being
  captured into a CUDA graph: a captured call is never queried, and while a capture seen on the
  device runs no event of that device is queried at all; ``wait_idle`` is the wait for the last
  eager query that a caller makes before a capture.
- The watchdog's verdict (a call unfinished ``timeout`` s after it was enqueued, or an
  asynchronous NCCL error) aborts the communicator.
- Threads: ``ncclCommAbort`` and ``ncclCommDestroy`` free the communicator, so they wait for the
  calls inside NCCL (which count themselves in and out), an abort at most ``abort_grace``;
  ``retire`` keeps the communicator alive while work may still run on it.
- Close: ``ncclCommDestroy`` waits for the communicator's kernels, so ``close`` waits for the
  eager calls at most ``timeout`` s and then aborts, or retires (no timeout, or a capture).
- NCCL's errors come as CuPy's ``NcclError``, or as ``KeyError(7)`` for ncclInProgress, which
  CuPy 14.2 cannot name (:func:`.tables.nccl_status` reads both).
"""

from __future__ import annotations

import collections
import contextlib
import threading
from typing import Any, Callable, Optional, Set, Tuple

from ... import config, log
from ...channel.base import ControlChannel, Flag
from ...dtypes import DType
from ...errors import ArgumentError, CollectiveTimeoutError, CommunicatorBrokenError, DenseCCLError, OpError
from ...ops import Op, PreMulSum, ReduceOp, op_kind
from ...streams import StreamRef, stream_pointer
from ...transport import Pending, Transport, abandon
from .cuda import CudaStreams
from .library import NCCLLibrary
from .pending import NCCLPending
from .tables import (
    CARRIED_AS, FP8_REDUCTION_CAPABILITY, FP8_SINCE, INT32, NCCL_IN_PROGRESS, NCCL_INVALID_ARGUMENT, NCCL_OPS,
    SPLIT_SINCE, UINT8, builtin_op, check_op, elements, in_progress_error, nccl_dtypes, nccl_status, premul_scalar,
    reducible_dtypes, version_string,
)
from .watchdog import Watchdog


def raw_handle(comm: Any) -> int:
    """The ``ncclComm_t`` of a CuPy ``NcclCommunicator`` (its ``.comm``)."""
    value = getattr(comm, "comm", None)
    if not isinstance(value, int):
        raise DenseCCLError(f"cannot find the raw ncclComm_t of {comm!r} (no .comm)")
    return value


class NCCLTransport(Transport):
    """Collectives over one CuPy ``NcclCommunicator`` (owned: :meth:`close` destroys it) bound
    to one CUDA device."""

    name = "nccl"
    device_memory = True
    device: int

    def __init__(
        self,
        comm: Any,
        device: int,
        *,
        version: int,
        timeout: Optional[float] = None,
        events: Optional[CudaStreams] = None,
        library: Optional[NCCLLibrary] = None,
        watchdog_interval: float = config.WATCHDOG_INTERVAL,
        abort_grace: float = config.ABORT_GRACE,
    ) -> None:
        self.comm = comm
        self.device = device
        self.rank = comm.rank_id()
        self.size = comm.size()
        self.timeout = timeout
        self.version = version
        self.dtypes = nccl_dtypes(version)
        self._reducible = reducible_dtypes(version)
        self.events = events if events is not None else CudaStreams(device)
        self.compute_capability = self.events.compute_capability()
        if self.compute_capability < FP8_REDUCTION_CAPABILITY:  # fp8 then only moves, as bytes
            self._reducible = {name: code for name, code in self._reducible.items() if not name.startswith("float8")}
            self.dtypes = {name: (UINT8 if name.startswith("float8") else code) for name, code in self.dtypes.items()}
        self._library = library
        self._premul: "collections.OrderedDict[Tuple[float, str], int]" = collections.OrderedDict()
        self._captured_ops: Set[Tuple[float, str]] = set()  # used by a CUDA graph: live as long as the communicator
        self._failure: Optional[Tuple[str, bool]] = None
        # _lock guards the fields below; the raw communicator is freed (abort, destroy) only under
        # it and only while no call is inside NCCL (_inside == 0)
        self._lock = threading.Lock()
        self._left = threading.Condition(self._lock)  # notified when the last call leaves NCCL
        self._abort_grace = abort_grace
        self._inside = 0
        self._deferred: Optional[str] = None  # "abort" or "destroy", run when the last call leaves
        self._released = False
        self._closed = False
        #: a call was captured into a CUDA graph: NCCL's destroy and abort then wait until every
        #: graph holding its persistent references is destroyed (forever, from close or exit)
        self._captured_any = False
        self._scratch: Any = None
        #: the control channel's flag and who gave up (:meth:`hear`), or None
        self._peers: Optional[Tuple[Flag, Callable[[], Optional[int]]]] = None
        self._watchdog = Watchdog(
            timeout, self.events.done, self.async_error, self.abort, watchdog_interval, self.events.bind_thread,
            self.events.capture_in_progress,
        )

    def __repr__(self) -> str:
        where = f"rank {self.rank} of {self.size} on cuda:{self.device}"
        return f"<NCCLTransport {where}, NCCL {version_string(self.version)}>"

    # -- state ---------------------------------------------------------------------------------

    @property
    def library(self) -> NCCLLibrary:
        if self._library is None:
            self._library = NCCLLibrary()
        return self._library

    def failure(self) -> Optional[str]:
        return None if self._failure is None else self._failure[0]

    def wait_idle(self, timeout: float = 5.0) -> bool:
        """Wait until the watchdog has retired every eager call and queries no more events; call
        it before beginning a CUDA graph capture in global mode. Whether it got there in time."""
        return self._watchdog.wait_idle(timeout)

    def raise_if_failed(self) -> None:
        if self._failure is not None:
            reason, timed_out = self._failure
            raise (CollectiveTimeoutError if timed_out else CommunicatorBrokenError)(reason)

    def hear(self, control: ControlChannel) -> None:
        self._peers = (control.gave_up_flag(), control.peer_gave_up)

    def async_error(self) -> Optional[str]:
        """NCCL's asynchronous error of this communicator as text, or None; or that a rank gave
        up (the control channel's flag): work paired with its abandoned call never completes,
        so the watchdog and the host's waits abort the communicator then, not at the timeout."""
        with self._lock:
            if self._failure is not None or self._released:
                return None
            try:
                self.comm.check_async_error()
            except Exception as error:  # noqa: BLE001 - cupy raises NcclError
                if nccl_status(error) == NCCL_IN_PROGRESS:
                    return None  # an operation still running (CuPy's KeyError for the status it cannot name)
                return f"NCCL reported an asynchronous error: {error}"
        peers = self._peers
        if peers is not None and peers[0][0]:
            return (f"rank {peers[1]()} gave up on a collective (a timeout, an interrupt or a failure): work paired "
                    "with its call cannot complete")
        return None

    def abort(self, reason: str, timed_out: bool = False) -> None:
        """Abort the NCCL communicator (unblocking its kernels); every later call raises. While
        another thread is inside a call on it, the abort waits for that call to return, at most
        ``abort_grace`` seconds: a call still inside then is one only the abort can release."""
        with self._lock:
            if self._failure is not None:
                return
            self._failure = (reason, timed_out)
        self._watchdog.close()  # outside the lock: it may be the watchdog's own thread that aborts
        with self._lock:
            if self._inside:
                self._deferred = "abort"
                log.warning(
                    "%s; ncclCommAbort waits (at most %g s) until the NCCL call now running in another thread "
                    "returns (aborting under it would free the communicator it uses)",
                    reason, self._abort_grace,
                )
                self._left.wait_for(lambda: not self._inside, timeout=self._abort_grace)
                if self._released or not self._inside:
                    return  # the last call out aborted it
                log.warning(
                    "the NCCL call in another thread did not return within %g s: it waits for something only the "
                    "abort ends (e.g. connecting to a peer that is gone); aborting under it",
                    self._abort_grace,
                )
                self._deferred = None
            aborting = self._release("abort")
        self._run_abort(aborting)

    def _release(self, how: str) -> bool:
        """Destroy the communicator, or mark it aborted (lock held, no call inside NCCL); True
        when the caller must then run ncclCommAbort, outside the lock (:meth:`_run_abort`): its
        frees wait for the whole device, where a stuck kernel of another communicator would
        hold every thread that asks this transport anything. A communicator that ever had a
        call captured is kept instead (retired): NCCL would wait for the graphs to be destroyed."""
        if self._released:
            return False
        self._released = True
        if self._captured_any:
            abandon(self.comm, self._scratch, self._premul)  # never destroyed, past exit too
            return False
        if how == "abort":
            self._premul.clear()  # the ops die with the communicator
            return True
        handle = raw_handle(self.comm)
        for op in self._premul.values():
            with contextlib.suppress(Exception):
                self.library.destroy_op(op, handle)
        self._premul.clear()
        self.comm.destroy()
        return False

    def _run_abort(self, aborting: bool) -> None:
        if aborting:
            with contextlib.suppress(Exception):  # aborting is the last resort; nothing more to do
                self.comm.abort()

    def _enter(self) -> None:
        """Count a call into NCCL in (refused once the communicator failed or was closed)."""
        with self._lock:
            if self._failure is None and not self._closed:
                self._inside += 1
                return
        self.raise_if_failed()
        raise DenseCCLError("this NCCL transport has been closed")

    def _leave(self) -> None:
        aborting = False
        with self._lock:
            self._inside -= 1
            if self._inside == 0:
                self._left.notify_all()
                if self._deferred is not None:
                    how, self._deferred = self._deferred, None
                    aborting = self._release(how)
        self._run_abort(aborting)

    def check_op(self, op: Op, dtype: DType) -> None:
        if dtype.name.startswith("float8") and self.version >= FP8_SINCE and dtype.name not in self._reducible:
            raise ArgumentError(
                f"dtype {dtype.name} cannot be reduced on this GPU: NCCL reduces fp8 on compute capability 9.0 "
                f"(sm90) and newer only, and cuda:{self.device} is {self.compute_capability // 10}."
                f"{self.compute_capability % 10}; broadcast and allgather move it, reductions need a wider dtype"
            )
        check_op(op, dtype, self.version)
        if self.size == 1 and dtype.name.startswith("float8") and isinstance(op, PreMulSum) and float(op.factor) != 1.0:
            raise OpError(
                f"PreMulSum({op.factor!r}) on {dtype.name} with one rank is refused: NCCL runs a one-rank PreMulSum "
                "as a host-side scaling that has no fp8 case (ncclInvalidArgument); scale the tensor itself "
                "(x.mul_(factor)) or use a wider dtype"
            )

    # -- plumbing ------------------------------------------------------------------------------

    def _stream(self, stream: Any) -> StreamRef:
        if isinstance(stream, StreamRef):
            return stream
        if stream is None:
            return self.events.default_stream()
        return StreamRef(stream_pointer(stream), "cupy", self.device)

    def _launch(
        self,
        what: str,
        stream: Any,
        call: Callable[[int, int], Any],
        op: Optional[Op] = None,
        dtype: Optional[DType] = None,
        *,
        host: bool = False,
    ) -> NCCLPending:
        """Run ``call(reduction, stream pointer)`` inside the counted window, with a watchdog
        entry unless the stream is being captured into a CUDA graph."""
        ref = self._stream(stream)
        self._enter()
        try:
            captured = self.events.capturing(ref.pointer)
            if captured and host:
                raise DenseCCLError(
                    f"{what} cannot run while stream {ref.pointer:#x} is being captured into a CUDA graph: it "
                    "blocks the host; call it before or after the capture"
                )
            reduction = -1 if op is None else self._reduction(op, dtype, captured)  # type: ignore[arg-type]
            entry = None if captured else self._watchdog.begin(what)
            try:
                call(reduction, ref.pointer)
                event = self.events.record(ref.pointer)
            except BaseException as error:
                if entry is not None:
                    entry.cancelled = True
                if self._failure is not None and isinstance(error, Exception):
                    self.raise_if_failed()  # released by the abort: its reason, not NCCL's words for it
                status = nccl_status(error)
                if status == NCCL_INVALID_ARGUMENT:
                    raise ArgumentError(
                        f"NCCL refused the arguments of {what} ({error}); it enqueued nothing and the communicator "
                        "stays usable. Run with NCCL_DEBUG=WARN to see which argument"
                    ) from error
                if status == NCCL_IN_PROGRESS:  # CuPy raised KeyError: its table of names stops at 6
                    raise in_progress_error(f"nccl {what}") from None
                raise
            if entry is not None:
                entry.event = event
            if captured:
                self._captured_any = True
        finally:
            self._leave()
        return NCCLPending(self, event, ref, host, captured)

    def _reduction(self, op: Op, dtype: DType, captured: bool = False) -> int:
        """The ncclRedOp_t of ``op`` on ``dtype`` (inside the counted window: a PreMulSum op is
        made on the raw communicator). Ops used by a captured call are never destroyed early."""
        if self.size == 1 and dtype.name.startswith("float8") and op_kind(op) in (ReduceOp.AVG, ReduceOp.PREMUL_SUM):
            return NCCL_OPS[ReduceOp.SUM]  # the identity on one rank (check_op refused other factors)
        if not isinstance(op, PreMulSum):
            return builtin_op(op, dtype)
        carrier = CARRIED_AS.get(dtype.name, dtype.name)
        key = (float(op.factor), carrier)
        found = self._premul.get(key)
        if found is None:
            scalar = premul_scalar(op.factor, carrier)
            code, handle = self._reducible[carrier], raw_handle(self.comm)
            found = self._premul[key] = self.library.create_premul_sum(scalar, code, handle)
            if len(self._premul) > config.PREMUL_CACHE:  # an op may be destroyed once the calls given it have returned
                oldest = next((k for k in self._premul if k not in self._captured_ops and k != key), None)
                if oldest is not None:
                    self.library.destroy_op(self._premul.pop(oldest), raw_handle(self.comm))
        else:
            self._premul.move_to_end(key)
        if captured:
            self._captured_ops.add(key)
        return found

    def _elements(self, dtype: DType, count: int, op: Optional[Op] = None) -> Tuple[int, int]:
        """``(ncclDataType_t, count)`` of a call; with ``op``, first whether NCCL can run it."""
        if op is not None:
            self.check_op(op, dtype)
        return elements(dtype, count, self._reducible)

    # -- collectives ---------------------------------------------------------------------------

    def allreduce(self, send: int, recv: int, count: int, dtype: DType, op: Op, stream: Any = None) -> Pending:
        code, n = self._elements(dtype, count, op)
        return self._launch(
            "allreduce", stream, lambda red, s: self.comm.allReduce(send, recv, n, code, red, s), op, dtype
        )

    def reduce(self, send: int, recv: int, count: int, dtype: DType, op: Op, root: int, stream: Any = None) -> Pending:
        code, n = self._elements(dtype, count, op)
        return self._launch(
            "reduce", stream, lambda red, s: self.comm.reduce(send, recv, n, code, red, root, s), op, dtype
        )

    def broadcast(self, buffer: int, count: int, dtype: DType, root: int, stream: Any = None) -> Pending:
        code, n = self._elements(dtype, count)
        return self._launch("broadcast", stream, lambda _, s: self.comm.broadcast(buffer, buffer, n, code, root, s))

    def allgather(self, send: int, recv: int, count: int, dtype: DType, stream: Any = None) -> Pending:
        code, n = self._elements(dtype, count)
        return self._launch("allgather", stream, lambda _, s: self.comm.allGather(send, recv, n, code, s))

    def reduce_scatter(self, send: int, recv: int, count: int, dtype: DType, op: Op, stream: Any = None) -> Pending:
        code, n = self._elements(dtype, count, op)
        return self._launch(
            "reduce_scatter", stream, lambda red, s: self.comm.reduceScatter(send, recv, n, code, red, s), op, dtype
        )

    def barrier(self) -> Pending:
        """A one-element allreduce on the current stream; waiting on it blocks the host."""
        if self._scratch is None:
            self._scratch = self.events.scratch(4)
        pointer = int(self._scratch.ptr)
        total = NCCL_OPS[ReduceOp.SUM]
        return self._launch(
            "barrier", None, lambda _, s: self.comm.allReduce(pointer, pointer, 1, INT32, total, s), host=True
        )

    # -- lifecycle -----------------------------------------------------------------------------

    def split(self, color: Optional[int], key: int) -> Optional["NCCLTransport"]:
        split = getattr(self.comm, "commSplit", None)
        if self.version < SPLIT_SINCE or split is None:
            raise DenseCCLError(
                f"splitting an NCCL communicator needs NCCL >= 2.18.1 (this is {version_string(self.version)}) and "
                f"CuPy's NcclCommunicator.commSplit (CuPy >= 14{'' if split is None else ', present'})"
            )
        self._enter()
        try:
            part = split(-1 if color is None else color, key)
        except KeyError as error:
            if nccl_status(error) == NCCL_IN_PROGRESS:
                raise in_progress_error("ncclCommSplit") from None
            raise
        finally:
            self._leave()
        if part is None:
            return None
        return NCCLTransport(
            part, self.device, timeout=self.timeout, version=self.version, events=self.events, library=self._library,
            abort_grace=self._abort_grace,
        )

    def retire(self) -> None:
        """Close while work may still run (a Work in flight or abandoned): stop watching and refuse
        new calls, but keep the communicator, its PreMulSum ops and the scratch for the process's
        life; ncclCommDestroy (or CuPy, on garbage collection) would free what running kernels use."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._keep()

    def _keep(self) -> None:
        self._watchdog.close()
        with self._lock:
            self._deferred = None if self._deferred == "destroy" else self._deferred
        abandon(self.comm, self._scratch)

    def close(self) -> None:
        """Destroy the PreMulSum ops and the communicator (after an abort there is nothing left);
        new calls are refused at once, and a call still inside NCCL in another thread is let
        finish first. ncclCommDestroy waits for the communicator's kernels, forever when a peer
        is gone: so the eager calls enqueued are waited for first, at most ``timeout`` s, and the
        communicator is then aborted (as the watchdog does), or retired (kept for the process's
        life) where there is no timeout (after ``abort_grace`` s) or a CUDA graph capture on the
        device forbids asking. Captured calls are the graph owner's: their replays must have
        completed."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if self._captured_any:
            log.info("close(): a call on this NCCL communicator was captured into a CUDA graph; ncclCommDestroy "
                     "would wait until every such graph is destroyed, so the communicator is retired (kept)")
            self._keep()
            return
        if self._failure is None and not self._watchdog.wait_idle(self._close_wait()):
            capturing = self.events.capture_in_progress()  # then its work cannot be asked about
            if self.timeout is None or capturing:
                log.warning(
                    "close(): NCCL work enqueued on this communicator %s after %g s; ncclCommDestroy would wait for "
                    "it (forever if a peer is gone), so the communicator is kept for the process's life instead "
                    "(retired)%s",
                    "could not be asked about during a CUDA graph capture" if capturing else "had not completed",
                    self._close_wait(), "" if capturing else ". Give the communicator a timeout to abort it",
                )
                self._keep()
                return
            reason = (
                f"close(): NCCL work enqueued on this communicator did not complete within {self.timeout:g} s; "
                "the NCCL communicator was aborted (ncclCommDestroy would wait for that work)"
            )
            log.warning("%s", reason)
            self.abort(reason, timed_out=True)
        self._watchdog.close()
        with self._lock:
            if self._failure is None:
                if self._inside:
                    self._deferred = "destroy"
                else:
                    self._release("destroy")
        self._scratch = None

    def _close_wait(self) -> float:
        """Seconds close() waits for the eager calls in flight to complete."""
        return self._abort_grace if self.timeout is None else self.timeout


__all__ = ["NCCLTransport"]
