"""Repeated calls run on persistent MPI requests that the ranks set up together
(denseccl/backends/mpi/persistent.py, Requests): however the ranks' caches differ, every rank gets
NumPy's result, the ranks decide alike, and nothing is left allocated at exit."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.checker import expect_summaries
from tests.support.ranks import run_ranks

pytestmark = pytest.mark.mpi

SCRIPT = Path(__file__).parent / "ranks" / "persistent.py"


@pytest.mark.parametrize("nranks", [2, 3])
def test_ranks_whose_caches_differ_agree_on_persistent_requests(nranks: int) -> None:
    done = run_ranks(nranks, SCRIPT, timeout=180, env={"DENSECCL_TIMEOUT": "30"})
    expect_summaries(done.stdout, "persistent", nranks)
    # MPICH reports persistent requests still allocated when MPI is finalized
    assert "persistent request" not in done.stderr, done.stderr
