"""Host arithmetic the MPI library lacks: float16/bfloat16 reductions, averaging and
pre-multiplication.

Half types are reduced as NCCL does on the GPU: each pairwise step is computed in float32 and
rounded to the storage type (round to nearest even). Work goes in fixed-size chunks through
scratch buffers allocated once, so no temporary grows with the array.
"""

from __future__ import annotations

import ctypes
import threading
from typing import Callable, Dict, Tuple

import numpy as np

from ..ops import DType, ReduceOp

#: Elements per chunk: large enough to amortise NumPy's per-call cost, small enough for L2.
CHUNK = 1 << 15

_STORAGE: Dict[str, np.dtype] = {"bfloat16": np.dtype(np.uint16)}
_HALVES = frozenset({"float16", "bfloat16"})


def storage_dtype(dtype: DType) -> np.dtype:
    """NumPy dtype holding the elements' bits (bfloat16 as uint16)."""
    found = _STORAGE.get(dtype.name)
    return found if found is not None else np.dtype(dtype.name)


def host_view(pointer: int, count: int, dtype: DType) -> np.ndarray:
    """A flat, writable NumPy view of ``count`` elements at ``pointer``."""
    if count == 0:
        return np.empty(0, storage_dtype(dtype))
    raw = (ctypes.c_char * (count * dtype.itemsize)).from_address(pointer)
    return np.frombuffer(raw, storage_dtype(dtype))


class _Scratch(threading.local):
    def __init__(self) -> None:
        self.left = np.empty(CHUNK, np.float32)
        self.right = np.empty(CHUNK, np.float32)
        self.bits = np.empty(CHUNK, np.uint32)
        self.nan = np.empty(CHUNK, np.bool_)


_scratch = _Scratch()


def _widen(half: np.ndarray, out: np.ndarray, name: str) -> np.ndarray:
    """float16/bfloat16 chunk -> float32 (exact)."""
    out = out[: half.size]
    if name == "float16":
        np.copyto(out, half)
    else:
        np.left_shift(half, 16, out=out.view(np.uint32), dtype=np.uint32)
    return out


def _narrow(single: np.ndarray, out: np.ndarray, name: str) -> None:
    """float32 chunk -> float16/bfloat16, round to nearest even; NaN stays NaN."""
    if name == "float16":
        np.copyto(out, single, casting="same_kind")
        return
    scratch = _scratch
    n = single.size
    bits = single.view(np.uint32)
    rounding = scratch.bits[:n]
    np.right_shift(bits, 16, out=rounding)
    np.bitwise_and(rounding, 1, out=rounding)
    rounding += 0x7FFF
    rounding += bits
    rounding >>= 16
    np.copyto(out, rounding, casting="unsafe")
    nan = np.isnan(single, out=scratch.nan[:n])
    if nan.any():
        out[nan] = 0x7FC0


_UFUNCS = {
    ReduceOp.SUM: np.add,
    ReduceOp.PRODUCT: np.multiply,
    ReduceOp.MIN: np.minimum,
    ReduceOp.MAX: np.maximum,
}


def half_reduction(kind: ReduceOp, dtype: DType) -> Callable[[object, object, object], None]:
    """An MPI user-op function ``inout = in (op) inout`` for float16/bfloat16 elements."""
    ufunc = _UFUNCS[kind]
    storage = storage_dtype(dtype)
    name = dtype.name

    def reduce_halves(inbuf: object, inoutbuf: object, datatype: object) -> None:
        incoming = np.frombuffer(inbuf, storage)  # type: ignore[call-overload]
        result = np.frombuffer(inoutbuf, storage)  # type: ignore[call-overload]
        scratch = _scratch
        for start in range(0, result.size, CHUNK):
            stop = start + CHUNK
            left = _widen(incoming[start:stop], scratch.left, name)
            right = _widen(result[start:stop], scratch.right, name)
            ufunc(left, right, out=right)
            _narrow(right, result[start:stop], name)

    return reduce_halves


def _chunks(view: np.ndarray):  # type: ignore[no-untyped-def]
    for start in range(0, view.size, CHUNK):
        yield start, start + CHUNK


def scale(destination: np.ndarray, source: np.ndarray, factor: float, dtype: DType) -> None:
    """``destination = source * factor`` in the dtype's arithmetic (may alias exactly)."""
    if dtype.name in _HALVES:
        scratch = _scratch
        for start, stop in _chunks(source):
            single = _widen(source[start:stop], scratch.left, dtype.name)
            single *= np.float32(factor)
            _narrow(single, destination[start:stop], dtype.name)
    elif dtype.kind in "iu":
        np.multiply(source, int(factor), out=destination, casting="unsafe")
    else:
        np.multiply(source, factor, out=destination)


def divide(view: np.ndarray, divisor: int, dtype: DType) -> None:
    """``view /= divisor`` in place; integers truncate toward zero, as NCCL's average does."""
    if dtype.name in _HALVES:
        scratch = _scratch
        for start, stop in _chunks(view):
            single = _widen(view[start:stop], scratch.left, dtype.name)
            single /= np.float32(divisor)
            _narrow(single, view[start:stop], dtype.name)
    elif dtype.kind in "iu":
        for start, stop in _chunks(view):
            chunk = view[start:stop]
            chunk -= np.fmod(chunk, divisor).astype(chunk.dtype, copy=False)
            chunk //= divisor
    else:
        view /= divisor


def scaled_copy(source: np.ndarray, factor: float, dtype: DType) -> np.ndarray:
    """A new array ``source * factor`` (for inputs that must not be written)."""
    destination = np.empty_like(source)
    scale(destination, source, factor, dtype)
    return destination


def is_half(dtype: DType) -> bool:
    return dtype.name in _HALVES


__all__: Tuple[str, ...] = ("host_view", "half_reduction", "scale", "divide", "scaled_copy", "is_half", "storage_dtype")
