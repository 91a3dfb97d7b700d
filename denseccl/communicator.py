"""The Communicator: validate locally, agree across ranks, then run the transport on spans.

Every collective follows one flow: array -> Buffer -> layout checks -> agreement -> transport.
A rank whose input fails validation still joins the agreement step (as "invalid") so that every
rank raises and nobody is left waiting; nothing is written before agreement succeeds.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any, Iterator, Optional, Tuple

from . import arrays
from .agreement import Descriptor, agree
from .arrays import HOST, Buffer, allocate, as_buffer
from .errors import CollectiveTimeoutError, CommunicatorBrokenError, DenseCCLError, LayoutError
from .layout import Layout, block_of, overlap, stacked, stacked_problem
from .ops import DTYPES, Op, OpLike, as_op, check_op_for_dtype
from .transports.base import DONE, ControlChannel, Pending, Transport, abandon
from .plans import compile_plan, lookup, remember, writable
from .work import Orphans, Work

def _spans(buffer: Buffer) -> Tuple[int, int]:
    return buffer.span_pointer, buffer.layout.numel * buffer.layout.itemsize


class Communicator:
    """Collectives among ``size`` ranks on arrays of any non-overlapping dense layout.

    Create one with :func:`denseccl.init`. Results keep the input's layout; in-place calls
    return the input itself.
    """

    def __init__(self, transport: Transport, control: ControlChannel, *, check: bool = True, timeout: Optional[float] = 300.0) -> None:
        self.transport = transport
        self.control = control
        self.rank: int = transport.rank
        self.size: int = transport.size
        self.backend: str = transport.name
        self.check = check
        self.timeout = timeout if timeout and timeout > 0 else None
        self._broken: Optional[str] = None
        #: per-geometry plans of repeated synchronous in-place calls on NumPy arrays (plans.py)
        self._plans: dict = {}
        self._orphans = Orphans(self)

    def __repr__(self) -> str:
        state = f", broken: {self._broken}" if self._broken else ""
        return f"<denseccl.Communicator backend={self.backend} rank={self.rank} size={self.size}{state}>"

    # -- collectives -------------------------------------------------------------------------

    def allreduce(self, x: Any, op: OpLike = "sum", *, out: Any = None, async_op: bool = False, stream: Any = None) -> Any:
        """Reduce ``x`` over all ranks; every rank gets the result (in ``x`` unless ``out``)."""
        key = None
        if out is None and stream is None and not async_op and type(op) is str:
            key, run = lookup(self._plans, "allreduce", x, op)
            if run is not None and writable(x):
                return run(x)
        self._usable()
        try:
            reduce_op = as_op(op)
            source = self._input(x, writable=out is None)
            stream = self._stream(source, stream)
            self._check_op(reduce_op, source)
            target = source if out is None else self._output(out, source.layout, "out", forbid_overlap_with=source)
            descriptor = Descriptor("allreduce", None, str(reduce_op), source.layout.key)
        except Exception as error:  # noqa: BLE001 - every local failure must reach the peers
            self._fail("allreduce", error)
        self._agree(descriptor)
        count, dtype, transport = source.layout.numel, DTYPES[source.layout.dtype], self.transport
        if not count:
            pending = DONE
        elif async_op:
            pending = self._guard(transport.allreduce, source.span_pointer, target.span_pointer, count, dtype, reduce_op, stream)
        else:  # waited for here: the transport may split it into calls issued one after the other
            self._guard(transport.allreduce_now, source.span_pointer, target.span_pointer, count, dtype, reduce_op, stream, self._deadline())
            pending = DONE
        if key is not None and count and not transport.device_memory:
            self._plan(key, descriptor, source, transport.in_place("allreduce", count, dtype, reduce_op))
        return self._complete(pending, target.owner, async_op, (source, target), stream)

    def reduce(self, x: Any, root: int = 0, op: OpLike = "sum", *, out: Any = None, async_op: bool = False, stream: Any = None) -> Any:
        """Reduce ``x`` onto ``root`` (in ``x`` there unless ``out``). Other ranks only read
        ``x``, ignore ``out`` and get ``x`` back."""
        key = None
        if out is None and type(op) is str and type(root) is int and not async_op and stream is None:
            key, run = lookup(self._plans, "reduce", x, (op, root))
            if run is not None and (self.rank != root or writable(x)):
                return run(x)
        self._usable()
        try:
            root = self._root(root)
            reduce_op = as_op(op)
            on_root = self.rank == root
            source = self._input(x, writable=on_root and out is None)
            stream = self._stream(source, stream)
            self._check_op(reduce_op, source)
            target = source
            if on_root and out is not None:
                target = self._output(out, source.layout, "out", forbid_overlap_with=source)
            descriptor = Descriptor("reduce", root, str(reduce_op), source.layout.key)
        except Exception as error:  # noqa: BLE001
            self._fail("reduce", error)
        self._agree(descriptor)
        count = source.layout.numel
        dtype = DTYPES[source.layout.dtype]
        pending = self._guard(self.transport.reduce, source.span_pointer, target.span_pointer, count, dtype, reduce_op, root, stream) if count else DONE
        if key is not None and count and not self.transport.device_memory:
            self._plan(key, descriptor, source, self.transport.in_place("reduce", count, dtype, reduce_op, root))
        return self._complete(pending, target.owner, async_op, (source, target), stream)

    def broadcast(self, x: Any, root: int = 0, *, async_op: bool = False, stream: Any = None) -> Any:
        """Copy ``root``'s ``x`` into every rank's ``x`` (in place)."""
        key = None
        if type(root) is int and not async_op and stream is None:
            key, run = lookup(self._plans, "broadcast", x, root)
            if run is not None and (self.rank == root or writable(x)):
                return run(x)
        self._usable()
        try:
            root = self._root(root)
            buffer = self._input(x, writable=self.rank != root)
            stream = self._stream(buffer, stream)
            self._check_dtype(buffer)
            descriptor = Descriptor("broadcast", root, None, buffer.layout.key)
        except Exception as error:  # noqa: BLE001
            self._fail("broadcast", error)
        self._agree(descriptor)
        count = buffer.layout.numel
        pending = self._guard(self.transport.broadcast, buffer.span_pointer, count, DTYPES[buffer.layout.dtype], root, stream) if count else DONE
        if key is not None and count and not self.transport.device_memory:
            self._plan(key, descriptor, buffer, self.transport.in_place("broadcast", count, DTYPES[buffer.layout.dtype], None, root))
        return self._complete(pending, buffer.owner, async_op, buffer, stream)

    def allgather(self, x: Any, *, out: Any = None, async_op: bool = False, stream: Any = None) -> Any:
        """Gather every rank's ``x`` into a stacked array of shape ``(size, *x.shape)`` whose
        block ``r`` is rank ``r``'s ``x`` with ``x``'s layout (a new array unless ``out``)."""
        self._usable()
        try:
            source = self._input(x, writable=False)
            stream = self._stream(source, stream)
            self._check_dtype(source)
            block = source.layout
            if out is not None:
                target = self._stacked_buffer(out, block, "out")
                self._check_stacked_overlap(source, target, allow_own_block=True)
            else:  # before the agreement: a rank out of memory makes every rank raise
                target = as_buffer(allocate(source, stacked(block, self.size)))
            descriptor = Descriptor("allgather", None, None, block.key)
        except Exception as error:  # noqa: BLE001
            self._fail("allgather", error)
        self._agree(descriptor)
        count = block.numel
        pending = self._guard(self.transport.allgather, source.span_pointer, target.span_pointer, count, DTYPES[block.dtype], stream) if count else DONE
        return self._complete(pending, target.owner, async_op, (source, target), stream)

    def reduce_scatter(self, x: Any, op: OpLike = "sum", *, out: Any = None, async_op: bool = False, stream: Any = None) -> Any:
        """Reduce the stacked ``x`` (shape ``(size, *s)``) over ranks and give rank ``r`` block
        ``r`` of the result, with the blocks' layout (a new array unless ``out``)."""
        self._usable()
        try:
            reduce_op = as_op(op)
            source = self._input(x, writable=False, dense_required=False)
            stream = self._stream(source, stream)
            problem = stacked_problem(source.layout, self.size)
            if problem is not None:
                raise LayoutError(
                    f"reduce_scatter input {source.layout.describe()} is not a stacked buffer for {self.size} ranks: "
                    f"{problem}. Pass an array of shape (size, *block_shape) whose blocks x[r] are dense and follow "
                    "each other in memory, e.g. one made by allgather or by stacking along a new outermost dim"
                )
            self._check_op(reduce_op, source)
            block = block_of(source.layout)
            if out is not None:
                target = self._output(out, block, "out", forbid_overlap_with=source, allow_alias=False)
            else:  # before the agreement: a rank out of memory makes every rank raise
                target = as_buffer(allocate(source, block))
            descriptor = Descriptor("reduce_scatter", None, str(reduce_op), block.key)
        except Exception as error:  # noqa: BLE001
            self._fail("reduce_scatter", error)
        self._agree(descriptor)
        count = block.numel
        pending = self._guard(self.transport.reduce_scatter, source.span_pointer, target.span_pointer, count, DTYPES[block.dtype], reduce_op, stream) if count else DONE
        return self._complete(pending, target.owner, async_op, (source, target), stream)

    def barrier(self) -> None:
        """Return once every rank has called barrier."""
        self._usable()
        self._agree(Descriptor("barrier"))
        self._complete(self._guard(self.transport.barrier), None, False, None)

    def split(self, color: Optional[int], key: int = 0) -> Optional["Communicator"]:
        """A communicator over the ranks that pass the same ``color`` (a non-negative int),
        ranked by ``key`` then by rank; None on ranks that pass ``color=None``. Every rank
        must call it (MPI ``Comm.Split``; ``ncclCommSplit`` for NCCL >= 2.18)."""
        self._usable()
        try:
            if color is not None and (isinstance(color, bool) or not isinstance(color, int) or color < 0):
                raise LayoutError(f"color must be a non-negative int or None, got {color!r}")
            key = int(key)
        except Exception as error:  # noqa: BLE001 - peers must not wait in the split forever
            self._fail("split", error)
        self._agree(Descriptor("split"))
        control = self._guard(self.control.split, color, key, self._deadline())
        transport = self._guard(self.transport.split, color, key)
        if transport is None or control is None:
            return None
        return Communicator(transport, control, check=self.check, timeout=self.timeout)

    # -- lifecycle ---------------------------------------------------------------------------

    @property
    def broken(self) -> Optional[str]:
        """Why the communicator can no longer be used, or None."""
        if self._broken is None:
            self._broken = self.transport.failure()  # e.g. a device watchdog's verdict
        return self._broken

    def close(self) -> None:
        """Complete the Works dropped before they had completed (within the timeout), then
        release the transport and control channel. The communicator is unusable after."""
        if self._broken != "closed":
            try:
                self._orphans.wait(self._deadline())
            finally:
                self._broken = "closed"
                self.transport.close()
                self.control.close()

    def __enter__(self) -> "Communicator":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the steps ---------------------------------------------------------------------------

    def _usable(self) -> None:
        if self._broken is None:
            self._broken = self.transport.failure()
        if self._broken is not None:
            raise CommunicatorBrokenError(
                f"this communicator is unusable ({self._broken}); create a new one with denseccl.init()"
            )

    def _deadline(self, timeout: Optional[float] = None) -> Optional[float]:
        timeout = self.timeout if timeout is None else timeout
        return None if timeout is None else time.monotonic() + timeout

    def _input(self, x: Any, *, writable: bool, dense_required: bool = True) -> Buffer:
        buffer = as_buffer(x)
        self._check_device(buffer, "input")
        _check_resolved(buffer, "input")
        if dense_required and not buffer.layout.is_dense:
            raise LayoutError(_not_dense("input", buffer.layout))
        if writable and buffer.readonly:
            raise LayoutError(
                f"input {buffer.layout.describe()} is read-only but this call writes its result into it; "
                "pass a writable array, or out= for a separate result"
            )
        return buffer

    def _output(self, out: Any, layout: Layout, name: str, *, forbid_overlap_with: Buffer, allow_alias: bool = True) -> Buffer:
        buffer = as_buffer(out)
        self._check_device(buffer, name)
        _check_resolved(buffer, name)
        if buffer.layout.key != layout.key:
            raise LayoutError(
                f"{name} has {buffer.layout.describe()} but must have the layout {layout.describe()} "
                f"(same dtype, shape and strides, size-1 dims excepted); allocate it with that layout, e.g. "
                "np.empty_like(x) / torch.empty_like(x) for the input's"
            )
        if buffer.readonly:
            raise LayoutError(f"{name} is read-only; pass a writable array")
        if buffer.device != forbid_overlap_with.device:
            raise LayoutError(f"{name} is on another device than the input ({buffer.describe()} vs {forbid_overlap_with.describe()})")
        same = buffer.span_pointer == forbid_overlap_with.span_pointer and buffer.layout.key == forbid_overlap_with.layout.key
        if not (allow_alias and same) and overlap(*_spans(buffer), *_spans(forbid_overlap_with)):
            raise LayoutError(
                f"{name} overlaps the input's memory without being the same array; pass the input itself "
                "(in place) or a separate array"
            )
        return buffer

    def _stacked_buffer(self, out: Any, block: Layout, name: str) -> Buffer:
        buffer = as_buffer(out)
        self._check_device(buffer, name)
        _check_resolved(buffer, name)
        problem = stacked_problem(buffer.layout, self.size)
        if problem is None and block_of(buffer.layout).key != block.key:
            problem = f"its blocks {name}[r] have layout {block_of(buffer.layout).describe()}, not the input's {block.describe()}"
        if problem is not None:
            raise LayoutError(
                f"{name} {buffer.layout.describe()} is not a stacked buffer for {self.size} ranks of "
                f"{block.describe()}: {problem}. Omit {name} to get a new one, or allocate shape "
                f"({self.size}, *x.shape) with the input's strides after a new outermost dim"
            )
        if buffer.readonly:
            raise LayoutError(f"{name} is read-only; pass a writable array")
        return buffer

    def _check_stacked_overlap(self, block_buffer: Buffer, stacked_buffer: Buffer, *, allow_own_block: bool) -> None:
        own = stacked_buffer.span_pointer + self.rank * block_buffer.layout.numel * block_buffer.layout.itemsize
        if allow_own_block and block_buffer.span_pointer == own:
            return
        if overlap(*_spans(block_buffer), *_spans(stacked_buffer)):
            raise LayoutError(
                "out overlaps the input's memory; the input may only be out's own block out[rank] (in place)"
            )

    def _check_device(self, buffer: Buffer, name: str) -> None:
        on_device = buffer.device != HOST
        if on_device != self.transport.device_memory:
            where = "device (CUDA)" if on_device else "host"
            wanted = "device arrays: use denseccl.init(backend='nccl')" if on_device else "host arrays: use denseccl.init(backend='mpi')"
            raise LayoutError(f"{name} is a {where} array, but the {self.backend} transport moves {'device' if self.transport.device_memory else 'host'} memory only; for {wanted}")
        bound = self.transport.device
        if on_device and bound is not None and buffer.device != bound:
            raise LayoutError(
                f"{name} is on cuda:{buffer.device}, but this communicator's rank {self.rank} runs on cuda:{bound}; "
                f"move it there (x.to('cuda:{bound}') / cupy.asarray under cupy.cuda.Device({bound}))"
            )

    def _stream(self, buffer: Buffer, stream: Any) -> Any:
        """The stream a device collective runs on (see :func:`arrays.current_stream`)."""
        return arrays.current_stream(buffer, stream) if self.transport.device_memory else stream

    def _check_dtype(self, buffer: Buffer) -> None:
        """For collectives without an op: the transport must be able to move the dtype."""
        if buffer.layout.dtype not in self.transport.dtypes:
            supported = ", ".join(sorted(self.transport.dtypes))
            raise LayoutError(f"dtype {buffer.layout.dtype} is not supported by the {self.backend} transport (supported: {supported})")

    def _check_op(self, op: Op, buffer: Buffer) -> None:
        check_op_for_dtype(op, DTYPES[buffer.layout.dtype], self.transport.dtypes, self.backend)
        self.transport.check_op(op, DTYPES[buffer.layout.dtype])

    def _root(self, root: Any) -> int:
        if isinstance(root, bool) or not isinstance(root, int) or not 0 <= root < self.size:
            raise LayoutError(f"root {root!r} is not a rank of this communicator (0 <= root < {self.size})")
        return int(root)

    @contextlib.contextmanager
    def _covered(self, descriptor: Descriptor) -> Iterator[None]:
        """Agree once on ``descriptor`` for a composite call (torch's coalesced allreduce: one
        descriptor for all its tensors); the collectives issued inside are covered by it and
        skip their own agreement step. They run on buffers the caller built from the agreed
        inputs, so they cannot disagree."""
        self._agree(descriptor)
        check, self.check = self.check, False
        try:
            yield
        finally:
            self.check = check

    def _agree(self, descriptor: Descriptor) -> None:
        if self.check and self.size > 1:
            self._guard(agree, self.control, descriptor, self._deadline())

    def _fail(self, collective: str, error: BaseException) -> None:
        """Take part in the agreement as invalid, so that every rank raises; then raise."""
        if self.check and self.size > 1:
            try:
                agree(self.control, Descriptor(collective), self._deadline(), error)
            except Exception as raised:
                if raised is not error:  # the local error itself leaves the communicator usable
                    self._note_failure(raised)
                raise
        raise error

    def _guard(self, step: Any, *args: Any) -> Any:
        try:
            return step(*args)
        except Exception as error:
            self._note_failure(error)
            raise

    def _note_failure(self, error: Exception) -> None:
        """Mark the communicator broken after a timeout or a transport failure (not after a
        local or agreement error, which leave it usable)."""
        if isinstance(error, CollectiveTimeoutError):
            self._broken = f"timed out: {error}"
        elif not isinstance(error, DenseCCLError):
            self._broken = f"transport failure: {type(error).__name__}: {error}"

    def _wait(self, pending: Pending, timeout: Optional[float] = None) -> None:
        self._guard(pending.wait, self._deadline(timeout))

    def _synchronize(self, pending: Pending, timeout: Optional[float] = None) -> None:
        self._guard(pending.synchronize, self._deadline(timeout))

    def _plan(self, key: Any, descriptor: Descriptor, buffer: Buffer, start: Any) -> None:
        if start is not None:  # None: the transport wants the full path every time
            remember(self._plans, key, compile_plan(self, descriptor, buffer, start))

    def _complete(self, pending: Pending, result: Any, async_op: bool, keep: Any, stream: Any = None) -> Any:
        if self.transport.device_memory:
            arrays.record_stream(stream, keep)
        if self._orphans:
            self._orphans.poll()
        if async_op:
            return Work(self, pending, result, keep)
        try:
            self._wait(pending)
        except BaseException:
            abandon(pending, keep)  # a timed-out request may still touch them
            raise
        return result


def _check_resolved(buffer: Buffer, name: str) -> None:
    """A torch view with the conjugate or negative bit reads its memory conjugated / negated:
    its span does not hold its values, so it cannot take part (torch's own collectives refuse it)."""
    if buffer.library == "torch" and (buffer.owner.is_conj() or buffer.owner.is_neg()):
        fix = "x.resolve_conj()" if buffer.owner.is_conj() else "x.resolve_neg()"
        raise LayoutError(
            f"{name} is a torch view with the {'conjugate' if buffer.owner.is_conj() else 'negative'} bit set: its "
            f"memory does not hold its values; pass {fix} (a copy) and copy the result back if you need it there"
        )


def _not_dense(name: str, layout: Layout) -> str:
    return (
        f"{name} {layout.describe()} (strides in elements) is not non-overlapping and dense: it has gaps "
        "or repeats elements, so it does not fill one block of memory. Pass a dense array instead "
        "(x.copy(), np.ascontiguousarray(x), t.contiguous()) and copy the result back if you need it there"
    )


__all__ = ["Communicator", "Work", "arrays"]
