"""The Communicator: validate a call locally in one pass, then hand it to the flow whole
(:meth:`Flow.submit`), which chooses the transport's call and runs it.

A repeated synchronous in-place call on a host array runs the call prepared for its geometry
(:meth:`Flow.replay`); any other call is validated here. A rank whose input fails validation
still joins the agreement step (as "invalid", :meth:`Flow.fail`), so that every rank raises
and nobody is left waiting; nothing is written before the agreement succeeds.
"""

from __future__ import annotations

from typing import Any, Optional, Tuple

from . import config, streams
from .agreement import Descriptor
from .arrays import HOST, Buffer, allocate, as_buffer
from .dtypes import DTYPES
from .errors import ArgumentError, DenseCCLError, LayoutError
from .layout import Layout, block_of, overlap, stacked, stacked_problem
from .ops import Op, OpLike, ReduceOp, as_op, check_op_for_dtype
from .transport import Transport
from .channel.base import ControlChannel
from .flow import Flow, Work


def _spans(buffer: Buffer) -> Tuple[int, int]:
    return buffer.span_pointer, buffer.layout.numel * buffer.layout.itemsize


#: the op types of cached calls: a name or a member is the same op every time (a PreMulSum's
#: factor is the caller's, so it is validated each call)
CACHED_OPS = (str, ReduceOp)
#: what a call that is not cached has instead of :meth:`Flow.replay`'s answer: no key, no result
UNCACHED = (None, None)


class Communicator:
    """Collectives among ``size`` ranks on arrays of any non-overlapping dense layout.

    Create one with :func:`denseccl.init`. Results keep the input's layout; in-place calls
    return the input itself. ``flow`` is the interface for code built on the core (flow.py).
    """

    def __init__(
        self,
        transport: Transport,
        control: ControlChannel,
        *,
        check: bool = True,
        timeout: Optional[float] = config.DEFAULT_TIMEOUT,
        on_timeout: Optional[str] = None,
    ) -> None:
        self.flow = Flow(transport, control, check=check, timeout=timeout, on_timeout=config.on_timeout(on_timeout))
        self.transport = transport
        self.control = control
        self.rank: int = transport.rank
        self.size: int = transport.size
        self.backend: str = transport.name

    @property
    def check(self) -> bool:
        """Whether the cross-rank agreement check runs before each collective."""
        return self.flow.check

    @check.setter
    def check(self, value: bool) -> None:
        self.flow.check = bool(value)

    @property
    def timeout(self) -> Optional[float]:
        """Seconds a rank waits for its peers (None: forever)."""
        return self.flow.timeout

    @timeout.setter
    def timeout(self, value: Optional[float]) -> None:
        self.flow.timeout = value if value and value > 0 else None

    def __repr__(self) -> str:
        state = f", broken: {self.flow.broken}" if self.flow.broken else ""
        return f"<denseccl.Communicator backend={self.backend} rank={self.rank} size={self.size}{state}>"

    # -- collectives -------------------------------------------------------------------------

    def allreduce(
        self, x: Any, op: OpLike = "sum", *, out: Any = None, async_op: bool = False, stream: Any = None
    ) -> Any:
        """Reduce ``x`` over all ranks; every rank gets the result (in ``x`` unless ``out``)."""
        flow = self.flow
        cached = out is None and stream is None and not async_op and type(op) in CACHED_OPS
        key, done = flow.replay("allreduce", x, op, True) if cached else UNCACHED
        if done is not None:
            return done
        flow.usable()
        try:
            reduce_op = as_op(op)
            source, stream = self._input(x, stream, reduce_op, writable=out is None)
            target = source if out is None else self._output(out, source.layout, source)
            descriptor = Descriptor("allreduce", None, str(reduce_op), source.layout.key)
        except Exception as error:  # noqa: BLE001 - every local failure must reach the peers
            flow.fail("allreduce", error)
        return flow.submit(key, descriptor, source, target, reduce_op, async_op, stream)

    def reduce(
        self, x: Any, root: int = 0, op: OpLike = "sum", *, out: Any = None, async_op: bool = False, stream: Any = None
    ) -> Any:
        """Reduce ``x`` onto ``root`` (in ``x`` there unless ``out``). Other ranks only read
        ``x``, ignore ``out`` and get ``x`` back."""
        flow = self.flow
        cached = out is None and stream is None and not async_op and type(op) in CACHED_OPS and type(root) is int
        key, done = flow.replay("reduce", x, (op, root), self.rank == root) if cached else UNCACHED
        if done is not None:
            return done
        flow.usable()
        try:
            root = self._root(root)
            reduce_op = as_op(op)
            on_root = self.rank == root
            source, stream = self._input(x, stream, reduce_op, writable=on_root and out is None)
            target = source
            if on_root and out is not None:
                target = self._output(out, source.layout, source)
            descriptor = Descriptor("reduce", root, str(reduce_op), source.layout.key)
        except Exception as error:  # noqa: BLE001
            flow.fail("reduce", error)
        return flow.submit(key, descriptor, source, target, reduce_op, async_op, stream)

    def broadcast(self, x: Any, root: int = 0, *, async_op: bool = False, stream: Any = None) -> Any:
        """Copy ``root``'s ``x`` into every rank's ``x`` (in place)."""
        flow = self.flow
        cached = stream is None and not async_op and type(root) is int
        key, done = flow.replay("broadcast", x, root, self.rank != root) if cached else UNCACHED
        if done is not None:
            return done
        flow.usable()
        try:
            root = self._root(root)
            buffer, stream = self._input(x, stream, None, writable=self.rank != root)
            descriptor = Descriptor("broadcast", root, None, buffer.layout.key)
        except Exception as error:  # noqa: BLE001
            flow.fail("broadcast", error)
        return flow.submit(key, descriptor, buffer, buffer, None, async_op, stream)

    def allgather(self, x: Any, *, out: Any = None, async_op: bool = False, stream: Any = None) -> Any:
        """Gather every rank's ``x`` into a stacked array of shape ``(size, *x.shape)`` whose
        block ``r`` is rank ``r``'s ``x`` with ``x``'s layout (a new array unless ``out``)."""
        flow = self.flow
        flow.usable()
        try:
            source, stream = self._input(x, stream, None, writable=False)
            block = source.layout
            if out is not None:
                target = self._stacked_output(out, source)
            else:  # before the agreement: a rank out of memory makes every rank raise
                target = as_buffer(allocate(source, stacked(block, self.size)))
            descriptor = Descriptor("allgather", None, None, block.key)
        except Exception as error:  # noqa: BLE001
            flow.fail("allgather", error)
        return flow.submit(None, descriptor, source, target, None, async_op, stream)

    def reduce_scatter(
        self, x: Any, op: OpLike = "sum", *, out: Any = None, async_op: bool = False, stream: Any = None
    ) -> Any:
        """Reduce the stacked ``x`` (shape ``(size, *s)``) over ranks and give rank ``r`` block
        ``r`` of the result, with the blocks' layout (a new array unless ``out``)."""
        flow = self.flow
        flow.usable()
        try:
            reduce_op = as_op(op)
            source, stream = self._input(x, stream, reduce_op, writable=False, stacked=True)
            block = block_of(source.layout)
            if out is not None:
                target = self._output(out, block, source, allow_alias=False)
            else:  # before the agreement: a rank out of memory makes every rank raise
                target = as_buffer(allocate(source, block))
            descriptor = Descriptor("reduce_scatter", None, str(reduce_op), block.key)
        except Exception as error:  # noqa: BLE001
            flow.fail("reduce_scatter", error)
        return flow.submit(None, descriptor, source, target, reduce_op, async_op, stream)

    def barrier(self) -> None:
        """Return once every rank has called barrier."""
        self.flow.submit(None, Descriptor("barrier"))

    def split(self, color: Optional[int], key: int = 0) -> Optional["Communicator"]:
        """A communicator over the ranks that pass the same ``color`` (a non-negative int),
        ranked by ``key`` then by rank; None on ranks that pass ``color=None``. Every rank
        must call it (MPI ``Comm.Split``; ``ncclCommSplit`` for NCCL >= 2.18)."""
        flow = self.flow
        flow.usable()
        try:
            if color is not None and (isinstance(color, bool) or not isinstance(color, int) or color < 0):
                raise ArgumentError(f"color must be a non-negative int or None, got {color!r}")
            key = int(key)
        except Exception as error:  # noqa: BLE001 - peers must not wait in the split forever
            flow.fail("split", error)
        flow.agree(Descriptor("split"))
        control = flow.start(self.control.split, color, key, flow.deadline())
        transport = flow.start(self.transport.split, color, key)
        if transport is None or control is None:
            return None
        return Communicator(transport, control, check=flow.check, timeout=flow.timeout, on_timeout=flow.on_timeout)

    # -- lifecycle ---------------------------------------------------------------------------

    def dump_trace(self, directory: Optional[str] = None) -> str:
        """Write this communicator's flight recorder (its last calls) into its job's folder in
        ``directory`` (default ``DENSECCL_TRACE_DIR``, else ``denseccl-trace-<uid>`` in the
        temporary directory) and return the file's path; ``python -m denseccl.trace_summary DIR``
        reads every rank's dump (docs/debugging.md). A folder another user could read or
        redirect is refused with a DenseCCLError that says why; nothing is written then."""
        if self.flow.recorder is None:
            raise DenseCCLError(
                "this communicator has no flight recorder (DENSECCL_TRACE_BUFFER=0); set DENSECCL_TRACE_BUFFER to the "
                "number of calls to keep before denseccl.init()"
            )
        return self.flow.recorder.dump(directory)

    @property
    def broken(self) -> Optional[str]:
        """Why the communicator can no longer be used (a timeout here, a peer that gave up, a
        device watchdog's verdict, closed), or None."""
        return self.flow.state()

    def close(self) -> None:
        """Complete the Works dropped before they had completed (within the timeout), then
        release the transport and control channel. The communicator is unusable after."""
        self.flow.close()

    def __enter__(self) -> "Communicator":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- validation --------------------------------------------------------------------------

    def _array(self, x: Any, name: str) -> Buffer:
        """``x``'s Buffer, in the memory this transport moves, holding its values."""
        buffer = as_buffer(x)
        self._check_device(buffer, name)
        _check_resolved(buffer, name)
        return buffer

    def _input(
        self, x: Any, stream: Any, op: Optional[Op], *, writable: bool, stacked: bool = False
    ) -> Tuple[Buffer, Any]:
        """The input's Buffer, checked: dense (or a stacked buffer for ``size`` ranks), writable
        where the call writes into it, ``op`` defined for its dtype; and the stream the call runs on."""
        buffer = self._array(x, "input")
        layout = buffer.layout
        if not stacked and not layout.is_dense:
            raise LayoutError(
                f"input {layout.describe()} (strides in elements) is not non-overlapping and dense: it has gaps "
                "or repeats elements, so it does not fill one block of memory. Pass a dense array instead "
                "(x.copy(), np.ascontiguousarray(x), t.contiguous()) and copy the result back if you need it there"
            )
        if writable and buffer.readonly:
            raise LayoutError(
                f"input {layout.describe()} is read-only but this call writes its result into it; "
                "pass a writable array, or out= for a separate result"
            )
        if self.transport.device_memory:
            stream = streams.current_stream(buffer, stream)
        problem = stacked_problem(layout, self.size) if stacked else None
        if problem is not None:
            raise LayoutError(
                f"reduce_scatter input {layout.describe()} is not a stacked buffer for {self.size} ranks: "
                f"{problem}. Pass an array of shape (size, *block_shape) whose blocks x[r] are dense and follow "
                "each other in memory, e.g. one made by allgather or by stacking along a new outermost dim"
            )
        self._check_op(op, buffer)
        return buffer, stream

    def _output(self, out: Any, layout: Layout, source: Buffer, *, allow_alias: bool = True) -> Buffer:
        """``out`` checked: of ``layout``, writable, beside ``source`` (the same array only where
        ``allow_alias``)."""
        buffer = self._array(out, "out")
        if buffer.layout.key != layout.key:
            raise LayoutError(
                f"out has {buffer.layout.describe()} but must have the layout {layout.describe()} "
                f"(same dtype, shape and strides, size-1 dims excepted); allocate it with that layout, e.g. "
                "np.empty_like(x) / torch.empty_like(x) for the input's"
            )
        if buffer.readonly:
            raise LayoutError("out is read-only; pass a writable array")
        if buffer.device != source.device:
            raise ArgumentError(f"out is on another device than the input ({buffer.describe()} vs {source.describe()})")
        same = buffer.span_pointer == source.span_pointer and buffer.layout.key == source.layout.key
        if not (allow_alias and same) and overlap(*_spans(buffer), *_spans(source)):
            raise LayoutError(
                "out overlaps the input's memory without being the same array; pass the input itself "
                "(in place) or a separate array"
            )
        return buffer

    def _stacked_output(self, out: Any, source: Buffer) -> Buffer:
        """``out`` checked: a writable stacked buffer of ``source``'s layout that ``source`` is at
        most the block ``out[rank]`` of."""
        buffer = self._array(out, "out")
        block = source.layout
        problem = stacked_problem(buffer.layout, self.size)
        if problem is None and block_of(buffer.layout).key != block.key:
            problem = (
                f"its blocks out[r] have layout {block_of(buffer.layout).describe()}, "
                f"not the input's {block.describe()}"
            )
        if problem is not None:
            raise LayoutError(
                f"out {buffer.layout.describe()} is not a stacked buffer for {self.size} ranks of "
                f"{block.describe()}: {problem}. Omit out to get a new one, or allocate shape "
                f"({self.size}, *x.shape) with the input's strides after a new outermost dim"
            )
        if buffer.readonly:
            raise LayoutError("out is read-only; pass a writable array")
        own = buffer.span_pointer + self.rank * block.numel * block.itemsize
        if source.span_pointer != own and overlap(*_spans(source), *_spans(buffer)):
            raise LayoutError(
                "out overlaps the input's memory; the input may only be out's own block out[rank] (in place)"
            )
        return buffer

    def _check_device(self, buffer: Buffer, name: str) -> None:
        on_device = buffer.device != HOST
        if on_device != self.transport.device_memory:
            kind, moves, backend = ("device", "host", "nccl") if on_device else ("host", "device", "mpi")
            where = "device (CUDA)" if on_device else "host"
            raise ArgumentError(
                f"{name} is a {where} array, but the {self.backend} transport moves {moves} memory only; for "
                f"{kind} arrays: use denseccl.init(backend='{backend}')"
            )
        bound = self.transport.device
        if on_device and bound is not None and buffer.device != bound:
            raise ArgumentError(
                f"{name} is on cuda:{buffer.device}, but this communicator's rank {self.rank} runs on cuda:{bound}; "
                f"move it there (x.to('cuda:{bound}') / cupy.asarray under cupy.cuda.Device({bound}))"
            )

    def _check_op(self, op: Optional[Op], buffer: Buffer) -> None:
        """``op`` on the buffer's dtype, by denseccl's tables and the transport's. For collectives
        without an op (None) only whether the transport moves the dtype: SUM is defined for every
        dtype kind, so only the transport's table can refuse it."""
        dtype = DTYPES[buffer.layout.dtype]
        check_op_for_dtype(ReduceOp.SUM if op is None else op, dtype, self.transport.dtypes, self.backend)
        if op is not None:
            self.transport.check_op(op, dtype)

    def _root(self, root: Any) -> int:
        if isinstance(root, bool) or not isinstance(root, int) or not 0 <= root < self.size:
            raise ArgumentError(f"root {root!r} is not a rank of this communicator (0 <= root < {self.size})")
        return int(root)


def _check_resolved(buffer: Buffer, name: str) -> None:
    """A torch view with the conjugate or negative bit reads its memory conjugated / negated:
    its span does not hold its values, so it cannot take part (torch's own collectives refuse it)."""
    if buffer.library == "torch" and (buffer.owner.is_conj() or buffer.owner.is_neg()):
        fix = "x.resolve_conj()" if buffer.owner.is_conj() else "x.resolve_neg()"
        raise LayoutError(
            f"{name} is a torch view with the {'conjugate' if buffer.owner.is_conj() else 'negative'} bit set: its "
            f"memory does not hold its values; pass {fix} (a copy) and copy the result back if you need it there"
        )


__all__ = ["Communicator", "Work"]
