"""The nccl-tests-style table: header, one line per (size, layout, contender), footer.

Columns follow nccl-tests (``size``, ``count``, ``type``, ``redop``, ``root``, ``time``,
``algbw``, ``busbw``, ``#wrong``) with two more, ``layout`` and ``contender``. denseccl runs
in place, so there is one set of timing columns, not out-of-place and in-place.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Dict, Iterable, List, Mapping, Sequence, Tuple

from .conventions import NCCL_TESTS_NAMES, TYPE_NAMES

Row = Dict[str, Any]

#: the columns; the last, ``peak tmp``, only with --memcheck
_HEAD = ("size", "count", "type", "redop", "root", "layout", "contender", "time", "algbw", "busbw", "#wrong",
         "peak tmp")
_UNITS = ("(B)", "(elements)", "", "", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(B)")
_WIDTHS = (12, 12, 8, 6, 6, 14, 17, 10, 8, 8, 7, 12)


def _line(cells: Sequence[str], prefix: str = " ") -> str:
    return prefix + "  ".join(cell.rjust(width) for cell, width in zip(cells, _WIDTHS))


def header(memcheck: bool = False) -> List[str]:
    """The two column-title lines (``#``-prefixed, as nccl-tests)."""
    columns = len(_HEAD) if memcheck else len(_HEAD) - 1
    return [_line(_HEAD[:columns], "#"), _line(_UNITS[:columns], "#")]


def _time(value: float) -> str:
    """nccl-tests' time format: %7.0f from 10 ms, %7.1f from 100 us, else %7.2f."""
    if value != value:  # NaN
        return "N/A"
    if value >= 10000.0:
        return f"{value:.0f}"
    return f"{value:.1f}" if value >= 100.0 else f"{value:.2f}"


def _bandwidth(value: float) -> str:
    return "N/A" if value != value else f"{value:.2f}"


def format_row(row: Mapping[str, Any], memcheck: bool = False) -> str:
    """One result line. ``#wrong`` is N/A when the run did not check results (``-c 0``)."""
    cells = [
        str(row["size"]),
        str(row["count"]),
        TYPE_NAMES.get(row["type"], row["type"]),
        row["redop"] or "none",
        str(row["root"]),
        row["layout"],
        row["contender"],
    ]
    if row.get("error"):
        cells += ["error", "", "", "-"]
    else:
        wrong = row.get("wrong")
        cells += [_time(row["time_us"]), _bandwidth(row["algbw"]), _bandwidth(row["busbw"]),
                  "N/A" if wrong is None else str(wrong)]
    if memcheck:
        peak = row.get("peak_bytes")
        cells.append("-" if peak is None else str(peak))
    return _line(cells)


def collective_title(collective: str, op: Any) -> str:
    """``# all_reduce: redop sum``: the heading of one block of rows."""
    return f"#\n# {NCCL_TESTS_NAMES[collective]}: redop {op or 'none'}"


Case = Tuple[Any, ...]


def _measured(rows: Iterable[Mapping[str, Any]]) -> "OrderedDict[str, Dict[Case, float]]":
    """contender -> {(collective, redop, type, size, layout): busbw} over rows with a number."""
    found: "OrderedDict[str, Dict[Case, float]]" = OrderedDict()
    for row in rows:
        if not row.get("error") and row["busbw"] == row["busbw"]:
            key = (row["collective"], row["redop"], row["type"], row["size"], row["layout"])
            found.setdefault(row["contender"], {})[key] = row["busbw"]
    return found


def _over_common(measured: Mapping[str, Dict[Any, float]]) -> "Tuple[int, OrderedDict[str, float]]":
    """(cases, {contender: mean busbw}) over the cases every contender in ``measured`` ran."""
    common = set.intersection(*(set(cases) for cases in measured.values())) if measured else set()
    if not common:
        return 0, OrderedDict()
    return len(common), OrderedDict((name, sum(c[k] for k in common) / len(common)) for name, c in measured.items())


def average_busbw(rows: Iterable[Mapping[str, Any]]) -> "Tuple[OrderedDict[str, float], int]":
    """nccl-tests' 'Avg bus bandwidth' per contender, each over the same cases: those that every
    contender measured. Returns ({contender: mean busbw}, number of cases); empty when no case
    ran for every contender (then only :func:`by_layout` compares them)."""
    count, means = _over_common(_measured(rows))
    return means, count


def by_layout(rows: Iterable[Mapping[str, Any]]) -> "OrderedDict[str, Tuple[int, Dict[str, float]]]":
    """Per layout: (cases, {contender: mean busbw}) over the (collective, op, type, size) cases
    that every contender with rows in that layout measured there. Contenders run on different
    layouts (raw MPI on contiguous arrays only, the copy path on the others), so this is where
    all of them are compared like for like."""
    measured = _measured(rows)
    layouts = list(OrderedDict.fromkeys(key[4] for cases in measured.values() for key in cases))
    found: "OrderedDict[str, Tuple[int, Dict[str, float]]]" = OrderedDict()
    for layout in layouts:
        present = {name: {k[:4]: v for k, v in cases.items() if k[4] == layout} for name, cases in measured.items()}
        count, means = _over_common({name: cases for name, cases in present.items() if cases})
        if count:
            found[layout] = (count, means)
    return found


def footer(rows: Sequence[Mapping[str, Any]]) -> List[str]:
    """``# Out of bounds values`` (total #wrong), ``# Avg bus bandwidth`` per contender over the
    cases every contender ran, and, when several contenders ran, the same per layout."""
    wrong = sum(int(row.get("wrong") or 0) for row in rows)
    errors = sum(1 for row in rows if row.get("error"))
    checked = any(row.get("wrong") is not None for row in rows)
    verdict = "OK" if wrong == 0 and errors == 0 else "FAILED"
    lines = [f"# Out of bounds values : {wrong if checked or errors else 'N/A'} {verdict}"]
    if errors:
        lines.append(f"# Rows that raised     : {errors}")
    averages, count = average_busbw(rows)
    contenders = list(_measured(rows))
    for name, value in averages.items():
        lines.append(f"# Avg bus bandwidth    : {value:.4g}  ({name})")
    if len(contenders) > 1 and averages:
        lines.append(f"#   (each over the same {count} cases: those every contender ran)")
    elif len(contenders) > 1:
        lines.append("# Avg bus bandwidth    : no case ran for every contender; compared per layout below")
    layouts = by_layout(rows)
    if len(contenders) > 1 and layouts and (len(layouts) > 1 or not averages):
        width = max(len(name) for name in contenders)
        lines.append("# Avg bus bandwidth (GB/s) per layout, over the cases every contender in that layout ran:")
        names = "".join(name.rjust(width + 2) for name in contenders)
        lines.append("#   " + "layout".ljust(14) + "cases".rjust(6) + names)
        for layout, (cases, values) in layouts.items():
            cells = "".join((f"{values[name]:.3g}" if name in values else "-").rjust(width + 2) for name in contenders)
            lines.append("#   " + layout.ljust(14) + str(cases).rjust(6) + cells)
    lines.append("#")
    return lines
