"""The ``denseccl`` backend of ``torch.distributed``: a ``ProcessGroup`` subclass whose
collectives run on each tensor's storage span, in whatever dense layout it has, after the
cross-rank agreement check.

CPU tensors move over denseccl's MPI transport (the job is launched with ``mpiexec``; the torch
rank must be the MPI rank). CUDA tensors move over its NCCL transport, created on the first CUDA
collective. ``all_to_all_single``, ``alltoall`` and ``send``/``recv`` (which denseccl's core does
not offer) run here, on an MPI communicator this group owns, for CPU tensors.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import time
from typing import Any, Callable, Iterator, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
import torch._C._distributed_c10d as _c10d

from .. import init as denseccl_init
from ..agreement import Descriptor
from ..communicator import Communicator
from ..errors import DenseCCLError, LayoutError
from ..layout import layout_key
from ..ops import OpLike, PreMulSum
from . import buckets
from ._tensors import dense_strides_like, is_dense, is_stacked, key_of, not_dense_message, staging_stack, stacked_view
from .work import AsyncWork, Operation, Progress, completed_work, new_future

BACKEND_NAME = "denseccl"

_RED = dist.ReduceOp.RedOpType
_OPS = {_RED.SUM: "sum", _RED.PRODUCT: "prod", _RED.MIN: "min", _RED.MAX: "max", _RED.AVG: "avg"}
#: Environment variables that say the process was started by an MPI launcher.
_MPI_LAUNCH_VARIABLES = ("PMI_RANK", "PMI_SIZE", "PMIX_RANK", "OMPI_COMM_WORLD_SIZE", "MPI_LOCALNRANKS")


def reduce_op(op: Any) -> OpLike:
    """torch's ReduceOp (or RedOpType) as a denseccl op; PREMUL_SUM becomes
    ``denseccl.PreMulSum(factor)``."""
    kind = op if isinstance(op, _RED) else op.op
    if kind == _RED.PREMUL_SUM:
        factor = op.factor
        if isinstance(factor, torch.Tensor):
            if factor.numel() != 1:
                raise LayoutError(f"PREMUL_SUM needs one scale factor, got a tensor of shape {tuple(factor.shape)}")
            factor = factor.item()
        return PreMulSum(float(factor))
    name = _OPS.get(kind)
    if name is None:
        raise LayoutError(f"reduce op {kind} is not supported by the denseccl backend (use SUM, PRODUCT, MIN, MAX, AVG or PREMUL_SUM)")
    return name


def launched_by_mpi() -> bool:
    """Whether an MPI launcher (mpiexec, mpirun, srun with PMI) started this process."""
    return any(name in os.environ for name in _MPI_LAUNCH_VARIABLES)


def _as_list(tensors: Any) -> List[torch.Tensor]:
    return [tensors] if isinstance(tensors, torch.Tensor) else list(tensors)


def _options(opts: Any, cls: Any, **fields: Any) -> Any:
    """torch's options object; direct Python callers may pass a ReduceOp, or nothing."""
    if isinstance(opts, cls):
        return opts
    made = cls()
    if opts is not None and hasattr(made, "reduceOp"):
        made.reduceOp = opts
    for name, value in fields.items():
        setattr(made, name, value)
    return made


def _fail_everywhere(comm: Communicator, collective: str, error: BaseException) -> None:
    """Raise ``error`` here after taking part in the agreement step as invalid, so that every
    peer raises too (a MismatchError naming this rank's problem) instead of waiting."""
    comm._fail(collective, error)


def _agree_or_fail(comm: Communicator, collective: str, check: Callable[[], Descriptor]) -> None:
    """Run ``check`` (local validation returning the descriptor to agree on) and the agreement
    step; a local failure is raised on every rank."""
    try:
        descriptor = check()
    except Exception as error:  # noqa: BLE001 - every local failure must reach the peers
        _fail_everywhere(comm, collective, error)
        raise  # unreachable: _fail raises
    comm._agree(descriptor)


class ProcessGroupDenseCCL(dist.ProcessGroup):
    """torch.distributed process group over denseccl. Created by ``init_process_group("denseccl")``
    or ``new_group(backend="denseccl")``; not meant to be built by hand."""

    def __init__(self, store: Any, rank: int, size: int, timeout: Optional[datetime.timedelta] = None, global_ranks: Sequence[int] = ()) -> None:
        super().__init__(rank, size)
        self._store = store
        self._group_rank = rank
        self._group_size = size
        self._seconds = _timeout_seconds(timeout)
        #: How many operations had to stage through a copy (dim 0 not outermost, or an output
        #: whose layout differs from the moved blocks'); the rest moved the tensors' spans.
        self.staged_operations = 0
        self._global_ranks = list(global_ranks) or list(range(size))
        self._progress = Progress(f"denseccl-rank{rank}")
        self._mpi_group: Any = None  # mpi4py communicator of this group's ranks, in group-rank order
        self._owns_mpi_group = False
        self._host: Optional[Communicator] = None
        self._aux: Any = None  # mpi4py duplicate for point-to-point and all-to-all
        self._device: Optional[Communicator] = None
        self._host_problem: Optional[str] = None
        self._names: dict = {}
        self._setup_host()

    # -- setup -------------------------------------------------------------------------------

    def _setup_host(self) -> None:
        size, rank = self._group_size, self._group_rank
        if not launched_by_mpi() and size > 1:
            self._host_problem = (
                f"the denseccl backend moves CPU tensors over MPI, but this process was not started by an MPI "
                f"launcher: launch all {size} ranks with mpiexec -n {size} (or launch/run -n {size}) and give "
                "torch the MPI rank (denseccl.torch.init_process_group() does that). CUDA tensors work without "
                "one (their NCCL communicator bootstraps over torch's store)"
            )
            return
        try:
            from mpi4py import MPI  # noqa: PLC0415
        except ImportError as error:
            if launched_by_mpi():
                raise DenseCCLError(f"denseccl: the job was started by mpiexec but mpi4py is missing ({error}): pip install 'denseccl[mpi]'") from None
            self._host_problem = f"the denseccl backend moves CPU tensors over MPI, and mpi4py is not installed ({error}): pip install 'denseccl[mpi]'"
            return
        world = MPI.COMM_WORLD
        if world.Get_size() < len(self._global_ranks) or (
            self._global_ranks == list(range(size)) and world.Get_size() != size
        ):
            raise DenseCCLError(
                f"denseccl: torch's process group has {size} ranks but MPI has {world.Get_size()}: launch with "
                f"mpiexec -n {size}, or pass world_size={world.Get_size()} to init_process_group"
            )
        mine = self._global_ranks[rank]
        if world.Get_rank() != mine:
            raise DenseCCLError(
                f"denseccl: torch rank {mine} is MPI rank {world.Get_rank()}; the two must match because CPU tensors "
                "move over MPI. Pass rank=MPI.COMM_WORLD.Get_rank() (and world_size=MPI.COMM_WORLD.Get_size()) to "
                "init_process_group, or set RANK from the launcher (PMI_RANK under mpiexec); "
                "denseccl.torch.init_process_group() does this for you"
            )
        if self._global_ranks == list(range(world.Get_size())):
            base = world
        else:
            group = world.Get_group()
            subset = group.Incl(self._global_ranks)
            base = world.Create_group(subset)
            subset.Free()
            group.Free()
            self._owns_mpi_group = True
        self._mpi_group = base
        self._host = denseccl_init(backend="mpi", comm=base, timeout=self._seconds or 0)
        self._aux = base.Dup()

    def _communicator(self, tensors: Sequence[torch.Tensor], what: str) -> Communicator:
        """The denseccl communicator for these tensors' device (all must share one type)."""
        if not tensors:
            raise LayoutError(f"{what}: no tensors given")
        kinds = {t.device.type for t in tensors}
        if len(kinds) != 1:
            raise LayoutError(f"{what}: tensors on different device types {sorted(kinds)}; pass tensors of one device type")
        kind = kinds.pop()
        if kind == "cpu":
            if self._host is None:
                raise DenseCCLError(self._host_problem or "denseccl: no MPI communicator for CPU tensors")
            return self._host
        if kind == "cuda":
            return self._device_communicator(tensors[0].device)
        raise LayoutError(f"{what}: tensors on {kind} are not supported by the denseccl backend (cpu and cuda are)")

    def _device_communicator(self, device: torch.device) -> Communicator:
        """The NCCL communicator, created on the first CUDA collective (a collective step:
        every rank gets here at the same call). It bootstraps over this group's MPI
        communicator when the job was started by mpiexec, else over torch's store."""
        if self._device is None:
            index = device.index if device.index is not None else torch.cuda.current_device()
            if self._mpi_group is not None:
                where = {"comm": self._mpi_group}
            else:
                where = {"store": self._store, "rank": self._group_rank, "size": self._group_size}
            try:
                with _cuda_context(device):
                    self._device = denseccl_init(backend="nccl", device=index, timeout=self._seconds or 0, **where)
            except DenseCCLError:
                raise
            except Exception as error:  # noqa: BLE001
                raise DenseCCLError(
                    f"denseccl: could not create the NCCL communicator for CUDA tensors ({type(error).__name__}: {error}); "
                    "it needs CuPy with NCCL: pip install 'denseccl[cuda12]'"
                ) from error
        return self._device

    # -- running -----------------------------------------------------------------------------

    def _run(self, name: str, opts: Any, device: torch.device, issue: Callable[[], Tuple[List[Any], Callable[[], Any]]], *, source_rank: Optional[Callable[[], int]] = None) -> dist.Work:
        """Start an operation: ``issue()`` starts its steps and returns them with the finish
        that produces the future's value. Synchronous callers (``opts.asyncOp`` false) get a
        completed Work; the others an :class:`AsyncWork` that the progress thread completes."""
        with _cuda_context(device):
            steps, finish = issue()
        if not getattr(opts, "asyncOp", True) and source_rank is None:
            for step in steps:
                step.wait()
            return completed_work(finish(), device)
        deadline = None if self._seconds is None else time.monotonic() + self._seconds
        operation = Operation(name, steps, finish, new_future(device), deadline)
        self._progress.submit(operation)
        return AsyncWork(self._progress, operation, source_rank)

    @staticmethod
    def _each(starts: Sequence[Callable[[], Any]]) -> List[Any]:
        """Start several collectives; if one fails, finish the ones already started (their
        peers started them too) before raising."""
        started: List[Any] = []
        try:
            for start in starts:
                started.append(start())
        except BaseException:
            for work in started:
                with contextlib.suppress(Exception):
                    work.wait()
            raise
        return started

    # -- identity ----------------------------------------------------------------------------

    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        return BACKEND_NAME

    def name(self) -> str:
        return BACKEND_NAME

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
        """The denseccl communicator that moves CPU tensors (None without an MPI launch)."""
        return self._host

    # -- elementwise collectives -------------------------------------------------------------

    def allreduce(self, tensors: Any, opts: Any = None) -> dist.Work:
        opts = _options(opts, _c10d.AllreduceOptions)
        tensors = _as_list(tensors)
        comm = self._communicator(tensors, "allreduce")
        op = reduce_op(opts.reduceOp)

        def issue() -> Tuple[List[Any], Callable[[], Any]]:
            works = self._each([lambda t=t: comm.allreduce(t, op, async_op=True) for t in tensors])
            return works, lambda: tensors

        return self._run("allreduce", opts, tensors[0].device, issue)

    def allreduce_coalesced(self, tensors: Any, opts: Any = None) -> dist.Work:
        """One agreement on every tensor's layout, then one allreduce per (device, dtype) flat
        bucket of spans; the results are copied back run by run."""
        opts = _options(opts, _c10d.AllreduceCoalescedOptions)
        tensors = _as_list(tensors)
        comm = self._communicator(tensors, "allreduce_coalesced")
        op = reduce_op(opts.reduceOp)

        def check() -> Descriptor:
            for i, t in enumerate(tensors):
                if not is_dense(t):
                    raise LayoutError(not_dense_message(f"allreduce_coalesced tensor {i}", t))
            return Descriptor("allreduce_coalesced", None, str(op), _composite_key(tensors))

        def issue() -> Tuple[List[Any], Callable[[], Any]]:
            _agree_or_fail(comm, "allreduce_coalesced", check)
            packed = buckets.pack(tensors)
            works = self._each([lambda b=b: comm.allreduce(b.flat, op, async_op=True) for b in packed])

            def finish() -> List[torch.Tensor]:
                buckets.unpack(packed, tensors)
                return tensors

            return works, finish

        return self._run("allreduce_coalesced", opts, tensors[0].device, issue)

    def reduce(self, tensors: Any, opts: Any = None) -> dist.Work:
        opts = _options(opts, _c10d.ReduceOptions)
        tensors = _as_list(tensors)
        comm = self._communicator(tensors, "reduce")
        op = reduce_op(opts.reduceOp)
        root = opts.rootRank

        def issue() -> Tuple[List[Any], Callable[[], Any]]:
            works = self._each([lambda t=t: comm.reduce(t, root, op, async_op=True) for t in tensors])
            return works, lambda: tensors

        return self._run("reduce", opts, tensors[0].device, issue)

    def broadcast(self, tensors: Any, opts: Any = None) -> dist.Work:
        opts = _options(opts, _c10d.BroadcastOptions)
        tensors = _as_list(tensors)
        comm = self._communicator(tensors, "broadcast")
        root = opts.rootRank

        def issue() -> Tuple[List[Any], Callable[[], Any]]:
            works = self._each([lambda t=t: comm.broadcast(t, root, async_op=True) for t in tensors])
            return works, lambda: tensors

        return self._run("broadcast", opts, tensors[0].device, issue)

    # -- allgather ---------------------------------------------------------------------------

    def allgather(self, output_tensors: Any, input_tensors: Any, opts: Any = None) -> dist.Work:
        """``output_tensors[i][r]`` gets rank ``r``'s ``input_tensors[i]``, in its own layout:
        denseccl gathers into a stacked buffer with the input's layout, then each output is
        copied from its block."""
        opts = _options(opts, _c10d.AllgatherOptions)
        inputs = _as_list(input_tensors)
        outputs = [list(group) for group in output_tensors]
        comm = self._communicator(inputs, "allgather")

        def issue() -> Tuple[List[Any], Callable[[], Any]]:
            try:
                if len(outputs) != len(inputs):
                    raise LayoutError(f"allgather: {len(outputs)} output lists for {len(inputs)} inputs")
                for inp, outs in zip(inputs, outputs):
                    _check_gather_list(inp, outs, self._group_size, "allgather")
            except Exception as error:  # noqa: BLE001
                _fail_everywhere(comm, "allgather", error)
            works = self._each([lambda t=t: comm.allgather(t, async_op=True) for t in inputs])

            def finish() -> List[List[torch.Tensor]]:
                for work, outs in zip(works, outputs):
                    stacked = work.result
                    for r, out in enumerate(outs):
                        out.copy_(stacked[r])
                return outputs

            return works, finish

        return self._run("allgather", opts, inputs[0].device, issue)

    def allgather_coalesced(self, output_lists: Any, input_tensors: Any, opts: Any = None) -> dist.Work:
        """``output_lists[r][i]`` gets rank ``r``'s ``input_tensors[i]``."""
        opts = _options(opts, _c10d.AllgatherOptions)
        inputs = _as_list(input_tensors)
        per_rank = [list(outs) for outs in output_lists]
        comm = self._communicator(inputs, "allgather_coalesced")

        def issue() -> Tuple[List[Any], Callable[[], Any]]:
            try:
                if len(per_rank) != self._group_size or any(len(outs) != len(inputs) for outs in per_rank):
                    raise LayoutError(
                        f"allgather_coalesced: output_lists must hold {self._group_size} lists (one per rank) of "
                        f"{len(inputs)} tensors"
                    )
                for i, inp in enumerate(inputs):
                    _check_gather_list(inp, [outs[i] for outs in per_rank], self._group_size, "allgather_coalesced")
            except Exception as error:  # noqa: BLE001
                _fail_everywhere(comm, "allgather_coalesced", error)
            works = self._each([lambda t=t: comm.allgather(t, async_op=True) for t in inputs])

            def finish() -> List[List[torch.Tensor]]:
                for i, work in enumerate(works):
                    for r in range(self._group_size):
                        per_rank[r][i].copy_(work.result[r])
                return per_rank

            return works, finish

        return self._run("allgather_coalesced", opts, inputs[0].device, issue)

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> dist.Work:  # noqa: A002
        """``all_gather_into_tensor``: ``output`` is ``(size * d0, ...)`` (blocks concatenated
        along dim 0) or ``(size, d0, ...)``. When dim 0 is outermost in ``output``'s memory and
        its blocks have the input's layout, denseccl gathers straight into it; otherwise it
        gathers into a stacked buffer and copies (staging)."""
        opts = _options(opts, _c10d.AllgatherOptions)
        comm = self._communicator([output, input], "all_gather_into_tensor")
        return self._run("all_gather_into_tensor", opts, input.device, self._gather_single(comm, output, input))

    _allgather_base = all_gather_single

    def _gather_single(self, comm: Communicator, output: torch.Tensor, inp: torch.Tensor) -> Callable[[], Tuple[List[Any], Callable[[], Any]]]:
        size = self._group_size

        def issue() -> Tuple[List[Any], Callable[[], Any]]:
            try:
                if output.dtype != inp.dtype:
                    raise LayoutError(f"all_gather_into_tensor: output dtype {output.dtype} differs from input dtype {inp.dtype}")
                view = stacked_view(output, tuple(inp.shape), size, "all_gather_into_tensor output")
            except Exception as error:  # noqa: BLE001
                _fail_everywhere(comm, "allgather", error)
            direct = is_stacked(view, size) and _block_key(view) == key_of(inp)
            if direct:
                return [comm.allgather(inp, out=view, async_op=True)], lambda: [output]
            work = comm.allgather(inp, async_op=True)
            self.staged_operations += 1

            def finish() -> List[torch.Tensor]:
                view.copy_(work.result)
                return [output]

            return [work], finish

        return issue

    def all_gather_single_coalesced(self, outputs: Any, inputs: Any, opts: Any = None) -> dist.Work:
        opts = _options(opts, _c10d.AllgatherOptions)
        outputs, inputs = _as_list(outputs), _as_list(inputs)
        comm = self._communicator(inputs, "all_gather_into_tensor_coalesced")
        if len(outputs) != len(inputs):
            _fail_everywhere(comm, "allgather", LayoutError(f"{len(outputs)} outputs for {len(inputs)} inputs"))
        issues = [self._gather_single(comm, o, i) for o, i in zip(outputs, inputs)]
        return self._run("all_gather_into_tensor_coalesced", opts, inputs[0].device, _chain(issues, outputs))

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    # -- reduce-scatter ----------------------------------------------------------------------

    def reduce_scatter(self, output_tensors: Any, input_lists: Any, opts: Any = None) -> dist.Work:
        """``output_tensors[i]`` gets the reduction of every rank's ``input_lists[i][rank]``.
        The inputs are stacked (copied) into a buffer whose blocks have the output's layout, so
        the result lands in the output directly."""
        opts = _options(opts, _c10d.ReduceScatterOptions)
        outputs = _as_list(output_tensors)
        lists = [list(group) for group in input_lists]
        comm = self._communicator(outputs, "reduce_scatter")
        op = reduce_op(opts.reduceOp)
        size = self._group_size

        def issue() -> Tuple[List[Any], Callable[[], Any]]:
            stacks = []
            try:
                if len(lists) != len(outputs):
                    raise LayoutError(f"reduce_scatter: {len(lists)} input lists for {len(outputs)} outputs")
                for out, ins in zip(outputs, lists):
                    _check_gather_list(out, ins, size, "reduce_scatter", inputs_word="input_list")
                    stack = _stack_like(out, size)
                    for r, piece in enumerate(ins):
                        stack[r].copy_(piece)
                    stacks.append(stack)
            except Exception as error:  # noqa: BLE001
                _fail_everywhere(comm, "reduce_scatter", error)
            starts = []
            for out, stack in zip(outputs, stacks):
                direct = is_dense(out)
                starts.append(lambda out=out, stack=stack, direct=direct: comm.reduce_scatter(stack, op, out=out if direct else None, async_op=True))
            works = self._each(starts)

            def finish() -> List[torch.Tensor]:
                for out, work in zip(outputs, works):
                    if work.result is not out:
                        out.copy_(work.result)
                return outputs

            return works, finish

        return self._run("reduce_scatter", opts, outputs[0].device, issue)

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> dist.Work:  # noqa: A002
        """``reduce_scatter_tensor``: ``input`` is ``(size * d0, ...)`` or ``(size, d0, ...)``.
        When dim 0 is outermost in the input's memory its blocks are spans and denseccl reduces
        it in place of a stacked buffer; otherwise the input is staged (copied) into one."""
        opts = _options(opts, _c10d.ReduceScatterOptions)
        comm = self._communicator([output, input], "reduce_scatter_tensor")
        op = reduce_op(opts.reduceOp)
        return self._run("reduce_scatter_tensor", opts, input.device, self._scatter_single(comm, output, input, op))

    _reduce_scatter_base = reduce_scatter_single

    def _scatter_single(self, comm: Communicator, output: torch.Tensor, inp: torch.Tensor, op: OpLike) -> Callable[[], Tuple[List[Any], Callable[[], Any]]]:
        size = self._group_size

        def issue() -> Tuple[List[Any], Callable[[], Any]]:
            try:
                if output.dtype != inp.dtype:
                    raise LayoutError(f"reduce_scatter_tensor: output dtype {output.dtype} differs from input dtype {inp.dtype}")
                if not is_dense(inp):
                    raise LayoutError(not_dense_message("reduce_scatter_tensor input", inp))
                view = stacked_view(inp, tuple(output.shape), size, "reduce_scatter_tensor input")
                staged = not is_stacked(view, size)
                if staged:
                    stack = staging_stack(view, size)
                    stack.copy_(view)
                else:
                    stack = view
            except Exception as error:  # noqa: BLE001
                _fail_everywhere(comm, "reduce_scatter", error)
            direct = _block_key(stack) == key_of(output) and not _overlap(output, stack)
            self.staged_operations += int(staged or not direct)
            work = comm.reduce_scatter(stack, op, out=output if direct else None, async_op=True)
            if direct:
                return [work], lambda: [output]

            def finish() -> List[torch.Tensor]:
                output.copy_(work.result)
                return [output]

            return [work], finish

        return issue

    def reduce_scatter_single_coalesced(self, outputs: Any, inputs: Any, opts: Any = None) -> dist.Work:
        opts = _options(opts, _c10d.ReduceScatterOptions)
        outputs, inputs = _as_list(outputs), _as_list(inputs)
        comm = self._communicator(inputs, "reduce_scatter_tensor_coalesced")
        op = reduce_op(opts.reduceOp)
        if len(outputs) != len(inputs):
            _fail_everywhere(comm, "reduce_scatter", LayoutError(f"{len(outputs)} outputs for {len(inputs)} inputs"))
        issues = [self._scatter_single(comm, o, i, op) for o, i in zip(outputs, inputs)]
        return self._run("reduce_scatter_tensor_coalesced", opts, inputs[0].device, _chain(issues, outputs))

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    # -- barrier -----------------------------------------------------------------------------

    def barrier(self, opts: Any = None) -> dist.Work:
        opts = _options(opts, _c10d.BarrierOptions)
        if self._host is not None:
            comm = self._host
        else:
            device = getattr(opts, "device", None) or torch.device("cuda", torch.cuda.current_device())
            comm = self._device_communicator(device)
        comm.barrier()
        return completed_work([])

    # -- outside denseccl's core: all-to-all and point-to-point, on this group's MPI duplicate --

    def _aux_comm(self, tensors: Sequence[torch.Tensor], what: str) -> Any:
        if any(t.device.type != "cpu" for t in tensors):
            raise LayoutError(
                f"{what} on {tensors[0].device.type} tensors is not supported by the denseccl backend: denseccl has "
                "no all-to-all or point-to-point on device; use a cpu tensor, or a second process group (nccl)"
            )
        if self._aux is None:
            raise DenseCCLError(self._host_problem or f"denseccl: no MPI communicator for {what}")
        return self._aux

    def all_to_all_single(self, output: torch.Tensor, input: torch.Tensor, output_split_sizes: Sequence[int], input_split_sizes: Sequence[int], opts: Any = None) -> dist.Work:  # noqa: A002
        """Rows (dim 0) ``input[in_offsets[r]: ...]`` go to rank ``r``. Runs row-major: a tensor
        that is not row-major is staged through a contiguous copy."""
        opts = _options(opts, _c10d.AllToAllOptions)
        mpi = self._aux_comm([output, input], "all_to_all_single")
        from . import _extras  # noqa: PLC0415

        issue = _extras.all_to_all_single(self, mpi, output, input, list(output_split_sizes), list(input_split_sizes))
        return self._run("all_to_all_single", opts, input.device, issue)

    alltoall_base = all_to_all_single

    def alltoall(self, output_tensors: Any, input_tensors: Any, opts: Any = None) -> dist.Work:
        opts = _options(opts, _c10d.AllToAllOptions)
        outputs, inputs = _as_list(output_tensors), _as_list(input_tensors)
        mpi = self._aux_comm(outputs + inputs, "all_to_all")
        from . import _extras  # noqa: PLC0415

        issue = _extras.alltoall(self, mpi, outputs, inputs)
        return self._run("all_to_all", opts, inputs[0].device, issue)

    def send(self, tensors: Any, dst: int, tag: int = 0) -> dist.Work:
        tensors = _as_list(tensors)
        mpi = self._aux_comm(tensors, "send")
        from . import _extras  # noqa: PLC0415

        return self._run("send", None, tensors[0].device, _extras.send(mpi, tensors, dst, tag))

    def recv(self, tensors: Any, src: int, tag: int = 0) -> dist.Work:
        tensors = _as_list(tensors)
        mpi = self._aux_comm(tensors, "recv")
        from . import _extras  # noqa: PLC0415

        issue, source = _extras.recv(mpi, tensors, src, tag)
        return self._run("recv", None, tensors[0].device, issue, source_rank=source)

    def recv_anysource(self, tensors: Any, tag: int = 0) -> dist.Work:
        return self.recv(tensors, -1, tag)

    # -- gather / scatter (via allgather / broadcast: every rank moves the whole data) -------

    def gather(self, output_tensors: Any, input_tensors: Any, opts: Any = None) -> dist.Work:
        opts = _options(opts, _c10d.GatherOptions)
        inputs = _as_list(input_tensors)
        comm = self._communicator(inputs, "gather")
        root = opts.rootRank
        outs = list(output_tensors[0]) if self._group_rank == root and len(output_tensors) else []

        def issue() -> Tuple[List[Any], Callable[[], Any]]:
            try:
                if len(inputs) != 1:
                    raise LayoutError(f"gather takes one input tensor, got {len(inputs)}")
                if self._group_rank == root:
                    _check_gather_list(inputs[0], outs, self._group_size, "gather")
            except Exception as error:  # noqa: BLE001
                _fail_everywhere(comm, "allgather", error)
            work = comm.allgather(inputs[0], async_op=True)

            def finish() -> List[List[torch.Tensor]]:
                for r, out in enumerate(outs):
                    out.copy_(work.result[r])
                return [outs]

            return [work], finish

        return self._run("gather", opts, inputs[0].device, issue)

    def scatter(self, output_tensors: Any, input_tensors: Any, opts: Any = None) -> dist.Work:
        opts = _options(opts, _c10d.ScatterOptions)
        outputs = _as_list(output_tensors)
        comm = self._communicator(outputs, "scatter")
        root = opts.rootRank
        size = self._group_size
        out = outputs[0]
        stack = _stack_like(out, size)

        def issue() -> Tuple[List[Any], Callable[[], Any]]:
            try:
                if self._group_rank == root:
                    pieces = list(input_tensors[0]) if len(input_tensors) else []
                    _check_gather_list(out, pieces, size, "scatter", inputs_word="scatter_list")
                    for r, piece in enumerate(pieces):
                        stack[r].copy_(piece)
            except Exception as error:  # noqa: BLE001
                _fail_everywhere(comm, "broadcast", error)
            work = comm.broadcast(stack, root, async_op=True)

            def finish() -> List[torch.Tensor]:
                out.copy_(stack[self._group_rank])
                return [out]

            return [work], finish

        return self._run("scatter", opts, out.device, issue)

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
        self._progress.stop()
        for comm in (self._host, self._device):
            if comm is not None:
                with contextlib.suppress(Exception):
                    comm.close()
        self._host = self._device = None
        if self._mpi_group is not None:
            from mpi4py import MPI  # noqa: PLC0415

            if not MPI.Is_finalized():
                for mpi in (self._aux, self._mpi_group if self._owns_mpi_group else None):
                    if mpi is not None and mpi != MPI.COMM_NULL:
                        with contextlib.suppress(Exception):
                            mpi.Free()
        self._aux = self._mpi_group = None
        self._host_problem = "this process group has been shut down"

    def abort(self) -> None:
        self._progress.stop()


def _timeout_seconds(timeout: Optional[datetime.timedelta]) -> Optional[float]:
    """torch's timeout, unless DENSECCL_TIMEOUT (seconds, 0 for none) overrides it."""
    raw = os.environ.get("DENSECCL_TIMEOUT")
    if raw is not None:
        try:
            seconds = float(raw)
        except ValueError:
            raise DenseCCLError(f"DENSECCL_TIMEOUT must be a number of seconds, got {raw!r}") from None
        return seconds if seconds > 0 else None
    return timeout.total_seconds() if timeout else None


def _chain(issues: Sequence[Callable[[], Tuple[List[Any], Callable[[], Any]]]], outputs: List[torch.Tensor]) -> Callable[[], Tuple[List[Any], Callable[[], Any]]]:
    """Several single-tensor issues as one operation."""

    def issue() -> Tuple[List[Any], Callable[[], Any]]:
        steps: List[Any] = []
        finishes: List[Callable[[], Any]] = []
        try:
            for one in issues:
                more, finish = one()
                steps.extend(more)
                finishes.append(finish)
        except BaseException:
            for step in steps:
                with contextlib.suppress(Exception):
                    step.wait()
            raise

        def finish() -> List[torch.Tensor]:
            for one in finishes:
                one()
            return outputs

        return steps, finish

    return issue


def _stack_like(block: torch.Tensor, size: int) -> torch.Tensor:
    """An empty stacked buffer ``(size, *block.shape)`` whose blocks have ``block``'s dense
    layout."""
    strides = dense_strides_like(block)
    return torch.empty_strided((size, *block.shape), (block.numel(), *strides), dtype=block.dtype, device=block.device)


def _overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two dense tensors' spans share memory."""
    if a.numel() == 0 or b.numel() == 0 or a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr():
        return False
    a0, b0 = a.storage_offset() * a.element_size(), b.storage_offset() * b.element_size()
    return a0 < b0 + b.numel() * b.element_size() and b0 < a0 + a.numel() * a.element_size()


def _block_key(stack: torch.Tensor) -> tuple:
    """The layout key of one block ``stack[r]`` of a stacked view."""
    return layout_key(str(stack.dtype).rpartition(".")[2], tuple(stack.shape[1:]), stack.stride()[1:])


def _composite_key(tensors: Sequence[torch.Tensor]) -> tuple:
    """One layout key standing for several tensors (dtypes, shapes and strides of each)."""
    keys = [key_of(t) for t in tensors]
    return ("+".join(k[0] for k in keys), tuple(k[1] for k in keys), tuple(k[2] for k in keys))


def _check_gather_list(one: torch.Tensor, many: Sequence[torch.Tensor], size: int, what: str, *, inputs_word: str = "output list") -> None:
    if len(many) != size:
        raise LayoutError(f"{what}: the {inputs_word} has {len(many)} tensors; it needs one per rank ({size})")
    for r, t in enumerate(many):
        if tuple(t.shape) != tuple(one.shape) or t.dtype != one.dtype:
            raise LayoutError(
                f"{what}: tensor {r} of the {inputs_word} is {t.dtype} of shape {tuple(t.shape)}, but must match "
                f"{one.dtype} of shape {tuple(one.shape)}"
            )
        if t.device != one.device:
            raise LayoutError(f"{what}: tensor {r} of the {inputs_word} is on {t.device}, not {one.device}")


@contextlib.contextmanager
def _cuda_context(device: Optional[torch.device]) -> Iterator[None]:
    """For CUDA tensors, make their device current (denseccl runs a torch tensor's device
    collective on torch's current stream of that device)."""
    if device is None or device.type != "cuda":
        yield
        return
    with torch.cuda.device(device):
        yield


def create_process_group(options: Any, backend_options: Any = None) -> ProcessGroupDenseCCL:
    """The creator registered with ``Backend.register_backend`` (extended API: it receives the
    global ranks of the group, so subgroups map to MPI sub-communicators)."""
    return ProcessGroupDenseCCL(
        options.store,
        options.group_rank,
        options.group_size,
        options.timeout,
        list(options.global_ranks_in_group or ()),
    )


__all__ = ["BACKEND_NAME", "ProcessGroupDenseCCL", "create_process_group", "launched_by_mpi", "reduce_op"]
