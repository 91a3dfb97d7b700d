"""Markdown tables from ``--json`` files of the benchmark (for the README (Benchmark section)).

    python -m denseccl.bench.report scaling r2.json r4.json r8.json   # busbw by size x ranks
    python -m denseccl.bench.report ratio run.json channels_last/denseccl contiguous/denseccl
        # time of the first row over the second, per collective, type and size
    python -m denseccl.bench.report types run.json   # each type's time over float32's
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import OrderedDict
from typing import Any, Dict, Sequence, Tuple

from .conventions import NCCL_TESTS_NAMES, TYPE_NAMES
from .plot import size_label


def load(path: str) -> Dict[str, Any]:
    with open(path) as handle:
        return json.load(handle)


def _size(nbytes: int) -> str:
    """:func:`plot.size_label` spelled for a table: ``4 KiB``, ``64 MiB``, ``1536 B``."""
    label = size_label(nbytes)
    return f"{label[:-1]} {label[-1]}iB" if label[-1] in "KMG" else f"{label} B"


def scaling(runs: Sequence[Dict[str, Any]]) -> str:
    """busbw (GB/s) per (collective, type, layout, contender, size) row and rank-count column."""
    columns = sorted({run["meta"]["nranks"] for run in runs})
    table: "OrderedDict[Tuple[Any, ...], Dict[int, float]]" = OrderedDict()
    for run in runs:
        n = run["meta"]["nranks"]
        for row in run["rows"]:
            if row.get("error"):
                continue
            key = (NCCL_TESTS_NAMES[row["collective"]], TYPE_NAMES.get(row["type"], row["type"]), row["layout"],
                   row["contender"], row["size"])
            table.setdefault(key, {})[n] = row["busbw"]
    lines = ["| collective | type | layout | contender | size | " + " | ".join(f"{n} ranks" for n in columns) + " |",
             "|---|---|---|---|---:|" + "---:|" * len(columns)]
    ordered = sorted(table.items(), key=lambda kv: (kv[0][:4], kv[0][4]))
    for (collective, dtype, layout, contender, size), values in ordered:
        cells = [f"{values[n]:.2f}" if n in values else "" for n in columns]
        lines.append(f"| {collective} | {dtype} | {layout} | {contender} | {_size(size)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _ratio(a: Dict[str, Any], b: Dict[str, Any]) -> float:
    """Median over rounds of time(a) / time(b): rows of one group are timed in the same rounds
    (runner.run_group), so each round's ratio sees the same machine; else the medians' ratio."""
    ra, rb = a.get("rounds_us") or [], b.get("rounds_us") or []
    if ra and len(ra) == len(rb):
        return statistics.median(x / y for x, y in zip(ra, rb))
    return a["time_us"] / b["time_us"]


def ratio(run: Dict[str, Any], first: str, second: str) -> str:
    """time(first) / time(second) per collective, type and size; ``first``/``second`` are
    ``layout/contender``. The ratio is the median of per-round ratios (see :func:`_ratio`)."""
    def pick(spec: str) -> Dict[Tuple[str, str, Any, int], Dict[str, Any]]:
        layout, _, contender = spec.partition("/")
        return {(r["collective"], r["type"], r["redop"], r["size"]): r for r in run["rows"]
                if not r.get("error") and r["layout"] == layout and r["contender"] == contender}
    a, b = pick(first), pick(second)
    lines = [f"| collective | type | size | {first} (us) | {second} (us) | ratio |", "|---|---|---:|---:|---:|---:|"]
    for key in sorted(set(a) & set(b), key=lambda k: (k[0], k[1], str(k[2]), k[3])):
        collective, dtype, op, size = key
        name = (NCCL_TESTS_NAMES[collective] + " " + (op or "")).strip()
        lines.append(f"| {name} | {TYPE_NAMES.get(dtype, dtype)} | {_size(size)} | "
                     f"{a[key]['time_us']:.1f} | {b[key]['time_us']:.1f} | {_ratio(a[key], b[key]):.2f} |")
    return "\n".join(lines)


def types(run: Dict[str, Any], base: str = "float32") -> str:
    """time of each type over ``base``'s, at the same collective, layout, contender and size
    (bytes), i.e. the inverse ratio of their bus bandwidths."""
    rows = {(r["collective"], r["layout"], r["contender"], r["size"], r["type"]): r
            for r in run["rows"] if not r.get("error")}
    lines = ["| collective | layout | contender | size | type | time (us) | vs " + TYPE_NAMES.get(base, base) + " |",
             "|---|---|---|---:|---|---:|---:|"]
    for (collective, layout, contender, size, dtype), row in sorted(rows.items()):
        reference = rows.get((collective, layout, contender, size, base))
        if reference is None or dtype == base:
            continue
        lines.append(f"| {NCCL_TESTS_NAMES[collective]} | {layout} | {contender} | {_size(size)} | "
                     f"{TYPE_NAMES.get(dtype, dtype)} | {row['time_us']:.1f} | {_ratio(row, reference):.2f} |")
    return "\n".join(lines)


def main(argv: Sequence[str] = ()) -> int:
    p = argparse.ArgumentParser(prog="python -m denseccl.bench.report", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="what", required=True)
    sub.add_parser("scaling", help="busbw by size and rank count").add_argument("files", nargs="+")
    r = sub.add_parser("ratio", help="time ratio of two layout/contender rows")
    for name in ("file", "first", "second"):
        r.add_argument(name)
    sub.add_parser("types", help="time of each element type over float32's").add_argument("file")
    args = p.parse_args(list(argv) or None)
    if args.what == "scaling":
        print(scaling([load(f) for f in args.files]))
    elif args.what == "types":
        print(types(load(args.file)))
    else:
        print(ratio(load(args.file), args.first, args.second))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
