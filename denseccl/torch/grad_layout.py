"""Tools for PyTorch's Gradient Layout Contract: a parameter's ``.grad`` has the parameter's
strides when the parameter is non-overlapping and dense, and is row-major otherwise.

torch's ``AccumulateGrad`` keeps the contract for gradients it creates, but not for all: a
``.grad`` the user assigned (``p.grad = torch.zeros(p.shape)`` for a channels-last ``p``) keeps
its layout through every later accumulation, and with ``create_graph=True`` an accumulation
computes ``grad + new_grad``, whose layout follows the old grad. A grad that breaks the contract
costs a transposing copy in DDP's bucket copy-in and makes gradient_as_bucket_view views
disagree with ``.grad``; with denseccl it would also make ranks disagree on layouts.
"""

from __future__ import annotations

from typing import Any, List, NamedTuple, Tuple

import torch

from ..layout import contiguous_strides, layout_key
from ._tensors import is_dense, restrided


class GradLayoutViolation(NamedTuple):
    """A parameter whose ``.grad`` does not have the strides the contract asks for."""

    name: str
    shape: Tuple[int, ...]
    param_strides: Tuple[int, ...]
    grad_strides: Tuple[int, ...]
    expected_strides: Tuple[int, ...]

    def __str__(self) -> str:
        return (
            f"{self.name}: grad strides {self.grad_strides}, expected {self.expected_strides} "
            f"(param shape {self.shape}, strides {self.param_strides})"
        )


def expected_grad_strides(param: torch.Tensor) -> Tuple[int, ...]:
    """The strides the contract (module docstring) asks of ``param``'s grad."""
    return tuple(param.stride()) if is_dense(param) else contiguous_strides(tuple(param.shape))


def _violates(param: torch.Tensor, grad: torch.Tensor) -> bool:
    if grad.layout is not torch.strided or grad.shape != param.shape:
        return False
    shape = tuple(param.shape)
    return layout_key("", shape, grad.stride()) != layout_key("", shape, expected_grad_strides(param))


def grad_layout_violations(module: torch.nn.Module) -> List[GradLayoutViolation]:
    """Parameters of ``module`` whose ``.grad`` strides differ from the contract's (strides of
    size-1 dims are ignored; parameters without a grad, and sparse grads, are skipped)."""
    return [
        GradLayoutViolation(name, tuple(p.shape), tuple(p.stride()), tuple(p.grad.stride()), expected_grad_strides(p))
        for name, p in module.named_parameters()
        if p.grad is not None and _violates(p, p.grad)
    ]


def _restride(param: torch.Tensor) -> bool:
    grad = param.grad
    if grad is None or not _violates(param, grad):
        return False
    param.grad = restrided(grad, expected_grad_strides(param))
    return True


def _restride_hook(param: torch.Tensor) -> None:
    _restride(param)


def restride_grads(module: torch.nn.Module) -> int:
    """Give every violating grad of ``module`` its parameter's layout (a copy, differentiable
    when the grad has a graph); returns how many were restrided."""
    return sum(_restride(param) for param in module.parameters())


class GradLayoutHooks:
    """The hooks :func:`enforce_grad_layout` installed; ``remove()`` takes them out."""

    def __init__(self, handles: List[Any]) -> None:
        self.handles = handles

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []

    def __enter__(self) -> "GradLayoutHooks":
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


def enforce_grad_layout(module: torch.nn.Module) -> GradLayoutHooks:
    """After every accumulation into a parameter's ``.grad`` (a post-accumulate-grad hook per
    parameter that requires grad), restride the grad to the parameter's layout if it broke the
    contract. Returns the hooks (``.remove()``, or use as a context manager)."""
    handles = [p.register_post_accumulate_grad_hook(_restride_hook) for p in module.parameters() if p.requires_grad]
    return GradLayoutHooks(handles)


__all__ = [
    "GradLayoutHooks",
    "GradLayoutViolation",
    "enforce_grad_layout",
    "expected_grad_strides",
    "grad_layout_violations",
    "restride_grads",
]
