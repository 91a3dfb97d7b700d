"""The denseccl backend under torch's own launchers, with no MPI launcher: torchrun and
mp.spawn (file://, tcp://, env://). CPU tensors move over the gloo engine; the rank programs
in tests/torch/ranks/ check every result against references of all ranks' inputs."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from tests.support.checker import expect_passed
from tests.torch.launchers import python, run, torchrun

RANKS = Path(__file__).parent / "ranks"
pytestmark = pytest.mark.torch


@pytest.mark.parametrize("n", [2, 3])
def test_torchrun_job(n):
    """Channels-last and transposed collectives, object collectives, barrier, a mismatch that
    raises everywhere, DDP: what issue 11 asks of `torchrun --standalone --nproc-per-node N`."""
    expect_passed(torchrun(n, RANKS / "torchrun_job.py", timeout=240), n)


@pytest.mark.parametrize("init", ["file", "tcp", "env"])
def test_spawn_job(init):
    expect_passed(python(RANKS / "spawn_job.py", ["2", init], timeout=240), 2)


def test_every_collective_on_every_layout_under_torchrun():
    expect_passed(torchrun(2, RANKS / "collectives.py", timeout=300), 2)


def test_subgroups_and_meshes_under_torchrun():
    expect_passed(torchrun(4, RANKS / "subgroups.py", timeout=300), 4)


def test_ddp_grad_layout_under_torchrun():
    result = torchrun(2, RANKS / "ddp_grad_layout.py", timeout=400)
    expect_passed(result, 2)
    assert "36 DDP configurations" in result.stdout


@pytest.mark.parametrize("n", [2, 4])
def test_modern_torch_stack_under_torchrun(n):
    """DeviceMesh, DTensor, FSDP2, tensor parallel and both spellings over the gloo engine."""
    expect_passed(torchrun(n, RANKS / "torch_stack.py", timeout=240), n)


def test_numpy_init_under_torchrun():
    expect_passed(torchrun(3, RANKS / "numpy_torchrun.py", timeout=240), 3)


def test_adapter_errors_on_one_rank_raise_everywhere_under_torchrun():
    expect_passed(torchrun(3, RANKS / "adapter_errors.py", timeout=240, env={"DENSECCL_TIMEOUT": "30"}), 3)


def test_repeated_calls_touch_no_new_memory_under_torchrun():
    expect_passed(torchrun(2, RANKS / "repeated_calls.py", timeout=180), 2)


#: srun's part, as far as a job step goes: N tasks, each with SLURM_PROCID and SLURM_STEP_NUM_TASKS
#: (no MPI: the tasks meet on the MASTER_ADDR:MASTER_PORT store); fails if any task fails
SRUN = (
    'unset RANK WORLD_SIZE; pids=""; for r in $(seq 0 $(($1 - 1))); do '
    'SLURM_PROCID=$r SLURM_STEP_NUM_TASKS=$1 "$2" "$3" "$4" & pids="$pids $!"; done; '
    'status=0; for p in $pids; do wait $p || status=1; done; exit $status'
)


@pytest.mark.parametrize("how", ["srun", "srun-direct"])
def test_init_under_srun_with_master_addr_but_no_rank(how: str):
    """Under srun without MPI: MASTER_ADDR/MASTER_PORT exported, no RANK or WORLD_SIZE; the rank
    and size come from srun's task variables, gloo moves the tensors; ``srun-direct``:
    ``denseccl.init()`` on NumPy arrays (it chose MPI, a singleton world, before)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "SLURM_JOB_ID": "4242"}
    command = ["bash", "-c", SRUN, "srun", "2", sys.executable, str(RANKS / "launcher_place.py"), how]
    expect_passed(run(command, timeout=180, env=env), 2)


def test_torch_tooling_under_torchrun():
    """Every functional collective (out-variants and batch_p2p_ops included), device types,
    sequence numbers and profiler ranges, side by side with gloo (issue 26)."""
    expect_passed(torchrun(2, RANKS / "torch_tooling.py", timeout=240, env={"DENSECCL_TRACE_BUFFER": "64"}), 2)


@pytest.mark.parametrize("scenario", ["collectives", "p2p"])
def test_a_program_that_ends_without_close_exits_cleanly(scenario: str) -> None:
    # gloo's threads released the last Python references of the call's tensors during the
    # interpreter's finalization and aborted the process, every time (held.py)
    for _ in range(3):
        expect_passed(torchrun(2, RANKS / "exit_without_close.py", [scenario], timeout=120), 2)
