"""The NCCL transport's pure parts, which need no GPU: version gates, dtype and op tables,
PreMulSum scalars (checked bit for bit against NumPy and torch), and the ctypes binding of
libnccl where the library is installed."""

from __future__ import annotations

import struct
import warnings

import numpy as np
import pytest

from denseccl.dtypes import DTYPES
from denseccl.errors import ArgumentError, OpError
from denseccl.ops import PreMulSum, ReduceOp
from denseccl.backends.nccl import library as nccl_ctypes
from denseccl.backends.nccl import tables as nccl_library

NEW = nccl_library.version_code(2, 32, 3)
OLD = nccl_library.version_code(2, 8, 4)


def test_version_codes():
    assert nccl_library.version_code(2, 7, 8) == 2708
    assert nccl_library.version_code(2, 10, 3) == 21003
    assert nccl_library.version_code(2, 32, 3) == 23203
    for code in (2708, 21003, 23203, 22400):
        major, minor, patch = map(int, nccl_library.version_string(code).split("."))
        assert nccl_library.version_code(major, minor, patch) == code


def test_type_codes_follow_nccl_h():
    expected = {
        "int8": 0, "uint8": 1, "int32": 2, "uint32": 3, "int64": 4, "uint64": 5,
        "float16": 6, "float32": 7, "float64": 8, "bfloat16": 9, "float8_e4m3fn": 10, "float8_e5m2": 11,
    }  # fmt: skip
    assert {name: code for name, (code, _) in nccl_library.NCCL_TYPES.items()} == expected
    ops = {ReduceOp.SUM: 0, ReduceOp.PRODUCT: 1, ReduceOp.MAX: 2, ReduceOp.MIN: 3, ReduceOp.AVG: 4}
    assert nccl_library.NCCL_OPS == ops


def test_cupy_constants_agree_where_cupy_has_them():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # cupy warns when libnccl is missing
        cupy_nccl = pytest.importorskip("cupy.cuda.nccl")
    if not getattr(cupy_nccl, "available", False):
        pytest.skip("cupy has no NCCL here")
    for name, constant in [("int8", "NCCL_INT8"), ("uint8", "NCCL_UINT8"), ("int32", "NCCL_INT32"),
                           ("float16", "NCCL_FLOAT16"), ("float32", "NCCL_FLOAT32"), ("float64", "NCCL_FLOAT64"),
                           ("bfloat16", "NCCL_BFLOAT16"),
                           ("uint64", "NCCL_UINT64")]:  # fmt: skip
        if hasattr(cupy_nccl, constant):
            assert nccl_library.NCCL_TYPES[name][0] == getattr(cupy_nccl, constant)
    for op, constant in [(ReduceOp.SUM, "NCCL_SUM"), (ReduceOp.PRODUCT, "NCCL_PROD"), (ReduceOp.MAX, "NCCL_MAX"),
                         (ReduceOp.MIN, "NCCL_MIN"), (ReduceOp.AVG, "NCCL_AVG")]:  # fmt: skip
        if hasattr(cupy_nccl, constant):
            assert nccl_library.NCCL_OPS[op] == getattr(cupy_nccl, constant)


def test_dtype_table_by_version():
    new, old = nccl_library.reducible_dtypes(NEW), nccl_library.reducible_dtypes(OLD)
    assert {"float8_e4m3fn", "float8_e5m2", "bfloat16"} <= set(new)
    assert "bfloat16" not in old and "float8_e4m3fn" not in old
    assert "float8_e4m3fn" not in nccl_library.reducible_dtypes(nccl_library.version_code(2, 23, 4))
    assert "float8_e4m3fn" in nccl_library.reducible_dtypes(nccl_library.version_code(2, 24, 3))
    assert new["complex64"] == new["float32"] and new["complex128"] == new["float64"] and new["bool"] == new["uint8"]
    assert "int16" not in new and "uint16" not in new
    # every dtype can be moved (broadcast, allgather): those without an NCCL type as bytes
    assert set(nccl_library.nccl_dtypes(NEW)) == set(DTYPES) == set(nccl_library.nccl_dtypes(OLD))
    assert nccl_library.nccl_dtypes(OLD)["bfloat16"] == nccl_library.UINT8


@pytest.mark.parametrize(
    "name, count, expected",
    [
        ("float32", 5, (7, 5)),
        ("complex64", 5, (7, 10)),
        ("complex128", 3, (8, 6)),
        ("bool", 4, (1, 4)),
        ("int16", 5, (1, 10)),
        ("uint16", 0, (1, 0)),
        ("float8_e5m2", 7, (11, 7)),
        ("bfloat16", 2, (9, 2)),
    ],
)
def test_elements(name, count, expected):
    assert nccl_library.elements(DTYPES[name], count, nccl_library.reducible_dtypes(NEW)) == expected


def test_elements_before_fp8_move_bytes():
    before_fp8 = nccl_library.reducible_dtypes(nccl_library.version_code(2, 21, 5))
    assert nccl_library.elements(DTYPES["float8_e4m3fn"], 7, before_fp8) == (1, 7)


def test_builtin_ops_and_bool():
    f32, boolean = DTYPES["float32"], DTYPES["bool"]
    assert nccl_library.builtin_op(ReduceOp.SUM, f32) == 0 and nccl_library.builtin_op(ReduceOp.AVG, f32) == 4
    assert nccl_library.builtin_op(ReduceOp.SUM, boolean) == nccl_library.NCCL_OPS[ReduceOp.MAX]  # logical or
    assert nccl_library.builtin_op(ReduceOp.PRODUCT, boolean) == nccl_library.NCCL_OPS[ReduceOp.MIN]  # logical and
    assert nccl_library.builtin_op(ReduceOp.MIN, boolean) == nccl_library.NCCL_OPS[ReduceOp.MIN]


def test_check_op():
    c64 = DTYPES["complex64"]
    for op in (ReduceOp.SUM, ReduceOp.AVG, PreMulSum(0.5)):
        nccl_library.check_op(op, c64, NEW)
    with pytest.raises(OpError, match="pairs of reals"):
        nccl_library.check_op(ReduceOp.PRODUCT, c64, NEW)
    with pytest.raises(OpError, match="2.10"):
        nccl_library.check_op(ReduceOp.AVG, DTYPES["float32"], OLD)
    with pytest.raises(OpError, match="2.11"):
        nccl_library.check_op(PreMulSum(2.0), DTYPES["float32"], nccl_library.version_code(2, 10, 3))
    with pytest.raises(ArgumentError, match="int16"):
        nccl_library.check_op(ReduceOp.SUM, DTYPES["int16"], NEW)
    with pytest.raises(ArgumentError, match="2.24"):
        nccl_library.check_op(ReduceOp.SUM, DTYPES["float8_e4m3fn"], nccl_library.version_code(2, 23, 4))
    with pytest.raises(OpError, match="range"):
        nccl_library.check_op(PreMulSum(1000.0), DTYPES["float8_e4m3fn"], NEW)
    with pytest.raises(OpError, match="range"):
        nccl_library.check_op(PreMulSum(1e5), DTYPES["float16"], NEW)
    nccl_library.check_op(PreMulSum(448.0), DTYPES["float8_e4m3fn"], NEW)
    nccl_library.check_op(PreMulSum(1e30), DTYPES["bfloat16"], NEW)
    nccl_library.check_op(ReduceOp.MAX, DTYPES["bool"], NEW)


# -- PreMulSum scalars, bit for bit ------------------------------------------------------------

SAMPLES = [
    0.0, -0.0, 1.0, -1.0, 0.5, 1 / 3, -1 / 7, 0.1, 2.0 / 3, 1e-3, 1e-5, 3e-6, 6e-8, 1e-8, 1e-40, 7.0, 100.0, 448.0,
    300.0,
    57344.0, 65504.0, 1e4, 3.0e38, 1.5, 1.25, 1.125, 1.0625, 1.03125, 1.015625, 1.0078125, 1.00390625, 1.001953125,
    1.0009765625, 1.00048828125, 2**-14, 2**-24, 2**-25, 3 * 2**-26, 2**-9, 2**-10, 3 * 2**-11, 2**-16, 2**-17, 2**-133,
    2**-134, 2**-126,
]  # fmt: skip


def _torch_bits(value, name):
    torch = pytest.importorskip("torch")
    return torch.tensor([value], dtype=torch.float32).to(getattr(torch, name)).view(torch.uint8).numpy().tobytes()


@pytest.mark.parametrize("name", ["float16", "bfloat16", "float8_e4m3fn", "float8_e5m2"])
def test_small_float_scalars_match_torch(name):
    """Bit for bit as torch rounds, over the samples and a sweep of the whole finite range
    (values exact in float32: torch rounds float64 -> float32 -> small)."""
    limit = nccl_library.max_finite(name)
    for value in SAMPLES + [-v for v in SAMPLES] + list(np.linspace(-limit, limit, 997)):
        single = float(np.float32(value))
        if abs(single) <= limit:
            assert nccl_library.premul_scalar(single, name) == _torch_bits(single, name), (name, single)


@pytest.mark.parametrize("name", ["bfloat16", "float8_e4m3fn", "float8_e5m2"])
def test_small_float_scalars_without_ml_dtypes(name, monkeypatch):
    """Without ml_dtypes the torch cast encodes them, to the same bits."""
    import sys

    pytest.importorskip("torch")
    for value in (1.0, -0.5, 0.125, 1 / 3, 3.0):
        with_ml = nccl_library.premul_scalar(value, name)
        with monkeypatch.context() as patch:
            patch.setitem(sys.modules, "ml_dtypes", None)  # import ml_dtypes now raises ImportError
            assert nccl_library.premul_scalar(value, name) == with_ml == _torch_bits(value, name)


def test_max_finite_matches_the_libraries():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    for name in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):
        assert nccl_library.max_finite(name) == float(ml_dtypes.finfo(getattr(ml_dtypes, name)).max)
    for name in ("float16", "float32"):
        assert nccl_library.max_finite(name) == float(np.finfo(name).max)


def test_premul_scalars():
    assert nccl_library.premul_scalar(0.25, "float32") == struct.pack("<f", 0.25)
    assert nccl_library.premul_scalar(0.1, "float64") == struct.pack("<d", 0.1)
    assert nccl_library.premul_scalar(0.5, "float16") == np.float16(0.5).tobytes()
    assert nccl_library.premul_scalar(1.0, "bfloat16") == (0x3F80).to_bytes(2, "little")
    assert nccl_library.premul_scalar(1.0, "float8_e4m3fn") == bytes([0x38])
    assert nccl_library.premul_scalar(-3, "int32") == np.int32(-3).tobytes()
    assert nccl_library.premul_scalar(3, "uint64") == np.uint64(3).tobytes()
    assert nccl_library.premul_scalar(-1, "uint8") == bytes([255])  # multiplication mod 2**8 gives the same result
    assert nccl_library.premul_scalar(2**40, "int64") == np.int64(2**40).tobytes()
    with pytest.raises(OpError, match="no NCCL scalar"):
        nccl_library.premul_scalar(1.0, "int16")


# -- the ctypes layer -------------------------------------------------------------------------


def test_functions_are_declared_as_data():
    names = [function.name for function in nccl_ctypes.FUNCTIONS]
    assert len(names) == len(set(names))
    assert {"ncclRedOpCreatePreMulSum", "ncclRedOpDestroy", "ncclGetErrorString"} <= set(names)
    # what CuPy wraps is used through CuPy, not bound twice
    assert not {"ncclGetVersion", "ncclCommGetAsyncError", "ncclCommAbort", "ncclAllReduce"} & set(names)
    for function in nccl_ctypes.FUNCTIONS:
        assert isinstance(function.argtypes, list)


def _library():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            from cupy.cuda import nccl as cupy_nccl  # noqa: F401 - loads libnccl
        except Exception:  # noqa: BLE001
            pass
    try:
        return nccl_ctypes.NCCLLibrary()
    except Exception as error:  # noqa: BLE001
        pytest.skip(f"no libnccl here: {error}")


def test_library_binding_without_a_gpu():
    library = _library()
    assert all(library._functions[function.name] is not None for function in nccl_ctypes.FUNCTIONS)
    assert library.error_string(6)  # ncclRemoteError has a message
    assert library.error_string(0)
    with pytest.raises(nccl_ctypes.NCCLError, match="ncclRedOpDestroy failed: invalid argument") as raised:
        library.NCCL_CHECK(4, "ncclRedOpDestroy")
    assert raised.value.status == 4
    assert nccl_ctypes.NCCLLibrary(library.path)._functions is library._functions  # bound once per path


def test_library_missing_path():
    with pytest.raises(Exception, match="cannot load"):
        nccl_ctypes.NCCLLibrary("/nonexistent/libnccl.so.2")


def test_library_bound_once_when_the_soname_does_not_load(monkeypatch):
    """When ``libnccl.so.2`` does not load by soname but the mapped file does, the second
    NCCLLibrary() finds the first's binding (and its real path) without loading again."""
    real = _library()
    real_path = nccl_ctypes.loaded_nccl_path() or real.path
    loads = []
    cdll = nccl_ctypes.ctypes.CDLL

    def only_by_path(name, *args, **kwargs):
        loads.append(name)
        if name == "libnccl.so.2":
            raise OSError("not on the loader's path")
        return cdll(name, *args, **kwargs)

    monkeypatch.setattr(nccl_ctypes.ctypes, "CDLL", only_by_path)
    monkeypatch.setattr(nccl_ctypes, "loaded_nccl_path", lambda: real_path)
    monkeypatch.setattr(nccl_ctypes.NCCLLibrary, "_bound", {})
    first = nccl_ctypes.NCCLLibrary()
    second = nccl_ctypes.NCCLLibrary()
    assert first.path == second.path == real_path
    assert second._functions is first._functions
    assert loads == ["libnccl.so.2", real_path]
