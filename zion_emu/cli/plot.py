"""Bus bandwidth vs message size plots (matplotlib, Agg, no display needed)."""

from __future__ import annotations

import os
from typing import Any, Sequence

from zion_emu._format import format_bytes
from zion_emu.cli import CliError

# One panel: a title and, per curve label, (bytes, busbw GB/s) points.
Panel = tuple[str, dict[str, Sequence[tuple[int, float]]]]


def _figure_class() -> Any:
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise CliError("plots need matplotlib: pip install matplotlib") from None
    return Figure


def check_writable(path: str) -> None:
    """Fails before any work is done if ``path`` cannot take a plot."""
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise CliError(f"cannot write plot {path!r}: it is a directory")
    if not os.path.isdir(folder):
        raise CliError(f"cannot write plot {path!r}: folder {folder!r} does not exist")
    if not os.access(folder, os.W_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        raise CliError(f"cannot write plot {path!r}: permission denied")
    ext = os.path.splitext(path)[1].lstrip(".").lower()
    formats = _figure_class()().canvas.get_supported_filetypes()
    if ext not in formats:
        raise CliError(f"cannot write plot {path!r}: unknown image format {ext!r}; use one of {', '.join(formats)}")


def plot_busbw(path: str, suptitle: str, panels: list[Panel]) -> None:
    """Side-by-side panels of busbw (GB/s) against size on a log2 axis."""
    from matplotlib.ticker import FuncFormatter

    fig = _figure_class()(figsize=(6.5 * len(panels), 4.5), layout="constrained")
    for ax, (title, curves) in zip(fig.subplots(1, len(panels), squeeze=False)[0], panels):
        for label, points in curves.items():
            ax.plot([b for b, _ in points], [bw for _, bw in points], marker=".", label=label)
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _pos: format_bytes(x)))
        ax.tick_params(axis="x", labelrotation=45)
        ax.set_xlabel("message size")
        ax.set_ylabel("bus bandwidth (GB/s, GB = 1e9 B)")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.suptitle(suptitle)
    try:
        fig.savefig(path)
    except OSError as e:
        raise CliError(f"cannot write plot {path!r}: {e.strerror or e}") from None
