"""The NCCL backend on two ranks: on two GPUs, or on one GPU when each rank gets its own
NCCL_HOSTID (NCCL otherwise refuses with "Duplicate GPU detected"). Ranks start torchrun-style
(RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT: the unique id and the agreement go through a
TCPStore), and under mpiexec where MPI works. Skipped without a GPU, or when two ranks cannot run."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from tests.gpu.support import ROOT, describe, inner_timeout, require_gpu, spawn_ranks, two_rank_mode

require_gpu()


@pytest.fixture(scope="module")
def mode():
    found = two_rank_mode()
    if found["mode"] == "no":
        pytest.skip(found["why"])
    return found


def test_two_ranks_collectives(mode):
    results = spawn_ranks(
        2, ["tests/gpu/rank.py", "probe,matrix,mismatch,streams,split"], split_hosts=mode["split_hosts"],
        timeout=inner_timeout(150),
    )
    assert all(r["returncode"] == 0 for r in results), describe(results)
    matrix_lines = [line for r in results for line in r["json"] if line.get("scenario") == "matrix"]
    assert len(matrix_lines) == 2 and all(line["failures"] == 0 and line["checks"] > 1000 for line in matrix_lines), (
        matrix_lines
    )


def test_two_ranks_faults(mode):
    results = spawn_ranks(
        2, ["tests/gpu/rank.py", "faults"], split_hosts=mode["split_hosts"], timeout=inner_timeout(90)
    )
    assert all(r["returncode"] == 0 for r in results), describe(results)


def _mpiexec():
    beside = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    return beside if os.path.exists(beside) else shutil.which("mpiexec")


def test_two_ranks_under_mpiexec(mode):
    mpiexec = _mpiexec()
    if mpiexec is None:
        pytest.skip("no mpiexec here")
    try:
        subprocess.run([sys.executable, "-c", "from mpi4py import MPI"], check=True, capture_output=True, timeout=60)
    except Exception as error:  # noqa: BLE001
        pytest.skip(f"mpi4py does not start here: {error}")
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK")
    }
    env.update(PYTHONPATH=str(ROOT), DENSECCL_SPLIT_HOSTS="1" if mode["split_hosts"] else "0", PYTHONUNBUFFERED="1")
    try:
        process = subprocess.run(
            [mpiexec, "-n", "2", sys.executable, "tests/gpu/rank.py", "probe,mismatch,split"],
            cwd=str(ROOT), env=env, capture_output=True, text=True, timeout=inner_timeout(90),
        )  # fmt: skip
    except subprocess.TimeoutExpired as expired:
        pytest.fail(f"mpiexec -n 2 did not finish in time:\n{expired.stdout}\n{expired.stderr}")
    assert process.returncode == 0, process.stdout[-4000:] + process.stderr[-4000:]
    assert process.stdout.count('"scenario": "probe"') == 2
