"""The shared-memory engine's calls (backends/shm) on threads as ranks, each with a board step
of its own (``ShmTransport``'s Transport methods): hypothesis-drawn collectives, sizes, dtypes
and ops at 2 and 3 ranks, three rounds in a row (both halves of the area, rewritten), against
NumPy over every rank's input; the same bits on every rank. Real ranks: tests/torch/test_shm_calls.py."""

from __future__ import annotations

from typing import Any, List

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from denseccl.dtypes import DTYPES  # noqa: E402
from denseccl.ops import ReduceOp  # noqa: E402

from .shm_threads import engines, on_threads  # noqa: E402

LIMIT = 512
#: dtype -> the ops the gloo engine takes on it
OPS = {
    "float32": ["sum", "prod", "min", "max", "avg"],
    "float64": ["sum", "avg", "max"],
    "float16": ["sum", "min", "avg"],
    "bfloat16": ["sum", "max", "avg"],
    "int8": ["sum", "prod", "min", "max", "avg"],
    "int32": ["sum", "min", "avg"],
    "int64": ["sum", "prod", "max", "avg"],
    "uint8": ["sum", "max"],
    "bool": ["sum", "prod", "min", "max"],
    "complex64": ["sum", "avg"],
}
KINDS = {"sum": ReduceOp.SUM, "prod": ReduceOp.PRODUCT, "min": ReduceOp.MIN, "max": ReduceOp.MAX, "avg": ReduceOp.AVG}


def inputs(size: int, count: int, dtype: str, seed: int) -> List[torch.Tensor]:
    """Small whole numbers per rank (every sum and product exact in every dtype)."""
    rng = np.random.default_rng(seed)
    low = 0 if dtype in ("uint8", "bool") else -4
    high = 2 if dtype == "bool" else 5
    return [torch.tensor(rng.integers(low, high, count)).to(getattr(torch, dtype)) for _ in range(size)]


def reference(op: str, arrays: List[torch.Tensor]) -> torch.Tensor:
    """NumPy's reduction of ``arrays`` in rank order (bfloat16: in float32, rounded once)."""
    dtype = arrays[0].dtype
    values = [a.to(torch.float32).numpy() if dtype == torch.bfloat16 else a.numpy() for a in arrays]
    if dtype == torch.bool:
        out = np.logical_or.reduce(values) if op in ("sum", "max") else np.logical_and.reduce(values)
        return torch.from_numpy(np.asarray(out))
    ufunc = {"sum": np.add, "avg": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum}[op]
    out = values[0].copy()
    for v in values[1:]:
        out = ufunc(out, v)
    if op == "avg":
        if np.issubdtype(out.dtype, np.integer):
            out = (np.abs(out) // len(values) * np.sign(out)).astype(out.dtype)
        else:
            out = (out / np.asarray(len(values), dtype=out.dtype)).astype(out.dtype)
    return torch.from_numpy(np.asarray(out)).to(dtype)


def ptr(t: torch.Tensor) -> int:
    return int(t.data_ptr())


@settings(max_examples=40, deadline=None)
@given(
    size=st.sampled_from([2, 3]),
    dtype=st.sampled_from(sorted(OPS)),
    collective=st.sampled_from(["allreduce", "reduce", "broadcast", "allgather", "reduce_scatter"]),
    count=st.integers(1, 40),
    in_place=st.booleans(),
    data=st.data(),
)
def test_calls_against_numpy(size: int, dtype: str, collective: str, count: int, in_place: bool, data: Any) -> None:
    op = data.draw(st.sampled_from(OPS[dtype]))
    root = data.draw(st.integers(0, size - 1))
    itemsize = torch.empty(0, dtype=getattr(torch, dtype)).element_size()
    limit_count = LIMIT // itemsize // (size if collective == "reduce_scatter" else 1)
    count = min(count, limit_count)
    ranks = engines(size, LIMIT)
    dt = DTYPES[dtype]
    rounds = [inputs(size, count * (size if collective == "reduce_scatter" else 1), dtype, seed) for seed in range(3)]

    def rank_work(rank: int) -> List[torch.Tensor]:
        engine, kind, got = ranks[rank], KINDS[op], []
        for per_rank in rounds:
            x = per_rank[rank].clone()
            if collective == "allgather":
                out = torch.empty(size * count, dtype=x.dtype)
                if in_place:
                    out[rank * count : (rank + 1) * count] = x
                    x = out[rank * count : (rank + 1) * count]
                assert engine.allgather(ptr(x), ptr(out), count, dt).test()
            elif collective == "reduce_scatter":
                out = x[rank * count : (rank + 1) * count] if in_place else torch.empty(count, dtype=x.dtype)
                assert engine.reduce_scatter(ptr(x), ptr(out), count, dt, kind).test()
                out = out.clone()
            elif collective == "broadcast":
                out = x
                assert engine.broadcast(ptr(x), count, dt, root).test()
            else:
                out = x if in_place else torch.empty_like(x)
                call = engine.allreduce if collective == "allreduce" else engine.reduce
                args = (ptr(x), ptr(out), count, dt, kind) + ((root,) if collective == "reduce" else ())
                assert call(*args).test()  # type: ignore[operator]
                if collective == "reduce" and rank != root:
                    assert torch.equal(x, per_rank[rank]), "a non-root's input was written"
                    out = None  # type: ignore[assignment]
            got.append(out)
        return got

    results = on_threads(size, rank_work)
    for index, per_rank in enumerate(rounds):
        for rank in range(size):
            got = results[rank][index]
            if collective == "allgather":
                expected = torch.cat(per_rank)
            elif collective == "broadcast":
                expected = per_rank[root]
            elif collective == "reduce_scatter":
                expected = reference(op, [x[rank * count : (rank + 1) * count] for x in per_rank])
            elif collective == "reduce" and rank != root:
                continue
            else:
                expected = reference(op, per_rank)
            assert got.view(torch.uint8).tolist() == expected.contiguous().view(torch.uint8).tolist(), (
                f"{collective} {op} {dtype} round {index} rank {rank}: {got} != {expected}"
            )


@pytest.mark.parametrize("size", [2, 3])
def test_barriers_and_mixed_calls_in_a_row(size: int) -> None:
    """Barriers between gathers (each a board step): both halves of the area rewritten many times."""
    ranks, dt = engines(size, 64), DTYPES["int32"]

    def rank_work(rank: int) -> List[List[int]]:
        seen = []
        for call in range(20):
            assert ranks[rank].barrier().test()
            x = torch.full((4,), 100 * call + rank, dtype=torch.int32)
            out = torch.empty(4 * size, dtype=torch.int32)
            assert ranks[rank].allgather(ptr(x), ptr(out), 4, dt).test()
            seen.append(out[::4].tolist())
        return seen

    for seen in on_threads(size, rank_work):
        assert seen == [[100 * call + r for r in range(size)] for call in range(20)]
