"""What NCCL of each version can do, as data: the ``ncclDataType_t`` / ``ncclRedOp_t`` /
``ncclResult_t`` tables, version gates, how a dtype and op map onto them (:func:`elements`,
:func:`builtin_op`, :func:`check_op`), a PreMulSum factor's bytes (:func:`premul_scalar`) and
the status of an error CuPy raises for an NCCL call (:func:`nccl_status`).

Why it exists: the NCCL backend's init (:mod:`.init`) and its transport (:mod:`.transport`)
both read these tables; giving them this one home, which imports neither, keeps the two free
of an import circle. Pure data and functions: tested without CuPy or a GPU.
"""

from __future__ import annotations

import functools
import math
from typing import Dict, Optional, Tuple

import numpy as np

from ...dtypes import DTYPES, DType
from ...errors import ArgumentError, OpError
from ...ops import Op, PreMulSum, ReduceOp, op_kind, reduction_kind


def version_code(major: int, minor: int, patch: int = 0) -> int:
    """NCCL's ``NCCL_VERSION(X, Y, Z)``: ``X*1000 + Y*100 + Z`` up to 2.8, ``X*10000 + Y*100 + Z``
    from 2.9 on (what ``ncclGetVersion`` and ``cupy.cuda.nccl.get_version()`` return)."""
    if major <= 2 and minor <= 8:
        return major * 1000 + minor * 100 + patch
    return major * 10000 + minor * 100 + patch


def version_string(code: int) -> str:
    """``23203`` -> ``"2.32.3"``; ``2708`` -> ``"2.7.8"``."""
    if code >= 10000:
        return f"{code // 10000}.{code // 100 % 100}.{code % 100}"
    return f"{code // 1000}.{code // 100 % 10}.{code % 100}"


AVG_SINCE = version_code(2, 10)
BFLOAT16_SINCE = version_code(2, 10)
PREMUL_SUM_SINCE = version_code(2, 11)
SPLIT_SINCE = version_code(2, 18, 1)
FP8_SINCE = version_code(2, 24)
#: NCCL reduces fp8 only on GPUs of compute capability 9.0 (sm90) and newer
FP8_REDUCTION_CAPABILITY = 90

#: ncclDataType_t values (nccl.h), with the first NCCL version that has each.
NCCL_TYPES: Dict[str, Tuple[int, int]] = {
    "int8": (0, 0),
    "uint8": (1, 0),
    "int32": (2, 0),
    "uint32": (3, 0),
    "int64": (4, 0),
    "uint64": (5, 0),
    "float16": (6, 0),
    "float32": (7, 0),
    "float64": (8, 0),
    "bfloat16": (9, BFLOAT16_SINCE),
    "float8_e4m3fn": (10, FP8_SINCE),  # ncclFloat8e4m3
    "float8_e5m2": (11, FP8_SINCE),  # ncclFloat8e5m2
}
UINT8 = NCCL_TYPES["uint8"][0]
INT32 = NCCL_TYPES["int32"][0]

#: dtypes NCCL has no type for, carried as another: complex as pairs of reals, bool as bytes.
CARRIED_AS: Dict[str, str] = {"complex64": "float32", "complex128": "float64", "bool": "uint8"}

#: ncclRedOp_t values of the built-in ops (nccl.h).
NCCL_OPS: Dict[ReduceOp, int] = {
    ReduceOp.SUM: 0,
    ReduceOp.PRODUCT: 1,
    ReduceOp.MAX: 2,
    ReduceOp.MIN: 3,
    ReduceOp.AVG: 4,
}
_COMPLEX_OPS = frozenset({ReduceOp.SUM, ReduceOp.AVG, ReduceOp.PREMUL_SUM})


@functools.lru_cache(maxsize=None)
def reducible_dtypes(version: int) -> Dict[str, int]:
    """dtype name -> ncclDataType_t of the elements it travels as, for every dtype NCCL of
    ``version`` can reduce (complex as its real type, bool as uint8)."""
    table = {name: code for name, (code, since) in NCCL_TYPES.items() if version >= since}
    for name, carrier in CARRIED_AS.items():
        if carrier in table:
            table[name] = table[carrier]
    return table


def nccl_dtypes(version: int) -> Dict[str, int]:
    """The transport's ``dtypes``: every dtype it can move. Those NCCL cannot reduce (int16,
    uint16; fp8 before NCCL 2.24) travel as bytes (uint8) in broadcast and allgather."""
    table = {name: UINT8 for name in DTYPES}
    table.update(reducible_dtypes(version))
    return table


def elements(dtype: DType, count: int, reducible: Dict[str, int]) -> Tuple[int, int]:
    """``(ncclDataType_t, count)`` for ``count`` elements of ``dtype``: complex doubles the
    count; a dtype NCCL cannot reduce travels as ``count * itemsize`` bytes."""
    code = reducible.get(dtype.name)
    if code is None:
        return UINT8, count * dtype.itemsize
    return code, count * 2 if dtype.kind == "c" else count


def builtin_op(op: Op, dtype: DType) -> int:
    """ncclRedOp_t of a built-in op (bool: sum/prod as max/min)."""
    return NCCL_OPS[reduction_kind(op, dtype)]


#: largest finite value of each float dtype NCCL reduces (bfloat16 and fp8 have no NumPy type)
MAX_FINITE: Dict[str, float] = {
    "float16": 65504.0,
    "bfloat16": 3.3895313892515355e38,
    "float32": 3.4028234663852886e38,
    "float64": math.inf,
    "float8_e4m3fn": 448.0,
    "float8_e5m2": 57344.0,
}
_SMALL_FLOATS = ("bfloat16", "float8_e4m3fn", "float8_e5m2")


def max_finite(name: str) -> float:
    """Largest finite value of a float dtype (inf for integers: any factor is cast)."""
    return MAX_FINITE.get(name, math.inf)


def _small_float_bytes(value: float, name: str) -> bytes:
    """``value`` rounded to nearest-even in bfloat16 or an fp8 format: through ml_dtypes' NumPy
    types where installed, else a torch cast (these dtypes reach NCCL only as torch tensors)."""
    try:
        import ml_dtypes  # noqa: PLC0415 - optional
    except ImportError:
        pass
    else:
        return np.array(value, np.float64).astype(getattr(ml_dtypes, name)).tobytes()
    try:
        import torch  # noqa: PLC0415 - optional
    except ImportError:
        raise OpError(
            f"PreMulSum on {name} needs ml_dtypes or torch to encode its factor (pip install ml_dtypes)"
        ) from None
    return torch.tensor([value], dtype=torch.float64).to(getattr(torch, name)).view(torch.uint8).numpy().tobytes()


def premul_scalar(factor: float, name: str) -> bytes:
    """The PreMulSum factor in the memory format of the dtype ``name`` (a real dtype: complex
    inputs are scaled through their real type), as ``ncclScalarHostImmediate`` reads it. Integer
    dtypes take the factor's integer part, modulo 2**bits."""
    if name in _SMALL_FLOATS:
        return _small_float_bytes(float(factor), name)
    if name in ("float16", "float32", "float64"):
        return np.array(float(factor), np.float64).astype(name).tobytes()
    if name in ("int8", "uint8", "int32", "uint32", "int64", "uint64"):
        return np.array(int(factor) % (1 << (8 * np.dtype(name).itemsize)), np.uint64).astype(name).tobytes()
    raise OpError(f"PreMulSum has no NCCL scalar for dtype {name}")


def check_op(op: Op, dtype: DType, version: int) -> None:
    """What NCCL of ``version`` cannot do beyond the common tables: reduce a dtype it has no
    type for, complex other than sum/avg/premul_sum, avg before 2.10, PreMulSum before 2.11 or
    with a factor the dtype cannot hold."""
    kind = op_kind(op)
    if dtype.name not in reducible_dtypes(version):
        since = NCCL_TYPES.get(dtype.name, (None, None))[1]
        why = f"it needs NCCL >= {version_string(since)}" if since else "NCCL has no such type"
        raise ArgumentError(
            f"dtype {dtype.name} cannot be reduced by the nccl transport ({why}; this is NCCL "
            f"{version_string(version)}); broadcast and allgather move it, reductions need a wider dtype or the "
            "mpi backend"
        )
    if dtype.kind == "c" and kind not in _COMPLEX_OPS:
        raise OpError(
            f"op {op} is not supported for {dtype.name} by the nccl transport: NCCL reduces complex numbers as "
            "pairs of reals, which is right for sum, avg and PreMulSum with a real factor only; use the mpi "
            "backend for a complex product"
        )
    if kind is ReduceOp.AVG and version < AVG_SINCE:
        raise OpError(f"op avg needs NCCL >= 2.10 (this is NCCL {version_string(version)}); use sum and divide")
    if isinstance(op, PreMulSum):
        if version < PREMUL_SUM_SINCE:
            raise OpError(
                f"PreMulSum needs NCCL >= 2.11 (this is NCCL {version_string(version)}); scale the input and use sum"
            )
        carrier = CARRIED_AS.get(dtype.name, dtype.name)
        if abs(float(op.factor)) > max_finite(carrier):
            raise OpError(
                f"PreMulSum factor {op.factor!r} is beyond the range of {carrier} (largest {max_finite(carrier)!r}); "
                "use a smaller factor or a wider dtype"
            )


# -- NCCL's results -------------------------------------------------------------------------------

#: ncclResult_t values (nccl.h) and their names; CuPy 14.2's NcclError names 0-6 only
NCCL_RESULTS: Dict[int, str] = {
    0: "ncclSuccess",
    1: "ncclUnhandledCudaError",
    2: "ncclSystemError",
    3: "ncclInternalError",
    4: "ncclInvalidArgument",
    5: "ncclInvalidUsage",
    6: "ncclRemoteError",
    7: "ncclInProgress",
}
NCCL_INVALID_ARGUMENT = 4
NCCL_IN_PROGRESS = 7  # a non-blocking communicator's operation has not finished yet


def nccl_status(error: BaseException) -> Optional[int]:
    """The ``ncclResult_t`` of an exception raised by a CuPy NCCL call, or None for any other.
    CuPy raises ``NcclError`` (its ``.status``), except for a status its table of names lacks
    (CuPy 14.2: ncclInProgress, 7), where building that NcclError raises ``KeyError(status)``."""
    status = getattr(error, "status", None)
    if isinstance(status, int) and not isinstance(status, bool):
        return status
    key = error.args[0] if type(error) is KeyError and len(error.args) == 1 else None
    if type(key) is int and key in NCCL_RESULTS:
        return key
    return None


def result_name(status: int) -> str:
    """``ncclInProgress (7)``: an ncclResult_t as NCCL's headers name it."""
    return f"{NCCL_RESULTS.get(status, 'ncclResult_t')} ({status})"


class NCCLStatusError(RuntimeError):
    """An NCCL error CuPy could not raise as its ``NcclError`` (a status missing from its
    table); like NcclError a RuntimeError with ``.status``, so that it breaks the communicator."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


def in_progress_error(what: str) -> NCCLStatusError:
    """What ncclInProgress from ``what`` means for denseccl, which needs blocking communicators."""
    return NCCLStatusError(
        f"{what} returned {result_name(NCCL_IN_PROGRESS)}: the NCCL communicator is non-blocking "
        "(NCCL_COMM_BLOCKING=0 in the environment, or a blocking=0 config), which denseccl does not support; "
        "unset NCCL_COMM_BLOCKING (or set it to 1)",
        NCCL_IN_PROGRESS,
    )


__all__ = [
    "NCCL_OPS", "NCCL_RESULTS", "NCCL_TYPES", "NCCLStatusError", "builtin_op", "check_op", "elements",
    "in_progress_error", "max_finite", "nccl_dtypes", "nccl_status", "premul_scalar", "reducible_dtypes",
    "result_name", "version_code", "version_string",
]
