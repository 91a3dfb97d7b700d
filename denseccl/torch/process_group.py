"""The ``denseccl`` backend of ``torch.distributed``: a ``ProcessGroup`` subclass whose
collectives run on each tensor's storage span, in whatever dense layout it has, after the
cross-rank agreement check.

CPU tensors move over MPI under an MPI launcher, else over the gloo engine made from this
group's store (:mod:`._launch`); CUDA tensors over NCCL, created on the first CUDA collective;
all-to-all and point-to-point, for CPU tensors, on an engine this group owns
(:mod:`.all_to_all_p2p`). This module holds the group itself (communicators, lifecycle) and
its elementwise collectives; the gather and scatter family is the
:class:`~.gather_scatter.GatherScatter` mixin the group inherits.
"""

from __future__ import annotations

import contextlib
import datetime
from functools import partial
from typing import Any, Callable, Iterator, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
import torch._C._distributed_c10d as _c10d

from .. import init as denseccl_init
from ..agreement import Descriptor
from ..communicator import Communicator
from ..errors import ArgumentError, DenseCCLError, LayoutError
from ..ops import as_op
from ..transport import abandon
from ..backends.nccl.advice import install_hint
from ..wait import deadline_after
from . import all_to_all_p2p, buckets, dispatcher, p2p, profiling
from .operations import Issue, as_list, cuda_context, options, raising_everywhere, start_each, timeout_seconds
from ._launch import arrive, host_engine, mpi_group
from ._tensors import composite_key, is_dense, not_dense_message
from .gather_scatter import GatherScatter
from .progress import AsyncWork, Operation, Progress, completed_work, failed, new_future
from .tooling import TorchTooling

BACKEND_NAME = "denseccl"


class ProcessGroupDenseCCL(GatherScatter, TorchTooling, dist.ProcessGroup):
    """torch.distributed process group over denseccl. Created by ``init_process_group("denseccl")``
    or ``new_group(backend="denseccl")``; not meant to be built by hand."""

    def __init__(
        self,
        store: Any,
        rank: int,
        size: int,
        timeout: Optional[datetime.timedelta] = None,
        global_ranks: Sequence[int] = (),
    ) -> None:
        super().__init__(rank, size)
        self._store = store
        self._group_rank = rank
        self._group_size = size
        self._seconds = timeout_seconds(timeout)
        #: How many operations had to stage through a copy (dim 0 not outermost, or an output
        #: whose layout differs from the moved blocks'); the rest moved the tensors' spans.
        self.staged_operations = 0
        self._progress = Progress(f"denseccl-rank{rank}")
        self._mpi_group: Any = None  # mpi4py communicator of this group's ranks, in group-rank order
        self._owns_mpi_group = False
        self._host: Optional[Communicator] = None
        self._aux: Optional[all_to_all_p2p.Engine] = None  # of point-to-point and all-to-all
        self._device: Optional[Communicator] = None
        self._names: dict = {}
        self._setup_host(list(global_ranks))

    # -- setup -------------------------------------------------------------------------------

    def _setup_host(self, global_ranks: List[int]) -> None:
        """The communicator that moves CPU tensors: MPI under an MPI launcher, else the gloo
        engine on this group's store; and the engine of all-to-all and send/recv."""
        if host_engine() == "gloo":
            self._host = denseccl_init(
                backend="gloo",
                store=self._store,
                rank=self._group_rank,
                size=self._group_size,
                timeout=self._seconds or 0,
            )
        else:
            if global_ranks:  # MPI_Comm_create_group blocks until every member calls it
                arrive(self._store, self._group_rank, self._group_size, self._seconds, "creating the denseccl subgroup")
            self._mpi_group, self._owns_mpi_group = mpi_group(self._group_rank, self._group_size, global_ranks)
            self._host = denseccl_init(backend="mpi", comm=self._mpi_group, timeout=self._seconds or 0)
        self._aux = all_to_all_p2p.Engine(self._host)

    def _communicator(self, tensors: Sequence[torch.Tensor], what: str) -> Communicator:
        """The denseccl communicator for these tensors' device (all must share one type)."""
        if not tensors:
            raise ArgumentError(f"{what}: no tensors given")
        kinds = {t.device.type for t in tensors}
        if len(kinds) != 1:
            raise ArgumentError(
                f"{what}: tensors on different device types {sorted(kinds)}; pass tensors of one device type"
            )
        kind = kinds.pop()
        if kind == "cpu":
            return self._live_host()
        if kind == "cuda":
            return self._device_communicator(tensors[0].device)
        raise ArgumentError(f"{what}: tensors on {kind} are not supported by the denseccl backend (cpu and cuda are)")

    def _live_host(self) -> Communicator:
        """The host communicator; every group has one until :meth:`shutdown`."""
        if self._host is None:
            raise DenseCCLError("this process group has been shut down")
        return self._host

    def _device_communicator(self, device: torch.device) -> Communicator:
        """The NCCL communicator, created on the first CUDA collective (a collective step:
        every rank gets here at the same call), bootstrapped over MPI or torch's store."""
        if self._device is None:
            index = device.index if device.index is not None else torch.cuda.current_device()
            if self._mpi_group is not None:
                where = {"comm": self._mpi_group}
            else:
                where = {"store": self._store, "rank": self._group_rank, "size": self._group_size}
            try:
                with cuda_context(device):
                    self._device = denseccl_init(backend="nccl", device=index, timeout=self._seconds or 0, **where)
            except DenseCCLError:
                raise
            except Exception as error:
                raise DenseCCLError(
                    "denseccl: could not create the NCCL communicator for CUDA tensors "
                    f"({type(error).__name__}: {error}); it needs CuPy with NCCL: {install_hint()}"
                ) from error
        return self._device

    @contextlib.contextmanager
    def _arguments(self, what: str, *given: Any) -> Iterator[None]:
        """Where a call reads torch's arguments (options, op, tensors, their device): a failure
        there is raised on every rank, through the agreement step the peers' call takes first
        (on the communicator of the tensors' device, else the host's), so that no peer waits
        and no peer's call pairs with this rank's next one. Must cover only steps before the
        call's first agreement."""
        try:
            yield
        except Exception as error:
            comm = self._device if self._device is not None and _any_cuda(given) else self._host
            if comm is None:
                raise
            comm.flow.fail(what, error)

    # -- running -----------------------------------------------------------------------------

    def _run(
        self,
        name: str,
        opts: Any,
        device: torch.device,
        issue: Issue,
        *,
        source_rank: Optional[Callable[[], int]] = None,
        on_failure: Optional[Callable[[BaseException], None]] = None,
    ) -> dist.Work:
        """Start the operation ``issue``; a synchronous caller (``opts.asyncOp`` false) gets a
        completed Work, the others an :class:`AsyncWork` (see :mod:`.progress`). ``on_failure``:
        see :class:`.progress.Operation`."""
        with cuda_context(device):
            steps, finish = issue()
        operation = Operation(name, steps, finish, new_future(device), deadline_after(self._seconds),
                              on_failure=on_failure)
        if not getattr(opts, "asyncOp", True) and source_rank is None:
            try:
                for step in steps:
                    step.wait()
                return completed_work(finish(), device)
            except BaseException as error:
                failed(operation, error)
                raise
        with cuda_context(device):  # a stream-ordered completion records on the device's current stream
            self._progress.launch(operation, device)
        return AsyncWork(self._progress, operation, source_rank)

    # -- identity ----------------------------------------------------------------------------

    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        return BACKEND_NAME

    name = getBackendName

    # a ProcessGroup without C++ backends keeps its name and description here (torch's base
    # class reads them from its backends)
    def getGroupName(self) -> str:  # noqa: N802
        return self._names.get("name", "")

    def setGroupName(self, name: str) -> None:  # noqa: N802
        self._names["name"] = name

    def getGroupDesc(self) -> str:  # noqa: N802
        return self._names.get("desc", "")

    def setGroupDesc(self, desc: str) -> None:  # noqa: N802
        self._names["desc"] = desc

    @property
    def host_communicator(self) -> Optional[Communicator]:
        """The denseccl communicator that moves CPU tensors (MPI or the gloo engine)."""
        return self._host

    # -- elementwise collectives -------------------------------------------------------------

    def _per_tensor(
        self, what: str, tensors: Any, opts: Any, kind: Any, read: Callable[[Any], Tuple[Any, ...]]
    ) -> dist.Work:
        """``comm.<what>(t, *read(opts))`` for each tensor. ``read`` takes the collective's op
        and root from the options: a bad one fails on every rank, as any argument does."""
        with self._arguments(what, tensors):
            opts = options(opts, kind)
            tensors = as_list(tensors)
            collective = getattr(self._communicator(tensors, what), what)
            args = read(opts)

        # a synchronous call on CPU tensors runs its collectives synchronously, so that a
        # repeated geometry runs its prepared call (flow.py)
        now = not getattr(opts, "asyncOp", True) and all(t.device.type == "cpu" for t in tensors)

        def issue() -> Tuple[List[Any], Callable[[], Any]]:
            if now:
                for t in tensors:
                    collective(t, *args, async_op=False)
                return [], lambda: tensors
            works = start_each([partial(collective, t, *args, async_op=True) for t in tensors])
            return works, lambda: tensors

        return self._run(what, opts, tensors[0].device, issue)

    def allreduce(self, tensors: Any, opts: Any = None) -> dist.Work:
        return self._per_tensor("allreduce", tensors, opts, _c10d.AllreduceOptions, lambda o: (as_op(o.reduceOp),))

    def allreduce_coalesced(self, tensors: Any, opts: Any = None) -> dist.Work:
        """One agreement on every tensor's layout, then one allreduce per (device, dtype) flat
        bucket of spans, covered by that agreement; the results are copied back run by run."""
        with self._arguments("allreduce_coalesced", tensors):
            opts = options(opts, _c10d.AllreduceCoalescedOptions)
            tensors = as_list(tensors)
            comm = self._communicator(tensors, "allreduce_coalesced")
            op = as_op(opts.reduceOp)

        def issue() -> Tuple[List[Any], Callable[[], Any]]:
            with raising_everywhere(comm, "allreduce_coalesced"):
                for i, t in enumerate(tensors):
                    if not is_dense(t):
                        raise LayoutError(not_dense_message(f"allreduce_coalesced tensor {i}", t))
                descriptor = Descriptor("allreduce_coalesced", None, str(op), composite_key(tensors))
                packed = buckets.pack(tensors)  # a rank that cannot allocate the buckets fails everywhere
            with comm.flow.covered(descriptor):
                works = start_each([partial(comm.allreduce, b.flat, op, async_op=True) for b in packed])

            def finish() -> List[torch.Tensor]:
                buckets.unpack(packed, tensors)
                return tensors

            return works, finish

        return self._run("allreduce_coalesced", opts, tensors[0].device, issue)

    def reduce(self, tensors: Any, opts: Any = None) -> dist.Work:
        return self._per_tensor("reduce", tensors, opts, _c10d.ReduceOptions, lambda o: (o.rootRank, as_op(o.reduceOp)))

    def broadcast(self, tensors: Any, opts: Any = None) -> dist.Work:
        return self._per_tensor("broadcast", tensors, opts, _c10d.BroadcastOptions, lambda o: (o.rootRank,))

    # -- barrier -----------------------------------------------------------------------------

    def barrier(self, opts: Any = None) -> dist.Work:
        """On the host communicator, which every group has (a barrier orders hosts, not streams)."""
        options(opts, _c10d.BarrierOptions)
        self._live_host().barrier()
        return completed_work([])

    # -- outside denseccl's core: all-to-all and point-to-point, on this group's engine --------

    def _engine(self, tensors: Sequence[torch.Tensor], what: str) -> all_to_all_p2p.Engine:
        """The engine on the host communicator (whose agreement step checks an all-to-all)."""
        if any(t.device.type != "cpu" for t in tensors):
            raise ArgumentError(
                f"{what} on {tensors[0].device.type} tensors is not supported by the denseccl backend: denseccl has "
                "no all-to-all or point-to-point on device; use a cpu tensor, or a second process group (nccl)"
            )
        host = self._live_host()
        host.flow.usable()  # a peer that gave up, or this rank's own failure: at once
        assert self._aux is not None  # made with the host communicator, dropped with it
        return self._aux

    def all_to_all_single(
        self,
        output: torch.Tensor,
        input: torch.Tensor,  # noqa: A002 - torch's own parameter name
        output_split_sizes: Sequence[int],
        input_split_sizes: Sequence[int],
        opts: Any = None,
    ) -> dist.Work:
        """Rows (dim 0) ``input[in_offsets[r]: ...]`` go to rank ``r`` (see :mod:`.all_to_all_p2p`)."""
        with self._arguments("all_to_all_single", output, input):
            opts = options(opts, _c10d.AllToAllOptions)
            engine = self._engine([output, input], "all_to_all_single")

        splits = list(output_split_sizes), list(input_split_sizes)
        issue = all_to_all_p2p.all_to_all_single(engine, output, input, *splits)
        return self._run("all_to_all_single", opts, input.device, issue, on_failure=engine.breaks)

    alltoall_base = all_to_all_single

    def alltoall(self, output_tensors: Any, input_tensors: Any, opts: Any = None) -> dist.Work:
        with self._arguments("alltoall", output_tensors, input_tensors):
            opts = options(opts, _c10d.AllToAllOptions)
            outputs, inputs = as_list(output_tensors), as_list(input_tensors)
            engine = self._engine(outputs + inputs, "all_to_all")

        issue = all_to_all_p2p.alltoall(engine, outputs, inputs)
        return self._run("all_to_all", opts, inputs[0].device, issue, on_failure=engine.breaks)

    def send(self, tensors: Any, dst: int, tag: int = 0) -> dist.Work:
        tensors = as_list(tensors)
        engine = self._engine(tensors, "send")
        issue = p2p.send(engine, tensors, dst, tag)
        return self._run("send", None, tensors[0].device, issue, on_failure=engine.breaks)

    def recv(self, tensors: Any, src: int, tag: int = 0) -> dist.Work:
        tensors = as_list(tensors)
        engine = self._engine(tensors, "recv")
        issue, source = p2p.recv(engine, tensors, src, tag)
        return self._run("recv", None, tensors[0].device, issue, source_rank=source, on_failure=engine.breaks)

    def recv_anysource(self, tensors: Any, tag: int = 0) -> dist.Work:
        return self.recv(tensors, -1, tag)

    # -- coalescing and lifecycle --------------------------------------------------------------

    def start_coalescing(self, device: Any = None) -> None:
        """Ops inside torch's coalescing manager run one by one (each is asynchronous)."""

    def end_coalescing(self, device: Any = None) -> dist.Work:
        return completed_work([])

    _start_coalescing = start_coalescing
    _end_coalescing = end_coalescing

    def shutdown(self) -> None:
        """Stop the progress thread and release the communicators (collective: every rank of the
        group calls it, as destroy_process_group does)."""
        finished = self._progress.stop()
        for comm in (self._host, self._device):
            if comm is not None:
                with contextlib.suppress(Exception):
                    comm.close()
        if not finished:  # a request given up on may still use them: kept, never freed
            abandon(self._mpi_group, self._aux)
        elif self._owns_mpi_group:
            from ..backends.mpi.control import free_comm  # noqa: PLC0415 - only under an MPI launch

            with contextlib.suppress(Exception):
                free_comm(self._mpi_group)
        self._host = self._device = self._aux = self._mpi_group = None

    def abort(self) -> None:
        self._progress.stop()


profiling.trace_methods(ProcessGroupDenseCCL)
profiling.enable()


def _any_cuda(given: Any) -> bool:
    """Whether a CUDA tensor is among ``given`` (tensors and lists of them, nested)."""
    if isinstance(given, (list, tuple)):
        return any(_any_cuda(item) for item in given)
    return isinstance(given, torch.Tensor) and given.device.type == "cuda"


def create_process_group(options: Any, backend_options: Any = None) -> ProcessGroupDenseCCL:
    """The creator registered with ``Backend.register_backend`` (extended API: it receives the
    global ranks of the group, so subgroups map to MPI sub-communicators)."""
    dispatcher.install(ProcessGroupDenseCCL)
    return ProcessGroupDenseCCL(
        options.store, options.group_rank, options.group_size, options.timeout, options.global_ranks_in_group or ()
    )


__all__ = ["BACKEND_NAME", "ProcessGroupDenseCCL", "create_process_group"]
