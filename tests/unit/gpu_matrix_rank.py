"""Rank program: the GPU test matrix on the MPI backend with host arrays (see test_gpu_matrix_on_cpu.py)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import denseccl
from tests.gpu import matrix
from tests.support.checker import Checker


def main() -> None:
    comm = denseccl.init(backend="mpi", timeout=60)
    libs = [(matrix.NumpyLib(), ["float16", "float64", "uint8", "int32", "bool", "complex128", "int16"])]
    try:
        libs.append((matrix.TorchLib("cpu"), ["bfloat16", "float32", "bool"]))
    except ImportError:
        pass
    report = matrix.run_matrix(comm, libs)
    check = Checker("gpu_matrix", comm.rank, comm.size)
    check.tally(report.checks, report.failures)
    comm.close()
    check.finish()


if __name__ == "__main__":
    main()
