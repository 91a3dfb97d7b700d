"""The pure parts of the benchmark: nccl-tests conventions (sizes, counts, bus-bandwidth
factors), the layouts and references of the cases, and the table."""

from __future__ import annotations

import numpy as np
import pytest

import denseccl
from denseccl.bench import cases, conventions as cv, options, plot, table
from denseccl.bench.libs import NumpyLib
from denseccl.bench.heartbeat import Progress
from denseccl.layout import stacked


@pytest.mark.parametrize(
    "collective, n, factor",
    [
        ("allreduce", 2, 1.0),
        ("allreduce", 4, 1.5),
        ("allreduce", 8, 1.75),
        ("reduce_scatter", 4, 0.75),
        ("allgather", 8, 0.875),
        ("broadcast", 8, 1.0),
        ("reduce", 4, 1.0),
        ("allreduce", 1, 0.0),
    ],
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
    assert cv.parse_size("1.5M") == 1572864 and cv.parse_size("0.5k") == 512 and cv.parse_size("4m") == 4 << 20
    with pytest.raises(ValueError):
        cv.parse_size("lots")
    assert cv.sizes(4096, 65536, 4) == [4096, 16384, 65536]
    assert cv.sizes(1000, 3000, increment=1000) == [1000, 2000, 3000]
    assert cv.sizes(8, 8) == [8]
    with pytest.raises(ValueError):
        cv.sizes(10, 5)
    # nccl-tests: a factor > 1 wins over the step in bytes; else the step (default 1M) applies
    assert cv.sizes(4096, 65536, 4, increment=1000) == [4096, 16384, 65536]
    assert cv.sizes(1 << 20, 3 << 20) == [1 << 20, 2 << 20, 3 << 20]
    with pytest.raises(ValueError):
        cv.sizes(10, 20, 1, increment=0)


def _args(*argv: str):  # type: ignore[no-untyped-def]
    return options.parser().parse_args(list(argv))


def test_flags_mean_what_they_mean_in_nccl_tests() -> None:
    args = _args()
    # nccl-tests' defaults: one 32 MiB size, 5 warm-up and 20 timed iterations, check on, mean time
    assert (args.minbytes, args.maxbytes, args.warmup_iters, args.iters, args.check, args.average) == (
        "32M",
        "32M",
        5,
        20,
        1,
        1,
    )
    plan = options.plan(args)
    assert plan.sizes == [32 << 20] and plan.collectives == ["allreduce"] and plan.dtypes == ["float32"]
    assert plan.ops == ["sum"] and plan.agreement == [True] and plan.layouts == list(cv.LAYOUTS)
    args = _args(
        "-b",
        "1.5M",
        "-e",
        "6M",
        "-f",
        "2",
        "-c",
        "0",
        "-o",
        "all",
        "-d",
        "half,bf16",
        "-r",
        "1",
        "-a",
        "3",
        "-n",
        "7",
        "-w",
        "2",
        "--collective",
        "all_gather,reduce_scatter",
        "--agreement",
        "off,on",
    )
    plan = options.plan(args)
    assert plan.sizes == [1572864, 3145728, 6291456] and args.check == 0 and args.average == 3
    assert plan.ops == list(cv.OPS) and plan.dtypes == ["float16", "bfloat16"] and args.root == 1
    assert plan.collectives == ["allgather", "reduce_scatter"] and plan.agreement == [False, True]
    assert (args.iters, args.warmup_iters) == (7, 2)
    long_names = _args(
        "--minbytes",
        "4K",
        "--maxbytes",
        "8K",
        "--stepfactor",
        "2",
        "--check",
        "3",
        "--op",
        "max",
        "--datatype",
        "int32",
        "--iters",
        "4",
        "--warmup_iters",
        "0",
        "--average",
        "0",
    )
    assert options.plan(long_names).sizes == [4096, 8192] and long_names.check == 3


def test_c_is_the_check_and_names_the_collective_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        _args("-c", "allreduce")
    assert "--collective" in capsys.readouterr().err
    for bad in (["-c", "-1"], ["--agreement", "sometimes"], ["--collective", "alltoall"], ["-n", "0"]):
        with pytest.raises(ValueError):
            options.plan(_args(*bad))
    with pytest.raises(SystemExit):  # nccl-tests flags without a meaning here are refused, not reused
        _args("-g", "1")


def test_pin_cpus() -> None:
    assert options.pin_cpus("0", [0, 1], 1) == {0}
    assert options.pin_cpus("0-2,5", [0, 1, 2, 3, 4, 5], 0) == {0, 1, 2, 5}
    assert options.pin_cpus("core", [2, 3], 0) == {2} and options.pin_cpus("core", [2, 3], 3) == {3}
    with pytest.raises(ValueError, match="not usable"):
        options.pin_cpus("7", [0, 1], 0)
    with pytest.raises(ValueError, match="CPU list"):
        options.pin_cpus("first", [0, 1], 0)


def test_names_accept_nccl_tests_spellings() -> None:
    assert cv.expand("all", cv.COLLECTIVES, cv.collective_name) == list(cv.COLLECTIVES)
    assert cv.expand("all_reduce,reducescatter,allreduce", cv.COLLECTIVES, cv.collective_name) == [
        "allreduce",
        "reduce_scatter",
    ]
    assert cv.expand("float,half,bf16,double", tuple(cv.TYPE_NAMES), cv.dtype_name) == [
        "float32",
        "float16",
        "bfloat16",
        "float64",
    ]
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
    base = dict(
        collective="allreduce",
        size=4096,
        count=1024,
        type="float32",
        redop="sum",
        root=-1,
        layout="channels_last",
        contender="denseccl",
        time_us=12.345,
        algbw=0.33,
        busbw=0.33,
        wrong=0,
    )
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
    # nccl-tests' time format: %7.2f, %7.1f from 100 us, %7.0f from 10 ms
    assert [table.format_row(row(time_us=t)).split()[7] for t in (99.994, 123.45, 12345.6)] == [
        "99.99",
        "123.5",
        "12346",
    ]
    assert table.format_row(row(wrong=None)).split()[-1] == "N/A"  # -c 0: not checked
    memory = table.format_row(row(peak_bytes=2048), memcheck=True)
    assert memory.split()[-1] == "2048" and len(memory) == len(table.header(memcheck=True)[0])


def test_footer() -> None:
    rows = [row(busbw=1.0), row(size=8192, busbw=3.0), row(contender="naive", busbw=0.5, wrong=2)]
    lines = table.footer(rows)
    assert lines[0] == "# Out of bounds values : 2 FAILED"
    # the same rows for every contender: naive has no 8 KiB row, so denseccl's 3.0 is left out
    assert "# Avg bus bandwidth    : 1  (denseccl)" in lines
    assert "# Avg bus bandwidth    : 0.5  (naive)" in lines
    assert not any("per layout" in line for line in lines)  # one layout: the lines above say it all
    assert table.footer([row()])[0].endswith("0 OK")
    assert table.footer([row(wrong=None)])[0] == "# Out of bounds values : N/A OK"


def test_footer_compares_contenders_on_the_same_rows_per_layout() -> None:
    rows = []
    for size, scale in ((4096, 1.0), (8192, 2.0), (16384, 4.0)):
        for layout in ("contiguous", "channels_last"):
            rows.append(row(size=size, layout=layout, contender="denseccl", busbw=scale))
        rows.append(row(size=size, layout="contiguous", contender="mpi4py", busbw=scale * 1.5))
        if size != 16384:  # the copy path raised at 16 KiB: no contender's 16 KiB channels_last counts
            rows.append(row(size=size, layout="channels_last", contender="naive", busbw=scale / 2))
    rows.append(row(size=16384, layout="channels_last", contender="naive", error="boom", busbw=float("nan")))
    averages, count = table.average_busbw(rows)
    assert count == 0 and not averages  # no case ran for every contender
    per_layout = table.by_layout(rows)
    assert per_layout["contiguous"] == (3, {"denseccl": pytest.approx(7 / 3), "mpi4py": pytest.approx(3.5)})
    assert per_layout["channels_last"] == (2, {"denseccl": pytest.approx(1.5), "naive": pytest.approx(0.75)})
    text = "\n".join(table.footer(rows))
    assert "no case ran for every contender" in text and "per layout" in text
    line = next(x for x in table.footer(rows) if x.startswith("#   channels_last"))
    assert line.split() == ["#", "channels_last", "2", "1.5", "-", "0.75"]


def test_plot_helpers() -> None:
    assert [plot.size_label(n) for n in (4096, 1 << 20, 256 << 20, 1 << 30, 1536, 100)] == [
        "4K",
        "1M",
        "256M",
        "1G",
        "1536",
        "100",
    ]
    sizes = [4096 << (2 * i) for i in range(10)]  # 4K .. 1G
    assert plot.ticks(sizes) == sizes
    many = [1 << i for i in range(3, 31)]  # 8 B .. 1G, 28 sizes
    chosen = plot.ticks(many)
    assert len(chosen) <= 13 and chosen[0] == 8 and chosen[-1] == 1 << 30
    slow, fast = plot.round_spread(row(size=4096, rounds_us=[4.096, 2.048, 1.024]), 2)
    assert (slow, fast) == (pytest.approx(1.0), pytest.approx(4.0))  # allreduce on 2 ranks: busbw = algbw
    assert plot.round_spread(row(busbw=0.5), 2) == (0.5, 0.5)


def test_plot_draws_error_bars_and_log_y(tmp_path) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("matplotlib")
    rows = [
        row(size=s, busbw=b, rounds_us=[s / 1e3 / b * f for f in (0.9, 1.0, 1.2)])
        for s, b in ((4096, 0.5), (1 << 20, 5.0))
    ]
    out = tmp_path / "busbw.png"
    plot.plot(rows, str(out), "test", nranks=2, logy=True)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_progress_lines_only_after_silence() -> None:
    import io

    now = [0.0]
    stream = io.StringIO()
    progress = Progress(10.0, stream, clock=lambda: now[0])
    progress.enter("all_reduce sum 4096 B")
    progress.at("timing round 1/3")
    assert stream.getvalue() == ""
    now[0] = 11.0
    progress.at("timing round 2/3")
    assert stream.getvalue() == "denseccl.bench: 11 s: all_reduce sum 4096 B: timing round 2/3\n"
    progress.at("timing round 3/3")  # just said something
    now[0] = 15.0
    progress.printed()  # a row went out
    now[0] = 24.0
    progress.at("checking")
    assert stream.getvalue().count("\n") == 1
    Progress(0, stream, clock=lambda: 1e9).at("never")
    assert "never" not in stream.getvalue()


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
