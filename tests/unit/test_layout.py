"""The pure core (denseccl/layout.py) against a brute-force oracle that enumerates offsets."""

from __future__ import annotations

import ast
import importlib.util
import pickle
import subprocess
import sys
import sysconfig
from math import prod
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from denseccl import layout as L
from tests.support.layouts import (
    make_strides,
    offsets,
    oracle_dense,
    oracle_dense_strides,
    oracle_row_major,
    oracle_span,
)

LAYOUT_PY = Path(L.__file__)

SETTINGS = settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def geometries(draw, max_ndim: int = 5, max_size: int = 6):
    """(shape, strides): dense layouts (permuted, flipped, odd size-1 strides), then sometimes
    broken on purpose (sliced with a step, shrunk, expanded) or entirely random."""
    ndim = draw(st.integers(0, max_ndim))
    shape = draw(st.lists(st.integers(0, max_size), min_size=ndim, max_size=ndim))
    kind = draw(st.sampled_from(["dense", "dense", "step", "shrink", "expand", "random"]))
    if kind == "random":
        strides = draw(st.lists(st.integers(-40, 40), min_size=ndim, max_size=ndim))
        return tuple(shape), tuple(strides)
    order = draw(st.permutations(range(ndim)))
    flips = draw(st.lists(st.sampled_from(range(ndim)), unique=True)) if ndim else []
    odd = draw(st.lists(st.integers(-50, 50), min_size=ndim, max_size=ndim))
    strides = list(make_strides(shape, order, flips, odd))
    if ndim and kind != "dense":
        d = draw(st.integers(0, ndim - 1))
        if kind == "step":  # x[..., ::step, ...] of a bigger dense array: strides grow
            strides[d] *= draw(st.integers(2, 3))
        elif kind == "shrink":  # x[..., :k, ...]: sizes shrink, strides stay
            shape[d] = draw(st.integers(0, shape[d])) if shape[d] else 0
        else:  # expanded / broadcast
            strides[d] = 0
            shape[d] = draw(st.integers(0, max_size))
    return tuple(shape), tuple(strides)


# -- the dense rule and the span ----------------------------------------------------------------


@SETTINGS
@given(geometries())
def test_dense_rule_matches_oracle(geometry):
    shape, strides = geometry
    assert L.is_non_overlapping_and_dense(shape, strides) == oracle_dense(shape, strides)


@SETTINGS
@given(geometries())
def test_span_matches_oracle(geometry):
    shape, strides = geometry
    layout = L.Layout(shape, strides, 4, "float32")
    assert layout.numel == prod(shape)
    assert layout.span[1] == prod(shape)
    assert layout.span[0] <= 0
    if layout.numel and layout.is_dense:
        assert layout.span == oracle_span(shape, strides)
        # the span [lo, lo + numel) holds every element, and nothing else
        assert sorted(offsets(shape, strides).tolist()) == list(range(layout.span[0], layout.span[0] + layout.numel))


@pytest.mark.parametrize(
    "shape, strides, dense",
    [
        ((), (), True),  # 0-d
        ((5,), (1,), True),
        ((5,), (-1,), True),  # reversed
        ((5,), (2,), False),  # x[::2]
        ((3, 4), (4, 1), True),
        ((3, 4), (1, 3), True),  # transposed
        ((3, 4), (8, 1), False),  # x[:, :4] of a (3, 8): gaps between rows
        ((3, 4), (4, 2), False),
        ((3, 4), (0, 1), False),  # expanded along dim 0
        ((1, 4), (0, 1), True),  # stride 0 on a size-1 dim is just a meaningless stride
        ((4, 1, 1, 1), (1, 256, 1, 1), True),  # [Cout, Cin, 1, 1] weights with odd strides
        ((0, 3), (7, 13), True),  # empty: dense whatever the strides
        ((3, 0, 2), (0, 0, 0), True),
        ((2, 3), (3, 2), False),  # overlapping
        ((2, 3), (-3, -1), True),
        ((2, 2), (1, 1), False),
        ((2, 3, 4), (1, 8, 2), True),  # channels-last-like
    ],
)
def test_dense_rule_examples(shape, strides, dense):
    assert L.is_non_overlapping_and_dense(shape, strides) is dense
    assert oracle_dense(shape, strides) is dense


def test_dense_rule_rejects_length_mismatch():
    with pytest.raises(ValueError, match="differ in length"):
        L.is_non_overlapping_and_dense((2, 3), (1,))


@pytest.mark.parametrize(
    "shape, strides, lo",
    [
        ((5,), (-1,), -4),
        ((2, 3), (-3, 1), -3),
        ((2, 3), (-3, -1), -5),
        ((2, 3), (1, -2), -4),
        ((1, 3), (-99, 1), 0),  # size-1 dims never move the start
        ((), (), 0),
    ],
)
def test_span_start_examples(shape, strides, lo):
    assert L.span_start(shape, strides) == lo
    assert L.Layout(shape, strides, 8, "float64").span == (lo, prod(shape))


# -- layout keys ------------------------------------------------------------------------------


@SETTINGS
@given(geometries(max_ndim=4, max_size=3), st.data())
def test_key_equal_iff_informative_strides_equal(geometry, data):
    shape, strides = geometry
    other = tuple(
        data.draw(st.sampled_from([s, s + 1, -s, 0, 7])) for s in strides
    )
    same = prod(shape) == 0 or all(a == b for size, a, b in zip(shape, strides, other) if size != 1)
    assert (L.layout_key("float32", shape, strides) == L.layout_key("float32", shape, other)) == same
    assert L.layout_key("float32", shape, strides) != L.layout_key("float64", shape, strides)


def test_key_wildcards_size1_dims():
    a = L.Layout((256, 64, 1, 1), (64, 1, 64, 64), 4, "float32")
    b = L.Layout((256, 64, 1, 1), (64, 1, 1, 1), 4, "float32")
    assert a.key == b.key == ("float32", (256, 64, 1, 1), (64, 1, None, None))
    assert a != b  # the Layouts themselves still differ; only their keys agree


def test_key_empty_arrays_wildcard_everything():
    a = L.Layout((0, 3), (3, 1), 4, "float32")
    b = L.Layout((0, 3), (1, 0), 4, "float32")
    assert a.key == b.key == ("float32", (0, 3), (None, None))
    assert a.key != L.Layout((3, 0), (1, 3), 4, "float32").key  # shape still counts


def test_key_distinguishes_transpose_and_flip():
    c = L.Layout((3, 4), (4, 1), 4, "float32")
    f = L.Layout((3, 4), (1, 3), 4, "float32")
    flipped = L.Layout((3, 4), (-4, 1), 4, "float32")
    assert len({c.key, f.key, flipped.key}) == 3


def test_key_of_0d():
    assert L.layout_key("int8", (), ()) == ("int8", (), ())


# -- physical order and contiguous strides ---------------------------------------------------


@SETTINGS
@given(geometries())
def test_physical_order_reconstructs_dense_strides(geometry):
    shape, strides = geometry
    order = L.physical_order(shape, strides)
    assert sorted(order) == list(range(len(shape)))
    if not prod(shape) or not oracle_dense(shape, strides):
        return
    rebuilt = L.contiguous_strides(shape, order)
    for d, size in enumerate(shape):
        if size != 1:
            assert rebuilt[d] == abs(strides[d])
    # size-1 dims come last, in index order
    tail = [d for d in order if shape[d] == 1]
    assert tail == sorted(d for d in range(len(shape)) if shape[d] == 1)
    assert list(order[len(order) - len(tail):]) == tail


def test_physical_order_breaks_ties_by_dim_index():
    assert L.physical_order((2, 1, 3, 1), (3, 99, 1, -5)) == (0, 2, 1, 3)
    assert L.physical_order((2, 2), (1, 1)) == (0, 1)  # equal strides: lower index first
    assert L.physical_order((1, 1, 1), (5, 9, 1)) == (0, 1, 2)  # all size 1: index order
    assert L.physical_order((3, 4), (1, 3)) == (1, 0)
    assert L.physical_order((3, 4), (-1, -3)) == (1, 0)  # by |stride|
    assert L.physical_order((), ()) == ()
    # the same key gives the same order, whatever the size-1 strides
    assert L.physical_order((4, 1, 3), (3, 1000, 1)) == L.physical_order((4, 1, 3), (3, -7, 1))


@SETTINGS
@given(st.lists(st.integers(0, 5), max_size=5).flatmap(lambda s: st.tuples(st.just(s), st.permutations(range(len(s))))))
def test_contiguous_strides_match_numpy(shape_order):
    shape, order = shape_order
    if not prod(shape):  # NumPy gives empty arrays stride 0; any strides are dense there
        assert L.is_non_overlapping_and_dense(shape, L.contiguous_strides(shape, order))
        return
    assert L.contiguous_strides(shape) == oracle_row_major(shape)
    assert L.contiguous_strides(shape, order) == oracle_dense_strides(shape, order)


def test_contiguous_strides_examples():
    assert L.contiguous_strides((2, 3, 4)) == (12, 4, 1)
    assert L.contiguous_strides((2, 3, 4), (2, 1, 0)) == (1, 2, 6)  # Fortran order
    assert L.contiguous_strides((2, 3, 4, 5), (0, 2, 3, 1)) == (60, 1, 15, 3)  # channels-last
    assert L.contiguous_strides(()) == ()


# -- stacked layouts -------------------------------------------------------------------------


@SETTINGS
@given(geometries(max_ndim=4, max_size=4), st.integers(1, 5))
def test_stacked_block_of_round_trip(geometry, size):
    shape, strides = geometry
    block = L.Layout(shape, strides, 2, "float16")
    stacked = L.stacked(block, size)
    assert stacked.shape == (size, *shape)
    assert stacked.strides == (prod(shape), *strides)
    assert (stacked.itemsize, stacked.dtype) == (2, "float16")
    assert L.block_of(stacked) == block
    if block.is_dense:
        assert L.stacked_problem(stacked, size) is None
        assert stacked.is_dense == oracle_dense(stacked.shape, stacked.strides) is True
        if block.numel:
            # block r occupies [lo + r*numel, lo + (r+1)*numel) of the stacked span
            lo = block.span[0]
            for r in range(size):
                found = sorted((offsets(shape, strides) + r * block.numel).tolist())
                assert found == list(range(lo + r * block.numel, lo + (r + 1) * block.numel))
            assert stacked.span == (lo, size * block.numel)
    else:
        assert "not dense" in L.stacked_problem(stacked, size)


def test_stacked_problem_messages():
    block = L.Layout((2, 3), (3, 1), 4, "float32")
    assert "0-d" in L.stacked_problem(L.Layout((), (), 4, "float32"), 2)
    assert "dim 0 has size 3" in L.stacked_problem(L.stacked(block, 3), 2)
    spaced = L.Layout((2, 2, 3), (12, 3, 1), 4, "float32")  # a gap after each block
    problem = L.stacked_problem(spaced, 2)
    assert "stride 12" in problem and "stride 6" in problem
    reversed_blocks = L.Layout((2, 2, 3), (-6, 3, 1), 4, "float32")  # blocks in reverse order
    assert "stride -6" in L.stacked_problem(reversed_blocks, 2)
    interleaved = L.Layout((2, 2, 3), (1, 6, 2), 4, "float32")  # dim 0 innermost
    assert "not dense" in L.stacked_problem(interleaved, 2)
    gapped = L.Layout((2, 2, 3), (12, 6, 2), 4, "float32")
    assert "not dense" in L.stacked_problem(gapped, 2)


def test_stacked_problem_single_rank_stride_is_free():
    buffer = L.Layout((1, 2, 3), (12345, 3, 1), 4, "float32")
    assert L.stacked_problem(buffer, 1) is None
    assert L.stacked_problem(L.Layout((1, 2, 3), (12345, 3, 1), 4, "float32"), 2) is not None


def test_stacked_problem_empty_blocks_stride_is_free():
    assert L.stacked_problem(L.Layout((3, 0, 2), (5, 2, 1), 4, "float32"), 3) is None


# -- the Layout object ------------------------------------------------------------------------


def test_layout_is_immutable_hashable_picklable():
    layout = L.Layout((2, 3), (1, 2), 8, "float64")
    with pytest.raises(AttributeError):
        layout.shape = (6,)
    assert layout == L.Layout([2, 3], [1, 2], 8, "float64")
    assert hash(layout) == hash(L.Layout((2, 3), (1, 2), 8, "float64"))
    assert layout != L.Layout((2, 3), (3, 1), 8, "float64")
    clone = pickle.loads(pickle.dumps(layout))
    assert clone == layout and clone.key == layout.key and clone.span == layout.span
    assert (layout.ndim, layout.nbytes, layout.numel) == (2, 48, 6)
    text = layout.describe()
    assert "float64" in text and "(2, 3)" in text and "(1, 2)" in text


@SETTINGS
@given(st.integers(-5, 5), st.integers(0, 5), st.integers(-5, 5), st.integers(0, 5))
def test_overlap_matches_brute_force(a, na, b, nb):
    expected = bool(set(range(a, a + na)) & set(range(b, b + nb)))
    assert L.overlap(a, na, b, nb) == expected


# -- purity ----------------------------------------------------------------------------------


def _standard_library(name: str, names: Any = getattr(sys, "stdlib_module_names", None)) -> bool:
    """``name`` is a module of the standard library: one of ``names`` (``sys.stdlib_module_names``,
    Python 3.10+), else by where it lives (built in, or in the interpreter's library, not site-packages)."""
    if names is not None:
        return name in names
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None:
        return False
    if spec.origin in ("built-in", "frozen"):
        return True
    library = Path(sysconfig.get_paths()["stdlib"]).resolve()
    origin = Path(spec.origin).resolve()
    return library in origin.parents and "site-packages" not in origin.parts


@pytest.mark.parametrize("names", [getattr(sys, "stdlib_module_names", None), None], ids=["names", "location"])
def test_the_standard_library_check(names):
    assert all(_standard_library(name, names) for name in ("sys", "math", "functools", "typing", "__future__"))
    assert not any(_standard_library(name, names) for name in ("numpy", "pytest", "denseccl", "no_such_module"))


def test_layout_imports_only_the_standard_library():
    tree = ast.parse(LAYOUT_PY.read_text())
    modules = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"relative import in layout.py: from {'.' * node.level}{node.module}"
            modules.add(node.module.split(".")[0])
    assert modules, "expected some imports"
    assert all(_standard_library(name) for name in modules), {m for m in modules if not _standard_library(m)}


def test_layout_runs_without_numpy():
    """Load layout.py alone, in a fresh interpreter, and check nothing heavy came along."""
    code = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('layout_alone', {str(LAYOUT_PY)!r})\n"
        "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
        "assert m.Layout((2, 3), (1, 2), 4, 'float32').is_dense\n"
        "heavy = {'numpy', 'torch', 'cupy', 'mpi4py'} & set(sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-I", "-c", code], check=True, timeout=60)
