"""Benchmark cases: the four layouts, deterministic per-rank inputs, and the reference result
built from every rank's inputs (nccl-tests' ``-c 1`` check, counted in ``#wrong``).

Inputs are small integers (sums and products stay exact in every dtype, bfloat16 included), so
a result is right only if every element met its own counterparts on the other ranks: any
layout mix-up shows up as wrong elements.
"""

from __future__ import annotations

from typing import Any, Dict, List, NamedTuple, Optional, Tuple

import numpy as np

#: layout name -> (physical order of the logical dims N, C, H, W, outermost first; mirrored dims)
LAYOUT_SPECS: Dict[str, Tuple[Tuple[int, ...], Tuple[int, ...]]] = {
    "contiguous": ((0, 1, 2, 3), ()),
    "channels_last": ((0, 2, 3, 1), ()),
    "transposed": ((3, 2, 1, 0), ()),
    "reversed": ((0, 1, 2, 3), (0, 1, 2, 3)),
}

#: relative tolerance of a float result (results are exact except avg's division)
TOLERANCE = {"float16": 2e-3, "bfloat16": 1.6e-2, "float32": 1e-6, "float64": 1e-12}


def _prime_factors(n: int) -> List[int]:
    found, p = [], 2
    while p * p <= n:
        while n % p == 0:
            found.append(p)
            n //= p
        p += 1
    return found + ([n] if n > 1 else [])


def logical_shape(count: int) -> Tuple[int, int, int, int]:
    """An NCHW shape holding ``count`` elements: its prime factors go round-robin to C, H and
    W (up to 256, 64 and 64), the rest to N, so that the four layouts differ whenever
    ``count`` allows (1 Ki elements -> (1, 16, 8, 8); 16 Mi -> (16, 256, 64, 64))."""
    if count <= 0:
        return (0, 1, 1, 1)
    dims, caps = [1, 1, 1], (256, 64, 64)
    n = 1
    turn = 0
    for factor in _prime_factors(count):
        for attempt in range(3):
            d = (turn + attempt) % 3
            if dims[d] * factor <= caps[d]:
                dims[d] *= factor
                turn = d + 1
                break
        else:
            n *= factor
    return (n, dims[0], dims[1], dims[2])


class Arena:
    """Memory that every run of one group of cases shares (runner.run_group): one input and one
    output region per kind of memory, grown as needed, so that a comparison measures the
    collective, not where the allocator put each array (docs/benchmark.md, Same memory)."""

    def __init__(self) -> None:
        self._host: Dict[str, np.ndarray] = {}
        self._device: Dict[str, Any] = {}

    def host(self, nbytes: int, role: str) -> np.ndarray:
        """``nbytes`` of host memory (uint8, 64-byte aligned) for ``role``."""
        found = self._host.get(role)
        if found is None or found.size < nbytes:
            raw = np.empty(nbytes + 64, np.uint8)
            start = -raw.ctypes.data % 64
            found = self._host[role] = raw[start : start + nbytes]
        return found[:nbytes]

    def device(self, nbytes: int, role: str) -> Any:
        """``nbytes`` of device memory (a CuPy uint8 array) for ``role``."""
        found = self._device.get(role)
        if found is None or found.size < nbytes:
            import cupy  # noqa: PLC0415

            found = self._device[role] = cupy.empty(nbytes, cupy.uint8)
        return found[:nbytes]


def build(lib: Any, shape: Tuple[int, ...], dtype: str, layout: str, stacked: int = 0, *,
          arena: Optional[Arena] = None, role: str = "input") -> Any:
    """An uninitialised array of logical ``shape`` with ``layout``; with ``stacked = n`` a
    stacked buffer ``(n, *shape)`` whose blocks have that layout (dim 0 outermost). With an
    ``arena`` the memory is the arena's region for ``role`` ("input" or "output")."""
    order, mirrored = LAYOUT_SPECS[layout]
    if stacked:
        order = (0, *(d + 1 for d in order))
        mirrored = tuple(d + 1 for d in mirrored)
        shape = (stacked, *shape)
    physical = lib.empty([shape[d] for d in order], dtype, arena=arena, role=role)
    logical = lib.permute(physical, tuple(int(i) for i in np.argsort(order)))
    return lib.mirror(logical, mirrored)


def buffers(lib: Any, case: "Case", layout: str, arena: Optional[Arena] = None) -> Tuple[Any, Any]:
    """``(input, output)`` of ``case`` in ``layout``: the stacked buffer is allgather's output and
    reduce-scatter's input; the other collectives run in place (the output is the input)."""

    def make(stacked: int, role: str) -> Any:
        return build(lib, case.shape, case.dtype, layout, stacked, arena=arena, role=role)

    if case.collective == "allgather":
        return make(0, "input"), make(case.nranks, "output")
    if case.collective == "reduce_scatter":
        return make(case.nranks, "input"), make(0, "output")
    x = make(0, "input")
    return x, x


class Case(NamedTuple):
    """One table row's problem: collective, element type, op, root, count (as nccl-tests
    counts it), layout, and the job's shape."""

    collective: str
    dtype: str
    op: Optional[str]
    root: int
    count: int  # type: ignore[assignment]  # the field shadows tuple.count, as nccl-tests names it
    layout: str
    nranks: int
    rank: int

    @property
    def shape(self) -> Tuple[int, int, int, int]:
        """Logical shape of the per-rank array (of one block for allgather/reduce_scatter)."""
        return logical_shape(self.count)


def input_values(case: Case, rank: int, block: Optional[int] = None) -> np.ndarray:
    """Rank ``rank``'s input, flat in logical order; ``block`` selects one block of a
    reduce-scatter input. float64 for float types, int64 otherwise."""
    i = np.arange(case.count, dtype=np.int64)
    salt = rank * 5 + (0 if block is None else block * 3)
    signed = not case.dtype.startswith("uint")
    if case.op == "prod":
        values = np.where((i + salt) % 7 == 0, 2, 1)
        if signed:
            values = np.where((i + salt) % 3 == 0, -values, values)
    else:
        values = (i * 7 + salt) % 11
        if signed:
            values -= 5
    return values.astype(np.float64) if case.dtype.startswith(("float", "bfloat")) else values


#: how an op combines two ranks' values (avg sums, then divides)
_COMBINE = {"sum": np.add, "avg": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum}


def _reduce(case: Case, block: Optional[int]) -> np.ndarray:
    """The reduction over ranks, in the dtype's integer arithmetic or exactly in float64."""
    combine = _COMBINE.get(case.op)  # type: ignore[arg-type]
    if combine is None:
        raise ValueError(f"unknown op {case.op!r}")
    dtype: Any = np.float64 if case.dtype.startswith(("float", "bfloat")) else np.dtype(case.dtype)
    result = input_values(case, 0, block).astype(dtype)
    for rank in range(1, case.nranks):
        combine(result, input_values(case, rank, block).astype(dtype), out=result, casting="unsafe")
    if case.op == "avg":
        if dtype == np.float64:
            result = result / case.nranks
        else:
            result = np.trunc(result.astype(np.float64) / case.nranks).astype(dtype)
    return result


def expected(case: Case) -> np.ndarray:
    """What this rank must hold after the collective, flat in logical order (the whole
    stacked buffer for allgather)."""
    c = case.collective
    if c == "allreduce":
        return _reduce(case, None)
    if c == "reduce":
        return _reduce(case, None) if case.rank == case.root else input_values(case, case.rank)
    if c == "broadcast":
        return input_values(case, case.root)
    if c == "allgather":
        return np.concatenate([input_values(case, r) for r in range(case.nranks)])
    if c == "reduce_scatter":
        return _reduce(case, case.rank)
    raise ValueError(f"unknown collective {c!r}")


def source_values(case: Case) -> np.ndarray:
    """This rank's input, flat in logical order (the whole stacked input for reduce-scatter)."""
    if case.collective == "reduce_scatter":
        return np.concatenate([input_values(case, case.rank, b) for b in range(case.nranks)])
    return input_values(case, case.rank)


def count_wrong(case: Case, got: np.ndarray, want: np.ndarray) -> int:
    """Elements of ``got`` (any shape, logical order) that differ from ``want``."""
    got = np.asarray(got).reshape(-1)
    if got.size != want.size:
        return int(want.size)
    tolerance = TOLERANCE.get(case.dtype)
    if tolerance is None:
        return int(np.count_nonzero(got.astype(want.dtype) != want))
    got = got.astype(np.float64)
    close = np.abs(got - want) <= tolerance * np.maximum(np.abs(want), 1.0)
    return int(close.size - np.count_nonzero(close))
