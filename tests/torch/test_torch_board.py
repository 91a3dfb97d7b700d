"""The agreement board without MPI (denseccl/channel/) under torchrun and mp.spawn, 2 and 4 ranks,
crowded (``taskset -c 0``) and not: calls agree on the board with no store operation, a layout
mismatch raises everywhere, a rank that never arrives makes its peers time out and finds the
"gave up" flag, a killed rank ends the job. Nothing of denseccl's is ever in /dev/shm (its
segments are memfds, with no name)."""

from __future__ import annotations

import os
import re
import shutil
import sys
from pathlib import Path
from typing import Sequence

import pytest

pytest.importorskip("torch")

from denseccl.channel import segment
from tests.support.checker import expect_passed, expect_summaries
from tests.torch.launchers import run

PROGRAM = Path(__file__).parent / "ranks" / "board_job.py"
pytestmark = [pytest.mark.torch, pytest.mark.skipif(not segment.available(), reason="no memfd_create here")]
TASKSET = shutil.which("taskset")


def torchrun(n: int, scenario: str, crowded: bool = False, **kwargs: object):
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(n),
               str(PROGRAM), scenario]
    if crowded:
        command = [TASKSET, "-c", "0", *command]  # type: ignore[list-item]
    return run(command, **kwargs)  # type: ignore[arg-type]


def left_of(output: str) -> Sequence[str]:
    """Anything of denseccl's in /dev/shm after this job's ranks (as printed) ran: nothing ever,
    since segments have no name, whichever way the job ended."""
    assert re.findall(r"\[board-pid\] (\d+)", output), output
    return [name for name in os.listdir("/dev/shm") if name.startswith(segment.PREFIX)]


@pytest.mark.parametrize("crowded", [False, True], ids=["own-cores", "taskset-c0"])
@pytest.mark.parametrize("n", [2, 4])
def test_calls_agree_on_the_board_under_torchrun(n: int, crowded: bool) -> None:
    if crowded and TASKSET is None:
        pytest.skip("taskset is not installed")
    if not crowded and len(os.sched_getaffinity(0)) < n:
        pytest.skip(f"{n} ranks on {len(os.sched_getaffinity(0))} cores are crowded")
    done = torchrun(n, "calls", crowded, timeout=300)
    expect_passed(done, n)
    assert left_of(done.stdout) == []


@pytest.mark.parametrize("n", [2, 4])
def test_calls_agree_on_the_board_under_spawn(n: int) -> None:
    done = run([sys.executable, str(PROGRAM), "calls", "spawn", str(n)], timeout=300)
    expect_passed(done, n)
    assert left_of(done.stdout) == []


@pytest.mark.parametrize("n", [2, 4])
def test_a_rank_that_never_arrives(n: int) -> None:
    done = torchrun(n, "late", timeout=240)
    expect_passed(done, n)
    assert "timed out" in done.stdout and "late rank:" in done.stdout, done.stdout


def test_a_killed_rank_ends_the_job_and_leaves_nothing() -> None:
    done = torchrun(2, "killed", timeout=240, expect_failure=True)
    assert done.stdout.count("[board-killed]") == 2, done.stdout + done.stderr
    assert left_of(done.stdout) == []
    with pytest.raises(AssertionError):  # no rank may report that a call completed without the dead one
        expect_summaries(done.stdout, "board-killed", 2)


def test_the_agreement_benchmark_runs_under_torchrun() -> None:
    """denseccl/bench/agreement_step.py (docs/benchmark.md): every contender of a torchrun job."""
    done = run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m",
                "denseccl.bench.agreement_step", "--rounds", "2", "--iters", "50"], timeout=240)
    rows = {line.split()[0] for line in done.stdout.splitlines() if line.startswith("  ")}
    assert rows == {"board", "gloo", "store"}, done.stdout


def test_the_gloo_calls_benchmark_runs_under_torchrun() -> None:
    """denseccl/bench/gloo_calls.py: every contender's row, its figures in range."""
    done = run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m",
                "denseccl.bench.gloo_calls", "--blocks", "3", "--calls", "20"], timeout=240)
    rows = {line.split()[0]: line.split() for line in done.stdout.splitlines() if line[:1].isalpha()}
    assert set(rows) == {"check", "off", "gloo"}, done.stdout
    assert rows["gloo"][-1] == "1.00" and all(float(row[1]) > 0 for row in rows.values()), done.stdout
