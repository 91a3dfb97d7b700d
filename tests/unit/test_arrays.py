"""Array adapters: NumPy arrays and torch CPU tensors -> Buffer / Layout, and allocation."""

from __future__ import annotations

from math import prod

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import denseccl
from denseccl.arrays import HOST, allocate, as_buffer
from denseccl.layout import Layout
from tests.support.layouts import empty_strided, make_strides, offsets, oracle_dense

torch = pytest.importorskip("torch")

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def numpy_views(draw):
    """A NumPy view made the way users make them: transpose, slice with steps, flip,
    broadcast; returned with its expected element strides."""
    ndim = draw(st.integers(0, 4))
    shape = tuple(draw(st.lists(st.integers(0, 5), min_size=ndim, max_size=ndim)))
    dtype = draw(st.sampled_from(["float32", "int16", "uint8", "complex128", "bool"]))
    x = np.arange(max(prod(shape), 1)).astype(dtype)[: prod(shape)].reshape(shape)
    if ndim:
        x = x.transpose(draw(st.permutations(range(ndim))))
        for d in range(ndim):
            step = draw(st.sampled_from([1, 1, 2, -1, -2]))
            index = [slice(None)] * ndim
            index[d] = slice(None, None, step)
            x = x[tuple(index)]
        if draw(st.booleans()):
            d = draw(st.integers(0, ndim - 1))
            if x.shape[d] == 1:
                x = np.broadcast_to(x, x.shape[:d] + (3,) + x.shape[d + 1 :])
    return x


@SETTINGS
@given(numpy_views())
def test_numpy_views(x):
    layout = denseccl.layout_of(x)
    strides = tuple(s // x.itemsize for s in x.strides)
    assert (layout.shape, layout.strides, layout.itemsize, layout.dtype) == (x.shape, strides, x.itemsize, x.dtype.name)
    assert layout.is_dense == oracle_dense(x.shape, strides)
    buffer = as_buffer(x)
    assert buffer.pointer == x.ctypes.data and buffer.device == HOST and buffer.library == "numpy"
    assert buffer.owner is x
    assert buffer.readonly == (not x.flags.writeable)
    if layout.is_dense and layout.numel:
        # the span starts at the lowest element's address and holds exactly the elements
        addresses = x.ctypes.data + offsets(x.shape, strides) * x.itemsize
        assert buffer.span_pointer == addresses.min()
        assert addresses.max() == buffer.span_pointer + (layout.numel - 1) * x.itemsize


def test_flipped_array_span_is_its_base():
    base = np.arange(12.0).reshape(3, 4)
    for view in (base[::-1], base[:, ::-1], base[::-1, ::-1], base.T[::-1]):
        assert denseccl.layout_of(view).is_dense
        assert as_buffer(view).span_pointer == base.ctypes.data


def test_common_layouts():
    x = np.zeros((2, 3, 4, 5), np.float32)
    assert denseccl.layout_of(x).strides == (60, 20, 5, 1)
    assert denseccl.layout_of(x.transpose(0, 2, 3, 1)).is_dense  # channels-last view
    assert not denseccl.layout_of(x[:, :, ::2]).is_dense
    assert not denseccl.layout_of(np.broadcast_to(np.zeros(3), (4, 3))).is_dense
    zero_d = np.float64(3.0) * np.ones(())
    assert denseccl.layout_of(zero_d).shape == () and denseccl.layout_of(zero_d).span == (0, 1)
    assert denseccl.layout_of(np.zeros((0, 3))).is_dense


def test_same_layout_numpy_and_torch():
    assert denseccl.same_layout(np.zeros((2, 3), np.float32), torch.zeros(2, 3))
    assert not denseccl.same_layout(np.zeros((2, 3), np.float64), torch.zeros(2, 3))  # dtype
    assert not denseccl.same_layout(np.zeros((2, 3), np.float32), torch.zeros(3, 2).T)  # transposed
    assert denseccl.same_layout(np.zeros((3, 2), np.float32).T, torch.zeros(3, 2).T)
    # channels-last: torch memory format and the equivalent NumPy transpose agree
    cl = torch.empty(2, 3, 4, 5).to(memory_format=torch.channels_last)
    assert cl.stride() == (60, 1, 15, 3)
    assert denseccl.same_layout(cl, np.empty((2, 4, 5, 3), np.float32).transpose(0, 3, 1, 2))
    assert not denseccl.same_layout(cl, torch.empty(2, 3, 4, 5))
    # bfloat16 (no NumPy equivalent) and shape differences
    assert denseccl.layout_of(torch.zeros(2, dtype=torch.bfloat16)).dtype == "bfloat16"
    assert not denseccl.same_layout(torch.zeros(2, 3), torch.zeros(3, 2))


def test_same_layout_ignores_size1_strides():
    a = torch.empty_strided((8, 1, 1, 1), (1, 8, 8, 8))
    b = torch.empty_strided((8, 1, 1, 1), (1, 1, 1, 1))
    c = np.ndarray((8, 1, 1, 1), np.float32, buffer=np.empty(8, np.float32), strides=(4, 0, 400, 4))
    assert denseccl.same_layout(a, b) and denseccl.same_layout(a, c)
    assert denseccl.layout_of(a).strides == (1, 8, 8, 8)  # the strides themselves are kept


def test_empty_arrays_of_any_strides_share_a_layout():
    a = np.zeros((0, 3), np.float32)
    b = np.zeros((3, 0), np.float32).T
    c = torch.empty_strided((0, 3), (1, 5))
    assert denseccl.same_layout(a, b) and denseccl.same_layout(a, c)
    assert not denseccl.same_layout(a, np.zeros((0, 4), np.float32))


@pytest.mark.parametrize("make", [
    lambda: torch.arange(24.0).reshape(2, 3, 4),
    lambda: torch.arange(24.0).reshape(2, 3, 4).permute(2, 0, 1),
    lambda: torch.arange(24.0).reshape(2, 3, 4)[:, ::2],
    lambda: torch.arange(4.0).reshape(4, 1).expand(4, 3),
    lambda: torch.arange(24.0).reshape(2, 3, 4).to(memory_format=torch.contiguous_format)[1],
    lambda: torch.tensor(5, dtype=torch.int64),
    lambda: torch.empty(0, 3, dtype=torch.float16),
])
def test_torch_tensors(make):
    t = make()
    layout = denseccl.layout_of(t)
    assert layout.shape == tuple(t.shape) and layout.strides == tuple(t.stride())
    assert layout.itemsize == t.element_size() and layout.dtype == str(t.dtype).split(".")[1]
    assert layout.is_dense == oracle_dense(tuple(t.shape), tuple(t.stride()))
    buffer = as_buffer(t)
    assert buffer.pointer == t.data_ptr() and buffer.device == HOST and buffer.library == "torch"
    if layout.is_dense and layout.numel:
        assert buffer.span_pointer == t.data_ptr()  # torch strides are never negative


@pytest.mark.parametrize(
    "dtype, name",
    [
        ("bfloat16", "bfloat16"),
        ("float16", "float16"),
        ("uint16", "uint16"),
        ("float8_e4m3fn", "float8_e4m3fn"),
        ("bool", "bool"),
    ],
)
def test_torch_dtype_names(dtype, name):
    assert denseccl.layout_of(torch.zeros(3, dtype=getattr(torch, dtype))).dtype == name


def test_torch_rejects_what_it_cannot_map():
    with pytest.warns(UserWarning):
        half_complex = torch.zeros(3, dtype=torch.complex32)
    with pytest.raises(denseccl.LayoutError, match="complex32 is not supported"):
        denseccl.layout_of(half_complex)
    with pytest.raises(denseccl.LayoutError, match="sparse"):
        denseccl.layout_of(torch.zeros(3).to_sparse())
    with pytest.raises(denseccl.LayoutError, match="device meta"):
        denseccl.layout_of(torch.zeros(3, device="meta"))


def test_numpy_rejections_name_the_problem_and_the_fix():
    with pytest.raises(denseccl.LayoutError) as info:
        denseccl.layout_of(np.array([1, "a", None], dtype=object))
    assert "object" in str(info.value) and "numeric" in str(info.value)

    swapped = np.arange(4, dtype=np.float32).astype(np.dtype(np.float32).newbyteorder())
    with pytest.raises(denseccl.LayoutError) as info:
        denseccl.layout_of(swapped)
    assert "byte order" in str(info.value) and "astype" in str(info.value)

    packed = np.zeros(4, dtype=[("a", "i1"), ("b", "f4")])["b"]  # byte stride 5, itemsize 4
    with pytest.raises(denseccl.LayoutError) as info:
        denseccl.layout_of(packed)
    text = str(info.value)
    assert "(4,)" in text and "(5,)" in text and "itemsize 4" in text and "ascontiguousarray" in text

    with pytest.raises(denseccl.LayoutError, match="not supported"):
        denseccl.layout_of(np.zeros(3, "datetime64[s]"))
    with pytest.raises(denseccl.LayoutError, match="not a numeric element type"):
        denseccl.layout_of(np.zeros(3, dtype=[("a", "f4")]))


@pytest.mark.parametrize("thing", [[1.0, 2.0], 3.0, "abc", None, memoryview(b"xy")])
def test_not_an_array(thing):
    with pytest.raises(denseccl.LayoutError, match="expected an array"):
        denseccl.layout_of(thing)


def test_array_interface_and_readonly():
    class Exposes:
        def __init__(self, array):
            self.__array_interface__ = array.__array_interface__
            self.keep = array

    base = np.arange(6, dtype=np.int32).reshape(2, 3).T
    buffer = as_buffer(Exposes(base))
    assert buffer.layout == denseccl.layout_of(base)
    assert buffer.pointer == base.ctypes.data
    frozen = np.arange(3.0)
    frozen.flags.writeable = False
    assert as_buffer(frozen).readonly
    assert not as_buffer(torch.zeros(3)).readonly


@st.composite
def dense_layouts(draw, allow_flips=True):
    ndim = draw(st.integers(0, 4))
    shape = draw(st.lists(st.integers(0, 4), min_size=ndim, max_size=ndim))
    order = draw(st.permutations(range(ndim)))
    flips = draw(st.lists(st.sampled_from(range(ndim)), unique=True)) if ndim and allow_flips else []
    odd = draw(st.lists(st.integers(0 if not allow_flips else -9, 9), min_size=ndim, max_size=ndim))
    return tuple(shape), make_strides(shape, order, flips, odd)


@SETTINGS
@given(dense_layouts(), st.sampled_from(["float64", "int8", "complex64"]))
def test_allocate_numpy_keeps_the_layout(geometry, dtype):
    shape, strides = geometry
    layout = Layout(shape, strides, np.dtype(dtype).itemsize, dtype)
    made = allocate(as_buffer(np.zeros(1, dtype)), layout)
    assert isinstance(made, np.ndarray) and made.dtype == np.dtype(dtype)
    assert denseccl.layout_of(made) == layout
    # exactly numel elements of memory, all of it covered by the span
    assert made.base is not None and made.base.size == layout.numel
    if layout.numel:
        assert as_buffer(made).span_pointer == made.base.ctypes.data
        made[...] = np.arange(layout.numel).reshape(shape).astype(dtype)
        assert np.array_equal(np.sort(made.base), np.sort(np.arange(layout.numel).astype(dtype)))


@SETTINGS
@given(dense_layouts(allow_flips=False), st.sampled_from(["bfloat16", "float32", "int64"]))
def test_allocate_torch_keeps_the_layout(geometry, dtype):
    shape, strides = geometry
    like = as_buffer(torch.zeros(1, dtype=getattr(torch, dtype)))
    layout = Layout(shape, strides, like.layout.itemsize, dtype)
    made = allocate(like, layout)
    assert isinstance(made, torch.Tensor) and made.dtype == getattr(torch, dtype)
    assert denseccl.layout_of(made) == layout


def test_allocate_empty_flipped_layout():
    layout = Layout((0, 3), (3, -1), 8, "float64")
    made = allocate(as_buffer(np.zeros(1)), layout)
    assert made.shape == (0, 3) and denseccl.layout_of(made).key == layout.key


def test_helper_builds_exact_strides():
    """The test helper itself: the strides asked for, over exactly numel elements."""
    x = empty_strided((2, 1, 3), (-1, 7, -2), "float32")
    assert denseccl.layout_of(x).strides == (-1, 7, -2) and x.base.size == 6
