"""The GPU tests' own harness (tests/gpu/), where it can go wrong without a GPU:

- the two-rank ``faults`` scenario's end: rank 0 serves the TCPStore and its process exits
  right after; TCPStore's ``set`` is not answered, so a peer still waiting lost its connection
  (two real processes and a real TCPStore here);
- ``cupy_from_host``: a pageable host-to-device cudaMemcpy is ordered only before the legacy
  stream's work, and may return before its DMA has landed (a fake device that keeps the bytes
  in flight until a synchronisation).
"""

from __future__ import annotations

import ctypes
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
PROGRAM = str(ROOT / "tests/unit/store_leave_rank.py")


def _pair() -> list:
    """Rank 0 (the server) and rank 1 of store_leave_rank.py: their (exit status, output)."""
    host = subprocess.Popen([sys.executable, PROGRAM, "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        port = host.stdout.readline().strip()  # the port it serves, printed once bound
        if not port.isdigit():
            _, error = host.communicate(timeout=90)
            pytest.fail(f"rank 0 printed no port ({port!r}):\n{error[-2000:]}")
        peer = subprocess.run(
            [sys.executable, PROGRAM, "1", port], capture_output=True, text=True, timeout=90
        )  # fmt: skip
        host_out, host_err = host.communicate(timeout=90)
        host_out += host_err[-1500:]
    finally:
        if host.poll() is None:
            host.kill()
            host.wait()
    return [(host.returncode, host_out), (peer.returncode, peer.stdout + peer.stderr[-1500:])]


@pytest.mark.timeout(300)
def test_the_store_host_waits_for_its_peers_before_it_exits():
    """Three rounds: with rank 0 leaving at once, most rounds lost rank 1 (3 of 5 on this
    machine: "Connection reset by peer", "Failed to recv, got 0 bytes")."""
    pytest.importorskip("torch.distributed")
    for round_ in range(3):
        (host, host_out), (peer, peer_out) = _pair()
        assert peer == 0 and "rank 1: left" in peer_out, f"round {round_}: rank 1 exited {peer}:\n{peer_out}"
        assert host == 0 and "rank 0: left" in host_out, f"round {round_}: rank 0 exited {host}:\n{host_out}"


class _FakeDevice:
    """What the copies in tests/gpu/support.py ask of CuPy, with CUDA's ordering: a pageable
    host-to-device cudaMemcpy returns once the bytes are staged; they land on the device (for a
    non-blocking stream to see) only at a synchronisation of the device or the legacy stream."""

    def __init__(self) -> None:
        self.memory = bytearray(1 << 12)
        self.in_flight: list = []
        self.calls: list = []
        device = self

        class Memory:
            def __init__(self, ptr: int) -> None:
                self.ptr = ptr

            def __add__(self, offset: int) -> "Memory":
                return Memory(self.ptr + offset)

        def memcpy(dst, src, size, kind):
            device.calls.append("memcpy")
            assert kind == runtime.memcpyHostToDevice
            staged = ctypes.string_at(src, size)
            device.in_flight.append((dst, staged))

        def synchronize(*_):
            device.calls.append("synchronize")
            for dst, data in device.in_flight:
                device.memory[dst : dst + len(data)] = data
            device.in_flight.clear()

        runtime = SimpleNamespace(
            memcpy=memcpy, memcpyHostToDevice=1, memcpyDeviceToHost=2, deviceSynchronize=synchronize,
            streamSynchronize=synchronize,
        )  # fmt: skip
        self.module = SimpleNamespace(
            cuda=SimpleNamespace(alloc=lambda size: Memory(64), runtime=runtime),
            ndarray=lambda shape, dtype, memptr, strides: SimpleNamespace(
                shape=shape, dtype=np.dtype(dtype), ptr=memptr.ptr, strides=strides
            ),
        )

    def seen_by_another_stream(self, array) -> np.ndarray:
        """The bytes a kernel on a non-blocking stream would read now."""
        count = int(np.prod(array.shape))
        start = array.ptr
        return np.frombuffer(bytes(self.memory[start : start + count * array.dtype.itemsize]), array.dtype)


def test_cupy_from_host_has_landed_when_it_returns(monkeypatch):
    from tests.gpu import support

    device = _FakeDevice()
    monkeypatch.setitem(sys.modules, "cupy", device.module)
    host = np.arange(1, 9, dtype=np.float32)
    array = support.cupy_from_host(host)
    assert np.array_equal(device.seen_by_another_stream(array), host)
    assert device.in_flight == [] and device.calls[0] == "memcpy"


def test_the_fake_device_keeps_a_copy_in_flight():
    """The fake itself: without a synchronisation the bytes are not there yet."""
    device = _FakeDevice()
    data = np.ones(4, np.float32)
    device.module.cuda.runtime.memcpy(64, data.ctypes.data, data.nbytes, 1)
    array = SimpleNamespace(shape=(4,), dtype=np.dtype(np.float32), ptr=64)
    assert not np.array_equal(device.seen_by_another_stream(array), data)
    device.module.cuda.runtime.deviceSynchronize()
    assert np.array_equal(device.seen_by_another_stream(array), data)
