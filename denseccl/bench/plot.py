"""``--plot FILE.png``: busbw against size, one line per layout and contender, one panel per
collective (and element type / op when a run has several). Points are the median round; the
error bars span the slowest to the fastest round. Sizes are labelled as nccl-tests users write
them (4K ... 256M); ``--logy`` puts busbw on a log scale."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from .conventions import NCCL_TESTS_NAMES, TYPE_NAMES, bandwidths

_STYLES = {"contiguous": "-", "channels_last": "--", "transposed": ":", "reversed": "-."}
_HINT = "--plot needs matplotlib: pip install matplotlib (or pip install 'denseccl[plot]')"
_MAX_TICKS = 12


class PlotUnavailable(RuntimeError):
    pass


def problem() -> Optional[str]:
    """Why no plot can be drawn here (checked before the run), or None."""
    try:
        import matplotlib  # noqa: F401, PLC0415
    except ImportError:
        return _HINT
    return None


def size_label(nbytes: int) -> str:
    """``4096`` -> ``4K``, ``268435456`` -> ``256M``, ``1536`` -> ``1536`` (nccl-tests' units)."""
    for suffix, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale}{suffix}"
    return str(nbytes)


def round_spread(row: Mapping[str, Any], nranks: int) -> Tuple[float, float]:
    """(slowest, fastest) busbw over the row's rounds; the row's own value when it has none."""
    values = [
        bandwidths(row["collective"], row["size"], t * 1e-6, nranks)[1] for t in row.get("rounds_us") or [] if t > 0
    ]
    if not values:
        return row["busbw"], row["busbw"]
    return min(values), max(values)


def ticks(sizes: Sequence[int]) -> List[int]:
    """At most a dozen of the measured sizes, evenly thinned, always with the largest."""
    ordered = sorted(set(sizes))
    step = -(-len(ordered) // _MAX_TICKS)
    chosen = ordered[::step]
    if chosen[-1] != ordered[-1]:
        chosen.append(ordered[-1])
    return chosen


def plot(rows: Sequence[Mapping[str, Any]], path: str, title: str, *, nranks: int = 2, logy: bool = False) -> None:
    """Write the busbw-vs-size figure to ``path`` (PNG). Raises :class:`PlotUnavailable` with
    an install hint when matplotlib is missing."""
    try:
        import matplotlib  # noqa: PLC0415

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
        from matplotlib.ticker import NullLocator  # noqa: PLC0415
    except ImportError:
        raise PlotUnavailable(_HINT) from None
    panels: "OrderedDict[Tuple[str, str, Any], List[Mapping[str, Any]]]" = OrderedDict()
    for row in rows:
        if not row.get("error"):
            panels.setdefault((row["collective"], row["type"], row["redop"]), []).append(row)
    if not panels:
        raise PlotUnavailable("nothing to plot: no row has a measurement")
    columns = min(len(panels), 3)
    lines = (len(panels) + columns - 1) // columns
    figure, axes = plt.subplots(lines, columns, figsize=(9.0 * columns, 4.6 * lines), squeeze=False)
    contenders = list(OrderedDict.fromkeys(row["contender"] for row in rows))
    colours = {name: f"C{i % 10}" for i, name in enumerate(contenders)}
    for ax, ((collective, dtype, op), panel) in zip(axes.flat, panels.items()):
        series: Dict[Tuple[str, str], List[Mapping[str, Any]]] = OrderedDict()
        for row in panel:
            series.setdefault((row["contender"], row["layout"]), []).append(row)
        for (contender, layout), points in series.items():
            points = sorted(points, key=lambda r: r["size"])
            spread = [round_spread(r, nranks) for r in points]
            middle = [r["busbw"] for r in points]
            below = [max(m - lo, 0.0) for m, (lo, _) in zip(middle, spread)]
            above = [max(hi - m, 0.0) for m, (_, hi) in zip(middle, spread)]
            ax.errorbar([r["size"] for r in points], middle, yerr=[below, above], fmt=_STYLES.get(layout, "-"),
                        marker="o", markersize=3, capsize=2, elinewidth=0.8, color=colours[contender],
                        label=f"{contender} / {layout}")
        ax.set_xscale("log", base=2)
        if logy:
            ax.set_yscale("log")
        chosen = ticks([r["size"] for r in panel])
        ax.set_xticks(chosen)
        ax.set_xticklabels([size_label(n) for n in chosen])
        ax.xaxis.set_minor_locator(NullLocator())  # only the labelled sizes on the x axis
        ax.set_xlabel("size (bytes)")
        ax.set_ylabel("busbw (GB/s)" + (", log scale" if logy else ""))
        ax.set_title(f"{NCCL_TESTS_NAMES[collective]} {TYPE_NAMES.get(dtype, dtype)} {op or ''}".strip())
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the lines, not over them
    for ax in list(axes.flat)[len(panels) :]:
        ax.set_visible(False)
    figure.suptitle(title + ("" if not any(r.get("rounds_us") for r in rows) else "; bars: slowest to fastest round"))
    figure.tight_layout()
    figure.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(figure)
