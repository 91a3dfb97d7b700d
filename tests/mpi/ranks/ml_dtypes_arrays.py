"""NumPy arrays of ml_dtypes' bfloat16 / float8 on real ranks: reduced as bfloat16 (float32 per
step), moved bit for bit; transposed and reversed layouts."""

from __future__ import annotations

import ml_dtypes
import numpy as np

import denseccl
from tests.support.checker import Checker

comm = denseccl.init()
rank, size = comm.rank, comm.size
check = Checker("ml_dtypes", rank, size)
bf16 = np.dtype(ml_dtypes.bfloat16)


def values(r: int) -> np.ndarray:
    """Rank r's input as float32 values that bfloat16 holds exactly."""
    return (np.arange(24, dtype=np.float32).reshape(4, 6) * 0.25 - 2 + r).astype(bf16).astype(np.float32)


for name, view in [("transposed", lambda a: a.T), ("reversed", lambda a: a[::-1, ::-1]), ("row-major", lambda a: a)]:
    x = view(values(rank).astype(bf16))
    check.check(denseccl.layout_of(x).dtype == "bfloat16", f"{name}: layout dtype {denseccl.layout_of(x).dtype}")
    exact = view(sum(values(r).astype(np.float64) for r in range(size)))
    comm.allreduce(x)
    # every partial sum is rounded to bfloat16 (8 bits of mantissa): relative error <= size * 2**-8
    error = np.abs(x.astype(np.float64) - exact)
    check.check(
        bool(np.all(error <= size * 2.0**-8 * np.abs(exact) + 1e-12)), f"{name}: allreduce off by {error.max()}"
    )
    check.check(x.dtype == bf16, f"{name}: dtype became {x.dtype}")

    y = view(values(rank).astype(bf16))
    gathered = comm.allgather(y)
    for r in range(size):
        expected = view(values(r).astype(bf16))
        check.check(gathered[r].tobytes() == expected.tobytes(), f"{name}: allgather block {r} differs")
        check.check(gathered[r].strides == expected.strides, f"{name}: block {r} strides {gathered[r].strides}")

f8 = (np.arange(10, dtype=np.float32) + rank).astype(ml_dtypes.float8_e4m3fn)
try:
    comm.allreduce(f8)
    check.fail("float8 allreduce on MPI did not raise")
except denseccl.ArgumentError as error:
    check.check("float8_e4m3fn" in str(error), f"float8 error does not name the dtype: {error}")
check.check(
    np.array_equal(
        f8.astype(np.float32),
        (np.arange(10, dtype=np.float32) + rank).astype(ml_dtypes.float8_e4m3fn).astype(np.float32),
    ),
    "float8 input changed by a refused call",
)
check.finish()
