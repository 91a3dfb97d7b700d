"""Shared by the rank programs: deterministic inputs from (seed, rank), an independent NumPy
reference of every collective built from ALL ranks' inputs. They report through
``tests.support.checker.Checker``.

Every rank rebuilds every other rank's input locally (same seed, same rank number), so each
rank can check its own result without trusting any data that came over the wire.
"""

from __future__ import annotations

import json
import time
import traceback
from math import prod
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from tests.support.checker import Checker
from tests.support.layouts import element_strides, empty_strided, filled, make_strides, raw_bytes, to_numpy

FLOATS = {"float16", "bfloat16", "float32", "float64"}
HALVES = {"float16", "bfloat16"}
COMPLEX = {"complex64", "complex128"}
INTS = {"int8", "uint8", "int16", "int32", "int64", "uint64"}
#: unit roundoff of each float type (twice it, to be safe on ties)
EPS = {
    "float16": 2.0**-10, "bfloat16": 2.0**-7, "float32": 2.0**-23, "float64": 2.0**-52, "complex64": 2.0**-23,
    "complex128": 2.0**-52,
}


def load_cases(path: str) -> List[Dict[str, Any]]:
    with open(path) as handle:
        return json.load(handle)


# -- building inputs ---------------------------------------------------------------------------


def op_name(op: Any) -> str:
    return f"premul({op['premul']})" if isinstance(op, dict) else op


def as_denseccl_op(op: Any) -> Any:
    import denseccl

    return denseccl.PreMulSum(op["premul"]) if isinstance(op, dict) else op


def op_kind(op: Any) -> str:
    return "premul" if isinstance(op, dict) else op


def values(case: Dict[str, Any], rank: int, shape: Sequence[int], salt: int = 0) -> np.ndarray:
    """The logical values rank ``rank`` puts in, as a NumPy array (bfloat16 as float32)."""
    rng = np.random.default_rng([case["seed"], rank, salt])
    dtype, kind, size = case["dtype"], op_kind(case.get("op", "sum")), case["size"]
    shape = tuple(shape)
    if dtype == "bool":
        return rng.random(shape) < (0.8 if kind in ("prod", "min") else 0.3)
    if dtype in INTS:
        info = np.iinfo(dtype)
        if (
            kind in ("min", "max", None)
            or case["collective"] in ("broadcast", "allgather")
            or (dtype == "uint64" and kind != "avg")
        ):
            return rng.integers(int(info.min), int(info.max), size=shape, dtype=dtype, endpoint=True)
        if kind == "prod":
            return rng.integers(-3 if info.min else 0, 3, size=shape, dtype=dtype, endpoint=True)
        limit = min(int(info.max) // (size * 4), 10**12)
        return rng.integers(-limit if info.min else 0, limit, size=shape, dtype=dtype, endpoint=True)
    if kind == "prod":
        magnitude = rng.uniform(0.5, 2.0, shape) * rng.choice([-1.0, 1.0], shape)
    else:
        magnitude = rng.standard_normal(shape) * 4
    if dtype in COMPLEX:
        other = rng.uniform(0.5, 2.0, shape) if kind == "prod" else rng.standard_normal(shape) * 4
        return (magnitude + 1j * other).astype(dtype)
    return magnitude.astype("float32" if dtype == "bfloat16" else dtype)


def strides_for(case: Dict[str, Any], size1: Optional[Sequence[int]] = None) -> tuple:
    shape = case["shape"]
    return make_strides(shape, case["order"], case["flips"], size1 if size1 is not None else case["odd"])


def build(case: Dict[str, Any], value: np.ndarray, strides: Sequence[int]) -> Any:
    return filled(value, strides, case["dtype"], case["lib"])


def sentinel_like(case: Dict[str, Any], shape: Sequence[int], strides: Sequence[int]) -> Any:
    """A buffer whose content is recognisable: 'untouched' means still equal to it."""
    value = np.zeros(tuple(shape), np.float32 if case["dtype"] == "bfloat16" else case["dtype"])
    if case["dtype"] != "bool":
        value = value + 7
    return filled(value.astype(value.dtype), strides, case["dtype"], case["lib"])


# -- the reference -------------------------------------------------------------------------------


def _round(x32: np.ndarray, dtype: str) -> np.ndarray:
    """float32 -> dtype, round to nearest even, returned widened to float64."""
    if dtype == "bfloat16":
        import torch

        single = np.array(x32, np.float32, order="C", copy=True)
        return torch.from_numpy(single).to(torch.bfloat16).to(torch.float64).numpy().reshape(single.shape)
    return np.asarray(x32, np.float32).astype(dtype).astype(np.float64)


def exact_pairwise(inputs: List[np.ndarray], dtype: str, op: Any, size: int) -> np.ndarray:
    """Two ranks: the result is one pairwise step, so it is exact in the dtype's arithmetic
    (halves: computed in float32, rounded once)."""
    kind = op_kind(op)
    work = "float32" if dtype in HALVES else dtype
    a, b = (np.asarray(x, work) for x in inputs)
    if kind == "premul":
        factor = op["premul"]
        a, b = (x * np.float32(factor) if work == "float32" else x * factor for x in (a, b))
        if dtype in HALVES:
            a, b = _round(a, dtype).astype(np.float32), _round(b, dtype).astype(np.float32)
        a, b = a.astype(work), b.astype(work)
    ufunc = {"sum": np.add, "avg": np.add, "premul": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum}[
        kind
    ]
    result = ufunc(a, b)
    if dtype in HALVES:
        result = _round(result, dtype).astype(np.float32)
    if kind == "avg":
        result = result / np.asarray(size, work)
        if dtype in HALVES:
            result = _round(result, dtype).astype(np.float32)
    return np.asarray(result, np.float64)


def reference(inputs: List[np.ndarray], dtype: str, op: Any, size: int) -> np.ndarray:
    """Reduce the ranks' inputs (as read back from the arrays) elementwise."""
    kind = op_kind(op)
    if dtype == "bool":
        stack = np.stack(inputs)
        return stack.any(0) if kind in ("sum", "max") else stack.all(0)
    if dtype in INTS:
        parts = [np.asarray(x, dtype) for x in inputs]
        if kind == "premul":
            parts = [np.multiply(x, int(op["premul"]), dtype=dtype, casting="unsafe") for x in parts]
        ufunc = {
            "sum": np.add, "avg": np.add, "premul": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum,
        }[kind]
        result = parts[0].copy()
        for part in parts[1:]:
            result = ufunc(result, part, dtype=dtype)  # wraps like C
        if kind == "avg":
            if np.iinfo(dtype).min < 0:
                wide = result.astype(np.int64)
                result = np.where(wide < 0, -((-wide) // size), wide // size).astype(dtype)
            else:
                result = result // np.asarray(size, dtype)
        return result
    wide = np.complex128 if dtype in COMPLEX else np.float64
    parts = [np.asarray(x, wide) for x in inputs]
    if kind == "premul":
        parts = [x * op["premul"] for x in parts]
    if kind in ("sum", "avg", "premul"):
        result = np.sum(parts, axis=0)
        return result / size if kind == "avg" else result
    if kind == "prod":
        return np.prod(parts, axis=0)
    return (np.min if kind == "min" else np.max)(parts, axis=0)


def tolerance(inputs: List[np.ndarray], dtype: str, op: Any, size: int) -> np.ndarray:
    kind = op_kind(op)
    parts = [np.abs(np.asarray(x, np.complex128)) for x in inputs]
    if kind == "prod":
        magnitude = np.prod(parts, axis=0)
    else:
        factor = abs(op["premul"]) if kind == "premul" else 1.0
        magnitude = np.sum(parts, axis=0) * factor
    return (size + 2) * EPS[dtype] * magnitude + 1e-30


def compare(
    check: Checker, what: str, actual: np.ndarray, inputs: List[np.ndarray], dtype: str, op: Any, size: int
) -> None:
    """Exact for integers, bool, min/max and any two-rank real float result; within a rounding
    bound otherwise (the order of an n-rank float reduction is MPI's choice)."""
    expected = reference(inputs, dtype, op, size)
    if expected.shape != actual.shape:
        check.fail(f"{what}: shape {actual.shape}, expected {expected.shape}")
        return
    kind = op_kind(op)
    if dtype in INTS or dtype == "bool" or kind in ("min", "max"):
        ok = np.array_equal(actual, expected.astype(actual.dtype) if dtype in INTS or dtype == "bool" else expected)
    elif size == 2 and dtype in FLOATS:
        expected = exact_pairwise(inputs, dtype, op, size)
        ok = np.array_equal(np.asarray(actual, np.float64), expected)
    else:
        ok = bool(np.all(np.abs(np.asarray(actual, np.complex128) - expected) <= tolerance(inputs, dtype, op, size)))
    if not ok:
        diff = _first_difference(np.asarray(actual), np.asarray(expected))
        check.fail(f"{what}: wrong result ({diff})")


def _first_difference(actual: np.ndarray, expected: np.ndarray) -> str:
    flat_a, flat_e = actual.reshape(-1), expected.reshape(-1)
    for i in range(flat_a.size):
        if flat_a[i] != flat_e[i]:
            return (
                f"first at flat index {i}: got {flat_a[i]!r}, expected {flat_e[i]!r}; "
                f"{np.sum(flat_a != flat_e)} of {flat_a.size} differ"
            )
    return "shapes or dtypes differ"


def same_values(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and np.array_equal(a, b)


def wait_for(work: Any, seconds: float = 60.0) -> Any:
    """Poll a Work until is_completed(), then wait() for its result."""
    started = time.monotonic()
    while not work.is_completed():
        if time.monotonic() - started > seconds:
            raise TimeoutError("Work never completed")
        time.sleep(0.001)
    return work.wait()


def describe(case: Dict[str, Any]) -> str:
    keys = ("collective", "dtype", "lib", "op", "root", "shape", "order", "flips", "odd", "mode", "async", "seed")
    return json.dumps({k: case.get(k) for k in keys})


__all__ = [
    "build",
    "compare",
    "describe",
    "element_strides",
    "empty_strided",
    "load_cases",
    "prod",
    "raw_bytes",
    "same_values",
    "sentinel_like",
    "strides_for",
    "to_numpy",
    "traceback",
    "values",
    "wait_for",
]
