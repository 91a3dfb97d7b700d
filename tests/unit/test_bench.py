"""The pure parts of the benchmark: nccl-tests conventions (sizes, counts, bus-bandwidth
factors), the layouts and references of the cases, and the table."""

from __future__ import annotations

import numpy as np
import pytest

import denseccl
from denseccl.bench import cases, conventions as cv, table
from denseccl.bench.libs import NumpyLib
from denseccl.layout import stacked


@pytest.mark.parametrize(
    "collective, n, factor",
    [("allreduce", 2, 1.0), ("allreduce", 4, 1.5), ("allreduce", 8, 1.75), ("reduce_scatter", 4, 0.75),
     ("allgather", 8, 0.875), ("broadcast", 8, 1.0), ("reduce", 4, 1.0), ("allreduce", 1, 0.0)],
)
def test_bus_factors_are_nccl_tests(collective: str, n: int, factor: float) -> None:
    assert cv.bus_factor(collective, n) == pytest.approx(factor)


def test_size_and_count_conventions() -> None:
    # count per rank for allgather / reduce_scatter; size is the larger buffer
    assert cv.count_for("allreduce", 4096, 4, 4) == 1024
    assert cv.size_of("allreduce", 1024, 4, 4) == 4096
    assert cv.count_for("allgather", 4096, 4, 4) == 256
    assert cv.size_of("allgather", 256, 4, 4) == 4096
    assert cv.count_for("reduce_scatter", 4096, 2, 8) == 256
    assert cv.size_of("reduce_scatter", 256, 2, 8) == 4096
    # rounded down, as nccl-tests does
    assert cv.count_for("allreduce", 4099, 4, 2) == 1024
    assert cv.count_for("allgather", 4100, 4, 4) == 256
    assert cv.count_for("broadcast", 2, 4, 2) == 0


def test_bandwidths_use_1e9_bytes() -> None:
    algbw, busbw = cv.bandwidths("allreduce", 2_000_000_000, 1.0, 4)
    assert algbw == pytest.approx(2.0)
    assert busbw == pytest.approx(3.0)
    assert cv.bandwidths("broadcast", 1000, 0.0, 2) == (0.0, 0.0)


def test_sizes_and_parsing() -> None:
    assert cv.parse_size("4K") == 4096 and cv.parse_size("64M") == 64 << 20 and cv.parse_size("1G") == 1 << 30
    assert cv.parse_size("100") == 100 and cv.parse_size("2MiB") == 2 << 20
    with pytest.raises(ValueError):
        cv.parse_size("lots")
    assert cv.sizes(4096, 65536, 4) == [4096, 16384, 65536]
    assert cv.sizes(1000, 3000, increment=1000) == [1000, 2000, 3000]
    assert cv.sizes(8, 8) == [8]
    with pytest.raises(ValueError):
        cv.sizes(10, 5)


def test_names_accept_nccl_tests_spellings() -> None:
    assert cv.expand("all", cv.COLLECTIVES, cv.collective_name) == list(cv.COLLECTIVES)
    assert cv.expand("all_reduce,reducescatter,allreduce", cv.COLLECTIVES, cv.collective_name) == ["allreduce", "reduce_scatter"]
    assert cv.expand("float,half,bf16,double", tuple(cv.TYPE_NAMES), cv.dtype_name) == ["float32", "float16", "bfloat16", "float64"]
    with pytest.raises(ValueError):
        cv.expand("alltoall", cv.COLLECTIVES, cv.collective_name)
    with pytest.raises(ValueError):
        cv.dtype_name("quad")


@pytest.mark.parametrize("count", [1, 7, 1024, 4096, 3 * 5 * 7, 1 << 22])
def test_logical_shape_holds_count(count: int) -> None:
    shape = cases.logical_shape(count)
    assert len(shape) == 4 and int(np.prod(shape)) == count


def test_layouts_are_dense_and_distinct() -> None:
    lib = NumpyLib()
    shape = cases.logical_shape(4096)
    keys = set()
    for layout in cv.LAYOUTS:
        x = cases.build(lib, shape, "float32", layout)
        described = denseccl.layout_of(x)
        assert x.shape == shape and described.is_dense, layout
        keys.add(described.key)
        if layout == "channels_last":
            assert x.strides[1] == 4  # C innermost
        if layout == "reversed":
            assert all(s < 0 for s in x.strides)
        block = described
        out = cases.build(lib, shape, "float32", layout, stacked=3)
        assert denseccl.layout_of(out).strides == stacked(block, 3).strides, layout
    assert len(keys) == 4


def test_references() -> None:
    case = cases.Case("allreduce", "int32", "sum", 0, 6, "contiguous", 3, 1)
    inputs = [cases.input_values(case, r) for r in range(3)]
    assert np.array_equal(cases.expected(case), sum(inputs))
    avg = case._replace(op="avg")
    assert np.array_equal(cases.expected(avg), np.trunc(sum(inputs) / 3))
    reduce = case._replace(collective="reduce", root=2)
    assert np.array_equal(cases.expected(reduce), inputs[1])  # not the root: input untouched
    gather = case._replace(collective="allgather")
    assert np.array_equal(cases.expected(gather), np.concatenate(inputs))
    scatter = case._replace(collective="reduce_scatter")
    assert np.array_equal(cases.expected(scatter), sum(cases.input_values(scatter, r, 1) for r in range(3)))
    assert cases.source_values(scatter).size == 18
    prod = cases.Case("allreduce", "bfloat16", "prod", 0, 1000, "contiguous", 8, 0)
    assert np.abs(cases.expected(prod)).max() <= 256  # exact in bfloat16


def test_count_wrong() -> None:
    case = cases.Case("allreduce", "float16", "sum", 0, 4, "contiguous", 2, 0)
    want = np.array([1.0, 2.0, -3.0, 40.0])
    assert cases.count_wrong(case, np.array([1, 2, -3, 40], np.float16), want) == 0
    assert cases.count_wrong(case, np.array([1, 2, 3, 40], np.float16), want) == 1
    assert cases.count_wrong(case, np.array([1, 2, np.nan, 40], np.float16), want) == 1
    assert cases.count_wrong(case, np.zeros(3), want) == 4
    ints = case._replace(dtype="int8")
    assert cases.count_wrong(ints, np.array([1, 2, -3, 41], np.int8), want.astype(np.int8)) == 1


def row(**changes):  # type: ignore[no-untyped-def]
    base = dict(collective="allreduce", size=4096, count=1024, type="float32", redop="sum", root=-1,
                layout="channels_last", contender="denseccl", time_us=12.345, algbw=0.33, busbw=0.33, wrong=0)
    base.update(changes)
    return base


def test_table_columns_line_up() -> None:
    head, units = table.header()
    line = table.format_row(row())
    assert head.startswith("#") and units.startswith("#")
    assert len(head) == len(line) == len(units)
    for word in ("size", "count", "type", "redop", "root", "layout", "contender", "time", "algbw", "busbw", "#wrong"):
        assert word in head
    cells = line.split()
    assert cells == ["4096", "1024", "float", "sum", "-1", "channels_last", "denseccl", "12.35", "0.33", "0.33", "0"]
    assert table.format_row(row(redop=None)).split()[3] == "none"
    assert table.format_row(row(time_us=12345.6)).split()[7] == "12345.6"
    memory = table.format_row(row(peak_bytes=2048), memcheck=True)
    assert memory.split()[-1] == "2048" and len(memory) == len(table.header(memcheck=True)[0])


def test_footer() -> None:
    rows = [row(busbw=1.0), row(busbw=3.0), row(contender="naive", busbw=0.5, wrong=2)]
    lines = table.footer(rows)
    assert lines[0] == "# Out of bounds values : 2 FAILED"
    assert "# Avg bus bandwidth    : 2  (denseccl)" in lines
    assert "# Avg bus bandwidth    : 0.5  (naive)" in lines
    assert table.footer([row()])[0].endswith("0 OK")


def test_arena_shares_memory_between_layouts() -> None:
    lib = NumpyLib()
    arena = cases.Arena()
    shape = cases.logical_shape(4096)
    views = {layout: cases.build(lib, shape, "float32", layout, arena=arena) for layout in cv.LAYOUTS}
    out = cases.build(lib, shape, "float32", "channels_last", stacked=2, arena=arena, role="output")
    spans = {layout: denseccl.arrays.as_buffer(v).span_pointer for layout, v in views.items()}
    assert len(set(spans.values())) == 1 and spans["contiguous"] % 64 == 0
    assert denseccl.arrays.as_buffer(out).span_pointer != spans["contiguous"]
    for layout, view in views.items():
        assert view.shape == shape and denseccl.layout_of(view).is_dense, layout
    assert denseccl.layout_of(views["channels_last"]).key != denseccl.layout_of(views["contiguous"]).key
    half = cases.build(lib, shape, "float16", "transposed", arena=arena)
    assert np.shares_memory(half, views["contiguous"])
