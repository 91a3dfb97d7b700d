"""Every collective x op x dtype x layout on real ranks (mpiexec -n 2, 3, 4).

Hypothesis generates a BATCH of case specs here, in the pytest process; one mpiexec runs the
whole batch (tests/mpi/ranks/collectives.py), where every rank rebuilds all ranks' inputs from
(seed, rank) and checks its result against an independent NumPy reference.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any, Dict, List

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from tests.support.checker import expect_summaries
from tests.support.optional import needs_torch, torch
from tests.support.ranks import run_ranks

pytestmark = pytest.mark.mpi

RANKS = Path(__file__).parent / "ranks"
SCRIPT = RANKS / "collectives.py"
ENV = {"DENSECCL_TIMEOUT": "20"}

NUMPY_DTYPES = [
    "float16", "float32", "float64", "int8", "uint8", "int16", "int32", "int64", "uint64", "bool", "complex64",
    "complex128",
]
TORCH_DTYPES = ["bfloat16", "float16", "float32", "int64", "int8", "uint8", "bool", "complex64"]
REDUCING = ["allreduce", "reduce", "reduce_scatter"]
MODES = {"allreduce": ["inplace", "out"], "reduce": ["inplace", "out"], "reduce_scatter": ["new", "out"],
         "allgather": ["new", "out", "own_block"], "broadcast": ["inplace"], "barrier": ["inplace"]}


def ops_for(dtype: str) -> List[str]:
    if dtype == "bool":
        return ["sum", "prod", "min", "max"]
    if dtype.startswith("complex"):
        return ["sum", "prod", "avg", "premul"]
    return ["sum", "prod", "min", "max", "avg", "premul"]


def premul_factors(dtype: str) -> List[float]:
    if dtype.startswith("uint"):
        return [1, 2, 3]
    if dtype.startswith("int"):
        return [2, 3, -2]
    return [0.5, 0.25, -1.5, 3.0]


def run_batch(nranks: int, cases: List[Dict[str, Any]], tmp_path: Path, timeout: float = 120) -> None:
    path = tmp_path / f"cases-{nranks}.json"
    path.write_text(json.dumps(cases))
    done = run_ranks(nranks, SCRIPT, [str(path)], timeout=timeout, env=ENV)
    expect_summaries(done.stdout, "collectives", nranks)


# -- hypothesis batches --------------------------------------------------------------------------


@st.composite
def cases(draw, libs=("numpy",)) -> Dict[str, Any]:
    lib = draw(st.sampled_from(libs))
    dtype = draw(st.sampled_from(NUMPY_DTYPES if lib == "numpy" else TORCH_DTYPES))
    collective = draw(
        st.sampled_from(["allreduce", "allreduce", "reduce", "broadcast", "allgather", "reduce_scatter", "barrier"])
    )
    op = None
    if collective in REDUCING:
        op = draw(st.sampled_from(ops_for(dtype)))
        if op == "premul":
            op = {"premul": draw(st.sampled_from(premul_factors(dtype)))}
    ndim = draw(st.integers(0, 4))
    shape = draw(st.lists(st.one_of(st.integers(1, 4), st.integers(0, 4)), min_size=ndim, max_size=ndim))
    order = draw(st.permutations(range(ndim)))
    flips = draw(st.lists(st.sampled_from(range(ndim)), unique=True)) if ndim and lib == "numpy" else []
    low = -9 if lib == "numpy" else 0
    odd = draw(st.lists(st.integers(low, 9), min_size=ndim, max_size=ndim))
    out_odd = draw(st.lists(st.integers(low, 9), min_size=ndim, max_size=ndim))
    return {
        "collective": collective,
        "dtype": dtype,
        "lib": lib,
        "op": op,
        "root": draw(st.integers(0, 3)),
        "shape": shape,
        "order": list(order),
        "flips": flips,
        "odd": odd,
        "out_odd": out_odd,
        "mode": draw(st.sampled_from(MODES[collective])),
        "async": draw(st.booleans()),
        "seed": draw(st.integers(0, 2**31)),
    }


BATCH = settings(
    max_examples=4,
    deadline=None,
    phases=[Phase.explicit, Phase.reuse, Phase.generate],  # no shrinking: each example is an mpiexec
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("nranks", [2, 3, 4])
@BATCH
@given(batch=st.lists(cases(), min_size=25, max_size=25))
def test_numpy_batches(nranks, batch, tmp_path):
    run_batch(nranks, batch, tmp_path)


@needs_torch
@pytest.mark.timeout(300)
@pytest.mark.parametrize("nranks", [2, 3])
@settings(BATCH, max_examples=2)
@given(batch=st.lists(cases(libs=("torch", "numpy")), min_size=25, max_size=25))
def test_torch_and_numpy_batches(nranks, batch, tmp_path):
    run_batch(nranks, batch, tmp_path)


# -- the full matrix, deterministically ---------------------------------------------------------

#: (shape, order, flips, size-1 strides) cycled through the matrix; torch cases drop flips and
#: negative size-1 strides.
LAYOUTS = [
    ((3, 4), (0, 1), (), (0, 0)),
    ((3, 4), (1, 0), (), (0, 0)),  # transposed
    ((2, 3, 2), (2, 0, 1), (1,), (0, 0, 0)),  # permuted and flipped
    ((4, 1, 3), (1, 2, 0), (0,), (0, 7, 0)),  # odd stride on a size-1 dim
    ((), (), (), ()),  # 0-d
    ((2, 1, 1, 3), (3, 2, 1, 0), (3,), (0, -5, 11, 0)),
    ((0, 3), (1, 0), (), (0, 0)),  # empty
    ((5,), (0,), (0,), (0,)),
]


def matrix(nranks: int) -> List[Dict[str, Any]]:
    out: List[Dict[str, Any]] = []
    layouts = itertools.cycle(LAYOUTS)
    seed = itertools.count(1000 * nranks)
    modes = {collective: itertools.cycle(choices) for collective, choices in MODES.items()}
    for lib, dtypes in (("numpy", NUMPY_DTYPES), ("torch", ["bfloat16", "float16"])):
        for dtype in dtypes:
            combos = [(c, op) for c in REDUCING for op in ops_for(dtype)]
            combos += [("broadcast", None), ("allgather", None)]
            for number, (collective, op) in enumerate(combos):
                shape, order, flips, odd = next(layouts)
                if lib == "torch":
                    flips, odd = (), tuple(abs(s) for s in odd)
                if op == "premul":
                    factors = premul_factors(dtype)
                    op = {"premul": factors[number % len(factors)]}
                out.append({
                    "collective": collective, "dtype": dtype, "lib": lib, "op": op, "root": number % nranks,
                    "shape": list(shape), "order": list(order), "flips": list(flips), "odd": list(odd),
                    "out_odd": [3] * len(shape), "mode": next(modes[collective]), "async": number % 3 == 0,
                    "seed": next(seed),
                })
    # long halves: several CHUNKs of the host kernels, exact on two ranks
    for lib, dtype in (("torch", "bfloat16"), ("numpy", "float16")):
        for op in ("sum", "avg", {"premul": 0.25}):
            out.append(
                {
                    "collective": "allreduce", "dtype": dtype, "lib": lib, "op": op, "root": 0, "shape": [300, 250],
                    "order": [1, 0], "flips": [], "odd": [0, 0], "out_odd": [0, 0], "mode": "out", "async": False,
                    "seed": next(seed),
                }
            )
    # large halves (over 1 MiB; an element count that 3 and 4 ranks do not divide): MPICH's
    # algorithms for user ops on long messages
    for lib, dtype in (("numpy", "float16"), ("torch", "bfloat16")):
        for number, (op, mode) in enumerate(
            (("sum", "inplace"), ("avg", "out"), ({"premul": 0.25}, "inplace"), ("max", "out"))
        ):
            out.append({
                "collective": "allreduce", "dtype": dtype, "lib": lib, "op": op, "root": 0,
                "shape": list(LARGE_HALF_SHAPE),
                "order": [1, 0], "flips": [0] if lib == "numpy" else [], "odd": [0, 0], "out_odd": [0, 0], "mode": mode,
                "async": number % 2 == 1, "seed": next(seed),
            })
    # broadcast from every root
    for root in range(nranks):
        out.append(
            {
                "collective": "broadcast", "dtype": "int32", "lib": "numpy", "op": None, "root": root, "shape": [2, 3],
                "order": [1, 0], "flips": [0], "odd": [0, 0], "out_odd": [0, 0], "mode": "inplace", "async": False,
                "seed": next(seed),
            }
        )
    out.append(dict(out[-1], collective="barrier"))
    return out


#: a float16/bfloat16 array of this shape holds over 1 MiB in a count 3 and 4 do not divide
LARGE_HALF_SHAPE = (1030, 517)


def test_matrix_covers_everything():
    cases_ = matrix(2)
    seen = {(c["dtype"], c["collective"], c["op"] if not isinstance(c["op"], dict) else "premul") for c in cases_}
    for dtype in NUMPY_DTYPES + ["bfloat16"]:
        for collective in REDUCING:
            for op in ops_for(dtype):
                assert (dtype, collective, op) in seen
    modes = {(c["collective"], c["mode"]) for c in cases_}
    assert all((c, m) in modes for c, ms in MODES.items() for m in ms if c != "barrier")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("nranks", [2, 3, 4])
def test_matrix(nranks, tmp_path):
    """The whole matrix; without torch (launch/versions' environments) its NumPy part."""
    cases = [case for case in matrix(nranks) if torch is not None or case["lib"] != "torch"]
    run_batch(nranks, cases, tmp_path, timeout=180)
