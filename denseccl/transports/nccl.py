"""NCCL transport: ``cupy.cuda.nccl`` collectives on device storage spans, on CUDA streams.

Each method maps ``(pointer, count, dtype, op, root, stream)`` to one ``NcclCommunicator`` call.
What NCCL lacks is mapped onto what it has, never by an extra pass over the data:

- complex numbers travel as pairs of reals (``count * 2``), which is right for sum, avg and
  premul_sum with a real factor, and is refused for prod (torch's ``supports_complex`` rule);
- bool travels as uint8, with sum/prod as max/min (logical or/and, ``ops.BOOL_OPS``);
- ``PreMulSum(f)`` is NCCL's own ``ncclRedOpCreatePreMulSum`` (reached through ctypes on the
  libnccl that CuPy loaded, with the communicator's raw handle), created once per
  ``(factor, dtype)`` and destroyed at :meth:`NCCLTransport.close`;
- broadcast and allgather of a dtype NCCL has no type for (int16, uint16) move bytes.

The pieces live beside it, each testable on the CPU: the version gates, dtype and op tables and
PreMulSum scalars in :mod:`.nccl_tables`; the ctypes binding of libnccl in :mod:`.nccl_library`;
CUDA events, the pending call (stream wait vs host synchronisation) and the watchdog that aborts
the communicator on a timeout or an asynchronous error in :mod:`.nccl_events`. The CUDA runtime
and the NCCL communicator are passed in, so tests can replace them with fakes.
"""

from __future__ import annotations

import collections
import contextlib
import threading
from typing import Any, Callable, Optional, Tuple

from ..arrays import StreamRef, stream_pointer
from ..errors import CollectiveTimeoutError, CommunicatorBrokenError, DenseCCLError, LayoutError
from ..ops import DType, Op, PreMulSum, ReduceOp
from .base import Pending, Transport
from .nccl_events import CudaEvents, NCCLPending, Watchdog
from .nccl_library import NCCLLibrary
from .nccl_tables import (
    CARRIED_AS,
    FP8_REDUCTION_CAPABILITY,
    FP8_SINCE,
    INT32,
    NCCL_OPS,
    UINT8,
    SPLIT_SINCE,
    builtin_op,
    check_op,
    elements,
    nccl_dtypes,
    premul_scalar,
    reducible_dtypes,
    version_string,
)


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
        watchdog_interval: float = 0.02,
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
        self.events = events if events is not None else CudaEvents(device)
        self.compute_capability = self.events.compute_capability()
        if self.compute_capability < FP8_REDUCTION_CAPABILITY:  # fp8 then only moves, as bytes
            self._reducible = {name: code for name, code in self._reducible.items() if not name.startswith("float8")}
            self.dtypes = {name: (UINT8 if name.startswith("float8") else code) for name, code in self.dtypes.items()}
        self._library = library
        self._premul: "collections.OrderedDict[Tuple[float, str], int]" = collections.OrderedDict()
        self._failure: Optional[Tuple[str, bool]] = None
        self._lock = threading.Lock()
        self._closed = False
        self._scratch: Any = None
        self._watchdog = Watchdog(
            timeout, self.events.done, self.async_error, self.abort, watchdog_interval, getattr(self.events, "bind_thread", None)
        )

    def __repr__(self) -> str:
        return f"<NCCLTransport rank {self.rank} of {self.size} on cuda:{self.device}, NCCL {version_string(self.version)}>"

    # -- state ---------------------------------------------------------------------------------

    @property
    def library(self) -> NCCLLibrary:
        if self._library is None:
            self._library = NCCLLibrary()
        return self._library

    def failure(self) -> Optional[str]:
        return None if self._failure is None else self._failure[0]

    def raise_if_failed(self) -> None:
        if self._failure is not None:
            reason, timed_out = self._failure
            raise (CollectiveTimeoutError if timed_out else CommunicatorBrokenError)(reason)

    def async_error(self) -> Optional[str]:
        """NCCL's asynchronous error of this communicator as text, or None. Under the lock:
        the watchdog's abort frees the communicator (ncclCommAbort) under it too."""
        with self._lock:
            if self._failure is not None or self._closed:
                return None
            try:
                self.comm.check_async_error()
            except Exception as error:  # noqa: BLE001 - cupy raises NcclError
                return f"NCCL reported an asynchronous error: {error}"
        return None

    def abort(self, reason: str, timed_out: bool = False) -> None:
        """Abort the NCCL communicator (unblocking its kernels); every later call raises."""
        with self._lock:
            if self._failure is not None:
                return
            self._failure = (reason, timed_out)
        self._watchdog.close()  # outside the lock: it may be the watchdog's own thread that aborts
        self._premul.clear()  # the ops die with the communicator
        with self._lock:  # not while another thread asks the communicator for its async error
            if not self._closed:
                try:
                    self.comm.abort()
                except Exception:  # noqa: BLE001 - aborting is the last resort; nothing more to do
                    pass

    def check_op(self, op: Op, dtype: DType) -> None:
        if dtype.name.startswith("float8") and self.version >= FP8_SINCE and dtype.name not in self._reducible:
            raise LayoutError(
                f"dtype {dtype.name} cannot be reduced on this GPU: NCCL reduces fp8 on compute capability 9.0 "
                f"(sm90) and newer only, and cuda:{self.device} is {self.compute_capability // 10}."
                f"{self.compute_capability % 10}; broadcast and allgather move it, reductions need a wider dtype"
            )
        check_op(op, dtype, self.version)

    # -- plumbing ------------------------------------------------------------------------------

    def _stream(self, stream: Any) -> StreamRef:
        if isinstance(stream, StreamRef):
            return stream
        if stream is None:
            return self.events.default_stream()
        return StreamRef(stream_pointer(stream), "cupy", self.device)

    def _launch(self, what: str, stream: Any, call: Callable[..., Any], *args: Any, host: bool = False) -> NCCLPending:
        self.raise_if_failed()
        ref = self._stream(stream)
        entry = self._watchdog.begin(what)
        try:
            call(*args, ref.pointer)
            event = self.events.record(ref.pointer)
        except BaseException:
            Watchdog.cancel(entry)
            raise
        Watchdog.arm(entry, event)
        return NCCLPending(self, event, ref, host)

    def _reduction(self, op: Op, dtype: DType) -> int:
        if not isinstance(op, PreMulSum):
            return builtin_op(op, dtype)
        self.raise_if_failed()  # an aborted communicator has a null handle: say it is broken instead
        carrier = CARRIED_AS.get(dtype.name, dtype.name)
        key = (float(op.factor), carrier)
        found = self._premul.get(key)
        if found is not None:
            self._premul.move_to_end(key)
            return found
        created = self.library.create_premul_sum(premul_scalar(op.factor, carrier), self._reducible[carrier], raw_handle(self.comm))
        self._premul[key] = created
        if len(self._premul) > 64:  # an op may be destroyed once the calls given it have returned
            _, oldest = self._premul.popitem(last=False)
            self.library.destroy_op(oldest, raw_handle(self.comm))
        return created

    def _elements(self, dtype: DType, count: int, *, reducing: bool) -> Tuple[int, int]:
        if reducing:
            self.check_op(ReduceOp.SUM, dtype)
        return elements(dtype, count, self._reducible)

    # -- collectives ---------------------------------------------------------------------------

    def allreduce(self, send: int, recv: int, count: int, dtype: DType, op: Op, stream: Any = None) -> Pending:
        code, n = self._elements(dtype, count, reducing=True)
        return self._launch("allreduce", stream, self.comm.allReduce, send, recv, n, code, self._reduction(op, dtype))

    def reduce(self, send: int, recv: int, count: int, dtype: DType, op: Op, root: int, stream: Any = None) -> Pending:
        code, n = self._elements(dtype, count, reducing=True)
        return self._launch("reduce", stream, self.comm.reduce, send, recv, n, code, self._reduction(op, dtype), root)

    def broadcast(self, buffer: int, count: int, dtype: DType, root: int, stream: Any = None) -> Pending:
        code, n = self._elements(dtype, count, reducing=False)
        return self._launch("broadcast", stream, self.comm.broadcast, buffer, buffer, n, code, root)

    def allgather(self, send: int, recv: int, count: int, dtype: DType, stream: Any = None) -> Pending:
        code, n = self._elements(dtype, count, reducing=False)
        return self._launch("allgather", stream, self.comm.allGather, send, recv, n, code)

    def reduce_scatter(self, send: int, recv: int, count: int, dtype: DType, op: Op, stream: Any = None) -> Pending:
        code, n = self._elements(dtype, count, reducing=True)
        return self._launch(
            "reduce_scatter", stream, self.comm.reduceScatter, send, recv, n, code, self._reduction(op, dtype)
        )

    def send(self, buffer: int, count: int, dtype: DType, peer: int, stream: Any = None) -> Pending:
        """Point-to-point send of ``count`` elements to ``peer`` (NCCL >= 2.7)."""
        code, n = self._elements(dtype, count, reducing=False)
        return self._launch("send", stream, self.comm.send, buffer, n, code, peer)

    def recv(self, buffer: int, count: int, dtype: DType, peer: int, stream: Any = None) -> Pending:
        """Point-to-point receive of ``count`` elements from ``peer`` (NCCL >= 2.7)."""
        code, n = self._elements(dtype, count, reducing=False)
        return self._launch("recv", stream, self.comm.recv, buffer, n, code, peer)

    def barrier(self) -> Pending:
        """A one-element allreduce on the current stream; waiting on it blocks the host."""
        if self._scratch is None:
            self._scratch = self.events.scratch(4)
        pointer = int(self._scratch.ptr)
        return self._launch("barrier", None, self.comm.allReduce, pointer, pointer, 1, INT32, NCCL_OPS[ReduceOp.SUM], host=True)

    # -- lifecycle -----------------------------------------------------------------------------

    def split(self, color: Optional[int], key: int) -> Optional["NCCLTransport"]:
        split = getattr(self.comm, "commSplit", None)
        if self.version < SPLIT_SINCE or split is None:
            raise DenseCCLError(
                f"splitting an NCCL communicator needs NCCL >= 2.18.1 (this is {version_string(self.version)}) and "
                f"CuPy's NcclCommunicator.commSplit (CuPy >= 14{'' if split is None else ', present'})"
            )
        self.raise_if_failed()
        part = split(-1 if color is None else color, key)
        if part is None:
            return None
        return NCCLTransport(part, self.device, timeout=self.timeout, version=self.version, events=self.events, library=self._library)

    def close(self) -> None:
        """Destroy the PreMulSum ops and the communicator (after an abort there is nothing left)."""
        if self._closed:
            return
        self._watchdog.close()
        self._closed = True
        if self._failure is None:
            handle = raw_handle(self.comm)
            for op in self._premul.values():
                with contextlib.suppress(Exception):
                    self.library.destroy_op(op, handle)
            self._premul.clear()
            self.comm.destroy()
        self._scratch = None


__all__ = ["NCCLTransport"]
