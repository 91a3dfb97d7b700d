"""The torch adapter with real ranks (mpiexec): every collective on every layout, the init
methods, and DDP's grad-layout test. The rank programs live in tests/torch/ranks/ and compare
every result with references computed with plain torch from all ranks' inputs."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("mpi4py")

from tests.support.checker import expect_passed
from tests.support.ranks import ROOT, run_ranks

RANKS = Path(__file__).parent / "ranks"
pytestmark = [pytest.mark.torch, pytest.mark.mpi]


@pytest.mark.parametrize("n", [2, 3])
def test_every_collective_on_every_layout(n):
    expect_passed(run_ranks(n, RANKS / "collectives.py", timeout=180), n)


@pytest.mark.parametrize("n", [4, 5, 8])
def test_subgroups_and_meshes_of_every_shape(n):
    """Prefixes [0..k-1] (once mistaken for the world), suffixes, singletons, strided and
    overlapping groups, new_subgroups, 2-D and 3-D meshes, per-host groups."""
    expect_passed(run_ranks(n, RANKS / "subgroups.py", timeout=300), n)


@pytest.mark.parametrize("n", [2, 3])
def test_adapter_errors_on_one_rank_raise_everywhere(n):
    """Issue 10 item 3: an unsupported op, a meta tensor, mixed devices, bad argument lists or
    splits on one rank only: every rank raises, and the next collective pairs correctly."""
    expect_passed(run_ranks(n, RANKS / "adapter_errors.py", timeout=240, env={"DENSECCL_TIMEOUT": "30"}), n)


def test_init_methods_and_rank_check():
    result = run_ranks(2, RANKS / "init_methods.py", timeout=120, env={"DENSECCL_TIMEOUT": ""})
    expect_passed(result, 2)
    assert result.stdout.count("torch rank") == 2, "each rank explains the rank mismatch"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_init_under_mpiexec_with_master_addr_but_no_rank():
    """Issue 25 item 5: cluster scripts export MASTER_ADDR/MASTER_PORT under mpiexec but no RANK
    or WORLD_SIZE: the rank and size come from MPI, the store from MASTER_ADDR:MASTER_PORT."""
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    expect_passed(run_ranks(2, RANKS / "launcher_place.py", ["mpi"], timeout=120, env=env), 2)


def test_ddp_grad_layout():
    result = run_ranks(2, RANKS / "ddp_grad_layout.py", timeout=240)
    expect_passed(result, 2)
    assert "36 DDP configurations" in result.stdout


@pytest.mark.parametrize("n", [2, 4])
def test_modern_torch_stack(n):
    """DeviceMesh, DTensor, FSDP2, tensor parallel (2 ranks: 1-D mesh; 4: 2x2 with HSDP and
    FSDP2 x TP) and both spellings of the single-tensor gather and reduce-scatter, each against
    single-process results (tests/torch/ranks/torch_stack.py)."""
    expect_passed(run_ranks(n, RANKS / "torch_stack.py", timeout=240), n)


def test_ddp_example_runs_as_documented():
    """The example of the README (torch section) on 2 ranks (launch/run is mpiexec with the venv on PATH)."""
    result = run_ranks(2, ROOT / "examples" / "torch_ddp_example.py", timeout=180)
    lines = result.stdout.splitlines()
    assert lines[-1] == "OK", result.stdout
    assert "parameters identical on all 2 ranks: True" in lines


def test_exit_with_async_work_in_flight():
    expect_passed(run_ranks(2, RANKS / "exit_in_flight.py", timeout=120), 2)


def test_shutdown_with_a_receive_in_flight():
    """destroy_process_group with a receive whose sender never sends: the communicators the
    receive may still use are kept, and later MPI calls work (Open MPI crashed here)."""
    expect_passed(run_ranks(2, RANKS / "shutdown_in_flight.py", timeout=120), 2)


def test_repeated_calls_touch_no_new_memory():
    """Issue 20: a repeated synchronous all_reduce / reduce of a 64 MiB channels-last tensor
    through the backend replays the core's plan, so MPI allocates no temporary per call (a
    fresh 64 MiB temporary per call cost its page faults every time)."""
    expect_passed(run_ranks(2, RANKS / "repeated_calls.py", timeout=180), 2)


def test_torch_tooling():
    """Every functional collective (out-variants and batch_p2p_ops included), device types,
    sequence numbers and profiler ranges, side by side with gloo (issue 26)."""
    expect_passed(run_ranks(2, RANKS / "torch_tooling.py", timeout=240, env={"DENSECCL_TRACE_BUFFER": "64"}), 2)
