"""torch for the tests of core modules: the module when it is installed, else None, so that a
file's NumPy tests still run without torch and only the tests marked ``needs_torch`` skip; the
same for mpi4py (``needs_mpi4py``), which is looked up, not imported: importing it starts MPI."""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest

torch: Any
try:
    import torch
except ImportError:
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="needs torch")

#: the one-rank communicator of the unit tests is an MPI one (singleton MPI, no mpiexec)
has_mpi4py = importlib.util.find_spec("mpi4py") is not None
needs_mpi4py = pytest.mark.skipif(not has_mpi4py, reason="needs mpi4py (pip install 'denseccl[mpi]')")


def require_mpi4py() -> None:
    """Skip the calling test (or fixture) where mpi4py is not installed."""
    if not has_mpi4py:
        pytest.skip("needs mpi4py (pip install 'denseccl[mpi]')")
