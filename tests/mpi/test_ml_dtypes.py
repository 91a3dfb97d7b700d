"""NumPy bfloat16 (ml_dtypes) arrays over MPI, on real ranks."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.checker import expect_summaries
from tests.support.ranks import run_ranks

pytestmark = pytest.mark.mpi
pytest.importorskip("ml_dtypes")

SCRIPT = Path(__file__).parent / "ranks" / "ml_dtypes_arrays.py"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("nranks", [2, 3])
def test_ml_dtypes_bfloat16(nranks):
    done = run_ranks(nranks, SCRIPT, timeout=90)
    expect_summaries(done.stdout, "ml_dtypes", nranks)
