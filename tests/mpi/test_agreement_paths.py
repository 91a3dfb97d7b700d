"""Both agreement paths on real ranks: the shared-memory board (the default when every rank
shares a host) and the MPI allreduce (DENSECCL_SHARED_AGREEMENT=0), under a seeded schedule of
agreements, mismatches and invalid inputs, on a communicator and its split."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.checker import expect_summaries
from tests.support.ranks import run_ranks

pytestmark = pytest.mark.mpi

SCRIPT = Path(__file__).parent / "ranks" / "agreement_paths.py"


@pytest.mark.timeout(180)
@pytest.mark.parametrize("board", [True, False], ids=["board", "mpi-allreduce"])
@pytest.mark.parametrize("nranks", [2, 3])
def test_agreement_paths(nranks: int, board: bool) -> None:
    env = {"DENSECCL_TIMEOUT": "30", "DENSECCL_SHARED_AGREEMENT": "1" if board else "0"}
    done = run_ranks(nranks, SCRIPT, [str(int(board)), "600"], timeout=150, env=env)
    expect_summaries(done.stdout, f"agreement-paths-{int(board)}", nranks)
