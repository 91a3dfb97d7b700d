"""Bootstrap deadlines (issue 10 item 4): a peer that never calls init_process_group,
denseccl.init() or new_group makes every other rank raise CollectiveTimeoutError within the
timeout, under mpiexec and under torchrun."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("mpi4py")

from tests.support.checker import expect_passed
from tests.support.ranks import run_ranks
from tests.torch.launchers import torchrun

SCRIPT = Path(__file__).parent / "ranks" / "bootstrap_deadline.py"
pytestmark = pytest.mark.torch
NO_OVERRIDE = {"DENSECCL_TIMEOUT": ""}  # the timeout under test is the one passed in the call


def verdicts(result, n: int) -> None:
    expect_passed(result, n)
    assert result.stdout.count("raised CollectiveTimeoutError") == n - 1, result.stdout + result.stderr


@pytest.mark.parametrize(
    "mode, n, skipper", [("torch-init", 2, -1), ("dist-init", 2, -1), ("numpy-init", 3, 0), ("subgroup", 2, -1)]
)
def test_bootstrap_deadline_under_mpiexec(mode, n, skipper):
    # the waiting ranks leave with os._exit (a timed-out request never completes); mpiexec may
    # then exit non-zero while the sleeping skipper is killed: the printed verdicts decide
    result = run_ranks(n, SCRIPT, [mode, "4", str(skipper)], timeout=90, env=NO_OVERRIDE, expect_failure=None)
    verdicts(result, n)


@pytest.mark.parametrize("mode, skipper", [("torch-init", 0), ("numpy-init", -1), ("subgroup", 0)])
def test_bootstrap_deadline_under_torchrun(mode, skipper):
    result = torchrun(2, SCRIPT, [mode, "4", str(skipper)], timeout=90, env=NO_OVERRIDE, expect_failure=None)
    verdicts(result, 2)
