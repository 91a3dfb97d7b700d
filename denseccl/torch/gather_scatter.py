"""The gather and scatter collectives of the process group: allgather, reduce-scatter, gather
and scatter, in their list, single-tensor and coalesced forms.

All of them move a *stacked* buffer, one block per rank, where the caller gave lists of
tensors or one tensor with the blocks concatenated along dim 0. That buffer must be laid out
so that every rank agrees on it, which is what this module decides: whether the caller's
tensor can be moved as it is (dim 0 outermost, blocks in the layout of the other side) or must
be staged through a copy (counted in ``staged_operations``). The methods keep torch's names,
so they live in a mixin that :class:`~.process_group.ProcessGroupDenseCCL` inherits.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Callable, ContextManager, List, Sequence, Tuple

import torch
import torch.distributed as dist
import torch._C._distributed_c10d as _c10d

from ..communicator import Communicator
from ..errors import ArgumentError, LayoutError
from ..ops import OpLike, as_op
from .operations import Issue, as_list, chain, one_step, options, raising_everywhere, start_each
from ._tensors import (
    is_dense,
    is_stacked,
    key_of,
    land,
    not_dense_message,
    overlap,
    stack_like,
    stacked_view,
    staging_stack,
)

#: Checks the caller's output lists and returns them per input: ``[i][r]`` receives rank ``r``'s input ``i``.
Blocks = Callable[[], List[List[torch.Tensor]]]


def _check_gather_list(
    one: torch.Tensor, many: Sequence[torch.Tensor], size: int, what: str, *, inputs_word: str = "output list"
) -> None:
    """``many`` holds one tensor per rank, each of ``one``'s dtype, shape and device."""
    if len(many) != size:
        raise ArgumentError(f"{what}: the {inputs_word} has {len(many)} tensors; it needs one per rank ({size})")
    for r, t in enumerate(many):
        if tuple(t.shape) != tuple(one.shape) or t.dtype != one.dtype:
            raise LayoutError(
                f"{what}: tensor {r} of the {inputs_word} is {t.dtype} of shape {tuple(t.shape)}, but must match "
                f"{one.dtype} of shape {tuple(one.shape)}"
            )
        if t.device != one.device:
            raise ArgumentError(f"{what}: tensor {r} of the {inputs_word} is on {t.device}, not {one.device}")


class GatherScatter:
    """torch's gather and scatter methods, mixed into the process group; they use its
    ``_communicator`` and ``_run``."""

    _group_rank: int
    _group_size: int
    staged_operations: int
    _communicator: Callable[[Sequence[torch.Tensor], str], Communicator]
    _run: Callable[..., dist.Work]
    _arguments: Callable[..., ContextManager[None]]

    # -- allgather ---------------------------------------------------------------------------

    def allgather(self, output_tensors: Any, input_tensors: Any, opts: Any = None) -> dist.Work:
        """``output_tensors[i][r]`` gets rank ``r``'s ``input_tensors[i]``, in its own layout:
        denseccl gathers into a stacked buffer with the input's layout, then each output is
        copied from its block."""
        with self._arguments("allgather", output_tensors, input_tensors):
            opts = options(opts, _c10d.AllgatherOptions)
            inputs = as_list(input_tensors)
            outputs = [list(group) for group in output_tensors]
            comm = self._communicator(inputs, "allgather")

        def blocks() -> List[List[torch.Tensor]]:
            if len(outputs) != len(inputs):
                raise ArgumentError(f"allgather: {len(outputs)} output lists for {len(inputs)} inputs")
            return outputs

        issue = self._allgather_into(comm, "allgather", inputs, blocks, outputs)
        return self._run("allgather", opts, inputs[0].device, issue)

    def allgather_coalesced(self, output_lists: Any, input_tensors: Any, opts: Any = None) -> dist.Work:
        """``output_lists[r][i]`` gets rank ``r``'s ``input_tensors[i]``."""
        with self._arguments("allgather_coalesced", output_lists):
            opts = options(opts, _c10d.AllgatherOptions)
            inputs = as_list(input_tensors)
            per_rank = [list(outs) for outs in output_lists]
            comm = self._communicator(inputs, "allgather_coalesced")

        def blocks() -> List[List[torch.Tensor]]:
            if len(per_rank) != self._group_size or any(len(outs) != len(inputs) for outs in per_rank):
                raise ArgumentError(
                    f"allgather_coalesced: output_lists must hold {self._group_size} lists (one per rank) of "
                    f"{len(inputs)} tensors"
                )
            return [[outs[i] for outs in per_rank] for i in range(len(inputs))]

        issue = self._allgather_into(comm, "allgather_coalesced", inputs, blocks, per_rank)
        return self._run("allgather_coalesced", opts, inputs[0].device, issue)

    def _allgather_into(
        self, comm: Communicator, what: str, inputs: List[torch.Tensor], blocks: Blocks, value: Any, name: str = ""
    ) -> Issue:
        """Allgather each of ``inputs`` into the lists ``blocks()`` returns; a bad list raises on
        every rank (as collective ``name``, default ``what``). The finish returns ``value``."""

        def issue() -> Tuple[List[Any], Callable[[], Any]]:
            with raising_everywhere(comm, name or what):
                targets = blocks()
                for inp, outs in zip(inputs, targets):
                    _check_gather_list(inp, outs, self._group_size, what)
            works = start_each([partial(comm.allgather, t, async_op=True) for t in inputs])

            def finish() -> Any:
                for work, outs in zip(works, targets):
                    for r, out in enumerate(outs):
                        land(out, work.result[r])
                return value

            return works, finish

        return issue

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> dist.Work:  # noqa: A002
        """``all_gather_into_tensor``: ``output`` is ``(size * d0, ...)`` (blocks concatenated
        along dim 0) or ``(size, d0, ...)``. When dim 0 is outermost in ``output``'s memory and
        its blocks have the input's layout, denseccl gathers straight into it; otherwise it
        gathers into a stacked buffer and copies (staging)."""
        with self._arguments("all_gather_single", output, input):
            opts = options(opts, _c10d.AllgatherOptions)
            comm = self._communicator([output, input], "all_gather_into_tensor")
        return self._run("all_gather_into_tensor", opts, input.device, self._gather_single(comm, output, input))

    _allgather_base = all_gather_single

    def _gather_single(self, comm: Communicator, output: torch.Tensor, inp: torch.Tensor) -> Issue:
        size = self._group_size

        def issue() -> Tuple[List[Any], Callable[[], Any]]:
            with raising_everywhere(comm, "allgather"):
                if output.dtype != inp.dtype:
                    raise LayoutError(
                        f"all_gather_into_tensor: output dtype {output.dtype} differs from input dtype {inp.dtype}"
                    )
                view = stacked_view(output, tuple(inp.shape), size, "all_gather_into_tensor output")
            if is_stacked(view, size) and key_of(view[0]) == key_of(inp):
                return one_step(comm.allgather(inp, out=view, async_op=True), output)
            work = comm.allgather(inp, async_op=True)
            self.staged_operations += 1
            return one_step(work, output, copy_into=view)

        return issue

    def all_gather_single_coalesced(self, outputs: Any, inputs: Any, opts: Any = None) -> dist.Work:
        return self._coalesced("all_gather_single_coalesced", "all_gather_into_tensor_coalesced", outputs, inputs,
                               opts, _c10d.AllgatherOptions, lambda comm, op, o, i: self._gather_single(comm, o, i))

    def _coalesced(
        self, what: str, name: str, outputs: Any, inputs: Any, opts: Any, kind: Any,
        single: Callable[[Communicator, Any, torch.Tensor, torch.Tensor], Issue],
    ) -> dist.Work:
        """The single-tensor operation ``single(comm, op, output, input)`` on each pair, as one
        operation (the method ``what``, torch's ``name``); ``op``: ``opts``' reduction, if any."""
        with self._arguments(what, outputs):
            opts = options(opts, kind)
            outputs, inputs = as_list(outputs), as_list(inputs)
            comm = self._communicator(inputs, name)
            op = as_op(opts.reduceOp) if hasattr(opts, "reduceOp") else None
            if len(outputs) != len(inputs):
                raise ArgumentError(f"{name}: {len(outputs)} outputs for {len(inputs)} inputs")
        issues = [single(comm, op, o, i) for o, i in zip(outputs, inputs)]
        return self._run(name, opts, inputs[0].device, chain(issues, outputs))

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    # -- reduce-scatter ----------------------------------------------------------------------

    def reduce_scatter(self, output_tensors: Any, input_lists: Any, opts: Any = None) -> dist.Work:
        """``output_tensors[i]`` gets the reduction of every rank's ``input_lists[i][rank]``.
        The inputs are stacked (copied) into a buffer whose blocks have the output's layout, so
        the result lands in the output directly."""
        with self._arguments("reduce_scatter", output_tensors):
            opts = options(opts, _c10d.ReduceScatterOptions)
            outputs = as_list(output_tensors)
            lists = [list(group) for group in input_lists]
            comm = self._communicator(outputs, "reduce_scatter")
            op = as_op(opts.reduceOp)
            size = self._group_size

        def issue() -> Tuple[List[Any], Callable[[], Any]]:
            stacks = []
            with raising_everywhere(comm, "reduce_scatter"):
                if len(lists) != len(outputs):
                    raise ArgumentError(f"reduce_scatter: {len(lists)} input lists for {len(outputs)} outputs")
                for out, ins in zip(outputs, lists):
                    _check_gather_list(out, ins, size, "reduce_scatter", inputs_word="input_list")
                    stack = stack_like(out, size)
                    for r, piece in enumerate(ins):
                        stack[r].copy_(piece)
                    stacks.append(stack)
            targets = [out if is_dense(out) else None for out in outputs]
            works = start_each(
                [partial(comm.reduce_scatter, stack, op, out=out, async_op=True) for stack, out in zip(stacks, targets)]
            )

            def finish() -> List[torch.Tensor]:
                for out, work in zip(outputs, works):
                    if work.result is not out:
                        land(out, work.result)
                return outputs

            return works, finish

        return self._run("reduce_scatter", opts, outputs[0].device, issue)

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> dist.Work:  # noqa: A002
        """``reduce_scatter_tensor``: ``input`` is ``(size * d0, ...)`` or ``(size, d0, ...)``.
        When dim 0 is outermost in the input's memory its blocks are spans and denseccl reduces
        it in place of a stacked buffer; otherwise the input is staged (copied) into one."""
        with self._arguments("reduce_scatter_single", output, input):
            opts = options(opts, _c10d.ReduceScatterOptions)
            comm = self._communicator([output, input], "reduce_scatter_tensor")
            op = as_op(opts.reduceOp)
        return self._run("reduce_scatter_tensor", opts, input.device, self._scatter_single(comm, op, output, input))

    _reduce_scatter_base = reduce_scatter_single

    def _scatter_single(self, comm: Communicator, op: OpLike, output: torch.Tensor, inp: torch.Tensor) -> Issue:
        size = self._group_size

        def issue() -> Tuple[List[Any], Callable[[], Any]]:
            with raising_everywhere(comm, "reduce_scatter"):
                if output.dtype != inp.dtype:
                    raise LayoutError(
                        f"reduce_scatter_tensor: output dtype {output.dtype} differs from input dtype {inp.dtype}"
                    )
                if not is_dense(inp):
                    raise LayoutError(not_dense_message("reduce_scatter_tensor input", inp))
                view = stacked_view(inp, tuple(output.shape), size, "reduce_scatter_tensor input")
                staged = not is_stacked(view, size)
                stack = staging_stack(view, size).copy_(view) if staged else view
            direct = key_of(stack[0]) == key_of(output) and not overlap(output, stack)
            self.staged_operations += int(staged or not direct)
            work = comm.reduce_scatter(stack, op, out=output if direct else None, async_op=True)
            return one_step(work, output, copy_into=None if direct else output)

        return issue

    def reduce_scatter_single_coalesced(self, outputs: Any, inputs: Any, opts: Any = None) -> dist.Work:
        return self._coalesced("reduce_scatter_single_coalesced", "reduce_scatter_tensor_coalesced", outputs, inputs,
                               opts, _c10d.ReduceScatterOptions, self._scatter_single)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    # -- gather / scatter (via allgather / broadcast: every rank moves the whole data) -------

    def gather(self, output_tensors: Any, input_tensors: Any, opts: Any = None) -> dist.Work:
        with self._arguments("gather", output_tensors, input_tensors):
            opts = options(opts, _c10d.GatherOptions)
            inputs = as_list(input_tensors)
            comm = self._communicator(inputs, "gather")
            root = opts.rootRank
            outs = list(output_tensors[0]) if self._group_rank == root and len(output_tensors) else []

        def blocks() -> List[List[torch.Tensor]]:
            if len(inputs) != 1:
                raise ArgumentError(f"gather takes one input tensor, got {len(inputs)}")
            return [outs] if self._group_rank == root else []

        issue = self._allgather_into(comm, "gather", inputs, blocks, [outs], name="allgather")
        return self._run("gather", opts, inputs[0].device, issue)

    def scatter(self, output_tensors: Any, input_tensors: Any, opts: Any = None) -> dist.Work:
        with self._arguments("scatter", output_tensors, input_tensors):
            opts = options(opts, _c10d.ScatterOptions)
            outputs = as_list(output_tensors)
            comm = self._communicator(outputs, "scatter")
            root = opts.rootRank
            size = self._group_size
            out = outputs[0]
            stack = stack_like(out, size)

        def issue() -> Tuple[List[Any], Callable[[], Any]]:
            with raising_everywhere(comm, "broadcast"):
                if self._group_rank == root:
                    pieces = list(input_tensors[0]) if len(input_tensors) else []
                    _check_gather_list(out, pieces, size, "scatter", inputs_word="scatter_list")
                    for r, piece in enumerate(pieces):
                        stack[r].copy_(piece)
            work = comm.broadcast(stack, root, async_op=True)

            def finish() -> List[torch.Tensor]:
                land(out, stack[self._group_rank])
                return [out]

            return [work], finish

        return self._run("scatter", opts, out.device, issue)
