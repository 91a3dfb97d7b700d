"""Rank program: the GPU test matrix on the MPI backend with host arrays (see test_gpu_matrix_on_cpu.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import denseccl
from tests.gpu import matrix


def main() -> None:
    comm = denseccl.init(backend="mpi", timeout=60)
    libs = [(matrix.NumpyLib(), ["float16", "float64", "uint8", "int32", "bool", "complex128", "int16"])]
    try:
        libs.append((matrix.TorchLib("cpu"), ["bfloat16", "float32", "bool"]))
    except ImportError:
        pass
    report = matrix.run_matrix(comm, libs)
    print(json.dumps({"rank": comm.rank, **report.summary()}), flush=True)
    if report.failures:
        sys.exit(1)
    comm.barrier()
    if comm.rank == 0:
        print("MATRIX OK", flush=True)
    comm.close()


if __name__ == "__main__":
    main()
