"""Point-to-point (send, recv) for CPU tensors of any dense layout, on the process group's
engine (:mod:`.all_to_all_p2p`): the bytes move as they lie in memory, with no copy on either
side where the receiver's layout is the sender's.

Each send is two messages on one tag: a header (the bytes that follow, the sender's shape and
the order of its dims in memory, outermost first), then the tensor's span. The receiver posts
both receives at once, the second into its own tensor's span, and reads the header on
completion. What moves is the sender's values in row-major order, as gloo moves them (shapes
may differ where the bytes agree: a 0-d tensor into a tensor of one element): where the
receiver's layout is the sender's, or both spans hold their values row-major, the bytes
already lie where they belong; otherwise (or for a receiver that is not dense) one copy lays
them out, never a wrong value. A message of at most ``config.P2P_ONE_MESSAGE_BYTES`` goes
with its header in one message instead, copied on each side: below that size a second
message costs more than the copies. Messages of one
source and tag arrive in the order they were sent (MPI's non-overtaking rule, gloo's pairs),
so headers and spans pair up; a receive from any source posts its span's receive once the
header has named the source. Why not one message: the receiver must post its buffer before
it can learn the sender's layout, and a header in the same message would need a copy.
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Sequence, Tuple

import torch

from .. import config
from ..errors import ArgumentError, MismatchError
from ..layout import contiguous_strides, physical_order
from .operations import Issue
from ._tensors import is_dense, land

#: int64 words of a header: the span's bytes, the number of dims, the shape, the dims' order
HEADER = 32
#: the most dims a header describes; a tensor with more moves row-major
MOST_DIMS = (HEADER - 2) // 2
#: a header's bytes
HEADER_BYTES = HEADER * 8


def order_of(t: torch.Tensor) -> Optional[Tuple[int, ...]]:
    """The order of ``t``'s dims in its span, outermost first, where its bytes can move as they
    lie (dense, at most :data:`MOST_DIMS` dims); else None."""
    if t.dim() > MOST_DIMS or not is_dense(t):
        return None
    return physical_order(tuple(t.shape), t.stride())


def span_of(t: torch.Tensor) -> torch.Tensor:
    """A dense tensor's span as a 1-D tensor of its dtype over the same memory (torch strides
    are never negative: the span starts at the data pointer)."""
    return t.as_strided((t.numel(),), (1,))


def header(nbytes: int, shape: Sequence[int], order: Sequence[int]) -> torch.Tensor:
    words = torch.zeros(HEADER, dtype=torch.int64)
    ndim = len(shape)
    words[0], words[1] = nbytes, ndim
    words[2 : 2 + 2 * ndim] = torch.tensor([*shape, *order], dtype=torch.int64)
    return words


def row_major(shape: Sequence[int], order: Sequence[int]) -> bool:
    """Whether a dense span in ``order`` holds its values in row-major order (the dims of
    more than one element come in index order)."""
    walked = [d for d in order if shape[d] != 1]
    return walked == sorted(walked)


def send(engine: Any, tensors: List[torch.Tensor], dst: int, tag: int) -> Issue:
    def issue() -> Tuple[List[Any], Callable[[], Any]]:
        if len(tensors) != 1:
            raise ArgumentError(f"send takes one tensor, got {len(tensors)}")
        t = tensors[0]
        order = order_of(t)
        if order is None:  # not dense: its values, row-major
            t, order = t.contiguous(), tuple(range(t.dim()))
        nbytes = t.numel() * t.element_size()
        words = header(nbytes, tuple(t.shape), order)
        if nbytes <= config.P2P_ONE_MESSAGE_BYTES:
            message = torch.empty(HEADER_BYTES + nbytes, dtype=torch.uint8)
            message[:HEADER_BYTES] = words.view(torch.uint8)
            message[HEADER_BYTES:] = span_of(t).view(torch.uint8)
            return [engine.send(message, dst, tag)], lambda: tensors
        return [engine.send(words, dst, tag), engine.send(span_of(t), dst, tag)], lambda: tensors

    return issue


class AfterHeader:
    """A receive from any source: its span's receive is posted once the header's receive
    completed and named the source (a step of the progress engine)."""

    def __init__(self, head: Any, source: Callable[[], int], post: Callable[[int], Any]) -> None:
        self.head, self.source, self.post = head, source, post
        self.data: Any = None

    def is_completed(self) -> bool:
        if self.data is None:
            if not self.head.is_completed():
                return False
            self.head.wait()
            self.data = self.post(self.source())
        return bool(self.data.is_completed())

    def wait(self, timeout: Optional[float] = None) -> None:
        if self.data is None:
            self.head.wait(timeout)
            self.data = self.post(self.source())
        self.data.wait(timeout)


def recv(engine: Any, tensors: List[torch.Tensor], src: int, tag: int) -> Tuple[Issue, Callable[[], int]]:
    """``src`` < 0 receives from any source."""
    sources: List[Callable[[], int]] = []

    def issue() -> Tuple[List[Any], Callable[[], Any]]:
        if len(tensors) != 1:
            raise ArgumentError(f"recv takes one tensor, got {len(tensors)}")
        out = tensors[0]
        wanted = out.numel() * out.element_size()
        if wanted <= config.P2P_ONE_MESSAGE_BYTES:
            message = torch.empty(HEADER_BYTES + wanted, dtype=torch.uint8)
            step, source = engine.recv(message, src, tag)
            sources.append(source)
            words = message[:HEADER_BYTES].view(torch.int64)
            lying = message[HEADER_BYTES:].view(out.dtype) if wanted else torch.empty(0, dtype=out.dtype)
            return [step], lambda: lay_out(out, words, lying, None, source)
        order = order_of(out)
        target = out if order is not None else torch.empty(out.shape, dtype=out.dtype)
        words = torch.zeros(HEADER, dtype=torch.int64)
        head, source = engine.recv(words, src, tag)
        sources.append(source)
        span = span_of(target)
        if src >= 0:
            return [head, engine.recv(span, src, tag)[0]], lambda: lay_out(out, words, span, order_of(target), source)
        after = AfterHeader(head, source, lambda found: engine.recv(span, found, tag)[0])
        return [after], lambda: lay_out(out, words, span, order_of(target), source)

    def lay_out(
        out: torch.Tensor, words: torch.Tensor, lying: torch.Tensor, order: Optional[Tuple[int, ...]],
        source: Callable[[], int],
    ) -> List[torch.Tensor]:
        """Put the values of the received span ``lying`` (the sender's, in the order its header
        ``words`` gives) in ``out``; ``order``: the order of ``lying``'s memory when it is
        ``out``'s own span, None for a staging span."""
        nbytes, ndim = int(words[0]), int(words[1])
        wanted = out.numel() * out.element_size()
        if nbytes != wanted:
            raise MismatchError(
                f"recv from rank {source()} got {nbytes} bytes into a tensor of {wanted} bytes ({out.dtype}, "
                f"shape {tuple(out.shape)}); send and recv tensors must have the same dtype and numel"
            )
        values = [int(w) for w in words[2 : 2 + 2 * ndim]]
        shape, sent = tuple(values[:ndim]), tuple(values[ndim:])
        into_out = order is not None and lying.data_ptr() == out.data_ptr()
        if into_out and (shape == tuple(out.shape) and sent == order or (
            row_major(shape, sent) and row_major(tuple(out.shape), order)  # type: ignore[arg-type]
        )):
            return tensors  # the bytes lie where they belong
        if out.numel():
            laid = (lying.clone() if into_out else lying).as_strided(shape, contiguous_strides(shape, sent))
            land(out, laid if shape == tuple(out.shape) else laid.reshape(out.shape))
        return tensors

    return issue, lambda: sources[0]()


__all__ = ["HEADER", "recv", "send"]
