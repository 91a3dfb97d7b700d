"""An all-to-all or point-to-point call interrupted on one rank after its transfer began, or
failing in its completion, breaks the communicator on every rank: the peer's wait (MPI) or its
next call (gloo, MPI) raises at once, naming the rank (tests/torch/ranks/p2p_faults.py).
Before, the peer waited for the 60 s timeout, and an interrupt in a Work's wait failed inside
torch's future ("not an Exception")."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")

from tests.support.checker import expect_summaries
from tests.support.ranks import run_ranks
from tests.torch.launchers import torchrun

PROGRAM = Path(__file__).parent / "ranks" / "p2p_faults.py"
pytestmark = pytest.mark.torch


@pytest.mark.timeout(120)
def test_under_torchrun() -> None:
    case = "interrupt-alltoall"
    expect_summaries(torchrun(2, PROGRAM, [case], timeout=100).stdout, f"p2p-faults-{case}", 2)


@pytest.mark.mpi
@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", ["interrupt-recv", "interrupt-irecv", "interrupt-alltoall", "short-message"])
def test_under_mpiexec(case: str) -> None:
    expect_summaries(run_ranks(2, PROGRAM, [case], timeout=100).stdout, f"p2p-faults-{case}", 2)
