"""Reduction ops: the user's forms (strings, :class:`ReduceOp`, :class:`PreMulSum`, torch's and
mpi4py's ops) normalised, and which ops each kind of dtype (dtypes.py) supports."""

from __future__ import annotations

import enum
import math
import numbers
import sys
from typing import Any, Dict, Mapping, NamedTuple, Optional, Union

from .dtypes import DType
from .errors import ArgumentError, OpError


class ReduceOp(enum.Enum):
    """Reduction ops; string forms ``"sum"``, ``"prod"``, ``"min"``, ``"max"``, ``"avg"``."""

    SUM = "sum"
    PRODUCT = "prod"
    MIN = "min"
    MAX = "max"
    AVG = "avg"
    PREMUL_SUM = "premul_sum"

    def __str__(self) -> str:
        return self.value


class PreMulSum(NamedTuple):
    """Sum of every rank's input multiplied by ``factor`` first (DDP's pre-division)."""

    factor: float

    @property
    def kind(self) -> ReduceOp:
        return ReduceOp.PREMUL_SUM

    def __str__(self) -> str:
        # float() so that PreMulSum(2) and PreMulSum(2.0) describe the same op on every rank
        return f"premul_sum({float(self.factor)!r})"


Op = Union[ReduceOp, PreMulSum]
#: also torch.distributed.ReduceOp members and mpi4py's MPI.SUM, MPI.PROD, MPI.MIN, MPI.MAX
OpLike = Union[str, ReduceOp, PreMulSum, Any]

_OP_ALIASES: Dict[str, ReduceOp] = {
    "sum": ReduceOp.SUM,
    "prod": ReduceOp.PRODUCT,
    "product": ReduceOp.PRODUCT,
    "min": ReduceOp.MIN,
    "max": ReduceOp.MAX,
    "avg": ReduceOp.AVG,
    "mean": ReduceOp.AVG,
}


def as_op(op: OpLike) -> Op:
    """Normalise a user's op to a :class:`ReduceOp` member or a :class:`PreMulSum`."""
    if isinstance(op, PreMulSum):
        factor = op.factor
        if not isinstance(factor, numbers.Real) or isinstance(factor, bool) or not math.isfinite(factor):
            raise OpError(f"PreMulSum factor must be a finite real number, got {factor!r}")
        if type(factor) not in (int, float):  # NumPy scalars and the like, as plain Python numbers
            return PreMulSum(int(factor) if isinstance(factor, numbers.Integral) else float(factor))
        return op
    if isinstance(op, ReduceOp):
        if op is ReduceOp.PREMUL_SUM:
            raise OpError("ReduceOp.PREMUL_SUM needs a factor: pass denseccl.PreMulSum(factor)")
        return op
    if isinstance(op, str) and op.lower() in _OP_ALIASES:
        return _OP_ALIASES[op.lower()]
    foreign = _foreign_op(op)
    if foreign is not None:
        return as_op(foreign)
    raise OpError(
        f"unknown reduction op {op!r}: use 'sum', 'prod', 'min', 'max', 'avg', a denseccl.ReduceOp "
        "member, denseccl.PreMulSum(factor), torch.distributed.ReduceOp SUM/PRODUCT/MIN/MAX/AVG/PREMUL_SUM or "
        "mpi4py's MPI.SUM/PROD/MIN/MAX"
    )


#: torch's op names are denseccl's member names
_TORCH_OPS = {name: ReduceOp[name] for name in ("SUM", "PRODUCT", "MIN", "MAX", "AVG")}
_MPI_OPS = {"SUM": ReduceOp.SUM, "PROD": ReduceOp.PRODUCT, "MIN": ReduceOp.MIN, "MAX": ReduceOp.MAX}
#: mpi4py's ops that denseccl names when it refuses them
_MPI_OTHER_OPS = ("LAND", "LOR", "LXOR", "BAND", "BOR", "BXOR", "MAXLOC", "MINLOC", "REPLACE", "NO_OP")


def _foreign_op(op: Any) -> Optional[Union[ReduceOp, PreMulSum]]:
    """torch's ``ReduceOp`` (or ``RedOpType``) and mpi4py's ``MPI.Op`` as denseccl ops, without
    importing either library; None for anything else. An op of theirs that denseccl does not
    support raises :class:`OpError`."""
    module = type(op).__module__ or ""
    if module.startswith("torch"):
        kind = getattr(op, "op", op)  # a ReduceOp object carries its RedOpType
        name = str(getattr(kind, "name", kind)).rpartition(".")[2]
        if name in _TORCH_OPS:
            return _TORCH_OPS[name]
        if name == "PREMUL_SUM" and hasattr(op, "factor"):
            factor = op.factor
            if hasattr(factor, "numel"):  # a one-element tensor
                if factor.numel() != 1:
                    raise OpError(f"PREMUL_SUM needs one scale factor, got a tensor of shape {tuple(factor.shape)}")
                factor = factor.item()
            return PreMulSum(float(factor))
        raise OpError(
            f"reduction op {name} (torch) is not supported by denseccl: use SUM, PRODUCT, MIN, MAX, AVG or PREMUL_SUM"
        )
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and isinstance(op, mpi.Op):
        for name, kind in _MPI_OPS.items():
            if op == getattr(mpi, name):
                return kind
        known = next((name for name in _MPI_OTHER_OPS if op == getattr(mpi, name, None)), "Op")
        raise OpError(
            f"reduction op MPI.{known} is not supported by denseccl: "
            "use MPI.SUM, MPI.PROD, MPI.MIN or MPI.MAX "
            "(or 'sum', 'prod', 'min', 'max', 'avg', denseccl.PreMulSum(factor))"
        )
    return None


def op_kind(op: Op) -> ReduceOp:
    return op.kind if isinstance(op, PreMulSum) else op


#: Ops each dtype kind supports, before any transport restriction. Bool follows torch: sum is a
#: logical or, prod a logical and. Complex follows torch's ``supports_complex``: no min/max.
KIND_OPS: Dict[str, frozenset] = {
    "f": frozenset(ReduceOp),
    "i": frozenset(ReduceOp),
    "u": frozenset(ReduceOp),
    "b": frozenset({ReduceOp.SUM, ReduceOp.PRODUCT, ReduceOp.MIN, ReduceOp.MAX}),
    "c": frozenset({ReduceOp.SUM, ReduceOp.PRODUCT, ReduceOp.AVG, ReduceOp.PREMUL_SUM}),
}

#: Bool reductions as the logical ops they are.
BOOL_OPS: Dict[ReduceOp, ReduceOp] = {
    ReduceOp.SUM: ReduceOp.MAX,
    ReduceOp.PRODUCT: ReduceOp.MIN,
    ReduceOp.MIN: ReduceOp.MIN,
    ReduceOp.MAX: ReduceOp.MAX,
}


def reduction_kind(op: Op, dtype: DType) -> ReduceOp:
    """The reduction a library runs for ``op`` on ``dtype``: the op's kind, with bool's sum and
    prod as the logical or and and they are (:data:`BOOL_OPS`)."""
    kind = op_kind(op)
    return BOOL_OPS[kind] if dtype.kind == "b" else kind


def check_op_for_dtype(op: Op, dtype: DType, transport_dtypes: Mapping[str, object], transport: str) -> None:
    """Raise :class:`ArgumentError` if the transport cannot move ``dtype``, :class:`OpError`
    if ``op`` is not defined for it."""
    if dtype.name not in transport_dtypes:
        supported = ", ".join(sorted(transport_dtypes))
        raise ArgumentError(
            f"dtype {dtype.name} is not supported by the {transport} transport (supported: {supported})"
        )
    kind = op_kind(op)
    if kind not in KIND_OPS[dtype.kind]:
        allowed = ", ".join(sorted(str(o) for o in KIND_OPS[dtype.kind] if o is not ReduceOp.PREMUL_SUM))
        raise OpError(f"op {op} is not defined for dtype {dtype.name} (allowed: {allowed})")
    if isinstance(op, PreMulSum) and dtype.kind in "iu":
        if op.factor != int(op.factor):
            raise OpError(
                f"PreMulSum factor {op.factor!r} is not an integer, so it cannot scale {dtype.name} "
                "inputs; use a float dtype or an integer factor"
            )
        bits = 8 * dtype.itemsize
        low, high = (0, 2**bits - 1) if dtype.kind == "u" else (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
        if not low <= int(op.factor) <= high:
            raise OpError(
                f"PreMulSum factor {op.factor!r} does not fit {dtype.name} ({low} to {high}); "
                "use a factor in that range or a float dtype"
            )
