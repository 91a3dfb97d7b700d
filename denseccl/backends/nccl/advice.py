"""Which extra installs the GPU stack on this machine: ``denseccl[cuda12]`` or ``denseccl[cuda13]``.

Why: CuPy and NCCL come as one wheel per CUDA major version, and a CuPy for the wrong one
installed beside the right one breaks both (they share the ``cupy`` package). The advice names
the extra for the CUDA this process already runs: torch's build when torch is loaded (the NCCL
wheels must match the ones torch brought), else the runtime CuPy loads, else the driver's.
"""

from __future__ import annotations

import ctypes
import sys
from typing import Any, Optional

#: CUDA major versions that have an extra (pyproject.toml's optional dependencies)
EXTRAS = (12, 13)
GENERIC = "pip install 'denseccl[cuda12]' (CuPy and NCCL for CUDA 12; 'denseccl[cuda13]' for CUDA 13)"


def _major(version: Any) -> Optional[int]:
    """12 from ``"12.8"``, 13 from ``13000`` (CUDA's integer form, 1000 * major + 10 * minor)."""
    try:
        if isinstance(version, str):
            return int(version.split(".")[0])
        if isinstance(version, int) and version > 0:
            return version // 1000
    except ValueError:
        return None
    return None


def _torch_cuda() -> Optional[int]:
    torch = sys.modules.get("torch")
    return _major(getattr(getattr(torch, "version", None), "cuda", None))


def _cupy_runtime() -> Optional[int]:
    try:
        from cupy.cuda import runtime  # noqa: PLC0415 - optional dependency

        return _major(int(runtime.runtimeGetVersion()))
    except Exception:  # noqa: BLE001 - no CuPy, or one that cannot load its runtime
        return None


def _driver() -> Optional[int]:
    """The newest CUDA the driver supports (``cuDriverGetVersion``), None without a driver."""
    try:
        library = ctypes.CDLL("libcuda.so.1")
        version = ctypes.c_int(0)
        if library.cuDriverGetVersion(ctypes.byref(version)) != 0:
            return None
        return _major(version.value)
    except (OSError, AttributeError):
        return None


def cuda_major() -> Optional[int]:
    """The CUDA major version this process uses, or None where nothing says."""
    for source in (_torch_cuda, _cupy_runtime, _driver):
        major = source()
        if major is not None:
            return major
    return None


def install_hint(major: Optional[int] = None) -> str:
    """``pip install 'denseccl[cudaNN]'`` for this machine's CUDA (``major``, default
    :func:`cuda_major`), or both extras where its CUDA is unknown or has none."""
    major = cuda_major() if major is None else major
    if major not in EXTRAS:
        return GENERIC
    return f"pip install 'denseccl[cuda{major}]' (CuPy and NCCL for CUDA {major}, the CUDA this process uses)"


def nccl_wheel(major: Optional[int] = None) -> str:
    """The NCCL wheel for this machine's CUDA (``nvidia-nccl-cu13`` on CUDA 13)."""
    major = cuda_major() if major is None else major
    return f"nvidia-nccl-cu{major}" if major in EXTRAS else "nvidia-nccl-cu12 (or nvidia-nccl-cu13 for CUDA 13)"


__all__ = ["cuda_major", "install_hint", "nccl_wheel"]
