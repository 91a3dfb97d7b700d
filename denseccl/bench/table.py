"""The nccl-tests-style table: header, one line per (size, layout, contender), footer.

Columns follow nccl-tests (``size``, ``count``, ``type``, ``redop``, ``root``, ``time``,
``algbw``, ``busbw``, ``#wrong``) with two more, ``layout`` and ``contender``. denseccl runs
in place, so there is one set of timing columns, not out-of-place and in-place.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Dict, Iterable, List, Mapping, Sequence

from .conventions import NCCL_TESTS_NAMES, TYPE_NAMES

Row = Dict[str, Any]

_HEAD = ("size", "count", "type", "redop", "root", "layout", "contender", "time", "algbw", "busbw", "#wrong")
_UNITS = ("(B)", "(elements)", "", "", "", "", "", "(us)", "(GB/s)", "(GB/s)", "")
_WIDTHS = (12, 12, 8, 6, 6, 14, 17, 10, 8, 8, 7)
_MEM_HEAD, _MEM_UNIT, _MEM_WIDTH = "peak tmp", "(B)", 12


def _line(cells: Sequence[str], widths: Sequence[int], prefix: str = " ") -> str:
    return prefix + "  ".join(cell.rjust(width) for cell, width in zip(cells, widths))


def header(memcheck: bool = False) -> List[str]:
    """The two column-title lines (``#``-prefixed, as nccl-tests)."""
    widths = list(_WIDTHS)
    head, units = list(_HEAD), list(_UNITS)
    if memcheck:
        head.append(_MEM_HEAD)
        units.append(_MEM_UNIT)
        widths.append(_MEM_WIDTH)
    return [_line(head, widths, "#"), _line(units, widths, "#")]


def _number(value: float, width: int) -> str:
    """nccl-tests prints time with %7.2f (or %7.1f above 10 ms) and bandwidths with %6.2f."""
    if value != value:  # NaN
        return "N/A"
    if width == 10:
        return f"{value:.1f}" if value >= 10000 else f"{value:.2f}"
    return f"{value:.2f}"


def format_row(row: Mapping[str, Any], memcheck: bool = False) -> str:
    """One result line."""
    cells = [
        str(row["size"]),
        str(row["count"]),
        TYPE_NAMES.get(row["type"], row["type"]),
        row["redop"] or "none",
        str(row["root"]),
        row["layout"],
        row["contender"],
    ]
    widths = list(_WIDTHS)
    if row.get("error"):
        cells += ["error", "", "", "-"]
    else:
        cells += [
            _number(row["time_us"], 10),
            _number(row["algbw"], 8),
            _number(row["busbw"], 8),
            str(row["wrong"]),
        ]
    if memcheck:
        widths.append(_MEM_WIDTH)
        peak = row.get("peak_bytes")
        cells.append("-" if peak is None else str(peak))
    return _line(cells, widths)


def collective_title(collective: str, op: Any) -> str:
    """``# all_reduce: redop sum``: the heading of one block of rows."""
    return f"#\n# {NCCL_TESTS_NAMES[collective]}: redop {op or 'none'}"


def average_busbw(rows: Iterable[Mapping[str, Any]]) -> "OrderedDict[str, float]":
    """Mean busbw per contender over its rows (nccl-tests' 'Avg bus bandwidth', per contender)."""
    sums: "OrderedDict[str, List[float]]" = OrderedDict()
    for row in rows:
        if not row.get("error") and row["busbw"] == row["busbw"]:
            sums.setdefault(row["contender"], []).append(row["busbw"])
    return OrderedDict((name, sum(values) / len(values)) for name, values in sums.items())


def footer(rows: Sequence[Mapping[str, Any]]) -> List[str]:
    """``# Out of bounds values`` (total #wrong) and ``# Avg bus bandwidth`` per contender."""
    wrong = sum(int(row.get("wrong") or 0) for row in rows)
    errors = sum(1 for row in rows if row.get("error"))
    lines = [f"# Out of bounds values : {wrong} {'OK' if wrong == 0 and errors == 0 else 'FAILED'}"]
    if errors:
        lines.append(f"# Rows that raised     : {errors}")
    for name, value in average_busbw(rows).items():
        lines.append(f"# Avg bus bandwidth    : {value:.4g}  ({name})")
    lines.append("#")
    return lines
