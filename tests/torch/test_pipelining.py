"""torch.distributed.pipelining on the backend (tests/torch/ranks/pipelining.py): every schedule
of the installed torch, hand-built stages (and traced ones for GPipe and 1F1B), row-major,
column-major, permuted and channels-last activations, against a single-process run; the
activations cross stage boundaries in the layout they were made in. Before staged receives
landed with autograd not watching, every non-row-major run raised "a leaf Variable that
requires grad is being used in an in-place operation" on the receiving stage."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")

from tests.support.checker import expect_passed
from tests.support.ranks import run_ranks
from tests.torch.launchers import torchrun

PROGRAM = Path(__file__).parent / "ranks" / "pipelining.py"
pytestmark = pytest.mark.torch


@pytest.mark.timeout(400)
def test_every_schedule_under_torchrun() -> None:
    expect_passed(torchrun(2, PROGRAM, timeout=360), 2)


@pytest.mark.mpi
@pytest.mark.timeout(200)
def test_gpipe_under_mpiexec() -> None:
    expect_passed(run_ranks(2, PROGRAM, ["ScheduleGPipe"], timeout=180), 2)
