"""Every collective x layout x dtype against a NumPy reference built from ALL ranks' inputs.

Each rank rebuilds every rank's input from ``(case, rank)``, so it checks its own result without
trusting data that came over the wire. Inputs are small integers (bool: 0/1), so sums,
products, minima, maxima, averages over two ranks and PreMulSum by 0.5 or 2 are exact in every
dtype, fp8 included: results are compared for equality, in any reduction order.

The arrays come from a *lib* adapter: CuPy arrays (negative strides included), CUDA torch tensors
(bfloat16, fp8), plain ``__cuda_array_interface__`` objects, and, so that this harness itself is
tested on the CPU, NumPy arrays and CPU tensors on the MPI backend (tests/unit/test_gpu_matrix_on_cpu.py).
"""

from __future__ import annotations

import traceback
import zlib
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

import denseccl
from denseccl.layout import Layout, stacked
from tests.support.layouts import make_strides

# name -> (shape, outer-to-inner order, flipped dims)
LAYOUTS: Dict[str, Tuple[Tuple[int, ...], Tuple[int, ...], Tuple[int, ...]]] = {
    "contiguous": ((4, 5), (0, 1), ()),
    "transposed": ((4, 5), (1, 0), ()),
    "channels_last": ((2, 3, 2, 4), (0, 2, 3, 1), ()),
    "size1_odd_strides": ((3, 1, 4), (0, 1, 2), ()),
    "empty": ((0, 3), (1, 0), ()),
    "scalar": ((), (), ()),
    "reversed": ((3, 4), (0, 1), (0, 1)),
    "permuted_reversed": ((2, 3, 4), (2, 0, 1), (1,)),
}
FLIPPED = {"reversed", "permuted_reversed"}
FLOATS = {"float16", "bfloat16", "float32", "float64", "float8_e4m3fn", "float8_e5m2"}


def layout_strides(name: str) -> Tuple[Tuple[int, ...], Tuple[int, ...]]:
    shape, order, flips = LAYOUTS[name]
    return shape, make_strides(shape, order, flips, [7] * len(shape))


# -- libs -----------------------------------------------------------------------------------------


def _storage(dtype: str) -> Any:
    """NumPy dtype that holds the logical values before conversion."""
    if dtype in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):
        return np.float32
    return np.dtype(dtype)


def _host(values: np.ndarray, strides: Sequence[int], dtype: str) -> np.ndarray:
    from tests.gpu.support import host_strided

    array = host_strided(values.shape, strides, dtype)
    array[...] = values
    return array


class NumpyLib:
    name, flips, device = "numpy", True, "cpu"

    def make(self, values: np.ndarray, strides: Sequence[int], dtype: str) -> Any:
        return _host(values, strides, dtype)

    def read(self, array: Any) -> np.ndarray:
        return np.array(array)

    def strides(self, array: Any) -> Tuple[int, ...]:
        return tuple(s // array.itemsize for s in array.strides)

    def where(self, array: Any) -> str:
        return "cpu"


class CupyLib(NumpyLib):
    name, flips = "cupy", True

    def make(self, values: np.ndarray, strides: Sequence[int], dtype: str) -> Any:
        from tests.gpu.support import cupy_from_host

        return cupy_from_host(_host(values, strides, dtype))

    def read(self, array: Any) -> np.ndarray:
        from tests.gpu.support import cupy_to_host

        return np.array(cupy_to_host(getattr(array, "array", array)))

    def strides(self, array: Any) -> Tuple[int, ...]:
        array = getattr(array, "array", array)
        return tuple(s // array.dtype.itemsize for s in array.strides)

    def where(self, array: Any) -> str:
        return f"cuda:{getattr(array, 'array', array).device.id}"


class CAILib(CupyLib):
    """Device arrays seen only through __cuda_array_interface__."""

    name = "cuda_array_interface"

    def make(self, values: np.ndarray, strides: Sequence[int], dtype: str) -> Any:
        from tests.gpu.support import CAIArray

        return CAIArray(super().make(values, strides, dtype))


class TorchLib:
    flips = False

    def __init__(self, device: str) -> None:
        import torch

        self.torch = torch
        self.device = device
        self.name = f"torch-{device.split(':')[0]}"

    def make(self, values: np.ndarray, strides: Sequence[int], dtype: str) -> Any:
        torch = self.torch
        target = getattr(torch, dtype)
        source = torch.from_numpy(np.array(values, dtype=_storage(dtype), order="C")).to(target)  # 0-d stays 0-d
        array = torch.empty_strided(values.shape, tuple(strides), dtype=target, device=self.device)
        if array.numel():
            array.copy_(source)
        return array

    def read(self, array: Any) -> np.ndarray:
        torch = self.torch
        host = array.detach().to("cpu")
        if host.dtype in (torch.bfloat16, torch.float16) or "float8" in str(host.dtype):
            host = host.to(torch.float64)
        return host.numpy().copy()

    def strides(self, array: Any) -> Tuple[int, ...]:
        return tuple(array.stride())

    def where(self, array: Any) -> str:
        return str(array.device)


# -- values and references ----------------------------------------------------------------------


def values_for(seed: Tuple[int, ...], rank: int, shape: Tuple[int, ...], dtype: str) -> np.ndarray:
    rng = np.random.default_rng([*seed, rank])
    if dtype == "bool":
        return rng.integers(0, 2, shape).astype(bool)
    if dtype.startswith("complex"):
        return (rng.integers(-3, 4, shape) + 1j * rng.integers(-3, 4, shape)).astype(dtype)
    if dtype.startswith("uint"):
        return rng.integers(0, 4, shape).astype(dtype)
    if dtype.startswith("float8"):
        return rng.integers(-2, 3, shape).astype(np.float32)
    return rng.integers(-3, 4, shape).astype(_storage(dtype))


def widen(values: np.ndarray) -> np.ndarray:
    if values.dtype == bool:
        return values
    if values.dtype.kind == "c":
        return values.astype(np.complex128)
    if values.dtype.kind in "iu":
        return values.astype(np.int64)
    return values.astype(np.float64)


def reference(inputs: List[np.ndarray], op: str, factor: Optional[float] = None) -> np.ndarray:
    stack = np.stack([widen(v) for v in inputs])
    if stack.dtype == bool:
        return {"sum": stack.any(0), "max": stack.any(0), "prod": stack.all(0), "min": stack.all(0)}[op]
    if op == "sum":
        return stack.sum(0)
    if op == "prod":
        return stack.prod(0)
    if op == "min":
        return stack.min(0)
    if op == "max":
        return stack.max(0)
    if op == "avg":
        total = stack.sum(0)
        if total.dtype.kind == "i":
            return np.trunc(total / len(inputs)).astype(np.int64)  # integer avg truncates, as NCCL does
        return total / len(inputs)
    if op == "premul":
        return (stack * factor).sum(0)
    raise ValueError(op)


def candidate_ops(dtype: str, backend: str) -> List[str]:
    """The ops the matrix tries on ``dtype``, before the library is asked (:func:`ops_for`)."""
    if dtype == "bool":
        return ["sum", "prod", "min", "max"]
    if dtype.startswith("complex"):
        return ["sum", "avg", "premul"] + (["prod"] if backend == "mpi" else [])
    if dtype in ("int16", "uint16") and backend == "nccl":
        return []  # NCCL moves them (broadcast, allgather) but cannot reduce them
    return ["sum", "prod", "min", "max", "avg", "premul"]


def ops_for(dtype: str, comm: Any) -> List[str]:
    """The candidate ops that ``comm``'s library accepts on ``dtype``, asked of denseccl itself
    (the common tables, then the transport's own check: its size, NCCL version and GPU). E.g.
    NCCL refuses PreMulSum(0.5) on fp8 with one rank on purpose, so the matrix does not try it."""
    from denseccl.dtypes import DTYPES
    from denseccl.errors import ArgumentError, OpError
    from denseccl.ops import as_op, check_op_for_dtype

    accepted = []
    for op in candidate_ops(dtype, comm.backend):
        reduce_op = as_op(op_arg(op, dtype))
        try:
            check_op_for_dtype(reduce_op, DTYPES[dtype], comm.transport.dtypes, comm.backend)
            comm.transport.check_op(reduce_op, DTYPES[dtype])
        except (ArgumentError, OpError):
            continue
        accepted.append(op)
    return accepted


def factor_for(dtype: str) -> float:
    return 2 if dtype.startswith(("int", "uint")) else 0.5


def op_arg(op: str, dtype: str) -> Any:
    return denseccl.PreMulSum(factor_for(dtype)) if op == "premul" else op


# -- the matrix -----------------------------------------------------------------------------------


class Report:
    def __init__(self) -> None:
        self.checks = 0
        self.failures: List[str] = []
        self.skipped: List[str] = []

    def check(self, condition: bool, what: str) -> None:
        self.checks += 1
        if not condition:
            self.failures.append(what)

    def summary(self) -> Dict[str, Any]:
        return {
            "checks": self.checks, "failures": len(self.failures), "first_failures": self.failures[:20],
            "skipped": self.skipped[:20],
        }


def _equal(got: np.ndarray, want: np.ndarray) -> bool:
    if got.shape != want.shape:
        return False
    if want.dtype == bool:
        return bool(np.array_equal(got.astype(bool), want))
    return bool(np.array_equal(widen(got), want))


def run_case(comm: Any, lib: Any, dtype: str, layout: str, report: Report, seed: int = 0) -> None:
    """All collectives of one (lib, dtype, layout) on this rank."""
    rank, size = comm.rank, comm.size
    shape, strides = layout_strides(layout)
    block = Layout(shape, strides, 1, "x")
    big = stacked(block, size)
    label = f"{lib.name} {dtype} {layout}"
    case_id = [seed, zlib.crc32(f"{lib.name} {dtype} {layout}".encode())]  # the same on every rank

    def inputs(tag: int) -> List[np.ndarray]:
        return [values_for((*case_id, tag), r, shape, dtype) for r in range(size)]

    def stacked_inputs(tag: int) -> List[np.ndarray]:
        return [values_for((*case_id, tag), r, (size, *shape), dtype) for r in range(size)]

    def attempt(what: str, thunk: Callable[[], None]) -> None:
        try:
            thunk()
        except Exception as error:  # noqa: BLE001 - report every failing case, keep going
            report.check(False, f"{label} {what}: {type(error).__name__}: {error}\n{traceback.format_exc(limit=3)}")

    ops = ops_for(dtype, comm)
    for index, op in enumerate(ops):

        def allreduce(op: str = op, tag: int = index) -> None:
            ins = inputs(tag)
            x = lib.make(ins[rank], strides, dtype)
            result = comm.allreduce(x, op_arg(op, dtype))
            report.check(result is x, f"{label} allreduce {op}: not in place")
            report.check(
                _equal(lib.read(x), reference(ins, op, factor_for(dtype))), f"{label} allreduce {op}: wrong values"
            )

        attempt(f"allreduce {op}", allreduce)

    if ops:
        op = ops[-1]

        def allreduce_out() -> None:
            ins = inputs(100)
            x = lib.make(ins[rank], strides, dtype)
            out = lib.make(np.zeros(shape, _storage(dtype)), strides, dtype)
            result = comm.allreduce(x, op_arg(op, dtype), out=out)
            report.check(result is out, f"{label} allreduce out=: result is not out")
            report.check(
                _equal(lib.read(out), reference(ins, op, factor_for(dtype))),
                f"{label} allreduce {op} out=: wrong values",
            )
            report.check(_equal(lib.read(x), widen(ins[rank])), f"{label} allreduce out=: input changed")

        def reduce_in_place(root: int = size - 1) -> None:
            ins = inputs(101)
            x = lib.make(ins[rank], strides, dtype)
            comm.reduce(x, root, ops[0])
            want = reference(ins, ops[0]) if rank == root else widen(ins[rank])
            report.check(_equal(lib.read(x), want), f"{label} reduce {ops[0]} root={root}: wrong values")

        def reduce_out(root: int = 0) -> None:
            ins = inputs(102)
            x = lib.make(ins[rank], strides, dtype)
            out = lib.make(np.zeros(shape, _storage(dtype)), strides, dtype)
            comm.reduce(x, root, op_arg(op, dtype), out=out)
            if rank == root:
                report.check(
                    _equal(lib.read(out), reference(ins, op, factor_for(dtype))),
                    f"{label} reduce {op} out=: wrong values",
                )
            report.check(_equal(lib.read(x), widen(ins[rank])), f"{label} reduce out=: input changed")

        def reduce_scatter(use_out: bool, op: str) -> None:
            ins = stacked_inputs(103 if use_out else 104)
            x = lib.make(ins[rank], big.strides, dtype)
            out = lib.make(np.zeros(shape, _storage(dtype)), strides, dtype) if use_out else None
            result = comm.reduce_scatter(x, op_arg(op, dtype), out=out)
            want = reference([v[rank] for v in ins], op, factor_for(dtype))
            report.check(_equal(lib.read(result), want), f"{label} reduce_scatter {op} out={use_out}: wrong values")
            if out is None:
                report.check(
                    _same_layout(result, shape, strides),
                    f"{label} reduce_scatter: result strides {lib.strides(result)} != {strides}",
                )
                report.check(
                    lib.where(result) == lib.where(x), f"{label} reduce_scatter: result on {lib.where(result)}"
                )
            else:
                report.check(result is out, f"{label} reduce_scatter out=: result is not out")

        attempt("allreduce out=", allreduce_out)
        attempt("reduce in place", reduce_in_place)
        attempt("reduce out=", reduce_out)
        attempt("reduce_scatter new", lambda: reduce_scatter(False, ops[0]))
        attempt("reduce_scatter out=", lambda: reduce_scatter(True, op))

    def broadcast(root: int = size - 1) -> None:
        ins = inputs(200)
        x = lib.make(ins[rank], strides, dtype)
        result = comm.broadcast(x, root)
        report.check(
            result is x and _equal(lib.read(x), widen(ins[root])), f"{label} broadcast root={root}: wrong values"
        )

    def allgather(use_out: bool) -> None:
        ins = inputs(201)
        x = lib.make(ins[rank], strides, dtype)
        out = lib.make(np.zeros((size, *shape), _storage(dtype)), big.strides, dtype) if use_out else None
        result = comm.allgather(x, out=out)
        want = np.stack([widen(v) for v in ins])
        report.check(_equal(lib.read(result), want), f"{label} allgather out={use_out}: wrong values")
        if out is None:
            report.check(
                _same_layout(result, big.shape, big.strides),
                f"{label} allgather: result strides {lib.strides(result)} != stacked {big.strides}",
            )
            report.check(lib.where(result) == lib.where(x), f"{label} allgather: result on {lib.where(result)}")

    attempt("broadcast", broadcast)
    attempt("allgather new", lambda: allgather(False))
    attempt("allgather out=", lambda: allgather(True))


def _same_layout(result: Any, shape: Sequence[int], strides: Sequence[int]) -> bool:
    """Same shape and strides (size-1 dims excepted): the layout key without the dtype."""
    return denseccl.layout_of(result).key[1:] == Layout(tuple(shape), tuple(strides), 1, "x").key[1:]


def run_matrix(comm: Any, libs: Sequence[Tuple[Any, Sequence[str]]], layouts: Optional[Sequence[str]] = None) -> Report:
    """Every (lib, dtype, layout) given; layouts with negative strides only where the lib has them."""
    report = Report()
    for lib, dtypes in libs:
        for dtype in dtypes:
            for layout in layouts or LAYOUTS:
                if layout in FLIPPED and not lib.flips:
                    continue
                run_case(comm, lib, dtype, layout, report)
    return report


CUPY_DTYPES = [
    "float16", "float32", "float64", "int8", "uint8", "int32", "int64", "uint32", "uint64", "bool", "complex64",
    "complex128", "int16",
]
TORCH_DTYPES = ["bfloat16", "float16", "float32", "int64", "uint8", "bool", "complex64"]
FP8_DTYPES = ["float8_e4m3fn", "float8_e5m2"]


def device_libs(comm: Any, *, fp8: bool) -> List[Tuple[Any, Sequence[str]]]:
    """The device libs to run on this machine: CuPy, CAI, and torch CUDA where torch has CUDA."""
    libs: List[Tuple[Any, Sequence[str]]] = [(CupyLib(), CUPY_DTYPES), (CAILib(), ["float32", "int32", "complex64"])]
    try:
        import torch

        if torch.cuda.is_available():
            dtypes = list(TORCH_DTYPES)
            if fp8 and all(hasattr(torch, name) for name in FP8_DTYPES):
                dtypes += FP8_DTYPES
            libs.append((TorchLib(f"cuda:{comm.transport.device}"), dtypes))
    except ImportError:
        pass
    return libs
