"""The board's shared memory where /dev/shm is full, where no segment can be made, and under
communicator churn, on real ranks under torchrun (tests/torch/ranks/shared_memory.py)."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from denseccl.channel import segment
from tests.support.checker import expect_passed
from tests.torch.launchers import run

PROGRAM = Path(__file__).parent / "ranks" / "shared_memory.py"
pytestmark = [pytest.mark.torch, pytest.mark.skipif(not segment.available(), reason="no memfd_create here")]


def torchrun(n: int, *args: str) -> list:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(n), str(PROGRAM),
            *args]


def private_mounts() -> bool:
    """Whether this process may mount a tmpfs in a mount namespace of its own (root, unshare)."""
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-m", "--propagation", "private", "mount", "-t", "tmpfs", "-o", "size=64k",
                            "tmpfs", "/mnt"], capture_output=True)
    return probe.returncode == 0


@pytest.mark.skipif(not private_mounts(), reason="needs root and unshare to mount a tmpfs of its own")
@pytest.mark.parametrize("n, scenario, mib", [(2, "full", 1), (3, "full", 1), (8, "mesh", 64)])
def test_a_full_dev_shm(n: int, scenario: str, mib: int) -> None:
    """A /dev/shm of ``mib`` MiB that another process filled (as DataLoader workers fill
    Docker's 64 MiB): before segments were memfds every rank died of SIGBUS at its first
    collective; 8 ranks with a 2-D DeviceMesh and a subgroup run as well."""
    job = " ".join(shlex.quote(part) for part in torchrun(n, scenario))
    script = (f"mount -t tmpfs -o size={mib}m tmpfs /dev/shm && "
              f"(head -c {(mib + 1) << 20} /dev/zero > /dev/shm/filler || true) && exec {job}")
    done = run(["unshare", "-m", "--propagation", "private", "sh", "-c", script], timeout=300)
    expect_passed(done, n)


def test_no_segment_can_be_made() -> None:
    done = run(torchrun(2, "unmade"), timeout=180)
    expect_passed(done, 2)
    assert "no shared memory for the agreement board" in done.stderr + done.stdout


def test_no_room_for_the_host_path() -> None:
    done = run(torchrun(2, "no-data"), timeout=180)
    expect_passed(done, 2)
    assert (done.stderr + done.stdout).count("the host path is off") == 1


def test_ranks_agree_on_one_host_path_limit() -> None:
    done = run(torchrun(3, "limits"), timeout=180)
    expect_passed(done, 3)


def test_communicator_churn_keeps_memory_flat() -> None:
    done = run(torchrun(2, "churn", "150"), timeout=400)
    expect_passed(done, 2)


@pytest.mark.parametrize("crowded", [False, True], ids=["own-cores", "taskset-c0"])
def test_waiting_for_a_stopped_peer_is_idle(crowded: bool) -> None:
    command = torchrun(2, "stopped")
    if crowded:
        if shutil.which("taskset") is None:
            pytest.skip("taskset is not installed")
        command = ["taskset", "-c", "0", *command]
    done = run(command, timeout=120)
    expect_passed(done, 2)
