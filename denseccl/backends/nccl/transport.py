"""NCCL transport: ``cupy.cuda.nccl`` collectives on device storage spans, on CUDA streams.

Each method maps ``(pointer, count, dtype, op, root, stream)`` to one ``NcclCommunicator`` call.
What NCCL lacks is mapped onto what it has, never by an extra pass over the data:

- complex numbers travel as pairs of reals (``count * 2``), which is right for sum, avg and
  premul_sum with a real factor, and is refused for prod (torch's ``supports_complex`` rule);
- bool travels as uint8, with sum/prod as max/min (logical or/and, ``ops.BOOL_OPS``);
- ``PreMulSum(f)`` is NCCL's own ``ncclRedOpCreatePreMulSum`` (reached through ctypes on the
  libnccl that CuPy loaded, with the communicator's raw handle), created once per
  ``(factor, dtype)`` and destroyed at :meth:`NCCLTransport.close`;
- broadcast and allgather of a dtype NCCL has no type for (int16, uint16) move bytes;
- with one rank, fp8 avg is the identity and runs as a sum (NCCL's one-rank path turns avg and
  PreMulSum into a host-side scaling that has no fp8 case and returns ncclInvalidArgument); fp8
  PreMulSum by a factor other than 1 is refused there with the reason.

Threads: ``ncclCommAbort`` and ``ncclCommDestroy`` free the communicator, so they do not run
while another thread is inside a call on it (NCCL's enqueue runs without the GIL). Calls count
themselves in and out under a lock; an abort that finds one inside waits for the last one to
leave, and meanwhile the transport already refuses new calls. That wait is bounded
(``abort_grace``): NCCL connects peers during the first collective (``NCCL_RUNTIME_CONNECT=1``,
the default), and a call stuck connecting to a dead peer returns only once ``ncclCommAbort``
sets the communicator's abort flag, so past the grace the abort runs under it, as torch's
watchdog aborts under a stuck collective.

The pieces live beside it, each testable on the CPU: the version gates, dtype and op tables,
PreMulSum scalars and the ctypes binding of libnccl in :mod:`.library`; CUDA events through
CuPy, the pending call and the watchdog in :mod:`.cuda`. The CuPy module and the NCCL
communicator are passed in, so tests can replace them with fakes.
"""

from __future__ import annotations

import collections
import contextlib
import threading
from typing import Any, Callable, Optional, Set, Tuple

from ... import config, log
from ...dtypes import DType
from ...errors import ArgumentError, CollectiveTimeoutError, CommunicatorBrokenError, DenseCCLError, OpError
from ...ops import Op, PreMulSum, ReduceOp, op_kind
from ...streams import StreamRef, stream_pointer
from ..base import Pending, Transport, abandon
from .cuda import CudaStreams, NCCLPending, Watchdog
from .library import (
    NCCLLibrary,
    CARRIED_AS,
    FP8_REDUCTION_CAPABILITY,
    FP8_SINCE,
    INT32,
    NCCL_OPS,
    SPLIT_SINCE,
    UINT8,
    builtin_op,
    check_op,
    elements,
    nccl_dtypes,
    premul_scalar,
    reducible_dtypes,
    version_string,
)

NCCL_INVALID_ARGUMENT = 4  # ncclInvalidArgument: refused by the argument checks, before any enqueue


def raw_handle(comm: Any) -> int:
    """The ``ncclComm_t`` of a CuPy ``NcclCommunicator`` (``.comm``; ``.ptr`` elsewhere)."""
    for attribute in ("comm", "ptr"):
        value = getattr(comm, attribute, None)
        if isinstance(value, int):
            return value
    raise DenseCCLError(f"cannot find the raw ncclComm_t of {comm!r} (no .comm or .ptr)")


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
        timeout: Optional[float] = None,
        version: Optional[int] = None,
        events: Any = None,
        library: Optional[NCCLLibrary] = None,
        watchdog_interval: float = config.WATCHDOG_INTERVAL,
        abort_grace: float = config.ABORT_GRACE,
    ) -> None:
        self.comm = comm
        self.device = device
        self.rank = comm.rank_id()
        self.size = comm.size()
        self.timeout = timeout
        if version is None:
            from cupy.cuda import nccl  # noqa: PLC0415

            version = nccl.get_version()
        self.version: int = version
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
        self._scratch: Any = None
        self._watchdog = Watchdog(
            timeout, self.events.done, self.async_error, self.abort, watchdog_interval,
            getattr(self.events, "bind_thread", None), getattr(self.events, "capture_in_progress", None),
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
        """Wait until the watchdog has retired every eager call (it then queries no CUDA event):
        call it before beginning a CUDA graph capture in the default global mode, in which a
        query from any thread invalidates the capture. Whether it got there within ``timeout``."""
        return self._watchdog.wait_idle(timeout)

    def raise_if_failed(self) -> None:
        if self._failure is not None:
            reason, timed_out = self._failure
            raise (CollectiveTimeoutError if timed_out else CommunicatorBrokenError)(reason)

    def async_error(self) -> Optional[str]:
        """NCCL's asynchronous error of this communicator as text, or None."""
        with self._lock:
            if self._failure is not None or self._released:
                return None
            try:
                self.comm.check_async_error()
            except Exception as error:  # noqa: BLE001 - cupy raises NcclError
                return f"NCCL reported an asynchronous error: {error}"
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
            self._release("abort")

    def _release(self, how: str) -> None:
        """Abort or destroy the communicator (lock held, no call inside NCCL)."""
        if self._released:
            return
        self._released = True
        if how == "abort":
            self._premul.clear()  # the ops die with the communicator
            with contextlib.suppress(Exception):  # aborting is the last resort; nothing more to do
                self.comm.abort()
            return
        handle = raw_handle(self.comm)
        for op in self._premul.values():
            with contextlib.suppress(Exception):
                self.library.destroy_op(op, handle)
        self._premul.clear()
        self.comm.destroy()

    def _enter(self) -> None:
        """Count a call into NCCL in (refused once the communicator failed or was closed)."""
        with self._lock:
            if self._failure is None and not self._closed:
                self._inside += 1
                return
        self.raise_if_failed()
        raise DenseCCLError("this NCCL transport has been closed")

    def _leave(self) -> None:
        with self._lock:
            self._inside -= 1
            if self._inside == 0:
                self._left.notify_all()
            if self._inside == 0 and self._deferred is not None:
                how, self._deferred = self._deferred, None
                self._release(how)

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
                    Watchdog.cancel(entry)
                if self._failure is not None and isinstance(error, Exception):
                    self.raise_if_failed()  # released by the abort: its reason, not NCCL's words for it
                if getattr(error, "status", None) == NCCL_INVALID_ARGUMENT:
                    raise ArgumentError(
                        f"NCCL refused the arguments of {what} ({error}); it enqueued nothing and the communicator "
                        "stays usable. Run with NCCL_DEBUG=WARN to see which argument"
                    ) from error
                raise
            if entry is not None:
                Watchdog.arm(entry, event)
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
        finally:
            self._leave()
        if part is None:
            return None
        return NCCLTransport(
            part, self.device, timeout=self.timeout, version=self.version, events=self.events, library=self._library,
            abort_grace=self._abort_grace,
        )

    def retire(self) -> None:
        """Close while work may still run on the communicator (a Work in flight or abandoned):
        stop watching and refuse new calls, but keep the communicator, its PreMulSum ops and
        the barrier's scratch for the process's life. ncclCommDestroy under running kernels
        frees what they use, and so would CuPy, which destroys a communicator when it is
        garbage collected; the MPI transport keeps its communicators the same way."""
        if self._closed:
            return
        self._watchdog.close()
        with self._lock:
            self._closed = True
            self._deferred = None if self._deferred == "destroy" else self._deferred
        abandon(self.comm, self._scratch)

    def close(self) -> None:
        """Destroy the PreMulSum ops and the communicator (after an abort there is nothing left);
        a call still inside NCCL in another thread is let finish first."""
        if self._closed:
            return
        self._watchdog.close()
        with self._lock:
            self._closed = True
            if self._failure is None:
                if self._inside:
                    self._deferred = "destroy"
                else:
                    self._release("destroy")
        self._scratch = None


__all__ = ["NCCLTransport"]
