"""All-to-all and point-to-point for CPU tensors, which denseccl's core does not offer.

They run on an *engine* owned by the process group (an MPI duplicate under an MPI launcher,
the gloo engine's group otherwise), as bytes in row-major order: a tensor that is not
row-major is staged through a contiguous copy, so the layouts of sender and receiver need not
agree (each side keeps its own). Before an all-to-all the ranks exchange their split sizes,
dtypes and row shapes on the agreement channel (with its timeout) and every rank raises if
they are inconsistent.
"""

from __future__ import annotations

from itertools import accumulate
from math import prod
from typing import TYPE_CHECKING, Any, Callable, List, Optional, Sequence, Tuple

import torch
import torch._C._distributed_c10d as c10d

from ..agreement import Descriptor
from ..errors import ArgumentError, LayoutError, MismatchError
from ._issue import Issue
from .progress import RequestStep, WorkStep

if TYPE_CHECKING:
    from .process_group import ProcessGroupDenseCCL


def _bytes(t: torch.Tensor) -> Any:
    """The memory of a contiguous tensor as a buffer mpi4py accepts."""
    from mpi4py import MPI  # noqa: PLC0415 - only under an MPI launch

    return MPI.buffer.fromaddress(t.data_ptr() if t.numel() else 0, t.numel() * t.element_size())


def _flat_bytes(t: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor's memory as a 1-D uint8 tensor (gloo moves it as bytes)."""
    return t.reshape(-1).view(torch.uint8) if t.numel() else torch.empty(0, dtype=torch.uint8)


class MPIEngine:
    """All-to-all and point-to-point on an mpi4py communicator (owned: :meth:`free`)."""

    def __init__(self, comm: Any) -> None:
        self.comm = comm

    def alltoallv(self, source: torch.Tensor, target: torch.Tensor, send: List[int], recv: List[int], what: str) -> Any:
        """``send[r]`` bytes of ``source`` go to rank ``r``; ``recv[r]`` bytes come from it."""
        from mpi4py import MPI  # noqa: PLC0415

        request = self.comm.Ialltoallv(
            [_bytes(source), (send, _displacements(send)), MPI.BYTE],
            [_bytes(target), (recv, _displacements(recv)), MPI.BYTE],
        )
        return RequestStep(request, what, keep=(source, target))

    def send(self, source: torch.Tensor, dst: int, tag: int) -> Any:
        from mpi4py import MPI  # noqa: PLC0415

        return RequestStep(
            self.comm.Isend([_bytes(source), MPI.BYTE], dest=dst, tag=tag), f"send to rank {dst}", keep=source
        )

    def recv(
        self, target: torch.Tensor, src: int, tag: int
    ) -> Tuple[Any, Callable[[], int], Callable[[], Optional[int]]]:
        """The step, then (once it completed) the source rank and the bytes received."""
        from mpi4py import MPI  # noqa: PLC0415

        source = MPI.ANY_SOURCE if src < 0 else src
        step = RequestStep(self.comm.Irecv([_bytes(target), MPI.BYTE], source=source, tag=tag), "recv", keep=target)
        return step, step.status.Get_source, lambda: step.status.Get_count(MPI.BYTE)

    def free(self) -> None:
        from mpi4py import MPI  # noqa: PLC0415

        if self.comm is not None and not MPI.Is_finalized() and self.comm != MPI.COMM_NULL:
            self.comm.Free()
        self.comm = None


class GlooEngine:
    """All-to-all and point-to-point on the gloo engine's group (owned by its transport)."""

    def __init__(self, group: Any) -> None:
        self.group = group

    def alltoallv(self, source: torch.Tensor, target: torch.Tensor, send: List[int], recv: List[int], what: str) -> Any:
        work = self.group.alltoall_base(_flat_bytes(target), _flat_bytes(source), recv, send, c10d.AllToAllOptions())
        return WorkStep(work, what, keep=(source, target))

    def send(self, source: torch.Tensor, dst: int, tag: int) -> Any:
        return WorkStep(self.group.send([_flat_bytes(source)], dst, tag), f"send to rank {dst}", keep=source)

    def recv(
        self, target: torch.Tensor, src: int, tag: int
    ) -> Tuple[Any, Callable[[], int], Callable[[], Optional[int]]]:
        flat = _flat_bytes(target)
        work = self.group.recv_anysource([flat], tag) if src < 0 else self.group.recv([flat], src, tag)
        return WorkStep(work, "recv", keep=target), (work._source_rank if src < 0 else lambda: src), lambda: None

    def free(self) -> None:
        self.group = None


def _receive_buffer(t: torch.Tensor) -> torch.Tensor:
    """Where row-major bytes can land: ``t`` itself when it is row-major, else a row-major
    tensor of its shape, copied into ``t`` when the transfer completed."""
    return t if t.is_contiguous() else torch.empty(t.shape, dtype=t.dtype, device=t.device)


def _displacements(counts: Sequence[int]) -> List[int]:
    """Where each rank's run starts when the runs of ``counts`` follow each other."""
    return list(accumulate([0, *counts]))[:-1]


def _agree_on_plans(group: "ProcessGroupDenseCCL", what: str, plan: dict, problem: Optional[BaseException]) -> None:
    """The core's agreement on what every rank must share (dtype, row shape), with a local
    ``problem`` taking part as invalid, so that every rank raises (that rank its own error, the
    others a MismatchError). Then one more step, a max-allreduce of the split matrices each
    rank fills one row of, checks that rank ``j`` receives from rank ``r`` what ``r`` sends it:
    every rank reaches the same verdict from the same matrices."""
    host = group.host_communicator
    assert host is not None
    size = host.size
    if problem is not None:  # every rank raises (with the check off: this rank alone, as the core does)
        host.flow.fail(what, problem)
    key = (plan.get("dtype", ""), tuple(plan.get("row", ())), ())
    host.flow.agree(Descriptor(what, None, None, key))  # type: ignore[arg-type]
    rank = host.rank
    rows = [-1] * (2 * size * size)
    rows[rank * size : (rank + 1) * size] = plan["send"]
    rows[size * size + rank * size : size * size + (rank + 1) * size] = plan["recv"]
    every = host.flow.start(host.control.allreduce_max, rows, host.flow.deadline())
    sends = [every[r * size : (r + 1) * size] for r in range(size)]
    receives = [every[size * size + r * size : size * size + (r + 1) * size] for r in range(size)]
    lines = [
        f"rank {r} sends {sends[r][j]} to rank {j}, which expects {receives[j][r]}"
        for r in range(size)
        for j in range(size)
        if sends[r][j] != receives[j][r]
    ]
    if lines:
        raise MismatchError(
            f"{what} mismatch: "
            + "; ".join(lines[:8])
            + (" ..." if len(lines) > 8 else "")
            + ". Every rank's input split sizes must equal the receivers' output split sizes. Nothing was sent"
        )


def all_to_all_single(
    group: "ProcessGroupDenseCCL",
    engine: Any,
    output: torch.Tensor,
    inp: torch.Tensor,
    out_splits: List[int],
    in_splits: List[int],
) -> Issue:
    size = group._group_size

    def issue() -> Tuple[List[Any], Callable[[], Any]]:
        problem: Optional[BaseException] = None
        plan: dict = {}
        try:
            if output.dtype != inp.dtype:
                raise LayoutError(f"output dtype {output.dtype} differs from input dtype {inp.dtype}")
            if inp.dim() == 0 or output.dim() == 0:
                raise LayoutError("input and output need a dim 0 to split")
            if tuple(inp.shape[1:]) != tuple(output.shape[1:]):
                raise LayoutError(f"input rows {tuple(inp.shape[1:])} and output rows {tuple(output.shape[1:])} differ")
            ins = _splits(in_splits, inp.shape[0], size, "input")
            outs = _splits(out_splits, output.shape[0], size, "output")
            plan = {"dtype": str(inp.dtype), "row": list(inp.shape[1:]), "send": ins, "recv": outs}
        except Exception as error:  # noqa: BLE001 - every local failure must reach the peers
            problem = error
        _agree_on_plans(group, "all_to_all_single", plan, problem)
        row = _row_bytes(inp)
        source, target = inp.contiguous(), _receive_buffer(output)
        step = engine.alltoallv(
            source, target, [n * row for n in plan["send"]], [n * row for n in plan["recv"]], "all_to_all_single"
        )

        def finish() -> List[torch.Tensor]:
            if target is not output:
                output.copy_(target)
            return [output]

        return [step], finish

    return issue


def _row_bytes(t: torch.Tensor) -> int:
    return prod(t.shape[1:]) * t.element_size()


def _splits(splits: List[int], rows: int, size: int, what: str) -> List[int]:
    if not splits:
        if rows % size:
            raise LayoutError(f"{what} dim 0 ({rows}) does not divide by the {size} ranks; pass split sizes")
        return [rows // size] * size
    if len(splits) != size or any(s < 0 for s in splits) or sum(splits) != rows:
        raise ArgumentError(
            f"{what} split sizes {splits} must be {size} non-negative numbers summing to dim 0 ({rows})"
        )
    return [int(s) for s in splits]


def alltoall(
    group: "ProcessGroupDenseCCL", engine: Any, outputs: List[torch.Tensor], inputs: List[torch.Tensor]
) -> Issue:
    size = group._group_size

    def issue() -> Tuple[List[Any], Callable[[], Any]]:
        problem: Optional[BaseException] = None
        plan: dict = {}
        try:
            if len(outputs) != size or len(inputs) != size:
                raise ArgumentError(
                    f"all_to_all needs {size} input and {size} output tensors, got {len(inputs)} and {len(outputs)}"
                )
            dtypes = {t.dtype for t in outputs + inputs}
            if len(dtypes) != 1:
                raise LayoutError(f"all_to_all tensors have different dtypes {sorted(map(str, dtypes))}")
            plan = {
                "dtype": str(inputs[0].dtype),
                "send": [t.numel() for t in inputs],
                "recv": [t.numel() for t in outputs],
            }
        except Exception as error:  # noqa: BLE001 - every local failure must reach the peers
            problem = error
        _agree_on_plans(group, "all_to_all", plan, problem)
        itemsize = inputs[0].element_size()
        source = torch.cat([t.reshape(-1) for t in inputs]) if inputs else torch.empty(0)
        target = torch.empty(sum(plan["recv"]), dtype=outputs[0].dtype)
        step = engine.alltoallv(
            source, target, [n * itemsize for n in plan["send"]], [n * itemsize for n in plan["recv"]], "all_to_all"
        )

        def finish() -> List[torch.Tensor]:
            offset = 0
            for out in outputs:
                n = out.numel()
                out.copy_(target[offset : offset + n].view(out.shape))
                offset += n
            return outputs

        return [step], finish

    return issue


def send(engine: Any, tensors: List[torch.Tensor], dst: int, tag: int) -> Issue:
    def issue() -> Tuple[List[Any], Callable[[], Any]]:
        if len(tensors) != 1:
            raise ArgumentError(f"send takes one tensor, got {len(tensors)}")
        return [engine.send(tensors[0].contiguous(), dst, tag)], lambda: tensors

    return issue


def recv(engine: Any, tensors: List[torch.Tensor], src: int, tag: int) -> Tuple[Issue, Callable[[], int]]:
    """``src`` < 0 receives from any source."""
    sources: List[Callable[[], int]] = []

    def issue() -> Tuple[List[Any], Callable[[], Any]]:
        if len(tensors) != 1:
            raise ArgumentError(f"recv takes one tensor, got {len(tensors)}")
        out = tensors[0]
        target = _receive_buffer(out)
        step, source, received = engine.recv(target, src, tag)
        sources.append(source)

        def finish() -> List[torch.Tensor]:
            got = received()
            wanted = out.numel() * out.element_size()
            if got is not None and got != wanted:
                raise MismatchError(
                    f"recv from rank {source()} got {got} bytes into a tensor of {wanted} bytes "
                    f"({out.dtype}, shape {tuple(out.shape)}); send and recv tensors must have the same dtype and numel"
                )
            if target is not out:
                out.copy_(target)
            return tensors

        return [step], finish

    return issue, lambda: sources[0]()
