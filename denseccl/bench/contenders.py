"""The contenders measured side by side on the host (``--backend mpi``).

* ``denseccl`` / ``denseccl-nocheck``: denseccl on the array as it is (any layout), with the
  cross-rank agreement check on / off; ``...-recorder``: with the flight recorder
  (``--recorder off,on`` measures what it costs).
* ``mpi4py``: raw mpi4py on a contiguous array of the same size (the floor; contiguous rows only).
* ``naive``: what one does without denseccl for a non-contiguous array: copy it to a contiguous
  one, call mpi4py, copy the result back (non-contiguous rows only).
* ``gloo``: torch.distributed's gloo on torch tensors with the same layout.
* ``denseccl-torch``: torch.distributed with denseccl's backend (``import denseccl.torch``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Sequence

import numpy as np

from . import cases
from .cases import Case
from .job import Job
from .libs import NumpyLib, TorchLib, Unsupported


@dataclass
class Run:
    """One contender's buffers for one case: ``step`` runs the collective once on them."""

    lib: Any
    step: Callable[[], Any]
    source: Any
    output: Any
    #: whether a non-root rank's input must be unchanged after reduce (checked if so)
    keep_non_root: bool = True

    def load(self, values: Optional[np.ndarray]) -> None:
        """Fill the input with ``values`` (logical order), or zeros for timing."""
        if values is None:
            self.lib.fill_zero(self.source)
        else:
            self.lib.assign(self.source, values)

    def result(self) -> np.ndarray:
        return self.lib.to_numpy(self.output)

    def sync(self) -> None:
        self.lib.synchronize()


class Contender:
    name = "?"
    #: rows of the denseccl family decide the benchmark's exit status
    denseccl = False

    def __init__(self, job: Job) -> None:
        self.job = job

    def skip(self, case: Case) -> Optional[str]:
        """Why this contender has no row for ``case`` (None: it has one)."""
        return None

    def prepare(self, case: Case, arena: Optional[cases.Arena] = None) -> Run:
        raise NotImplementedError


class Denseccl(Contender):
    denseccl = True

    def __init__(self, job: Job, check: bool, recorder: bool = False) -> None:
        super().__init__(job)
        self.check = check
        self.recorder = recorder
        self.name = ("denseccl" if check else "denseccl-nocheck") + ("-recorder" if recorder else "")

    def lib(self, dtype: str) -> Any:
        """NumPy arrays; for bfloat16 without ml_dtypes, CPU torch tensors."""
        if dtype == "bfloat16":
            try:
                NumpyLib().dtype(dtype)
            except Unsupported:
                return TorchLib("cpu")
        return NumpyLib()

    def prepare(self, case: Case, arena: Optional[cases.Arena] = None) -> Run:
        comm = self.job.denseccl(self.check, self.recorder)
        lib = self.lib(case.dtype)
        x, out = cases.buffers(lib, case, case.layout, arena)
        op, root = case.op, case.root
        steps = {
            "allreduce": lambda: comm.allreduce(x, op),
            "reduce": lambda: comm.reduce(x, root, op),
            "broadcast": lambda: comm.broadcast(x, root),
            "allgather": lambda: comm.allgather(x, out=out),
            "reduce_scatter": lambda: comm.reduce_scatter(x, op, out=out),
        }
        return Run(lib, steps[case.collective], x, out)


class RawContender(Contender):
    """A library called directly on contiguous arrays; with ``naive`` (the row "naive") the arrays
    have the case's layout and each call copies to contiguous and back, allocating as a user
    would: the path denseccl replaces."""

    #: the library as the skip reasons name it, and why it has no bfloat16 rows
    library = "?"
    no_bfloat16 = "?"
    #: :attr:`Run.keep_non_root` of the library's reduce
    keep_non_root = True
    #: the class of the library's arrays (libs.NumpyLib, libs.CupyLib)
    array_lib: Any = None

    def __init__(self, job: Job, naive: bool = False) -> None:
        super().__init__(job)
        self.naive = naive
        if naive:
            self.name = "naive"

    def skip(self, case: Case) -> Optional[str]:
        if self.naive and case.layout == "contiguous":
            return f"the naive copy path equals raw {self.library} on contiguous arrays"
        if not self.naive and case.layout != "contiguous":
            return f"raw {self.library} runs on contiguous arrays only (see the contiguous rows)"
        if case.dtype == "bfloat16":
            return self.no_bfloat16
        return None

    def call(self, case: Case) -> Callable[[Any, Any], None]:
        """The library's collective on (contiguous input, contiguous output), the same array for
        the collectives that run in place."""
        raise NotImplementedError

    def prepare(self, case: Case, arena: Optional[cases.Arena] = None) -> Run:
        lib = self.array_lib()
        x, out = cases.buffers(lib, case, case.layout if self.naive else "contiguous", arena)
        call = self.call(case)
        if not self.naive:
            return Run(lib, functools.partial(call, x, out), x, out, self.keep_non_root)
        on_root = self.job.rank == case.root
        copy_back = {"reduce": on_root, "broadcast": not on_root}.get(case.collective, True)
        xp = lib.xp

        def copy_path() -> None:
            source = xp.ascontiguousarray(x)
            target = source if out is x else xp.empty(out.shape, out.dtype)
            call(source, target)
            if copy_back:
                out[...] = target

        return Run(lib, copy_path, x, out, self.keep_non_root)


class RawMPI(RawContender):
    """mpi4py on NumPy arrays (MPICH reduces float16 natively; no bfloat16)."""

    name = "mpi4py"
    library = "mpi4py"
    no_bfloat16 = "MPI has no bfloat16"
    array_lib = NumpyLib

    def call(self, case: Case) -> Callable[[Any, Any], None]:
        world, root, n, mpi = self.job.world, case.root, case.nranks, self.job.MPI
        op = {"sum": mpi.SUM, "avg": mpi.SUM, "prod": mpi.PROD, "min": mpi.MIN, "max": mpi.MAX, None: None}[case.op]
        in_place = mpi.IN_PLACE
        on_root = self.job.rank == root
        calls = {
            "allreduce": lambda s, t: world.Allreduce(in_place, t, op),
            "reduce": lambda s, t: world.Reduce(in_place, t, op, root) if on_root else world.Reduce(s, None, op, root),
            "broadcast": lambda s, t: world.Bcast(t, root),
            "allgather": lambda s, t: world.Allgather(s, t),
            "reduce_scatter": lambda s, t: world.Reduce_scatter_block(s, t, op),
        }
        call = calls[case.collective]
        if case.op != "avg" or (case.collective == "reduce" and not on_root):
            return call

        def then_divide(source: np.ndarray, target: np.ndarray) -> None:
            """What a user of raw MPI does for avg: sum, then divide (integers truncate)."""
            call(source, target)
            if target.dtype.kind == "f":
                target /= n
            else:
                target[...] = np.trunc(target / n)

        return then_divide


#: the rows of torch.distributed, and the backend each runs on
TORCH_ROWS = {"gloo": "gloo", "torch-nccl": "nccl", "denseccl-torch": "denseccl"}


class TorchDistributed(Contender):
    """torch.distributed collectives on torch tensors of the case's layout."""

    def __init__(self, job: Job, row: str, device: str = "cpu") -> None:
        super().__init__(job)
        self.name = row
        self.backend = TORCH_ROWS[row]
        self.device = device
        self.denseccl = self.backend == "denseccl"

    def skip(self, case: Case) -> Optional[str]:
        if case.layout == "reversed":
            return "torch tensors cannot have negative strides"
        return None

    def prepare(self, case: Case, arena: Optional[cases.Arena] = None) -> Run:
        import torch.distributed as dist  # noqa: PLC0415

        from ..torch.single_tensor import all_gather_single, reduce_scatter_single  # noqa: PLC0415

        group = self.job.torch_group(self.backend)
        lib = TorchLib(self.device if self.device == "cpu" else f"cuda:{self.job.local_rank % _cuda_count()}")
        c, root = case.collective, case.root
        ops = {"sum": dist.ReduceOp.SUM, "prod": dist.ReduceOp.PRODUCT, "min": dist.ReduceOp.MIN,
               "max": dist.ReduceOp.MAX, "avg": dist.ReduceOp.AVG}
        op = ops.get(case.op)  # type: ignore[arg-type]
        x, out = cases.buffers(lib, case, case.layout, arena)
        stacked = {"allgather": out, "reduce_scatter": x}.get(c)
        flat = None if stacked is None else _merge_dim0(stacked)
        steps = {
            "allreduce": lambda: dist.all_reduce(x, op=op, group=group),
            "reduce": lambda: dist.reduce(x, dst=root, op=op, group=group),
            "broadcast": lambda: dist.broadcast(x, src=root, group=group),
            "allgather": lambda: all_gather_single(flat, x, group=group),
            "reduce_scatter": lambda: reduce_scatter_single(out, flat, op=op, group=group),
        }
        if stacked is not None and flat is None:  # blocks that are not one tensor: the list forms
            blocks = list(stacked.unbind(0))
            steps["allgather"] = lambda: dist.all_gather(blocks, x, group=group)
            steps["reduce_scatter"] = lambda: dist.reduce_scatter(out, blocks, op=op, group=group)
        return Run(lib, steps[c], x, out, keep_non_root=self.denseccl)


def _merge_dim0(stacked: Any) -> Any:
    """The stacked buffer ``(n, N, ...)`` as the dim-0 concatenation ``(n*N, ...)`` torch's
    ``*_tensor`` collectives want, when that is a view (N outermost in a block); else None."""
    shape = tuple(stacked.shape)
    try:
        return stacked.view(shape[0] * shape[1], *shape[2:])
    except RuntimeError:
        return None


def _cuda_count() -> int:
    import torch  # noqa: PLC0415

    return max(torch.cuda.device_count(), 1)


def torch_contender(job: Job, row: str, notes: List[str], device: str = "cpu") -> List[Contender]:
    """The torch.distributed contender of ``row`` (:data:`TORCH_ROWS`) where it can run here;
    else none, and a note saying why."""
    try:
        import torch.distributed as dist  # noqa: PLC0415

        reason = None if dist.is_available() else "torch is not installed"
    except ImportError:
        reason = "torch is not installed"
    if reason is None and row == "denseccl-torch":
        try:
            import denseccl.torch  # noqa: F401, PLC0415
        except Exception as error:  # noqa: BLE001 - any failure means: no such contender
            reason = f"{type(error).__name__}: {error}"
    if reason is None:
        return [TorchDistributed(job, row, device=device)]
    notes.append(f"{row}: not available ({reason})")
    return []


HOST_CONTENDERS = ("denseccl", "mpi4py", "naive", "gloo", "denseccl-torch")


def host_contenders(job: Job, names: Sequence[str], checks: Sequence[bool], notes: List[str],
                    recorders: Sequence[bool] = (False,)) -> List[Contender]:
    """The requested host contenders that can run here (and a note for each that cannot)."""
    found: List[Contender] = []
    for name in names:
        if name == "denseccl":
            found.extend(Denseccl(job, check, recorder) for check in checks for recorder in recorders)
        elif name in ("mpi4py", "naive"):
            found.append(RawMPI(job, naive=name == "naive"))
        elif name in ("gloo", "denseccl-torch"):
            found.extend(torch_contender(job, name, notes))
        else:
            raise ValueError(f"unknown host contender {name!r}; use {', '.join(HOST_CONTENDERS)}")
    return found
