"""The NCCL backend on one GPU with one rank, in this process: every collective x layout x dtype
(CuPy arrays with negative strides, CUDA torch tensors with bfloat16/fp8, bare
__cuda_array_interface__ objects) against a NumPy reference, streams and Work, PreMulSum's op
cache, local errors, split; timeouts and the watchdog in a subprocess. Skipped without a GPU."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from tests.gpu.support import ROOT, cupy_from_host, cupy_to_host, require_gpu, torch_cuda

cupy = require_gpu()

import denseccl  # noqa: E402
from denseccl.errors import DenseCCLError, LayoutError  # noqa: E402
from tests.gpu import matrix  # noqa: E402


@pytest.fixture(scope="module")
def comm():
    communicator = denseccl.init(backend="nccl", size=1, timeout=60)
    yield communicator
    communicator.close()


def test_backend_and_device(comm):
    assert (comm.backend, comm.rank, comm.size) == ("nccl", 0, 1)
    assert comm.transport.device == cupy.cuda.runtime.getDevice()


@pytest.mark.parametrize("lib_index", [0, 1, 2])
def test_matrix(comm, lib_index):
    from denseccl.transports.nccl_tables import FP8_SINCE

    libs = matrix.device_libs(comm, fp8=comm.transport.version >= FP8_SINCE)
    if lib_index >= len(libs):
        pytest.skip("no CUDA torch here")
    report = matrix.run_matrix(comm, [libs[lib_index]])
    assert report.failures == [], "\n".join(report.failures[:10])
    assert report.checks > 100


def test_premul_ops_are_cached(comm):
    x = cupy_from_host(np.arange(6, dtype=np.float32))
    before = len(comm.transport._premul)
    comm.allreduce(x, denseccl.PreMulSum(0.125))
    comm.allreduce(x, denseccl.PreMulSum(0.125))
    assert len(comm.transport._premul) == before + 1
    assert np.array_equal(cupy_to_host(x), np.arange(6, dtype=np.float32) / 64)
    y = cupy_from_host(np.arange(6, dtype=np.complex64) * (1 + 1j))
    comm.allreduce(y, denseccl.PreMulSum(0.125))  # complex scales through float32: same op
    assert len(comm.transport._premul) == before + 1
    assert np.array_equal(cupy_to_host(y), np.arange(6) * (1 + 1j) / 8)


def test_stream_and_async(comm):
    side = cupy.cuda.Stream(non_blocking=True)
    x = cupy_from_host(np.full((64, 32), 3.0, np.float32)).T
    with side:
        work = comm.allreduce(x, "avg", async_op=True)
    assert work.wait() is x  # the null stream now waits for `side`
    assert np.array_equal(cupy_to_host(x), np.full((32, 64), 3.0, np.float32))
    assert work.is_completed()
    assert work.synchronize() is x


def test_stream_argument_forms(comm):
    x = cupy_from_host(np.ones(8, np.float64))
    stream = cupy.cuda.Stream(non_blocking=True)
    for form in (stream, stream.ptr):
        comm.allreduce(x, stream=form)
        stream.synchronize()
    with pytest.raises(LayoutError, match="not a CUDA stream"):
        comm.allreduce(x, stream="default")


def test_torch_tensors_keep_layout_and_device(comm):
    torch = torch_cuda()
    if torch is None:
        pytest.skip("no CUDA torch")
    t = torch.arange(24, dtype=torch.float32, device=f"cuda:{comm.transport.device}").reshape(2, 3, 4).permute(0, 2, 1)
    strides = t.stride()
    gathered = comm.allgather(t)
    assert gathered.device == t.device and gathered.stride()[1:] == strides
    assert torch.equal(gathered[0], t)
    channels_last = torch.randn(2, 3, 4, 5, device=t.device).to(memory_format=torch.channels_last)
    expected = channels_last.clone()
    comm.allreduce(channels_last, denseccl.PreMulSum(2.0))
    assert channels_last.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(channels_last, expected * 2)


def test_local_errors(comm):
    with pytest.raises(LayoutError, match="backend='mpi'"):
        comm.allreduce(np.ones(3, np.float32))
    with pytest.raises(LayoutError, match="pairs of reals"):
        comm.allreduce(cupy_from_host(np.ones(3, np.complex64)), "prod")
    with pytest.raises(LayoutError, match="int16"):
        comm.allreduce(cupy_from_host(np.ones(3, np.int16)))
    z = cupy_from_host(np.arange(3, dtype=np.int16))
    comm.broadcast(z, 0)  # moved as bytes
    assert np.array_equal(cupy_to_host(z), np.arange(3))
    with pytest.raises(LayoutError, match="not non-overlapping and dense"):
        comm.allreduce(cupy_from_host(np.ones((4, 4), np.float32))[:, ::2])


def test_split(comm):
    try:
        part = comm.split(0)
    except DenseCCLError as error:
        pytest.skip(str(error))
    x = cupy_from_host(np.ones(4, np.float32))
    part.allreduce(x)
    assert np.array_equal(cupy_to_host(x), np.ones(4))
    assert comm.split(None) is None
    part.close()


def test_default_backend_is_nccl(monkeypatch):
    monkeypatch.delenv("DENSECCL_BACKEND", raising=False)
    communicator = denseccl.init(timeout=30)
    try:
        assert communicator.backend == "nccl"
    finally:
        communicator.close()


def test_timeout_and_watchdog_in_a_subprocess():
    process = subprocess.run(
        [sys.executable, "tests/gpu/rank.py", "hang1"], cwd=str(ROOT), capture_output=True, text=True, timeout=180,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert process.returncode == 0, process.stdout[-4000:] + process.stderr[-4000:]
    assert '"ok": true' in process.stdout
