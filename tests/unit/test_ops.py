"""Reduction ops, dtype tables, and the host arithmetic the MPI transport adds (halves, avg,
PreMulSum), each against an independent reference."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import denseccl
from denseccl.dtypes import DTYPES
from denseccl.ops import BOOL_OPS, KIND_OPS, PreMulSum, ReduceOp, as_op, check_op_for_dtype
from denseccl.backends.mpi import host_kernels as hk
from tests.support.optional import has_mpi4py, needs_mpi4py, needs_torch, torch

if has_mpi4py:
    from denseccl.backends.mpi.transport import MPITransport

#: what the MPI transport moves (empty without mpi4py: its tests then skip)
MPI_DTYPES = MPITransport.dtypes if has_mpi4py else {}


# -- ops -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "given_op, expected",
    [
        ("sum", ReduceOp.SUM),
        ("SUM", ReduceOp.SUM),
        ("prod", ReduceOp.PRODUCT),
        ("product", ReduceOp.PRODUCT),
        ("min", ReduceOp.MIN),
        ("max", ReduceOp.MAX),
        ("avg", ReduceOp.AVG),
        ("mean", ReduceOp.AVG),
        (ReduceOp.MAX, ReduceOp.MAX),
        (PreMulSum(0.25), PreMulSum(0.25)),
        (PreMulSum(3), PreMulSum(3)),
    ],
)
def test_as_op(given_op, expected):
    assert as_op(given_op) == expected


@pytest.mark.parametrize("bad", ["average", "", "bor", None, 3, sum, ReduceOp.PREMUL_SUM])
def test_bad_ops_say_what_is_allowed(bad):
    with pytest.raises(denseccl.OpError) as info:
        as_op(bad)
    text = str(info.value)
    assert "PreMulSum" in text
    if bad is not ReduceOp.PREMUL_SUM:
        assert "'sum'" in text and "'avg'" in text and repr(bad) in text


@pytest.mark.parametrize("factor", [math.inf, -math.inf, math.nan, True, "0.5", None, 1j])
def test_premulsum_factor_must_be_finite_real(factor):
    with pytest.raises(denseccl.OpError, match="finite real"):
        as_op(PreMulSum(factor))


def test_op_names_are_stable():
    """They go into agreement descriptors, so every process must print them the same."""
    assert [str(op) for op in ReduceOp] == ["sum", "prod", "min", "max", "avg", "premul_sum"]
    assert str(PreMulSum(0.5)) == "premul_sum(0.5)"
    assert PreMulSum(2).kind is ReduceOp.PREMUL_SUM
    assert str(as_op("product")) == str(as_op("prod"))


# -- dtype tables ------------------------------------------------------------------------------


@needs_torch
@pytest.mark.parametrize("name", sorted(DTYPES))
def test_dtype_table_matches_torch(name):
    dtype = DTYPES[name]
    t = torch.zeros(1, dtype=getattr(torch, name))
    assert t.element_size() == dtype.itemsize
    expected_kind = (
        "b"
        if t.dtype == torch.bool
        else "c"
        if t.is_complex()
        else "f"
        if t.is_floating_point()
        else "i"
        if t.is_signed()
        else "u"
    )
    assert dtype.kind == expected_kind
    if name not in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):
        assert np.dtype(name).itemsize == dtype.itemsize


@needs_mpi4py
def test_mpi_moves_every_dtype_but_float8():
    assert set(MPI_DTYPES) == set(DTYPES) - {"float8_e4m3fn", "float8_e5m2"}


@pytest.mark.parametrize("name", sorted(MPI_DTYPES))
@pytest.mark.parametrize("op", ["sum", "prod", "min", "max", "avg", PreMulSum(2.0)])
@needs_mpi4py
def test_op_dtype_matrix(name, op):
    dtype = DTYPES[name]
    reduce_op = as_op(op)
    kind = reduce_op.kind if isinstance(reduce_op, PreMulSum) else reduce_op
    forbidden = (dtype.kind == "c" and kind in (ReduceOp.MIN, ReduceOp.MAX)) or (
        dtype.kind == "b" and kind in (ReduceOp.AVG, ReduceOp.PREMUL_SUM)
    )
    if forbidden:
        with pytest.raises(denseccl.OpError) as info:
            check_op_for_dtype(reduce_op, dtype, MPI_DTYPES, "mpi")
        assert f"op {reduce_op} is not defined for dtype {name}" in str(info.value)
        assert "allowed:" in str(info.value)
    else:
        check_op_for_dtype(reduce_op, dtype, MPI_DTYPES, "mpi")
    assert (kind in KIND_OPS[dtype.kind]) == (not forbidden)


@needs_mpi4py
def test_float8_is_refused_by_mpi():
    with pytest.raises(denseccl.ArgumentError) as info:
        check_op_for_dtype(ReduceOp.SUM, DTYPES["float8_e5m2"], MPI_DTYPES, "mpi")
    assert "float8_e5m2 is not supported by the mpi transport" in str(info.value)
    assert "float32" in str(info.value)  # lists what is supported


@needs_mpi4py
def test_integer_premulsum_needs_integer_factor():
    for name in ("int8", "uint64"):
        check_op_for_dtype(PreMulSum(3.0), DTYPES[name], MPI_DTYPES, "mpi")
        with pytest.raises(denseccl.OpError, match="not an integer"):
            check_op_for_dtype(PreMulSum(0.5), DTYPES[name], MPI_DTYPES, "mpi")
    check_op_for_dtype(PreMulSum(0.5), DTYPES["float16"], MPI_DTYPES, "mpi")


@pytest.mark.parametrize(
    "name, fits, too_big",
    [
        ("uint8", [0, 255], [-1, 256]), ("int8", [-128, 127], [-129, 128]), ("uint64", [2**64 - 1], [-1, 2.0**64]),
        ("int64", [-(2**63)], [1e19]),
    ],
)
@needs_mpi4py
def test_integer_premulsum_factor_must_fit_the_dtype(name, fits, too_big):
    for factor in fits:
        check_op_for_dtype(PreMulSum(factor), DTYPES[name], MPI_DTYPES, "mpi")
    for factor in too_big:
        with pytest.raises(denseccl.OpError, match=f"does not fit {name}"):
            check_op_for_dtype(PreMulSum(factor), DTYPES[name], MPI_DTYPES, "mpi")


def test_bool_ops_are_logical():
    assert BOOL_OPS == {
        ReduceOp.SUM: ReduceOp.MAX, ReduceOp.PRODUCT: ReduceOp.MIN, ReduceOp.MIN: ReduceOp.MIN,
        ReduceOp.MAX: ReduceOp.MAX,
    }


# -- host kernels ----------------------------------------------------------------------------

INT_NAMES = ["int8", "uint8", "int16", "int32", "int64", "uint64"]


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(INT_NAMES), st.integers(1, 8), st.data())
def test_integer_divide_truncates_toward_zero(name, divisor, data):
    info = np.iinfo(name)
    values = data.draw(st.lists(st.integers(int(info.min), int(info.max)), min_size=1, max_size=20))
    view = np.array(values, dtype=name)
    hk.divide(view, divisor, DTYPES[name])
    expected = [(abs(v) // divisor) * (1 if v >= 0 else -1) for v in values]  # Python ints: exact
    assert view.tolist() == expected


def test_integer_divide_examples():
    view = np.array([-7, 7, -1, 1, -128, 127], np.int8)
    hk.divide(view, 2, DTYPES["int8"])
    assert view.tolist() == [-3, 3, 0, 0, -64, 63]


def test_divide_crosses_chunks():
    n = hk.CHUNK * 2 + 5
    view = np.arange(-n, n, dtype=np.int32)
    hk.divide(view, 3, DTYPES["int32"])
    assert np.array_equal(view, np.trunc(np.arange(-n, n) / 3).astype(np.int32))


def _bf16(values):
    """float32 values -> bfloat16 bits, rounded by torch (the reference)."""
    return torch.tensor(np.asarray(values, np.float32)).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)


def _from_bf16(bits):
    return torch.from_numpy(bits.view(np.int16).copy()).view(torch.bfloat16).to(torch.float32).numpy()


UFUNCS = {ReduceOp.SUM: np.add, ReduceOp.PRODUCT: np.multiply, ReduceOp.MIN: np.minimum, ReduceOp.MAX: np.maximum}
HALF_CASES = pytest.mark.parametrize("kind, size", [(kind, size) for kind in UFUNCS for size in (7, hk.CHUNK + 3)])


def _half_case(kind, size):
    """Two float32 inputs and the ufunc of ``kind``."""
    rng = np.random.default_rng(size)
    a = (rng.standard_normal(size) * 10).astype(np.float32)
    b = (rng.standard_normal(size) * 10).astype(np.float32)
    return a, b, UFUNCS[kind]


@needs_torch
@HALF_CASES
def test_bfloat16_reductions_round_each_step_like_a_gpu(kind, size):
    a, b, ufunc = _half_case(kind, size)
    # widen exactly, compute in float32, round once (torch, the reference, rounds to nearest even)
    left, right = _bf16(a), _bf16(b)
    expected = _bf16(ufunc(_from_bf16(left), _from_bf16(right)))
    hk.half_reduction(kind, DTYPES["bfloat16"])(left, right, None)
    assert np.array_equal(right, expected)


@HALF_CASES
def test_float16_reductions_round_each_step_like_a_gpu(kind, size):
    a, b, ufunc = _half_case(kind, size)
    # likewise, with NumPy's float16 rounding as the reference
    left16, right16 = a.astype(np.float16), b.astype(np.float16)
    expected16 = ufunc(left16.astype(np.float32), right16.astype(np.float32)).astype(np.float16)
    hk.half_reduction(kind, DTYPES["float16"])(left16, right16, None)
    assert np.array_equal(right16.view(np.uint16), expected16.view(np.uint16))


@needs_torch
def test_bfloat16_rounding_ties_and_nan():
    # 1 + 2**-8 lies exactly between two bfloat16 values: ties go to even (1.0);
    # 1 + 3 * 2**-8 goes up to 1 + 2**-6.
    left = _bf16([1.0, 1.0, np.nan, 1.0])
    right = _bf16([2**-8, 3 * 2**-8, 1.0, np.inf])
    hk.half_reduction(ReduceOp.SUM, DTYPES["bfloat16"])(left, right, None)
    result = _from_bf16(right)
    assert result[0] == 1.0 and result[1] == 1.0 + 2**-6
    assert np.isnan(result[2]) and result[3] == np.inf


@pytest.mark.parametrize("name", ["float16", pytest.param("bfloat16", marks=needs_torch)])
def test_half_scale_and_divide(name):
    values = np.array([1.0, -3.0, 0.1, 1000.0, 7.0], np.float32)
    bits = _bf16(values) if name == "bfloat16" else values.astype(np.float16)
    widened = _from_bf16(bits) if name == "bfloat16" else bits.astype(np.float32)
    round_back = _bf16 if name == "bfloat16" else (lambda v: np.asarray(v, np.float32).astype(np.float16))
    scaled = hk.scaled_copy(bits, 0.3, DTYPES[name])
    assert np.array_equal(scaled.view(np.uint16), round_back(widened * np.float32(0.3)).view(np.uint16))
    divided = bits.copy()
    hk.divide(divided, 3, DTYPES[name])
    assert np.array_equal(divided.view(np.uint16), round_back(widened / np.float32(3)).view(np.uint16))


def test_scale_integers_and_floats():
    ints = np.array([-5, 3, 100], np.int16)
    out = np.empty_like(ints)
    hk.scale(out, ints, 3.0, DTYPES["int16"])
    assert out.tolist() == [-15, 9, 300]
    floats = np.array([1.5, -2.0], np.float64)
    hk.scale(floats, floats, 0.5, DTYPES["float64"])  # may alias exactly
    assert floats.tolist() == [0.75, -1.0]
    c = np.array([1 + 2j], np.complex64)
    assert hk.scaled_copy(c, 2.0, DTYPES["complex64"]).tolist() == [2 + 4j]


def test_host_view_is_a_writable_alias():
    array = np.arange(6, dtype=np.int32)
    view = hk.host_view(array.ctypes.data + 8, 3, DTYPES["int32"])
    assert view.tolist() == [2, 3, 4]
    view[0] = 99
    assert array[2] == 99
    assert hk.host_view(0, 0, DTYPES["bfloat16"]).dtype == np.uint16


def test_premul_sum_accepts_numpy_scalars_as_plain_numbers():
    import numpy as np

    from denseccl.ops import PreMulSum, as_op

    half = as_op(PreMulSum(np.float32(0.5)))
    assert half == PreMulSum(0.5) and type(half.factor) is float
    three = as_op(PreMulSum(np.int64(3)))
    assert three == PreMulSum(3) and type(three.factor) is int
    # the same op however the factor was spelled, so ranks agree
    assert str(as_op(PreMulSum(np.float64(0.25)))) == str(as_op(PreMulSum(0.25)))
    for bad in (np.bool_(True), True, float("nan"), "0.5", np.float32("inf")):
        with pytest.raises(denseccl.OpError, match="finite real number"):
            as_op(PreMulSum(bad))
