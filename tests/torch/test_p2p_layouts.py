"""send/recv between every pair of layouts of one shape, under torchrun (the gloo engine) and
mpiexec (MPI): the receiver gets the sender's values in its own layout, through no copy where
the layouts allow it (tests/torch/ranks/p2p_layouts.py). Before, every non-row-major tensor
was copied on both sides."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")

from tests.support.checker import expect_summaries
from tests.support.ranks import run_ranks
from tests.torch.launchers import torchrun

PROGRAM = Path(__file__).parent / "ranks" / "p2p_layouts.py"
pytestmark = pytest.mark.torch


@pytest.mark.timeout(120)
def test_under_torchrun() -> None:
    expect_summaries(torchrun(2, PROGRAM, timeout=100).stdout, "p2p-layouts", 2)


@pytest.mark.mpi
@pytest.mark.timeout(120)
def test_under_mpiexec() -> None:
    expect_summaries(run_ranks(2, PROGRAM, timeout=100).stdout, "p2p-layouts", 2)
