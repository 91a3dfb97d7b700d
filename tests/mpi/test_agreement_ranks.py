"""The mismatch matrix on real ranks: every rank raises, nothing is touched, the communicator
stays usable; ranks that should agree (size-1 strides, empty, 0-d) do."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.checker import expect_summaries
from tests.support.ranks import run_ranks

pytestmark = pytest.mark.mpi

SCRIPT = Path(__file__).parent / "ranks" / "mismatch.py"


@pytest.mark.timeout(180)
@pytest.mark.parametrize("nranks, args", [(2, ["--torch"]), (3, []), (4, [])], ids=["2-with-torch", "3", "4"])
def test_mismatch_matrix(nranks, args):
    done = run_ranks(nranks, SCRIPT, args, timeout=150, env={"DENSECCL_TIMEOUT": "20"})
    expect_summaries(done.stdout, "mismatch", nranks)


@pytest.mark.timeout(180)
def test_the_matrix_detects_a_missing_check():
    """With the agreement check off, the same program must fail (silently wrong sums, buffers
    written): the matrix can fail."""
    done = run_ranks(
        2, SCRIPT, [], timeout=150, env={"DENSECCL_CHECK": "off", "DENSECCL_TIMEOUT": "1"}, expect_failure=True
    )
    assert "no error raised (expected MismatchError)" in done.stdout
    assert "a buffer was written" in done.stdout
