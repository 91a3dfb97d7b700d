"""The shared-memory engine (denseccl/backends/shm), which the gloo engine hands its small calls
to, on real ranks: torchrun with 2 ranks and 4 ranks on one core, mp.spawn with 3.
tests/torch/ranks/host_path.py has the cases: every dtype and op, layouts, ranks that run
ahead, back-to-back calls (which caught a single slot per rank: 50-350 wrong results in 3000),
a rank on the general path, a rank whose engine refuses, barriers, a mismatch, the calls that
stay on gloo, and drawn layouts of every collective but all-to-all."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any, Dict

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

pytest.importorskip("torch")

from denseccl.channel import segment
from tests.support.checker import expect_passed
from tests.torch.launchers import run

PROGRAM = Path(__file__).parent / "ranks" / "host_path.py"
pytestmark = [pytest.mark.torch, pytest.mark.skipif(not segment.available(), reason="no memfd_create here")]
TASKSET = shutil.which("taskset")


def test_host_path_under_torchrun() -> None:
    done = run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(PROGRAM)],
               timeout=300)
    expect_passed(done, 2)


@pytest.mark.skipif(TASKSET is None, reason="taskset is not installed")
def test_host_path_with_four_ranks_on_one_core() -> None:
    done = run([TASKSET, "-c", "0", sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                "4", str(PROGRAM)], timeout=400)
    expect_passed(done, 4)


def test_host_path_under_spawn() -> None:
    done = run([sys.executable, str(PROGRAM), "spawn", "3"], timeout=300)
    expect_passed(done, 3)


def test_host_path_turned_off() -> None:
    done = run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(PROGRAM)],
               timeout=300, env={"DENSECCL_HOST_PATH": "0"})
    expect_passed(done, 2)


def test_a_rank_paused_between_the_step_and_its_reduce(tmp_path: Path) -> None:
    """SIGSTOP after the step, SIGCONT 4 s later: the paused rank's result is right (with one
    slot per rank instead of two it read its peer's next input: 102 for 3), every later call
    fails on every rank, no failed call writes its buffer."""
    done = run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(PROGRAM),
                "paused"], timeout=120, env={"DENSECCL_TRACE_DIR": str(tmp_path)})
    expect_passed(done, 2)


#: the dtypes the gloo engine reduces, per library (bfloat16: torch only)
DTYPES = {
    "numpy": ["float16", "float32", "float64", "int8", "uint8", "int32", "int64", "bool", "complex64", "complex128"],
    "torch": ["bfloat16", "float16", "float32", "int64", "int8", "uint8", "bool", "complex64"],
}


def ops_for(dtype: str) -> list:
    if dtype == "bool":
        return ["sum", "prod", "min", "max"]
    if dtype.startswith("complex"):
        return ["sum", "avg", {"premul": 2.0}]  # gloo refuses the product of complex numbers
    return ["sum", "prod", "min", "max", "avg", {"premul": 3.0}]


@st.composite
def cases(draw: Any) -> Dict[str, Any]:
    """One call: collective, dtype, op, root and a layout (permutation, flipped dims for NumPy,
    odd strides on size-1 dims, size-0 dims), sized from empty to over the host path's limit."""
    lib = draw(st.sampled_from(["numpy", "torch"]))
    dtype = draw(st.sampled_from(DTYPES[lib]))
    collective = draw(st.sampled_from(["allreduce", "allreduce", "reduce", "broadcast"]))
    ndim = draw(st.integers(0, 4))
    shape = draw(st.lists(st.one_of(st.integers(1, 6), st.integers(0, 3)), min_size=ndim, max_size=ndim))
    if draw(st.integers(0, 9)) == 0 and ndim:
        shape[0] = 8200  # past 64 KiB for 8-byte types: gloo
    low = -9 if lib == "numpy" else 0
    return {
        "collective": collective, "dtype": dtype, "lib": lib,
        "op": None if collective == "broadcast" else draw(st.sampled_from(ops_for(dtype))),
        "root": draw(st.integers(0, 3)), "shape": shape, "order": list(draw(st.permutations(range(ndim)))),
        "flips": draw(st.lists(st.sampled_from(range(ndim)), unique=True)) if ndim and lib == "numpy" else [],
        "odd": draw(st.lists(st.integers(low, 9), min_size=ndim, max_size=ndim)),
        "seed": draw(st.integers(0, 2**31)),
    }


#: hypothesis settings of a test whose every example is a torchrun job
JOBS = settings(
    max_examples=2, deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate],
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
)


@pytest.mark.parametrize("n", [2, 3])
@JOBS
@given(batch=st.lists(cases(), min_size=30, max_size=30))
def test_drawn_layouts_on_the_host_path(n: int, batch: list, tmp_path: Path) -> None:
    run_batch(n, batch, tmp_path / f"cases-{n}.json")


def run_batch(n: int, batch: list, path: Path) -> None:
    """One torchrun job of ``n`` ranks over the drawn ``batch`` (written to ``path``)."""
    path.write_text(json.dumps(batch))
    done = run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(n),
                str(PROGRAM), "layouts", str(path)], timeout=300)
    expect_passed(done, n)


@st.composite
def gather_cases(draw: Any) -> Dict[str, Any]:
    """One allgather, reduce-scatter or barrier: dtype (every one gloo moves; reductions on
    those it reduces), op, and a layout as :func:`cases` draws it, up to past the limit."""
    lib = draw(st.sampled_from(["numpy", "torch"]))
    collective = draw(st.sampled_from(["allgather", "reduce_scatter", "reduce_scatter", "barrier"]))
    moved = DTYPES[lib] + (["int16", "uint16", "uint32"] if lib == "numpy" and collective == "allgather" else [])
    dtype = draw(st.sampled_from(moved))
    ndim = draw(st.integers(0, 4))
    shape = draw(st.lists(st.one_of(st.integers(1, 6), st.integers(0, 3)), min_size=ndim, max_size=ndim))
    if draw(st.integers(0, 9)) == 0 and ndim:
        shape[0] = 4200  # past 64 KiB in one slot for most dtypes: gloo
    low = -9 if lib == "numpy" else 0
    return {
        "collective": collective, "dtype": dtype, "lib": lib,
        "op": draw(st.sampled_from(ops_for(dtype))) if collective == "reduce_scatter" else None,
        "root": 0, "shape": shape, "order": list(draw(st.permutations(range(ndim)))),
        "flips": draw(st.lists(st.sampled_from(range(ndim)), unique=True)) if ndim and lib == "numpy" else [],
        "odd": draw(st.lists(st.integers(low, 9), min_size=ndim, max_size=ndim)),
        "seed": draw(st.integers(0, 2**31)),
    }


@pytest.mark.parametrize("n", [2, 3])
@JOBS
@given(batch=st.lists(gather_cases(), min_size=30, max_size=30))
def test_drawn_gathers_and_barriers_through_shared_memory(n: int, batch: list, tmp_path: Path) -> None:
    run_batch(n, batch, tmp_path / f"gathers-{n}.json")


@pytest.mark.skipif(TASKSET is None, reason="taskset is not installed")
@settings(
    max_examples=1, deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate],  # each example is a job
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
)
@given(batch=st.lists(gather_cases(), min_size=25, max_size=25))
def test_drawn_gathers_with_four_ranks_on_one_core(batch: list, tmp_path: Path) -> None:
    """Crowded: every wait on the board yields, then sleeps on its doorbell."""
    path = tmp_path / "gathers-crowded.json"
    path.write_text(json.dumps(batch))
    done = run([TASKSET, "-c", "0", sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                "4", str(PROGRAM), "layouts", str(path)], timeout=400)
    expect_passed(done, 4)
