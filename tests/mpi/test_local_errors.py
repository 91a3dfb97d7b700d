"""Local errors of any kind, and an invalid split argument on one rank, raise on every rank
and leave the communicator usable (no peer waits for the timeout or forever)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.checker import expect_summaries
from tests.support.ranks import run_ranks

pytestmark = pytest.mark.mpi

SCRIPT = Path(__file__).parent / "ranks" / "local_errors.py"


@pytest.mark.parametrize("nranks", [2, 3])
def test_local_errors_raise_everywhere_and_leave_the_communicator_usable(nranks):
    result = run_ranks(nranks, SCRIPT, timeout=60, env={"DENSECCL_TIMEOUT": "20"})
    expect_summaries(result.stdout, "local_errors", nranks)
