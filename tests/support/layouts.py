"""Test helpers for memory layouts: a brute-force oracle, and arrays built with exact strides.

The oracle enumerates every element's offset and never uses ``denseccl.layout``, so the pure
core can be tested against it. The builders make NumPy arrays or torch CPU tensors with given
element strides (negative ones included, for NumPy) over a buffer of exactly ``numel`` elements.
"""

from __future__ import annotations

from math import prod
from typing import Any, Optional, Sequence, Tuple

import numpy as np

# -- the oracle --------------------------------------------------------------------------------


def offsets(shape: Sequence[int], strides: Sequence[int]) -> np.ndarray:
    """Offset (in elements) of every element, in logical row-major order."""
    total = np.zeros(tuple(shape), dtype=np.int64)
    for d, (size, stride) in enumerate(zip(shape, strides)):
        index_shape = [1] * len(shape)
        index_shape[d] = size
        total = total + (np.arange(size, dtype=np.int64) * stride).reshape(index_shape)
    return total.reshape(-1)


def oracle_dense(shape: Sequence[int], strides: Sequence[int]) -> bool:
    """Dense iff the offsets are exactly ``numel`` distinct consecutive integers (or empty)."""
    numel = prod(shape)
    if numel == 0:
        return True
    found = np.sort(offsets(shape, strides))
    return bool(np.array_equal(found, np.arange(found[0], found[0] + numel)))


def oracle_span(shape: Sequence[int], strides: Sequence[int]) -> Tuple[int, int]:
    """``(lowest offset, numel)`` of a non-empty array."""
    found = offsets(shape, strides)
    return int(found.min()), int(found.size)


def oracle_row_major(shape: Sequence[int]) -> Tuple[int, ...]:
    """Row-major element strides, as NumPy computes them."""
    return tuple(s // 8 for s in np.empty(tuple(shape), np.float64).strides)


def oracle_dense_strides(shape: Sequence[int], outer_to_inner: Sequence[int]) -> Tuple[int, ...]:
    """Element strides of a dense array whose dims are laid out outermost-first in
    ``outer_to_inner`` (NumPy does it: allocate the permuted shape, transpose back)."""
    permuted = np.empty(tuple(shape[d] for d in outer_to_inner), np.float64)
    back = permuted.transpose(tuple(np.argsort(outer_to_inner)))
    return tuple(s // 8 for s in back.strides)


def make_strides(
    shape: Sequence[int],
    outer_to_inner: Sequence[int],
    flips: Sequence[int] = (),
    size1_strides: Optional[Sequence[int]] = None,
) -> Tuple[int, ...]:
    """Dense element strides: a permutation of dims, some dims flipped (negative strides), and
    arbitrary strides on size-1 dims (``size1_strides[d]`` is used where ``shape[d] == 1``)."""
    strides = list(oracle_dense_strides(shape, outer_to_inner))
    for d in flips:
        strides[d] = -strides[d]
    if size1_strides is not None:
        for d, size in enumerate(shape):
            if size == 1:
                strides[d] = size1_strides[d]
    return tuple(strides)


# -- arrays with exact strides -----------------------------------------------------------------

TORCH_DTYPES = {
    "bool": "bool",
    "int8": "int8",
    "uint8": "uint8",
    "int16": "int16",
    "int32": "int32",
    "int64": "int64",
    "uint64": "uint64",
    "float16": "float16",
    "bfloat16": "bfloat16",
    "float32": "float32",
    "float64": "float64",
    "complex64": "complex64",
    "complex128": "complex128",
}


def torch_dtype(name: str) -> Any:
    import torch

    return getattr(torch, TORCH_DTYPES[name])


def empty_strided(shape: Sequence[int], strides: Sequence[int], dtype: str, lib: str = "numpy") -> Any:
    """A new array with exactly these element strides over a buffer of ``numel`` elements."""
    shape, strides = tuple(shape), tuple(strides)
    numel = prod(shape)
    if lib == "torch":
        import torch

        assert all(s >= 0 for s in strides), "torch has no negative strides"
        return torch.empty_strided(shape, strides, dtype=torch_dtype(dtype))
    item = np.dtype(dtype)
    lowest = sum((size - 1) * stride for size, stride in zip(shape, strides) if stride < 0) if numel else 0
    base = np.empty(numel, item)
    return np.ndarray(
        shape, item, buffer=base, offset=-lowest * item.itemsize, strides=tuple(s * item.itemsize for s in strides)
    )


def filled(values: np.ndarray, strides: Sequence[int], dtype: str, lib: str = "numpy") -> Any:
    """An array with these element strides whose logical content is ``values``."""
    array = empty_strided(values.shape, strides, dtype, lib)
    assign(array, values)
    return array


def assign(array: Any, values: np.ndarray) -> None:
    """``array[...] = values`` for NumPy arrays and torch tensors (through float32 for bfloat16)."""
    if isinstance(array, np.ndarray):
        array[...] = values
        return
    import torch

    source = torch.from_numpy(np.array(values, order="C", copy=True))
    array.copy_(source.to(array.dtype))


def to_numpy(array: Any) -> np.ndarray:
    """The logical values of an array as a NumPy array (bfloat16 and float16 widened to float64)."""
    if isinstance(array, np.ndarray):
        return np.array(array, copy=True)
    import torch

    if array.dtype in (torch.bfloat16, torch.float16):
        return array.detach().to(torch.float64).numpy().copy()
    return array.detach().numpy().copy()


def element_strides(array: Any) -> Tuple[int, ...]:
    if isinstance(array, np.ndarray):
        return tuple(s // array.itemsize for s in array.strides)
    return tuple(array.stride())


def raw_bytes(array: Any) -> bytes:
    """The bytes of an array's whole storage (for 'untouched' checks, padding included)."""
    if isinstance(array, np.ndarray):
        if array.dtype.hasobject:
            return repr(array.tolist()).encode()
        base = array
        while isinstance(base.base, np.ndarray):
            base = base.base
        return bytes(np.ascontiguousarray(base).view(np.uint8).reshape(-1)) + bytes(
            np.ascontiguousarray(array).view(np.uint8).reshape(-1)
        )
    import torch

    return torch.empty(0, dtype=torch.uint8).set_(array.untyped_storage()).numpy().tobytes()
