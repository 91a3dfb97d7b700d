"""Host arithmetic the MPI library lacks: float16/bfloat16 reductions, averaging and
pre-multiplication.

Half types are reduced as NCCL does on the GPU: each pairwise step is computed in float32 and
rounded to the storage type (round to nearest even). Three implementations compute the same
bits (a NaN stays a NaN, its payload may differ), chosen by ``DENSECCL_HOST_KERNELS``:

- ``native``: the compiled loops of ``denseccl.backends.mpi._half_kernels`` (built at install when a C
  compiler is present), in place, one vectorised pass, no temporary;
- ``torch``: torch's vectorised CPU kernels, when the process has already imported torch
  (denseccl never imports it), using torch's intra-op threads;
- ``numpy``: NumPy passes over fixed-size chunks through scratch buffers allocated once, so
  no temporary grows with the array (several times slower).

``auto`` (the default) takes the first of these that is available.
"""

from __future__ import annotations

import ctypes
import sys
import threading
import warnings
from typing import Any, Callable, Iterator, Tuple

import numpy as np

from ... import config
from ...dtypes import DType
from ...ops import ReduceOp

#: elements per chunk (config.HOST_KERNEL_CHUNK), bound here for the loops
CHUNK = config.HOST_KERNEL_CHUNK

#: "auto", "native", "torch" or "numpy" (see the module docstring).
KERNELS = config.settings().host_kernels

_native: Any  # the compiled module, or None
try:
    from . import _half_kernels as _native
except ImportError:  # built without a C compiler
    _native = None

_NATIVE_TYPES = {"float16": 0, "bfloat16": 1}


#: What a user sees when the compiled loops are missing (``python -m denseccl`` and the warning).
MISSING_NATIVE = (
    "the compiled float16/bfloat16 kernels (denseccl.backends.mpi._half_kernels) were not built, so half-precision "
    "reductions on MPI run on torch's kernels (when torch is imported) or NumPy's (up to 10x slower). "
    "Reinstall where a C compiler is present: pip install --force-reinstall --no-deps --no-binary denseccl denseccl "
    "(or launch/setup in a checkout); DENSECCL_HOST_KERNELS=torch or numpy chooses a fallback on purpose"
)


class HalfKernelsWarning(UserWarning):
    """The compiled half-precision loops are missing and a slower fallback runs (said once)."""


_warned = False


def native_available() -> bool:
    """Whether the compiled half-precision loops were built and imported."""
    return _native is not None


def _warn_fallback(stacklevel: int = 3) -> None:
    """Say once per process that half types fall back to slower kernels, unless the fallback
    was chosen on purpose (``DENSECCL_HOST_KERNELS=torch|numpy``). Called where half-precision
    work is set up, never from inside an MPI callback."""
    global _warned
    if _warned or _native is not None or KERNELS not in ("auto", "native"):
        return
    _warned = True
    warnings.warn(f"denseccl: {MISSING_NATIVE}", HalfKernelsWarning, stacklevel=stacklevel)


def _use_native(*arrays: np.ndarray) -> bool:
    """The compiled loops take addresses and counts: flat, contiguous arrays only."""
    return _native is not None and KERNELS in ("auto", "native") and all(a.flags.c_contiguous for a in arrays)


def _address(array: np.ndarray) -> int:
    return array.__array_interface__["data"][0]  # type: ignore[no-any-return]


_HALVES = frozenset({"float16", "bfloat16"})


def storage_dtype(dtype: DType) -> np.dtype:
    """NumPy dtype holding the elements' bits (bfloat16 as uint16)."""
    return np.dtype(np.uint16 if dtype.name == "bfloat16" else dtype.name)


def host_view(pointer: int, count: int, dtype: DType) -> np.ndarray:
    """A flat, writable NumPy view of ``count`` elements at ``pointer``."""
    if count == 0:
        return np.empty(0, storage_dtype(dtype))
    raw = (ctypes.c_char * (count * dtype.itemsize)).from_address(pointer)
    return np.frombuffer(raw, storage_dtype(dtype))  # type: ignore[call-overload]  # ctypes arrays are buffers


class _Scratch(threading.local):
    def __init__(self) -> None:
        self.left = np.empty(CHUNK, np.float32)
        self.right = np.empty(CHUNK, np.float32)
        self.bits = np.empty(CHUNK, np.uint32)
        self.more = np.empty(CHUNK, np.uint32)
        self.nan: np.ndarray = np.empty(CHUNK, np.bool_)


_scratch = _Scratch()


# NumPy's float16 <-> float32 casts are scalar loops (~2 ns and ~4.5 ns per element here); the
# integer/float passes below are vectorised (~0.1 ns per element each) and exact, and each falls
# back to NumPy's cast for a chunk holding values they do not cover (tests compare them with it).
_REBIAS = np.float32(2.0**112)  # float32 exponent bias minus float16's, as a power of two
_UNBIAS = np.float32(2.0**-112)
_HALF_OVERFLOW_BITS = 0x477FF000  # |x| >= 65520 rounds to inf in float16
_HALF_MIN_NORMAL_BITS = 0x38800000  # 2**-14, the smallest normal float16


def _widen_float16(half: np.ndarray, out: np.ndarray) -> None:
    """float16 -> float32: move sign, exponent and mantissa into place, then rebias the exponent
    by a float multiply (exact, subnormals included). inf/NaN come out as finite values of
    magnitude >= 65536 (no finite float16 reaches it): such a chunk is cast by NumPy instead."""
    bits: np.ndarray = out.view(np.int32)
    np.left_shift(half.view(np.int16), 16, out=bits, dtype=np.int32)  # sign at bit 31
    bits >>= 3  # exponent and mantissa at bits 13..27 (bits 28..30 copy the sign)
    bits &= np.int32(-0x70000001)  # 0x8FFFFFFF: clear bits 28..30
    out *= _REBIAS
    if out.max() >= 65536.0 or out.min() <= -65536.0:
        np.copyto(out, half)


def _narrow_float16(single: np.ndarray, out: np.ndarray) -> None:
    """float32 -> float16, round to nearest even. Vectorised when every value is zero or a
    normal float16 after rounding (the usual case): rebias by a float multiply, round the
    13 dropped mantissa bits to nearest even on the integer bits, add the sign. Otherwise
    (subnormal, overflow, inf, NaN anywhere in the chunk) NumPy's cast."""
    scratch = _scratch
    n = single.size
    magnitude = scratch.bits[:n]
    spare = scratch.more[:n]
    np.bitwise_and(single.view(np.uint32), 0x7FFFFFFF, out=magnitude)
    if magnitude.max() < _HALF_OVERFLOW_BITS:
        np.subtract(magnitude, 1, out=spare)  # zero wraps to the top: passes the next test
        if spare.min() >= _HALF_MIN_NORMAL_BITS - 1:
            magnitude.view(np.float32)[...] *= _UNBIAS  # |x| as float32 with float16's bias
            rounded = magnitude.view(np.int32)
            odd = spare.view(np.int32)
            np.right_shift(rounded, 13, out=odd)
            odd &= 1
            rounded += 0xFFF
            rounded += odd
            rounded >>= 13
            np.right_shift(single.view(np.uint32), 16, out=spare)
            spare &= 0x8000
            magnitude |= spare
            np.copyto(out.view(np.uint16), magnitude, casting="unsafe")
            return
    np.copyto(out, single, casting="same_kind")


def _widen(half: np.ndarray, out: np.ndarray, name: str) -> np.ndarray:
    """float16/bfloat16 chunk -> float32 (exact)."""
    out = out[: half.size]
    if name == "float16":
        _widen_float16(half, out)
    else:
        np.left_shift(half, 16, out=out.view(np.uint32), dtype=np.uint32)
    return out


def _narrow(single: np.ndarray, out: np.ndarray, name: str) -> None:
    """float32 chunk -> float16/bfloat16, round to nearest even; NaN stays NaN."""
    if name == "float16":
        _narrow_float16(single, out)
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
    if np.isnan(single.max()):  # one read pass; the mask only when there is a NaN
        nan = np.isnan(single, out=scratch.nan[:n])
        out[nan] = 0x7FC0


#: per reduction: (NumPy's ufunc, torch's function, the compiled loops' number)
_KINDS = {
    ReduceOp.SUM: (np.add, "add", 0),
    ReduceOp.PRODUCT: (np.multiply, "mul", 1),
    ReduceOp.MIN: (np.minimum, "minimum", 2),
    ReduceOp.MAX: (np.maximum, "maximum", 3),
}


def _torch_step(incoming: np.ndarray, result: np.ndarray, op_name: str, name: str) -> bool:
    """``result = incoming (op) result`` with torch's kernels if torch is imported (and both
    buffers are writable views torch can share); False when it did nothing."""
    torch = sys.modules.get("torch")
    if torch is None or KERNELS not in ("auto", "torch") or not (incoming.flags.writeable and result.flags.writeable):
        return False
    half = getattr(torch, name)
    right = torch.from_numpy(result.view(np.int16)).view(half)
    getattr(torch, op_name)(torch.from_numpy(incoming.view(np.int16)).view(half), right, out=right)
    return True


#: Overflow to inf and NaN arithmetic are results here, as on the GPU, not something to warn about
#: from inside an MPI callback.
def _quiet() -> "np.errstate":
    return np.errstate(over="ignore", invalid="ignore")


def half_reduction(kind: ReduceOp, dtype: DType) -> Callable[[object, object, object], None]:
    """An MPI user-op function ``inout = in (op) inout`` for float16/bfloat16 elements."""
    _warn_fallback()
    ufunc, op_name, native_kind = _KINDS[kind]
    storage = storage_dtype(dtype)
    name = dtype.name
    native_type = _NATIVE_TYPES[name]

    def reduce_halves(inbuf: object, inoutbuf: object, datatype: object) -> None:
        incoming = np.frombuffer(inbuf, storage)  # type: ignore[call-overload]
        result = np.frombuffer(inoutbuf, storage)  # type: ignore[call-overload]
        if not result.size:
            return
        if _use_native():
            _native.reduce(native_type, native_kind, _address(incoming), _address(result), result.size)
            return
        if _torch_step(incoming, result, op_name, name):
            return
        scratch = _scratch
        with _quiet():
            for start, stop in _chunks(result):
                left = _widen(incoming[start:stop], scratch.left, name)
                right = _widen(result[start:stop], scratch.right, name)
                ufunc(left, right, out=right)
                _narrow(right, result[start:stop], name)

    return reduce_halves


def _chunks(view: np.ndarray) -> Iterator[Tuple[int, int]]:
    for start in range(0, view.size, CHUNK):
        yield start, start + CHUNK


def _scale_halves(destination: np.ndarray, source: np.ndarray, divide: bool, by: float, name: str) -> None:
    """``destination = source * by`` (or ``/ by``) for float16/bfloat16, computed in float32."""
    _warn_fallback(4)  # the warning names the caller of scale or divide
    if _use_native(destination, source):
        _native.scale(_NATIVE_TYPES[name], int(divide), _address(source), _address(destination), source.size, by)
        return
    scratch = _scratch
    with _quiet():
        for start, stop in _chunks(source):
            single = _widen(source[start:stop], scratch.left, name)
            if divide:
                single /= np.float32(by)
            else:
                single *= np.float32(by)
            _narrow(single, destination[start:stop], name)


def scale(destination: np.ndarray, source: np.ndarray, factor: float, dtype: DType) -> None:
    """``destination = source * factor`` in the dtype's arithmetic (may alias exactly)."""
    if dtype.name in _HALVES:
        _scale_halves(destination, source, False, factor, dtype.name)
    elif dtype.kind in "iu":
        np.multiply(source, int(factor), out=destination, casting="unsafe")
    else:
        np.multiply(source, factor, out=destination)


def divide(view: np.ndarray, divisor: int, dtype: DType) -> None:
    """``view /= divisor`` in place; integers truncate toward zero, as NCCL's average does."""
    if dtype.name in _HALVES:
        _scale_halves(view, view, True, float(divisor), dtype.name)
    elif dtype.kind in "iu":
        if divisor > np.iinfo(view.dtype).max:  # NumPy refuses a divisor the dtype cannot hold
            for start, stop in _chunks(view):
                wide: np.ndarray = view[start:stop].astype(np.int64)
                view[start:stop] = np.sign(wide) * (np.abs(wide) // divisor)
            return
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


__all__: Tuple[str, ...] = (
    "HalfKernelsWarning", "MISSING_NATIVE", "host_view", "native_available", "half_reduction", "scale", "divide",
    "scaled_copy", "is_half", "storage_dtype",
)
