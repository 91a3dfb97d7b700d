"""The vectorised float16 conversions, the compiled loops and the torch-backed reduction step of
host_kernels give exactly what NumPy's scalar casts (and the float32-per-step rule) give."""

from __future__ import annotations

import shutil
import sysconfig
import warnings

import numpy as np
import pytest

from denseccl.dtypes import DTYPES
from denseccl.ops import ReduceOp
from denseccl.backends.mpi import host_kernels as hk

ALL_HALVES = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)


def same_bits(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (
        a.view(np.uint16 if a.itemsize == 2 else np.uint32) == b.view(np.uint16 if b.itemsize == 2 else np.uint32)
    ) | (np.isnan(a) & np.isnan(b))


@pytest.mark.parametrize("chunk", [64, 4096])
def test_widen_float16_is_exact_for_every_value(chunk: int) -> None:
    reference = ALL_HALVES.astype(np.float32)
    for start in range(0, ALL_HALVES.size, chunk):
        out = np.empty(chunk, np.float32)
        hk._widen_float16(ALL_HALVES[start : start + chunk], out)
        assert same_bits(out, reference[start : start + chunk]).all(), start
    finite = ALL_HALVES[np.isfinite(ALL_HALVES)]  # one chunk with no inf/NaN: the vectorised path throughout
    out = np.empty(finite.size, np.float32)
    hk._widen_float16(finite, out)
    assert same_bits(out, finite.astype(np.float32)).all()


def check_narrow(values: np.ndarray) -> None:
    out = np.empty(values.size, np.float16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hk._narrow_float16(values.copy(), out)
        reference = values.astype(np.float16)
    assert same_bits(out, reference).all(), values[~same_bits(out, reference)][:5]


def test_narrow_float16_rounds_to_nearest_even_like_numpy() -> None:
    rng = np.random.default_rng(7)
    halves = rng.integers(0x0400, 0x7BFF, 8192, dtype=np.uint16).view(np.float16).astype(np.float32)
    ties = (halves.view(np.uint32) | 0x1000).view(np.float32)  # exactly between two float16 values
    for values in (
        halves, ties, -ties, (ties.view(np.uint32) + 1).view(np.float32), (ties.view(np.uint32) - 1).view(np.float32),
    ):
        with_zeros = values.copy()
        with_zeros[::17] = 0.0
        with_zeros[::19] = -0.0
        check_narrow(values)
        check_narrow(with_zeros)
    magnitudes = (2.0 ** rng.uniform(-14, 15.99, 8192)).astype(np.float32)
    check_narrow(magnitudes * np.where(rng.random(8192) < 0.5, -1, 1).astype(np.float32))


@pytest.mark.parametrize(
    "value", [65504, 65519.996, 65520, 1e6, 2.0**-14, 2.0**-15, 2.0**-24, 2.0**-26, np.inf, -np.inf, np.nan, -0.0]
)
def test_narrow_float16_edges_fall_back_exactly(value: float) -> None:
    values = np.linspace(1, 2, 64, dtype=np.float32)
    values[5] = value
    check_narrow(values)
    check_narrow(np.full(8, value, np.float32))


def test_narrow_float16_random_bits() -> None:
    rng = np.random.default_rng(3)
    check_narrow(rng.integers(0, 1 << 32, 8192, dtype=np.uint64).astype(np.uint32).view(np.float32))


def random_pairs(count: int, seed: int) -> "tuple[np.ndarray, np.ndarray]":
    """Random bit patterns (every class: zeros, subnormals, normals, inf, NaN) plus the cases
    that decide ties: x against itself, against -x, and against +-0."""
    rng = np.random.default_rng(seed)
    a = rng.integers(0, 1 << 16, count, dtype=np.uint32).astype(np.uint16)
    b = rng.integers(0, 1 << 16, count, dtype=np.uint32).astype(np.uint16)
    a[::7] = b[::7] ^ 0x8000
    a[1::7] = b[1::7]
    a[2::7] &= 0x8000
    everything = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)  # every value against 1.5, 0 and -0
    for partner in (0x3E00, 0x3FC0, 0x0000, 0x8000):
        a = np.concatenate([a, everything])
        b = np.concatenate([b, np.full(1 << 16, partner, np.uint16)])
    return a, b


def same_or_both_nan(name: str, left: np.ndarray, right: np.ndarray) -> np.ndarray:
    if name == "float16":
        nan = np.isnan(left.view(np.float16)) & np.isnan(right.view(np.float16))
    else:
        nan = ((left & 0x7FFF) > 0x7F80) & ((right & 0x7FFF) > 0x7F80)
    return (left == right) | nan


KERNEL_CHOICES = ["numpy", "native", "torch"]


def skip_unless_available(kernels: str) -> None:
    if kernels == "torch":
        pytest.importorskip("torch")
    if kernels == "native" and not hk.native_available():
        if not c_compiler():
            pytest.skip(
                "no C compiler here, so denseccl.backends.mpi._half_kernels was not built "
                "(the NumPy/torch kernels are used)"
            )
        pytest.fail(
            "denseccl.backends.mpi._half_kernels was not built although a C compiler is present: "
            "rerun launch/setup and read .venv/setup.log"
        )


def c_compiler() -> "str | None":
    """The C compiler setuptools would use, if it is installed."""
    configured = (sysconfig.get_config_var("CC") or "cc").split()
    return shutil.which(configured[0]) if configured else None


@pytest.mark.parametrize("kernels", ["native", "torch"])
@pytest.mark.parametrize("name", ["float16", "bfloat16"])
@pytest.mark.parametrize("kind", [ReduceOp.SUM, ReduceOp.PRODUCT, ReduceOp.MIN, ReduceOp.MAX])
def test_fast_step_equals_numpy_step(kernels: str, name: str, kind: ReduceOp, monkeypatch: pytest.MonkeyPatch) -> None:
    skip_unless_available(kernels)
    a, b = random_pairs(200_003, seed=11)
    storage = hk.storage_dtype(DTYPES[name])
    step = hk.half_reduction(kind, DTYPES[name])
    results = []
    for choice in ("numpy", kernels):
        monkeypatch.setattr(hk, "KERNELS", choice)
        result = b.copy().view(storage)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            step(memoryview(a.copy().view(storage)), memoryview(result), None)
        results.append(result.view(np.uint16))
    reference, fast = results
    assert same_or_both_nan(name, reference, fast).all(), (
        a[~same_or_both_nan(name, reference, fast)][:5],
        b[~same_or_both_nan(name, reference, fast)][:5],
    )


@pytest.mark.parametrize("name", ["float16", "bfloat16"])
@pytest.mark.parametrize(
    "factor, divide", [(0.3, False), (1e-30, False), (7e4, False), (-2.5, False), (3, True), (7, True), (1000, True)]
)
def test_native_scale_and_divide_equal_numpy(
    name: str, factor: float, divide: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    skip_unless_available("native")
    source, _ = random_pairs(100_001, seed=5)
    dtype = DTYPES[name]
    storage = hk.storage_dtype(dtype)
    results = []
    for choice in ("numpy", "native"):
        monkeypatch.setattr(hk, "KERNELS", choice)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if divide:
                view = source.copy().view(storage)
                hk.divide(view, int(factor), dtype)
                results.append(view.view(np.uint16))
            else:
                results.append(hk.scaled_copy(source.view(storage), factor, dtype).view(np.uint16))
    assert same_or_both_nan(name, *results).all()


def test_native_loops_ignore_flush_to_zero_modes() -> None:
    """No float32 subnormal is ever an operand of the compiled loops, so results do not change
    when torch sets flush-denormal (FTZ/DAZ), which the float-multiply conversions would break."""
    torch = pytest.importorskip("torch")
    skip_unless_available("native")
    a, b = random_pairs(50_000, seed=2)
    expected = b.copy()
    hk._native.reduce(0, 0, hk._address(a), hk._address(expected), a.size)
    if not torch.set_flush_denormal(True):
        pytest.skip("this CPU has no flush-denormal mode")
    try:
        flushed = b.copy()
        hk._native.reduce(0, 0, hk._address(a), hk._address(flushed), a.size)
    finally:
        torch.set_flush_denormal(False)
    assert same_or_both_nan("float16", expected, flushed).all()


def test_native_rejects_unknown_types() -> None:
    skip_unless_available("native")
    x = np.zeros(4, np.uint16)
    with pytest.raises(ValueError, match="neither float16"):
        hk._native.reduce(2, 0, hk._address(x), hk._address(x), 4)
    with pytest.raises(ValueError, match="not 0..3"):
        hk._native.reduce(0, 4, hk._address(x), hk._address(x), 4)


@pytest.mark.parametrize("name, divisor", [("int8", 128), ("int8", 300), ("uint8", 256), ("int16", 40000)])
def test_integer_average_over_more_ranks_than_the_dtype_holds(name: str, divisor: int) -> None:
    """avg on int8 over >= 128 ranks: every |sum| <= 127 < ranks, so it truncates to 0 (no
    OverflowError from NumPy for a divisor that does not fit the dtype)."""
    info = np.iinfo(name)
    view = np.array([info.min, info.max, -1 if info.min else 1, 0], name)
    hk.divide(view, divisor, DTYPES[name])
    assert (
        view.tolist()
        == np.trunc(np.array([info.min, info.max, -1 if info.min else 1, 0]) / divisor).astype(int).tolist()
    )


def test_scale_of_strided_views_takes_the_numpy_loops() -> None:
    """The compiled loops read addresses and counts; a strided view must not be fed to them."""
    source = np.arange(40, dtype=np.float16)[::2]
    destination = np.zeros(40, np.float16)[::2]
    hk.scale(destination, source, 0.5, DTYPES["float16"])
    assert destination.tolist() == (np.arange(40, dtype=np.float32)[::2] * 0.5).tolist()
    view = np.arange(40, dtype=np.float16)[::-2]
    hk.divide(view, 2, DTYPES["float16"])
    assert view.tolist() == (np.arange(40, dtype=np.float32)[::-2] / 2).tolist()
