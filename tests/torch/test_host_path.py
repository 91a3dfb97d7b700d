"""The gloo engine's host path (denseccl/backends/gloo/host.py) on real ranks: torchrun with 2
ranks and 4 ranks on one core, mp.spawn with 3. tests/torch/ranks/host_path.py has the cases:
every dtype and op, layouts, ranks that run ahead, back-to-back calls (which caught a single
slot per rank: 50-350 wrong results in 3000), a rank on the general path, a mismatch, and the
calls that stay on gloo."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from denseccl.board import segment
from tests.support.checker import expect_passed
from tests.torch.launchers import run

PROGRAM = Path(__file__).parent / "ranks" / "host_path.py"
pytestmark = [pytest.mark.torch, pytest.mark.skipif(not segment.available(), reason="no /dev/shm here")]
TASKSET = shutil.which("taskset")


def test_host_path_under_torchrun() -> None:
    done = run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(PROGRAM)],
               timeout=300)
    expect_passed(done, 2)


@pytest.mark.skipif(TASKSET is None, reason="taskset is not installed")
def test_host_path_with_four_ranks_on_one_core() -> None:
    done = run([TASKSET, "-c", "0", sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                "4", str(PROGRAM)], timeout=400)
    expect_passed(done, 4)


def test_host_path_under_spawn() -> None:
    done = run([sys.executable, str(PROGRAM), "spawn", "3"], timeout=300)
    expect_passed(done, 3)


def test_host_path_turned_off() -> None:
    done = run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(PROGRAM)],
               timeout=300, env={"DENSECCL_HOST_PATH": "0"})
    expect_passed(done, 2)


def test_a_rank_paused_between_the_step_and_its_reduce(tmp_path: Path) -> None:
    """SIGSTOP after the step, SIGCONT 4 s later: the paused rank's result is right (with one
    slot per rank instead of two it read its peer's next input: 102 for 3), every later call
    fails on every rank, no failed call writes its buffer."""
    done = run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(PROGRAM),
                "paused"], timeout=120, env={"DENSECCL_TRACE_DIR": str(tmp_path)})
    expect_passed(done, 2)
