"""The GPU test matrix (tests/gpu/matrix.py) run on the CPU over the MPI backend, with NumPy
arrays and CPU torch tensors: it tests the harness that the GPU session will rely on (inputs,
references, layout checks), so that a failure there is the library's, not the harness's."""

from __future__ import annotations

from pathlib import Path

import pytest

import denseccl
from tests.gpu import matrix
from tests.support.checker import expect_summaries
from tests.support.optional import needs_mpi4py, require_mpi4py
from tests.support.ranks import run_ranks

RANK_PROGRAM = Path(__file__).with_name("gpu_matrix_rank.py")


@pytest.fixture(scope="module")
def comm():
    require_mpi4py()
    communicator = denseccl.init(backend="mpi", timeout=30)
    yield communicator
    communicator.close()


def test_matrix_numpy_one_rank(comm):
    report = matrix.run_matrix(
        comm, [(matrix.NumpyLib(), ["float16", "float32", "int8", "uint64", "bool", "complex64", "int16"])]
    )
    assert report.failures == [], report.failures[:5]
    assert report.checks > 300


def test_matrix_torch_cpu_one_rank(comm):
    pytest.importorskip("torch")
    report = matrix.run_matrix(comm, [(matrix.TorchLib("cpu"), ["bfloat16", "float32", "int64", "bool", "complex64"])])
    assert report.failures == [], report.failures[:5]
    assert report.checks > 200


@needs_mpi4py
def test_matrix_two_ranks():
    result = run_ranks(2, RANK_PROGRAM, timeout=300)
    expect_summaries(result.stdout, "gpu_matrix", 2)


def test_reference():
    import numpy as np

    ins = [np.array([1, -3], np.int64), np.array([2, 2], np.int64)]
    assert matrix.reference(ins, "avg").tolist() == [1, 0]  # truncation toward zero
    assert matrix.reference(ins, "premul", 2).tolist() == [6, -2]
    flags = [np.array([True, False]), np.array([True, True])]
    assert matrix.reference(flags, "sum").tolist() == [True, True]
    assert matrix.reference(flags, "prod").tolist() == [True, False]
    assert matrix.candidate_ops("int16", "nccl") == [] and "prod" not in matrix.candidate_ops("complex64", "nccl")
