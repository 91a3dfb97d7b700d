"""``python -m denseccl``: the environment report, run as a user runs it (a subprocess), here
and in an environment that has nothing but NumPy; and the one-time warning when the compiled
half kernels are missing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, Optional

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run(
    args: list, env: Optional[Dict[str, str]] = None, python: Optional[list] = None
) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("DENSECCL_", "NCCL_", "PMI_", "OMPI_"))}
    environment["PYTHONPATH"] = str(ROOT)
    environment.update(env or {})
    return subprocess.run(
        [*(python or [sys.executable]), *args],
        capture_output=True,
        text=True,
        env=environment,
        timeout=120,
        cwd=str(ROOT),
    )


def test_report_names_versions_kernels_backends_and_variables() -> None:
    done = _run(["-m", "denseccl"], env={"DENSECCL_DEBUG": "INFO", "NCCL_DEBUG": "WARN", "MPI_LOCALRANKID": "0"})
    assert done.returncode == 0, done.stderr
    out = done.stdout
    import denseccl

    assert f"denseccl      {denseccl.__version__}" in out and f"numpy         {np.__version__}" in out
    for section in (
        "Versions",
        "MPI library (MPI.Get_library_version())",
        "Compiled half kernels",
        "Backends",
        "Environment variables",
    ):
        assert section in out, section
    for backend in ("mpi ", "nccl ", "torch backend ", "gloo engine "):
        assert f"\n  {backend}" in out, backend
    assert "DENSECCL_DEBUG=INFO" in out and "NCCL_DEBUG=WARN" in out and "MPI_LOCALRANKID=0" in out
    pytest.importorskip("mpi4py")
    from mpi4py import MPI

    first = str(MPI.Get_library_version()).splitlines()[0].strip()
    assert first in out  # the MPI library's own words
    from denseccl.backends.mpi import host_kernels

    assert ("  yes: built" in out) == host_kernels.native_available()
    recorder = "Flight recorder\n  on: the last 1024 calls of each communicator (DENSECCL_TRACE_BUFFER)"
    assert f"{recorder}; record compiled (denseccl._ring)" in out


def test_report_says_when_the_recorder_is_off() -> None:
    done = _run(["-m", "denseccl"], env={"DENSECCL_TRACE_BUFFER": "0"})
    assert done.returncode == 0, done.stderr
    assert "Flight recorder\n  off (DENSECCL_TRACE_BUFFER=0)\n" in done.stdout


def test_report_as_json_does_not_start_mpi() -> None:
    done = _run(
        [
            "-c",
            "import json, sys; from denseccl.__main__ import main; main(['--json']); "
            "from mpi4py import MPI; print(json.dumps(MPI.Is_initialized()))",
        ]
    )
    if "No module named 'mpi4py'" in done.stderr:
        pytest.skip("mpi4py is not installed")
    assert done.returncode == 0, done.stderr
    report, initialized = done.stdout.rsplit("\n", 2)[0], done.stdout.rsplit("\n", 2)[1]
    data = json.loads(report)
    assert json.loads(initialized) is False  # asking the library's version did not initialise MPI
    assert set(data["backends"]) == {"mpi", "nccl", "torch backend", "gloo engine"}
    assert data["versions"]["denseccl"] and "MPI library" in data["versions"]


def test_report_without_mpi_torch_or_cupy(tmp_path: Path) -> None:
    """Only NumPy importable (no site-packages; a directory holding links to NumPy alone)."""
    site = Path(np.__file__).resolve().parents[1]
    only = tmp_path / "site"
    only.mkdir()
    for name in ("numpy", "numpy.libs"):
        if (site / name).exists():
            (only / name).symlink_to(site / name)
    done = _run(["-S", "-m", "denseccl"], env={"PYTHONPATH": os.pathsep.join([str(ROOT), str(only)])})
    assert done.returncode == 0, done.stderr
    out = done.stdout
    for name in ("mpi4py", "torch", "cupy", "ml_dtypes", "matplotlib"):
        assert f"  {name:<12}  not installed" in out, name
    assert "MPI library   not installed" in out and "NCCL          not installed" in out
    assert "mpi            no: mpi4py is not installed" in out
    assert "nccl           no: the nccl backend needs CuPy, which is not installed" in out
    assert "torch backend  no: torch is not installed" in out and "download.pytorch.org/whl/cpu" in out


def test_half_fallback_warns_once_and_the_report_says_so() -> None:
    hide = "import sys; sys.modules['denseccl.backends.mpi._half_kernels'] = None; "
    probe = hide + (
        "import warnings, numpy as np\n"
        "from denseccl.dtypes import DType\n"
        "from denseccl.ops import ReduceOp\n"
        "from denseccl.backends.mpi import host_kernels as hk\n"
        "assert not hk.native_available()\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    for _ in range(3):\n"
        "        hk.half_reduction(ReduceOp.SUM, DType('float16', 2, 'f'))\n"
        "        hk.divide(np.ones(4, np.float16), 2, DType('float16', 2, 'f'))\n"
        "print(len(caught), *(f'{c.category.__name__} {c.message}' for c in caught[:1]))\n"
    )
    done = _run(["-c", probe])
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("1 HalfKernelsWarning denseccl: the compiled float16/bfloat16 kernels"), done.stdout
    chosen = _run(["-c", probe], env={"DENSECCL_HOST_KERNELS": "numpy"})  # chosen on purpose: no warning
    assert chosen.returncode == 0 and chosen.stdout == "0\n", chosen.stdout + chosen.stderr
    report = _run(["-c", hide + "from denseccl.__main__ import main; main([])"])
    kernels = "(denseccl.backends.mpi._half_kernels)"
    assert f"  NO: the compiled float16/bfloat16 kernels {kernels} were not built" in report.stdout
