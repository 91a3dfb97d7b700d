"""async_op=True: Work objects, is_completed(), wait(), completion out of order."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.checker import expect_summaries
from tests.support.ranks import run_ranks

pytestmark = pytest.mark.mpi

SCRIPT = Path(__file__).parent / "ranks" / "async_ops.py"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("nranks, args", [(2, ["--torch"]), (3, []), (4, [])], ids=["2-with-torch", "3", "4"])
def test_async(nranks, args):
    done = run_ranks(nranks, SCRIPT, args, timeout=90)
    expect_summaries(done.stdout, "async", nranks)
