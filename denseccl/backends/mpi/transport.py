"""MPI transport: mpi4py nonblocking collectives on host storage spans.

Each method maps ``(pointer, count, dtype, op, root)`` to one ``MPI_I*`` call on a flat view
of the span (mpi4py refuses non-contiguous buffers; a span is contiguous by construction).
What MPI lacks is supplied around that call: float16/bfloat16 reductions as user ops computed
in float32, ``avg`` as a sum then a division, ``PreMulSum`` as a scaling of the input first.

One exception to "one call": a large float16/bfloat16 allreduce that the caller waits for at
once (``allreduce_now``) runs as a reduce-scatter, then an allgather. MPICH reduces user-op
types by recursive doubling, so every rank would send and reduce the whole array; split, each
rank reduces ``1/size`` of it, as MPI's own algorithm does for built-in types. Only then: the
second call must be issued at the same point of every rank's sequence of calls, which a
caller that waits later (polling, a progress thread) cannot promise.
"""

from __future__ import annotations

import ctypes
import itertools
import weakref
from functools import lru_cache
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

from mpi4py import MPI

from ... import config
from ...dtypes import DType
from ...ops import BOOL_OPS, Op, PreMulSum, ReduceOp, op_kind
from . import host_kernels
from ...transport import Pending, Start, Transport
from .persistent import Requests, in_place
from .control import MPIControl, free_comm, open_control, retire_comm, split_comm

_MPI_TYPES: Dict[str, Any] = {
    "bool": MPI.C_BOOL,
    **{f"{u}int{bits}": getattr(MPI, f"{u.upper()}INT{bits}_T") for u in ("", "u") for bits in (8, 16, 32, 64)},
    "float16": MPI.UINT16_T,  # carried as bits; reduced by our own user ops
    "bfloat16": MPI.UINT16_T,
    "float32": MPI.FLOAT,
    "float64": MPI.DOUBLE,
    "complex64": MPI.C_FLOAT_COMPLEX,
    "complex128": MPI.C_DOUBLE_COMPLEX,
}

_BASE_OPS = {
    ReduceOp.SUM: MPI.SUM,
    ReduceOp.AVG: MPI.SUM,
    ReduceOp.PREMUL_SUM: MPI.SUM,
    ReduceOp.PRODUCT: MPI.PROD,
    ReduceOp.MIN: MPI.MIN,
    ReduceOp.MAX: MPI.MAX,
}
_BOOL_MPI_OPS = {ReduceOp.MIN: MPI.LAND, ReduceOp.MAX: MPI.LOR}
#: the communicator's methods that start an in-place call: (nonblocking, persistent set-up)
_IN_PLACE_CALLS = {
    "allreduce": ("Iallreduce", "Allreduce_init"),
    "reduce": ("Ireduce", "Reduce_init"),
    "broadcast": ("Ibcast", "Bcast_init"),
}


def _mpi_op(op: Op, dtype: DType) -> Any:
    kind = op_kind(op)
    if dtype.kind == "b":
        return _BOOL_MPI_OPS[BOOL_OPS[kind]]
    if host_kernels.is_half(dtype):
        return _half_op(ReduceOp.SUM if kind in (ReduceOp.AVG, ReduceOp.PREMUL_SUM) else kind, dtype)
    return _BASE_OPS[kind]


@lru_cache(maxsize=None)
def _half_op(kind: ReduceOp, dtype: DType) -> Any:
    """The MPI user op reducing float16/bfloat16 by ``kind``, created once per process."""
    return MPI.Op.Create(host_kernels.half_reduction(kind, dtype), commute=True)


def _bytes(pointer: int, nbytes: int) -> Any:
    """The ``nbytes`` at ``pointer`` as a buffer mpi4py accepts."""
    return MPI.buffer.fromaddress(pointer if nbytes else 0, nbytes)


def _runs(counts: Sequence[int]) -> List[int]:
    """Where each rank's run starts when the runs of ``counts`` follow each other."""
    return list(itertools.accumulate([0, *counts]))[:-1]


@lru_cache(maxsize=None)
def has_persistent() -> bool:
    """Whether the MPI library has persistent collectives (MPI 4; Open MPI has them from 5.0
    while it reports MPI 3.1, so they are tried once, on ``COMM_SELF``)."""
    try:
        request = MPI.COMM_SELF.Bcast_init([bytearray(1), 1, MPI.BYTE], 0)
    except (NotImplementedError, MPI.Exception):
        return False
    request.Free()
    return True


class MPIPending(Pending):
    """An MPI request, plus what must run on the host once it has completed."""

    __slots__ = ("request", "finish", "keep")

    def __init__(self, request: Any, finish: Optional[Callable[[], None]] = None, keep: Any = None) -> None:
        self.request = request
        self.finish = finish
        self.keep = keep  # temporaries the request reads from

    def test(self) -> bool:
        if not self.request.Test():
            return False
        finish, self.finish, self.keep = self.finish, None, None
        if finish is not None:
            finish()
        return True


class StepsPending(Pending):
    """Several MPI requests issued one after the other: ``steps`` yields each request with the
    messages it uses, and runs the host work between them when resumed. The next request is
    issued inside ``test`` once the current one has completed."""

    __slots__ = ("steps", "request", "keep")

    def __init__(self, steps: Iterator[Tuple[Any, Any]]) -> None:
        self.steps = steps
        self.request, self.keep = next(steps)

    def test(self) -> bool:
        while self.request is not None:
            if not self.request.Test():
                return False
            self.request, self.keep = next(self.steps, (None, None))
        return True


class MPIReceived(MPIPending):
    """A receive's request and the status its completion fills in (the sender's rank)."""

    __slots__ = ("status", "done")

    def __init__(self, request: Any, status: Any) -> None:
        super().__init__(request)
        self.status = status
        self.done = False

    def test(self) -> bool:
        # a test after completion would overwrite the status (MPI_ANY_SOURCE)
        self.done = self.done or self.request.Test(self.status)
        return self.done

    def source(self) -> int:
        return int(self.status.Get_source())


class MPITransport(Transport):
    """Collectives over an mpi4py communicator (which this transport owns)."""

    name = "mpi"
    device_memory = False
    dtypes = _MPI_TYPES

    def __init__(self, comm: Any) -> None:
        self.comm = comm
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        #: the persistent requests of repeated calls (persistent.py)
        self.requests = Requests()
        # freed at exit, before mpi4py finalizes MPI (which reports requests still allocated)
        weakref.finalize(self, self.requests.release, False)

    def _message(self, pointer: int, count: int, dtype: DType) -> list:
        return [MPI.buffer.fromaddress(pointer, count * dtype.itemsize), count, _MPI_TYPES[dtype.name]]

    def _average(self, op: Op, pointer: int, count: int, dtype: DType) -> Optional[Callable[[], None]]:
        """For ``avg``, what turns the ``count`` sums at ``pointer`` into means; else None."""
        if op_kind(op) is not ReduceOp.AVG:
            return None
        size = self.size
        return lambda: host_kernels.divide(host_kernels.host_view(pointer, count, dtype), size, dtype)

    def _prescale(self, send: int, recv: int, count: int, dtype: DType, op: Op) -> Tuple[Any, Any]:
        """Apply a PreMulSum factor: into ``recv`` when we may write it (returns IN_PLACE as the
        new send), else into a temporary (returned to be kept alive)."""
        factor = op.factor  # type: ignore[union-attr]
        source = host_kernels.host_view(send, count, dtype)
        if recv:
            host_kernels.scale(host_kernels.host_view(recv, count, dtype), source, factor, dtype)
            return MPI.IN_PLACE, None
        temporary = host_kernels.scaled_copy(source, factor, dtype)
        return [temporary, temporary.size, _MPI_TYPES[dtype.name]], temporary

    def _allreduce_input(self, send: int, recv: int, count: int, dtype: DType, op: Op) -> Any:
        """The send side of an allreduce into ``recv``: IN_PLACE where ``recv`` holds the input
        (in place, or scaled there for PreMulSum), else ``send``'s message."""
        if isinstance(op, PreMulSum):
            return self._prescale(send, recv, count, dtype, op)[0]
        return MPI.IN_PLACE if send == recv else self._message(send, count, dtype)

    def allreduce(self, send: int, recv: int, count: int, dtype: DType, op: Op, stream: Any = None) -> Pending:
        receive = self._message(recv, count, dtype)
        message = self._allreduce_input(send, recv, count, dtype, op)
        request = self.comm.Iallreduce(message, receive, _mpi_op(op, dtype))
        return MPIPending(request, self._average(op, recv, count, dtype))

    def allreduce_now(self, send: int, recv: int, count: int, dtype: DType, op: Op, stream: Any = None) -> Pending:
        if not self._split_halves(count, dtype):
            return self.allreduce(send, recv, count, dtype, op, stream)
        return StepsPending(self._split_allreduce(send, recv, count, dtype, op))

    def _split_allreduce(self, send: int, recv: int, count: int, dtype: DType, op: Op) -> Iterator[Tuple[Any, Any]]:
        """The reduce-scatter, then the allgather, each yielded with the messages it uses; the
        next is issued only once the one before has completed."""
        message = self._allreduce_input(send, recv, count, dtype, op)
        rank, size, itemsize, mpi_type = self.rank, self.size, dtype.itemsize, _MPI_TYPES[dtype.name]
        counts = [count // size + (1 if r < count % size else 0) for r in range(size)]
        displacements = _runs(counts)
        block = recv + displacements[rank] * itemsize
        block_bytes = counts[rank] * itemsize
        fromaddress, mpi_op = MPI.buffer.fromaddress, _mpi_op(op, dtype)
        if message is MPI.IN_PLACE:  # MPI promises this rank's reduced block at the start of recv only
            scattered = [MPI.IN_PLACE, self._message(recv, count, dtype)]
        else:
            scattered = [message, [fromaddress(block, block_bytes), counts[rank], mpi_type]]
        yield self.comm.Ireduce_scatter(*scattered, counts, mpi_op), scattered
        if message is MPI.IN_PLACE and rank:  # disjoint: counts never grow with the rank
            ctypes.memmove(block, recv, block_bytes)
        whole = [fromaddress(recv, count * itemsize), counts, displacements, mpi_type]
        yield self.comm.Iallgatherv(MPI.IN_PLACE, whole), whole
        average = self._average(op, recv, count, dtype)
        if average is not None:
            average()

    def _split_halves(self, count: int, dtype: DType) -> bool:
        return self.size > 1 and count * dtype.itemsize >= config.SPLIT_HALVES_BYTES and host_kernels.is_half(dtype)

    def reduce(self, send: int, recv: int, count: int, dtype: DType, op: Op, root: int, stream: Any = None) -> Pending:
        on_root = self.rank == root
        receive = self._message(recv, count, dtype) if on_root else None
        keep = None
        if isinstance(op, PreMulSum):
            message, keep = self._prescale(send, recv if on_root else 0, count, dtype, op)
        elif on_root and send == recv:
            message = MPI.IN_PLACE
        else:
            message = self._message(send, count, dtype)
        request = self.comm.Ireduce(message, receive, _mpi_op(op, dtype), root)
        return MPIPending(request, self._average(op, recv, count, dtype) if on_root else None, keep)

    def broadcast(self, buffer: int, count: int, dtype: DType, root: int, stream: Any = None) -> Pending:
        return MPIPending(self.comm.Ibcast(self._message(buffer, count, dtype), root))

    def allgather(self, send: int, recv: int, count: int, dtype: DType, stream: Any = None) -> Pending:
        in_place = send == recv + self.rank * count * dtype.itemsize
        message = MPI.IN_PLACE if in_place else self._message(send, count, dtype)
        receive = self._message(recv, count * self.size, dtype)
        receive[1] = count  # mpi4py counts the receive side per block
        return MPIPending(self.comm.Iallgather(message, receive))

    def reduce_scatter(self, send: int, recv: int, count: int, dtype: DType, op: Op, stream: Any = None) -> Pending:
        keep = None
        if isinstance(op, PreMulSum):
            message, keep = self._prescale(send, 0, count * self.size, dtype, op)
        else:
            message = self._message(send, count * self.size, dtype)
        message[1] = count  # mpi4py counts the send side per block
        request = self.comm.Ireduce_scatter_block(message, self._message(recv, count, dtype), _mpi_op(op, dtype))
        return MPIPending(request, self._average(op, recv, count, dtype), keep)

    def barrier(self) -> Pending:
        return MPIPending(self.comm.Ibarrier())

    def alltoallv(self, send: int, recv: int, sends: Sequence[int], receives: Sequence[int]) -> Pending:
        messages = [[_bytes(pointer, sum(counts)), (list(counts), _runs(counts)), MPI.BYTE]
                    for pointer, counts in ((send, sends), (recv, receives))]
        return MPIPending(self.comm.Ialltoallv(*messages))

    def send(self, pointer: int, nbytes: int, peer: int, tag: int) -> Pending:
        return MPIPending(self.comm.Isend([_bytes(pointer, nbytes), MPI.BYTE], dest=peer, tag=tag))

    def recv(self, pointer: int, nbytes: int, peer: int, tag: int) -> Pending:
        source = MPI.ANY_SOURCE if peer < 0 else peer
        return MPIReceived(self.comm.Irecv([_bytes(pointer, nbytes), MPI.BYTE], source=source, tag=tag), MPI.Status())

    def prepare(
        self, collective: str, count: int, dtype: DType, op: Optional[Op] = None, root: int = 0
    ) -> Optional[Start]:
        """The in-place ``collective`` of one geometry (persistent.py): one library call on a
        prebuilt message, on a persistent request the ranks pair where MPI has them (MPI 4;
        Open MPI from 5.0). Where host work surrounds the call (avg, PreMulSum) or a large
        half-precision allreduce splits in two, the general method (``Transport.prepare``)."""
        issue = self._in_place_call(collective, op, root, dtype, persistent=False)
        if issue is None or (collective == "allreduce" and self._split_halves(count, dtype)):
            return super().prepare(collective, count, dtype, op, root)
        init = self._in_place_call(collective, op, root, dtype, persistent=True) if has_persistent() else None
        geometry = (collective, count, dtype.name, None if op is None else str(op), root)
        return in_place(issue, init, count, _MPI_TYPES[dtype.name], self.requests, self.size == 1, geometry)

    def _in_place_call(
        self, collective: str, op: Optional[Op], root: int, dtype: DType, *, persistent: bool
    ) -> Optional[Callable[[Any], Any]]:
        """The library call that starts (or, ``persistent``, sets up) the in-place
        ``collective`` on a message, with everything else bound; None where host work
        surrounds the call (avg, PreMulSum) and the general path must run."""
        kind = None if op is None else op_kind(op)
        if kind in (ReduceOp.AVG, ReduceOp.PREMUL_SUM) or collective not in _IN_PLACE_CALLS:
            return None
        call = getattr(self.comm, _IN_PLACE_CALLS[collective][persistent])
        mpi_op, in_place = None if op is None else _mpi_op(op, dtype), MPI.IN_PLACE
        if collective == "allreduce":
            return lambda message: call(in_place, message, mpi_op)
        if collective == "broadcast":
            return lambda message: call(message, root)
        if self.rank == root:
            return lambda message: call(in_place, message, mpi_op, root)
        return lambda message: call(message, None, mpi_op, root)

    def split(self, color: Optional[int], key: int) -> Optional["MPITransport"]:
        part = split_comm(self.comm, color, key)
        return None if part is None else MPITransport(part)

    def close(self) -> None:
        self.requests.release(keep=False)
        free_comm(self.comm)

    def retire(self) -> None:
        self.requests.release(keep=True)
        retire_comm(self.comm)


__all__ = ["MPIControl", "MPIPending", "MPIReceived", "MPITransport", "StepsPending", "open_control"]
