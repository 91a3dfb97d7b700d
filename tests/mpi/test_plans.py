"""Repeated calls run their prepared calls (denseccl/flow.py), which must behave exactly like
the full path on real ranks."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.checker import expect_summaries
from tests.support.ranks import run_ranks

pytestmark = pytest.mark.mpi


@pytest.mark.parametrize("nranks", [2, 3])
def test_repeated_calls_match_first_calls(nranks: int) -> None:
    done = run_ranks(nranks, Path(__file__).parent / "ranks" / "plans.py", timeout=120, env={"DENSECCL_TIMEOUT": "20"})
    expect_summaries(done.stdout, "plans", nranks)
