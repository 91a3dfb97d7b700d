"""A peer that never joins: CollectiveTimeoutError after the timeout, then a broken
communicator; and the check="off" policy."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.checker import expect_summaries
from tests.support.ranks import run_ranks

pytestmark = pytest.mark.mpi

RANKS = Path(__file__).parent / "ranks"


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "nranks, shared", [(2, "1"), (3, "1"), (2, "0")], ids=["2-board", "3-board", "2-mpi-allreduce"]
)
def test_peer_never_joins(nranks, shared):
    # Ranks leave with os._exit (their timed-out requests never complete, so no MPI_Finalize);
    # mpiexec may then kill a rank that is still leaving and exit non-zero, after every rank
    # has printed its verdict. The summaries are the verdict.
    done = run_ranks(
        nranks, RANKS / "timeouts.py", ["1.0"], timeout=90,
        env={"DENSECCL_TIMEOUT": "2", "DENSECCL_SHARED_AGREEMENT": shared}, expect_failure=None,
    )
    expect_summaries(done.stdout, "timeouts", nranks)


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "nranks, how, env",
    [(2, "kwarg", {"DENSECCL_TIMEOUT": "30"}), (3, "env", {"DENSECCL_CHECK": "off", "DENSECCL_TIMEOUT": "2.5"})],
    ids=["init-check-off", "DENSECCL_CHECK-off"],
)
def test_check_off(nranks, how, env):
    done = run_ranks(
        nranks, RANKS / "check_off.py", [how, "2.5"], timeout=90, env=env, expect_failure=None
    )  # os._exit, as above
    expect_summaries(done.stdout, f"check_off-{how}", nranks)
