"""The agreement without MPI across simulated hosts: torchrun on each of two hosts, two ranks
each. The world group agrees on a board per host and among one leader per host, a group within
a host on its board, a group of one rank per host among the leaders only; after a group exists,
a call makes no store operation (counted through a wrapping store); every result against a
reference built from every rank's inputs (tests/torch/ranks/board_job.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.hosts.simhosts import SimHosts
from tests.support.checker import expect_summaries

pytest.importorskip("torch")
pytestmark = [pytest.mark.torch, pytest.mark.hosts]

PROGRAM = Path(__file__).parents[1] / "torch" / "ranks" / "board_job.py"


@pytest.mark.timeout(300)
def test_boards_per_host_and_leaders_under_torchrun(simhosts: SimHosts) -> None:
    done = simhosts.torchrun([str(PROGRAM), "hosts", "2"], hosts=2, per_host=2, env={"DENSECCL_TIMEOUT": "60"},
                             timeout=240)
    expect_summaries(done.stdout, "board-hosts", 4)
