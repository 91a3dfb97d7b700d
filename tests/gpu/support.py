"""Helpers of the GPU tests: skip cleanly without a usable GPU, move arrays with exact layouts
between host and device WITHOUT CuPy kernels (raw cudaMemcpy of the storage span, so no NVRTC is
needed and the layout on the device is exactly the one built on the host), and start ranks in a
torchrun-style environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, LOCAL_RANK).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import warnings
from math import prod
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from denseccl.layout import span_start  # noqa: E402


def gpu_problem() -> Optional[str]:
    """Why the GPU tests cannot run here, or None."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import cupy  # noqa: F401
    except Exception as error:  # noqa: BLE001
        return f"cupy is not importable ({type(error).__name__}: {error})"
    from denseccl.backends.nccl.init import nccl_missing

    return nccl_missing()


def require_gpu() -> Any:
    """CuPy, or skip the calling test module."""
    import pytest

    problem = gpu_problem()
    if problem is not None:
        pytest.skip(f"GPU tests need CuPy, a GPU and NCCL: {problem}", allow_module_level=True)
    import cupy

    return cupy


def torch_cuda() -> Any:
    """torch with CUDA, or None."""
    try:
        import torch
    except Exception:  # noqa: BLE001
        return None
    return torch if torch.cuda.is_available() else None


# -- host <-> device with exact layouts ---------------------------------------------------------


def fp8_reduction_problem(transport: Any) -> Optional[str]:
    """Why ``transport`` (an NCCLTransport) cannot reduce fp8, or None: NCCL has fp8 types from
    2.24 on (a torch CUDA 12 build can pin an older NCCL) and reduces them on sm90 and newer."""
    from denseccl.backends.nccl.tables import FP8_REDUCTION_CAPABILITY, FP8_SINCE, version_string

    if transport.version < FP8_SINCE:
        return f"NCCL {version_string(transport.version)} has no fp8 types (NCCL >= {version_string(FP8_SINCE)})"
    if transport.compute_capability < FP8_REDUCTION_CAPABILITY:
        return "NCCL reduces fp8 on sm90 and newer only"
    return None


def host_strided(shape: Sequence[int], strides: Sequence[int], dtype: Any) -> np.ndarray:
    """A NumPy array with exactly these element strides over ``numel`` elements."""
    shape, strides = tuple(shape), tuple(strides)
    item = np.dtype(dtype)
    numel = prod(shape)
    lowest = span_start(shape, strides) if numel else 0
    base = np.zeros(max(numel, 1), item)
    return np.ndarray(
        shape, item, buffer=base, offset=-lowest * item.itemsize, strides=tuple(s * item.itemsize for s in strides)
    )


def _span(shape: Sequence[int], strides: Sequence[int]) -> tuple:
    numel = prod(shape)
    return (span_start(shape, strides) if numel else 0), numel


def cupy_from_host(host: np.ndarray) -> Any:
    """A CuPy array with ``host``'s shape, strides and values (one cudaMemcpy of the span), there
    for work on any stream once this returns. From pageable memory cudaMemcpy may return before
    the DMA has landed, and only the legacy stream is ordered after it, not a non-blocking stream
    the tests then use: so the device is synchronized before returning."""
    import cupy

    item = host.itemsize
    strides = tuple(s // item for s in host.strides)
    lo, numel = _span(host.shape, strides)
    memory = cupy.cuda.alloc(max(numel, 1) * item)
    if numel:
        cupy.cuda.runtime.memcpy(
            memory.ptr, host.ctypes.data + lo * item, numel * item, cupy.cuda.runtime.memcpyHostToDevice
        )
        cupy.cuda.runtime.deviceSynchronize()
    return cupy.ndarray(host.shape, host.dtype, memptr=memory + (-lo * item), strides=host.strides)


def cupy_to_host(array: Any) -> np.ndarray:
    """A NumPy array with the device array's shape, strides and values (synchronous copy)."""
    import cupy

    item = array.dtype.itemsize
    strides = tuple(s // item for s in array.strides)
    host = host_strided(array.shape, strides, array.dtype)
    lo, numel = _span(array.shape, strides)
    if numel:
        cupy.cuda.runtime.memcpy(
            host.ctypes.data + lo * item, array.data.ptr + lo * item, numel * item, cupy.cuda.runtime.memcpyDeviceToHost
        )
    return host


class CAIArray:
    """A device array known only through ``__cuda_array_interface__`` (wraps a CuPy array)."""

    def __init__(self, array: Any) -> None:
        self.array = array
        self.__cuda_array_interface__ = array.__cuda_array_interface__


# -- ranks -------------------------------------------------------------------------------------


def inner_timeout(default: float) -> float:
    """``default``, or less when tests/gpu/run.sh gives this step less time
    (``DENSECCL_GPU_INNER_TIMEOUT``): a limit inside a test must end before the cap around it,
    so that a hung rank is killed with its output printed rather than killed unseen."""
    raw = os.environ.get("DENSECCL_GPU_INNER_TIMEOUT")
    try:
        return min(default, max(float(raw), 10.0)) if raw else default
    except ValueError:
        return default


def run_program(
    argv: Sequence[str], timeout: float, env: Optional[Dict[str, str]] = None
) -> "subprocess.CompletedProcess[str]":
    """Run ``python *argv`` from the repository root; past ``timeout`` it is killed and its
    output so far is still returned (returncode -9)."""
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1", **(env or {})}
    try:
        return subprocess.run(
            [sys.executable, *argv], cwd=str(ROOT), capture_output=True, text=True, timeout=timeout, env=full_env
        )
    except subprocess.TimeoutExpired as expired:
        def text(value: Any) -> str:
            return value.decode(errors="replace") if isinstance(value, bytes) else (value or "")

        output = text(expired.stdout) + f"\n[killed after {timeout} s]"
        return subprocess.CompletedProcess(expired.cmd, -9, output, text(expired.stderr))


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def rank_env(rank: int, size: int, port: int, *, split_hosts: bool, local_rank: Optional[int] = None) -> Dict[str, str]:
    """torchrun-style variables for one rank; with ``split_hosts`` each rank gets its own
    NCCL_HOSTID (and sockets on lo), so that two ranks may share one GPU."""
    env = {
        "RANK": str(rank),
        "WORLD_SIZE": str(size),
        "LOCAL_RANK": str(rank if local_rank is None else local_rank),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        "PYTHONUNBUFFERED": "1",
    }
    if split_hosts:
        env.update({"NCCL_HOSTID": f"denseccl-rank{rank}", "NCCL_SOCKET_IFNAME": "lo", "NCCL_IB_DISABLE": "1"})
    return env


def spawn_ranks(
    size: int,
    argv: Sequence[str],
    *,
    split_hosts: bool,
    timeout: float = 240.0,
    extra_env: Optional[Dict[str, str]] = None,
) -> List[Dict[str, Any]]:
    """Run ``python *argv`` as ``size`` ranks; return each rank's returncode, stdout, stderr
    and the JSON lines it printed. Ranks still running after ``timeout`` are killed."""
    timeout = inner_timeout(timeout)
    port = free_port()
    processes = []
    for rank in range(size):
        env = dict(os.environ)
        env.update(rank_env(rank, size, port, split_hosts=split_hosts))
        env.update(extra_env or {})
        processes.append(
            subprocess.Popen(
                [sys.executable, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                cwd=str(ROOT),
            )
        )
    results = []
    deadline = time.monotonic() + timeout  # one limit for all ranks together
    for rank, process in enumerate(processes):
        try:
            out, err = process.communicate(timeout=max(deadline - time.monotonic(), 1.0))
        except subprocess.TimeoutExpired:
            for other in processes:
                other.kill()
            out, err = process.communicate()
            out += f"\n[killed after {timeout} s]"
        lines = []
        for line in out.splitlines():
            if line.startswith("{"):
                try:
                    lines.append(json.loads(line))
                except ValueError:
                    pass
        results.append({"rank": rank, "returncode": process.returncode, "stdout": out, "stderr": err, "json": lines})
    return results


def describe(results: List[Dict[str, Any]], tail: int = 4000) -> str:
    return "\n".join(
        f"--- rank {r['rank']} exited {r['returncode']}\n{r['stdout'][-tail:]}\n--- stderr\n{r['stderr'][-tail:]}"
        for r in results
    )


def two_rank_mode() -> Dict[str, Any]:
    """How two ranks can run here: on two GPUs, or on one GPU with NCCL_HOSTID per rank, or
    not at all. ``DENSECCL_GPU_TWO_RANKS`` (set by tests/gpu/run.sh from its probe) wins."""
    forced = os.environ.get("DENSECCL_GPU_TWO_RANKS")
    if forced in ("devices", "hostid"):
        return {"mode": forced, "split_hosts": forced == "hostid"}
    if forced == "no":
        return {"mode": "no", "why": "tests/gpu/run.sh's probe found no way to run two ranks"}
    import cupy

    if cupy.cuda.runtime.getDeviceCount() >= 2:
        return {"mode": "devices", "split_hosts": False}
    results = spawn_ranks(2, ["tests/gpu/rank.py", "probe"], split_hosts=True, timeout=120)
    if all(r["returncode"] == 0 for r in results):
        return {"mode": "hostid", "split_hosts": True}
    return {"mode": "no", "why": "two ranks on one GPU failed even with NCCL_HOSTID:\n" + describe(results, 1500)}


__all__ = [
    "CAIArray",
    "cupy_from_host",
    "cupy_to_host",
    "gpu_problem",
    "host_strided",
    "inner_timeout",
    "run_program",
    "require_gpu",
    "spawn_ranks",
    "torch_cuda",
    "two_rank_mode",
]
