"""All-to-all for CPU tensors, which denseccl's core does not offer, and the :class:`Engine` it
and point-to-point (:mod:`.p2p`) run on: the host communicator's transport (MPI's or the gloo
engine's), through its public calls (``alltoallv``, ``send``, ``recv``: bytes at a pointer).
An all-to-all moves bytes in row-major order (a tensor that is not row-major is staged through
a contiguous copy, so the layouts of the ranks need not agree) and is checked first
(:func:`_agreed`). A failure after the transfer began breaks the communicator on every rank
(:meth:`Engine.breaks`).
"""

from __future__ import annotations

from math import prod
from typing import Any, Callable, List, Optional, Tuple

import torch

from ..agreement import Descriptor
from ..communicator import Communicator
from ..transport import Pending
from ..errors import ArgumentError, CommunicatorBrokenError, LayoutError, MismatchError
from ..wait import deadline_after, wait_until
from .operations import Issue
from ..layout import physical_order
from ._tensors import land
from .p2p import order_of, span_of

#: raises once a peer gave up on the communicator the engine runs beside (``Flow.check_peers``)
Check = Optional[Callable[[], None]]


def hopeless(check: Callable[[], None], what: str) -> Callable[[], None]:
    """A step's watch: ``check``, its error naming the step (``what``)."""

    def watch() -> None:
        try:
            check()
        except CommunicatorBrokenError as error:
            raise CommunicatorBrokenError(f"{what}: {error}") from None

    return watch


class Step:
    """A transport's operation (its ``Pending``) as a step of the progress engine
    (``is_completed``, ``wait``). Until it completed it holds ``keep`` (the tensors it reads or
    writes) and counts in the communicator's ``unfinished``, as a collective's Work does: a
    communicator closed meanwhile keeps the library communicator the transfer uses. ``watch``
    raises once a peer gave up; a wait inside the library (gloo's) hears it only where the
    transport slices that wait."""

    __slots__ = ("pending", "keep", "what", "watch", "unfinished")

    def __init__(self, pending: Pending, what: str, keep: Any, watch: Check, unfinished: List[bool]) -> None:
        pending.what = what
        self.pending, self.keep, self.what, self.watch = pending, keep, what, watch
        self.unfinished = unfinished
        unfinished.append(True)

    def is_completed(self) -> bool:
        return self.pending.test()

    def wait(self, timeout: Optional[float] = None) -> None:
        pending = self.pending
        if pending.blocks:
            pending.wait(deadline_after(timeout))
        elif not pending.test():
            wait_until(pending.test, deadline_after(timeout), self.what, watch=self.watch)
        if self.keep is not None:  # a failed step keeps them: the transfer may still touch them
            self.keep = None
            self.unfinished.pop()


def _pointer(t: torch.Tensor) -> Tuple[int, int]:
    """A contiguous tensor's memory: its address and bytes."""
    return t.data_ptr(), t.numel() * t.element_size()


class Engine:
    """All-to-all and point-to-point of contiguous tensors as bytes, through the public calls
    of the host communicator's transport (MPI's, or the gloo engine's); its flow's
    ``check_peers`` is every step's watch."""

    def __init__(self, host: Communicator) -> None:
        self.host = host
        self.transport = host.transport
        self.flow = host.flow

    def breaks(self, error: BaseException) -> None:
        """What a failed all-to-all or point-to-point operation does once its transfer began (an
        error in its wait or its completion, an interrupt): it breaks the host communicator and
        gives up, so that a peer waiting for its next message raises at once, naming this rank,
        instead of at the timeout. A local error, which leaves a collective's communicator
        usable, breaks it too: the peers have moved on with the transfer."""
        self.flow.note_failure(error)
        if self.flow.broken is None:
            self.flow.note_failure(CommunicatorBrokenError(
                f"rank {self.host.rank} failed after its transfer began: {type(error).__name__}: {error}"
            ))

    def _step(self, pending: Pending, what: str, keep: Any, watched: bool = True) -> Step:
        return Step(pending, what, keep, hopeless(self.flow.check_peers, what) if watched else None,
                    self.flow.unfinished)

    def alltoallv(self, source: torch.Tensor, target: torch.Tensor, send: List[int], recv: List[int], what: str) -> Any:
        """``send[r]`` bytes of ``source`` go to rank ``r``; ``recv[r]`` bytes come from it."""
        pending = self.transport.alltoallv(source.data_ptr(), target.data_ptr(), send, recv)
        return self._step(pending, what, (source, target))

    # a send or recv whose wait blocks in the library cannot take slices of it: no watch
    def send(self, source: torch.Tensor, dst: int, tag: int) -> Any:
        pending = self.transport.send(*_pointer(source), dst, tag)
        return self._step(pending, f"send to rank {dst}", source, not pending.blocks)

    def recv(self, target: torch.Tensor, src: int, tag: int) -> Tuple[Step, Callable[[], int]]:
        """The step, and (once it completed) the source rank; ``src`` < 0: any source."""
        pending = self.transport.recv(*_pointer(target), src, tag)
        what = f"recv from rank {src}" if src >= 0 else "recv"
        return self._step(pending, what, target, not pending.blocks), pending.source


def _receive_buffer(t: torch.Tensor) -> torch.Tensor:
    """Where row-major bytes can land: ``t`` itself when it is row-major, else a row-major
    tensor of its shape, copied into ``t`` when the transfer completed."""
    return t if t.is_contiguous() else torch.empty(t.shape, dtype=t.dtype, device=t.device)


def _agreed(host: Communicator, what: str, plan: Callable[[], dict]) -> dict:
    """``plan()``: what every rank must share (dtype, row shape) and its split sizes. A local
    failure there takes part in the core's agreement step as invalid, so that every rank raises
    (that rank its own error, the others a MismatchError; with the check off this rank alone,
    as the core does). Then one more step, a max-allreduce of the split matrices each rank
    fills one row of, checks that rank ``j`` receives from rank ``r`` what ``r`` sends it:
    every rank reaches the same verdict from the same matrices. The same step tells whether
    every rank's ``plan()["code"]`` is the same (:func:`_row_order_code`): ``mine["direct"]``."""
    try:
        mine = plan()
    except Exception as error:  # noqa: BLE001 - every local failure must reach the peers
        host.flow.fail(what, error)
    host.flow.agree(Descriptor(what, None, None, (mine["dtype"], tuple(mine.get("row", ())), ())))  # type: ignore[arg-type]
    size, rank, n = host.size, host.rank, host.size * host.size
    rows = [-1] * (2 * n)  # [r * size + j]: what r sends to j; [n + j * size + r]: what j expects from r
    rows[rank * size : (rank + 1) * size] = mine["send"]
    rows[n + rank * size : n + (rank + 1) * size] = mine["recv"]
    code = mine.get("code", -1)
    rows += [code, -code]  # every rank's code equal: the max of the codes is minus the max of their negatives
    every = host.flow.start(host.control.allreduce_max, rows, host.flow.deadline())
    mine["direct"] = every[2 * n] >= 0 and every[2 * n] == -every[2 * n + 1]
    lines = [
        f"rank {r} sends {every[r * size + j]} to rank {j}, which expects {every[n + j * size + r]}"
        for r in range(size)
        for j in range(size)
        if every[r * size + j] != every[n + j * size + r]
    ]
    if lines:
        raise MismatchError(
            f"{what} mismatch: "
            + "; ".join(lines[:8])
            + (" ..." if len(lines) > 8 else "")
            + ". Every rank's input split sizes must equal the receivers' output split sizes. Nothing was sent"
        )
    return mine


def _alltoallv(engine: Any, what: str, source: torch.Tensor, target: torch.Tensor, plan: dict, unit: int) -> Any:
    """The step moving ``plan["send"][r]`` units of ``unit`` bytes to each rank ``r``."""
    return engine.alltoallv(source, target, [n * unit for n in plan["send"]], [n * unit for n in plan["recv"]], what)


def all_to_all_single(
    engine: Engine, out: torch.Tensor, inp: torch.Tensor, out_splits: List[int], in_splits: List[int]
) -> Issue:
    host = engine.host

    def plan() -> dict:
        if out.dtype != inp.dtype:
            raise LayoutError(f"output dtype {out.dtype} differs from input dtype {inp.dtype}")
        if inp.dim() == 0 or out.dim() == 0:
            raise LayoutError("input and output need a dim 0 to split")
        if tuple(inp.shape[1:]) != tuple(out.shape[1:]):
            raise LayoutError(f"input rows {tuple(inp.shape[1:])} and output rows {tuple(out.shape[1:])} differ")
        ins = _splits(in_splits, inp.shape[0], host.size, "input")
        outs = _splits(out_splits, out.shape[0], host.size, "output")
        codes = {_row_order_code(inp), _row_order_code(out)}
        code = codes.pop() if len(codes) == 1 else -1
        return {"dtype": str(inp.dtype), "row": list(inp.shape[1:]), "send": ins, "recv": outs, "code": code}

    def issue() -> Tuple[List[Any], Callable[[], Any]]:
        agreed = _agreed(host, "all_to_all_single", plan)
        if agreed["direct"]:  # every rank's rows lie alike, one after another: spans as they lie
            source, target = span_of(inp), span_of(out)
        else:
            source, target = inp.contiguous(), _receive_buffer(out)
        step = _alltoallv(engine, "all_to_all_single", source, target, agreed, prod(inp.shape[1:]) * inp.element_size())

        def finish() -> List[torch.Tensor]:
            if not agreed["direct"] and target is not out:
                land(out, target)
            return [out]

        return [step], finish

    return issue


def _row_order_code(t: torch.Tensor) -> int:
    """A number that stands for how ``t``'s rows lie in memory, where they lie one after another
    along dim 0 (dense, dim 0 outermost): equal numbers on tensors of one row shape mean equal
    layouts, so an all-to-all can move the spans as they lie. -1 otherwise."""
    order = order_of(t)
    shape, strides = tuple(t.shape), t.stride()
    row = prod(shape[1:])
    if order is None or (shape[0] > 1 and strides[0] != row):
        return -1
    inner = physical_order(shape[1:], strides[1:])
    return sum(d * (len(inner) + 1) ** i for i, d in enumerate(inner, 1))


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


def alltoall(engine: Engine, outputs: List[torch.Tensor], inputs: List[torch.Tensor]) -> Issue:
    host, size = engine.host, engine.host.size

    def plan() -> dict:
        if len(outputs) != size or len(inputs) != size:
            raise ArgumentError(
                f"all_to_all needs {size} input and {size} output tensors, got {len(inputs)} and {len(outputs)}"
            )
        dtypes = {t.dtype for t in outputs + inputs}
        if len(dtypes) != 1:
            raise LayoutError(f"all_to_all tensors have different dtypes {sorted(map(str, dtypes))}")
        counts = [t.numel() for t in inputs], [t.numel() for t in outputs]
        return {"dtype": str(inputs[0].dtype), "send": counts[0], "recv": counts[1]}

    def issue() -> Tuple[List[Any], Callable[[], Any]]:
        agreed = _agreed(host, "all_to_all", plan)
        source = torch.cat([t.reshape(-1) for t in inputs])
        target = torch.empty(sum(agreed["recv"]), dtype=outputs[0].dtype)
        step = _alltoallv(engine, "all_to_all", source, target, agreed, inputs[0].element_size())

        def finish() -> List[torch.Tensor]:
            for out, received in zip(outputs, target.split(agreed["recv"])):
                land(out, received.view(out.shape))
            return outputs

        return [step], finish

    return issue
