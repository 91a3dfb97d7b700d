"""``--plot FILE.png``: busbw against size, one line per layout and contender, one panel per
collective (and element type / op when a run has several)."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Dict, List, Mapping, Sequence, Tuple

from .conventions import NCCL_TESTS_NAMES, TYPE_NAMES

_STYLES = {"contiguous": "-", "channels_last": "--", "transposed": ":", "reversed": "-."}


class PlotUnavailable(RuntimeError):
    pass


def plot(rows: Sequence[Mapping[str, Any]], path: str, title: str) -> None:
    """Write the busbw-vs-size figure to ``path`` (PNG). Raises :class:`PlotUnavailable` with
    an install hint when matplotlib is missing."""
    try:
        import matplotlib  # noqa: PLC0415

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError:
        raise PlotUnavailable(
            "--plot needs matplotlib: pip install matplotlib (or pip install 'denseccl[plot]')"
        ) from None
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
        series: Dict[Tuple[str, str], List[Tuple[int, float]]] = OrderedDict()
        for row in panel:
            series.setdefault((row["contender"], row["layout"]), []).append((row["size"], row["busbw"]))
        for (contender, layout), points in series.items():
            points.sort()
            ax.plot(
                [p[0] for p in points], [p[1] for p in points], _STYLES.get(layout, "-"),
                marker="o", markersize=3, color=colours[contender], label=f"{contender} / {layout}",
            )
        ax.set_xscale("log", base=2)
        ax.set_xlabel("size (bytes)")
        ax.set_ylabel("busbw (GB/s)")
        ax.set_title(f"{NCCL_TESTS_NAMES[collective]} {TYPE_NAMES.get(dtype, dtype)} {op or ''}".strip())
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the lines, not over them
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(figure)
