"""Ranks that share cores must not spin: real ranks pinned with taskset, pinned per rank, and in
a cgroup with a CPU quota report "crowded" (and wait by yielding); ranks with a core each do
not. Speed itself is the benchmark's to show (docs/performance-pinning.md), not a timed test."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.support.checker import expect_summaries
from tests.support.ranks import ROOT, launch, mpiexec, run_ranks
from tests.support.segments import Job

pytestmark = pytest.mark.mpi

SCRIPT = Path(__file__).parent / "ranks" / "pinning.py"
CORES = sorted(os.sched_getaffinity(0))
ENV = {"DENSECCL_TIMEOUT": "30"}


def needs_cores(count: int):  # type: ignore[no-untyped-def]
    return pytest.mark.skipif(
        len(CORES) < count or shutil.which("taskset") is None, reason=f"needs {count} cores and taskset"
    )


@needs_cores(1)
@pytest.mark.parametrize("nranks", [2, 3])
def test_ranks_under_taskset_on_one_core_are_crowded(nranks: int) -> None:
    done = run_ranks(nranks, SCRIPT, ["1", "1"], timeout=90, env=ENV, launcher=["taskset", "-c", str(CORES[0])])
    expect_summaries(done.stdout, "pinning", nranks)


@needs_cores(2)
@pytest.mark.parametrize("shared_agreement", ["1", "0"], ids=["board", "mpi-allreduce"])
def test_ranks_pinned_to_one_core_each_are_not_crowded(shared_agreement: str) -> None:
    masks = f"{CORES[0]}/{CORES[1]}"
    done = run_ranks(
        2, SCRIPT, ["0", "0", masks], timeout=90, env={**ENV, "DENSECCL_SHARED_AGREEMENT": shared_agreement}
    )
    expect_summaries(done.stdout, "pinning", 2)


@needs_cores(2)
@pytest.mark.parametrize(
    "masks, crowded",
    [
        ("a/a", True),  # both on one core, decided from the exchanged masks (not the launcher's)
        ("a/a,b", False),  # the second rank can move to the other core
        ("a,b/a,b/a", True),  # three ranks, two cores
    ],
)
def test_per_rank_masks_are_exchanged(masks: str, crowded: bool) -> None:
    concrete = masks.replace("a", str(CORES[0])).replace("b", str(CORES[1]))
    nranks = masks.count("/") + 1
    done = run_ranks(nranks, SCRIPT, [str(int(crowded))] * 2 + [concrete], timeout=90, env=ENV)
    expect_summaries(done.stdout, "pinning", nranks)


def test_the_wait_setting_overrides_detection() -> None:
    done = run_ranks(
        2,
        SCRIPT,
        ["1", "0"],
        timeout=90,
        env={**ENV, "DENSECCL_WAIT": "spin"},
        launcher=["taskset", "-c", str(CORES[0])],
    )
    expect_summaries(done.stdout, "pinning", 2)
    if len(CORES) >= 2:
        done = run_ranks(
            2, SCRIPT, ["0", "1", f"{CORES[0]}/{CORES[1]}"], timeout=90, env={**ENV, "DENSECCL_WAIT": "yield"}
        )
        expect_summaries(done.stdout, "pinning", 2)


CPU_V1 = Path("/sys/fs/cgroup/cpu")


@pytest.mark.skipif(
    len(CORES) < 2 or not (CPU_V1 / "cpu.cfs_quota_us").exists() or not os.access(CPU_V1, os.W_OK),
    reason="needs two cores and a writable cgroup v1 cpu hierarchy",
)
def test_ranks_in_a_cgroup_with_a_one_core_quota_are_crowded() -> None:
    group = CPU_V1 / f"denseccl-test-{uuid.uuid4().hex[:12]}"
    group.mkdir()
    try:
        (group / "cpu.cfs_period_us").write_text("100000")
        (group / "cpu.cfs_quota_us").write_text("100000")  # one core's worth for the whole job
        environment = {**os.environ, **ENV, "PYTHONPATH": str(ROOT)}
        start, needs = launch(mpiexec(), 2)
        environment.update(needs)
        command = [*start, sys.executable, str(SCRIPT), "1", "1"]
        enter = f'echo $$ > {group / "cgroup.procs"} && exec "$@"'
        job = Job(["sh", "-c", enter, "sh", *command], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                  env=environment)
        process = job.process
        try:
            stdout, stderr = process.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            stdout, stderr = process.communicate()
        finally:
            job.finish()
        assert process.returncode == 0, f"{stdout}\n{stderr}"
        expect_summaries(stdout, "pinning", 2)
    finally:
        group.rmdir()
