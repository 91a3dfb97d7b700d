"""Communicator.split on real MPI ranks (MPI Comm.Split under the MPI transport)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.checker import expect_summaries
from tests.support.ranks import run_ranks

pytestmark = pytest.mark.mpi

SCRIPT = Path(__file__).parent / "ranks" / "split.py"


@pytest.mark.parametrize("nranks", [2, 4])
def test_split(nranks):
    result = run_ranks(nranks, SCRIPT, timeout=120)
    expect_summaries(result.stdout, "split", nranks)
