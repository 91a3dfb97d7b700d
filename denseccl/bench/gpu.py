"""The contenders of a GPU run (``--backend nccl``), on CuPy arrays and CUDA torch tensors.

* ``denseccl`` / ``denseccl-nocheck``: denseccl's NCCL backend on the array as it is.
* ``nccl``: raw ``cupy.cuda.nccl`` on contiguous arrays (contiguous rows only).
* ``naive``: ``cupy.ascontiguousarray``, raw NCCL, copy back (non-contiguous rows only).
* ``torch-nccl``: torch.distributed's NCCL group on CUDA tensors of the same layout.
* ``cupyx``: ``cupyx.distributed`` (it accepts C- or F-contiguous arrays only).

Each rank uses GPU ``local_rank % device_count``. Every ``Run.sync`` synchronises the device
(CuPy's current stream, or torch.cuda), so a timed loop ends only when the GPU has finished.
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Sequence

from . import cases
from .cases import Case
from .contenders import Contender, Denseccl, RawContender, Run, torch_contender
from .job import Job
from .libs import CupyLib, TorchLib, Unsupported


def use_device(job: Job) -> None:
    """Bind this rank to its GPU (before any allocation)."""
    import cupy  # noqa: PLC0415

    cupy.cuda.Device(job.local_rank % max(cupy.cuda.runtime.getDeviceCount(), 1)).use()
    try:
        import torch  # noqa: PLC0415

        if torch.cuda.is_available():
            torch.cuda.set_device(job.local_rank % max(torch.cuda.device_count(), 1))
    except ImportError:
        pass


class DensecclDevice(Denseccl):
    def lib(self, dtype: str) -> Any:
        """CuPy arrays; torch CUDA tensors for bfloat16 (CuPy has none)."""
        if dtype == "bfloat16":
            import cupy  # noqa: PLC0415

            return TorchLib(f"cuda:{cupy.cuda.runtime.getDevice()}")
        return CupyLib()


def _constant(nccl: Any, key: str, what: str) -> Any:
    """NCCL's constant for a type or op name: ``NCCL_FLOAT32`` for float32, ``NCCL_SUM`` for sum."""
    value = getattr(nccl, f"NCCL_{key.upper()}", None)
    if value is None:
        raise Unsupported(f"this NCCL build has no {what} {key}")
    return value


class RawNccl(RawContender):
    name = "nccl"
    library = "NCCL"
    no_bfloat16 = "CuPy has no bfloat16"
    keep_non_root = False
    array_lib = CupyLib

    def call(self, case: Case) -> Callable[[Any, Any], None]:
        import cupy  # noqa: PLC0415
        from cupy.cuda import nccl  # noqa: PLC0415

        comm = self.job.nccl()
        dtype = _constant(nccl, case.dtype, "type")
        op = _constant(nccl, case.op, "op") if case.op else None
        root, count = case.root, case.count

        def stream() -> int:
            return cupy.cuda.get_current_stream().ptr

        calls = {
            "allreduce": lambda s, t: comm.allReduce(t.data.ptr, t.data.ptr, count, dtype, op, stream()),
            "reduce": lambda s, t: comm.reduce(t.data.ptr, t.data.ptr, count, dtype, op, root, stream()),
            "broadcast": lambda s, t: comm.bcast(t.data.ptr, count, dtype, root, stream()),
            "allgather": lambda s, t: comm.allGather(s.data.ptr, t.data.ptr, count, dtype, stream()),
            "reduce_scatter": lambda s, t: comm.reduceScatter(s.data.ptr, t.data.ptr, count, dtype, op, stream()),
        }
        return calls[case.collective]


class Cupyx(Contender):
    name = "cupyx"

    def skip(self, case: Case) -> Optional[str]:
        if case.op == "avg":
            return "cupyx.distributed has no avg"
        if case.layout in ("channels_last", "reversed"):
            return "cupyx.distributed accepts C- or F-contiguous arrays only"
        if case.layout == "transposed" and case.collective in ("allgather", "reduce_scatter"):
            return "a stacked buffer of F-ordered blocks is neither C- nor F-contiguous"
        if case.dtype == "bfloat16":
            return "CuPy has no bfloat16"
        return None

    def prepare(self, case: Case, arena: Optional[cases.Arena] = None) -> Run:
        comm = self.job.cupyx()
        lib = CupyLib()
        x, out = cases.buffers(lib, case, case.layout, arena)
        root, op, count = case.root, case.op, case.count
        steps = {
            "allreduce": lambda: comm.all_reduce(x, x, op),
            "reduce": lambda: comm.reduce(x, x, root, op),
            "broadcast": lambda: comm.broadcast(x, root),
            "allgather": lambda: comm.all_gather(x, out, count),
            "reduce_scatter": lambda: comm.reduce_scatter(x, out, count, op),
        }
        return Run(lib, steps[case.collective], x, out, keep_non_root=False)


DEVICE_CONTENDERS = ("denseccl", "nccl", "naive", "torch-nccl", "cupyx", "denseccl-torch")


def device_contenders(job: Job, names: Sequence[str], checks: Sequence[bool], notes: List[str],
                      recorders: Sequence[bool] = (False,)) -> List[Contender]:
    """The requested GPU contenders that can run here (and a note for each that cannot);
    ``recorders`` is the host backend's (--recorder): device rows run without the recorder."""
    use_device(job)
    found: List[Contender] = []
    for name in names:
        if name == "denseccl":
            found.extend(DensecclDevice(job, check) for check in checks)
        elif name in ("nccl", "naive"):
            found.append(RawNccl(job, naive=name == "naive"))
        elif name in ("torch-nccl", "denseccl-torch"):
            found.extend(torch_contender(job, name, notes, device="cuda"))
        elif name == "cupyx":
            try:
                import cupyx.distributed  # noqa: F401, PLC0415
            except Exception as error:  # noqa: BLE001
                notes.append(f"cupyx: not available ({error})")
                continue
            found.append(Cupyx(job))
        else:
            raise ValueError(f"unknown GPU contender {name!r}; use {', '.join(DEVICE_CONTENDERS)}")
    return found
