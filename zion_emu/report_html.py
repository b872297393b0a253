"""The run report as one self-contained HTML page, to read in a browser or send on.

``zion-emu run --html OUT.html`` writes :func:`run_html`, ``zion-emu sweep
--html OUT.html`` :func:`sweep_html`. Everything is inside the file: the
charts are PNG images drawn by matplotlib and embedded as ``data:`` URIs,
the style sheet is inline, and there is no script; the page loads nothing.

A run's page has where the time went in each iteration (from the recorded
spans, as :mod:`zion_emu.breakdown` splits it), device utilization over
modeled time, each device's busy time and peak HBM, each device's allocated
HBM over modeled time with its peak marked, the link classes, the top
work and the tables of the text report. Report fields this page does not know
(``assumptions``, ``placeholders``, ``simulated_ranks`` or any other key of
the report's JSON) are shown as they are, so a new field appears without a
change here. A sweep's page compares the variants and marks the fastest.
"""

from __future__ import annotations

import base64
import datetime
import html
import io
import shlex
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import numpy as np

from zion_emu._format import format_bytes, format_time
from zion_emu.breakdown import COMMUNICATION, COMPUTE, COPY, Breakdown, breakdown

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from zion_emu.report import HbmOverTime, RankSnapshot, RunReport

__all__ = ["busy_over_time", "invocation", "iteration_breakdowns", "run_html", "sweep_html", "write_run",
           "write_sweep"]

BINS = 200  # time bins of the utilization charts
_ACTIVITIES = ((COMPUTE, "compute"), (COPY, "copy"), (COMMUNICATION, "communication"))
# The four parts that sum to the wall time, with their colors in every chart.
_PARTS = (("compute_s", "compute", "#1f77b4"), ("communication_exposed_s", "communication, exposed", "#d62728"),
          ("copies_exposed_s", "copies, exposed", "#ff7f0e"), ("host_s", "host (device idle)", "#c7c7c7"))
_ACTIVITY_COLORS = {"compute": "#1f77b4", "copy": "#ff7f0e", "communication": "#d62728"}
# Report fields shown first, under "Assumptions and placeholders", whenever a report has them.
_PROMINENT = ("simulated_ranks", "assumptions", "placeholders")
# Report fields the page shows in its own sections; any other is shown as it is.
_SHOWN = {"platform", "ranks", "wall_s", "iterations", "iteration_s", "samples_per_iteration", "samples_per_s",
          "throughput",
          "breakdown", "breakdown_note", "devices", "sockets", "links", "top_ops", "guessed_ops", "status",
          "cuda_compat_remapped", "mode", "fp32_matmul_precision", "fp32_matmul_counts", *_PROMINENT}
_DEVICE_COLUMNS = {"device", "rank", "busy_s", "busy_pct", "busy_by_activity_s", "flops", "bytes", "copy_bytes",
                   "ops", "guessed_ops", "peak_hbm_bytes", "hbm_capacity_bytes", "breakdown", "compiled_kernels",
                   "compiled_busy_s", "hbm_over_time"}
_LINK_COLUMNS = {"name", "bandwidth", "links", "bytes", "busy_s", "transfers", "utilization_pct"}


def invocation() -> str:
    """This process's command line as the user typed it to ``python -m zion_emu``."""
    return shlex.join(["python", "-m", "zion_emu", *sys.argv[1:]])


# -- from the recorded spans ---------------------------------------------------


def _covered_per_bin(starts: np.ndarray, ends: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Seconds of each bin [edges[i], edges[i+1]) covered by the union of the intervals."""
    keep = ends > starts
    s, e = starts[keep], ends[keep]
    if len(s) == 0:
        return np.zeros(len(edges) - 1)
    order = np.argsort(s, kind="stable")
    s, e = s[order], e[order]
    reach = np.maximum.accumulate(e)
    first = np.flatnonzero(np.concatenate(([True], s[1:] > reach[:-1])))  # where a disjoint block begins
    block_start, block_end = s[first], np.maximum.reduceat(e, first)
    before = np.concatenate(([0.0], np.cumsum(block_end - block_start)))  # covered before each block
    # Covered time in [0, t]: the blocks before t's block, and the part of its own up to t.
    k = np.searchsorted(block_start, edges, side="right") - 1
    inside = np.clip(edges - block_start[np.maximum(k, 0)], 0.0, (block_end - block_start)[np.maximum(k, 0)])
    covered = np.where(k >= 0, before[np.maximum(k, 0)] + inside, 0.0)
    return np.diff(covered)


@dataclass
class BusyOverTime:
    """Busy fractions (0..1) per time bin: ``edges`` in seconds; ``tracks``,
    one row per device or socket (any activity); ``by_activity``, the mean over
    zion devices of each activity; ``links``, per link class, the fraction of
    time some transfer crosses it."""

    edges: np.ndarray
    tracks: dict[str, np.ndarray]
    by_activity: dict[str, np.ndarray]
    links: dict[str, np.ndarray]


def busy_over_time(snapshots: Sequence[RankSnapshot], wall_s: float, bins: int = BINS) -> BusyOverTime | None:
    """What was busy when, from the ranks' spans; None when no rank recorded any."""
    snaps = [s for s in sorted(snapshots, key=lambda s: s.rank) if s.spans is not None and len(s.spans["start"])]
    if not snaps or wall_s <= 0:
        return None
    edges = np.linspace(0.0, wall_s, bins + 1)
    width = np.diff(edges)
    tracks: dict[str, np.ndarray] = {}
    sums = {name: np.zeros(bins) for _, name in _ACTIVITIES}
    zion_tracks = 0
    link_spans: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}
    for snap in snaps:
        sp = snap.spans
        start, end = np.asarray(sp["start"], float), np.minimum(np.asarray(sp["end"], float), wall_s)
        device, activity = np.asarray(sp["device"]), np.asarray(sp["activity"])
        used = sorted({d.device for d in snap.devices} | {int(d) for d in np.unique(device)})
        for d in used:
            mine = device == d
            zion = d < snap.oam_tracks
            name = (f"zion:{d}" if zion else f"socket {d - snap.oam_tracks}")
            name = name if len(snaps) == 1 else f"rank {snap.rank} {name}"
            tracks[name] = _covered_per_bin(start[mine], end[mine], edges) / width
            if zion:
                zion_tracks += 1
                for kind, act in _ACTIVITIES:
                    m = mine & (activity == kind)
                    sums[act] += _covered_per_bin(start[m], end[m], edges) / width
        mask = np.asarray(sp["link_classes"], dtype=np.int64)
        for c, link in enumerate(snap.links):
            m = (mask >> c) & 1 == 1
            if m.any():
                link_spans.setdefault(link.name, []).append((start[m], end[m]))
    links = {name: _covered_per_bin(np.concatenate([s for s, _ in parts]), np.concatenate([e for _, e in parts]),
                                    edges) / width
             for name, parts in link_spans.items()}
    by_activity = {act: total / zion_tracks for act, total in sums.items()} if zion_tracks else {}
    return BusyOverTime(edges, tracks, by_activity, links)


def iteration_breakdowns(snapshots: Sequence[RankSnapshot], wall_s: float) -> list[tuple[str, Breakdown]]:
    """Where each iteration's modeled time went, the mean over every zion
    device of the run: iteration k is the time from the end of step k-1's work
    to the end of step k's (the lead rank's steps); the first includes
    everything before it, and the time after the last step is its own entry
    ("after"). The entries of a device add up to its breakdown over the run.
    Empty without steps, or unless every rank kept all of its spans."""
    snaps = sorted(snapshots, key=lambda s: s.rank)
    steps = next((s.iterations for s in snaps if s.iterations), [])
    if not steps or any(s.spans is None or s.dropped_spans for s in snaps):
        return []
    bounds = [0.0, *steps]
    labels = [str(k) for k in range(1, len(steps) + 1)]
    if wall_s > steps[-1]:
        bounds.append(wall_s)
        labels.append("after")
    per_window: list[list[Breakdown]] = [[] for _ in labels]
    for snap in snaps:
        sp = snap.spans
        for dev in snap.devices:
            mine = np.asarray(sp["device"]) == dev.device
            start, end = np.asarray(sp["start"], float)[mine], np.asarray(sp["end"], float)[mine]
            order = np.argsort(start, kind="stable")
            start, end, activity = start[order], end[order], np.asarray(sp["activity"])[mine][order]
            longest = float(np.max(end - start, initial=0.0))
            for i, (a, b) in enumerate(zip(bounds, bounds[1:])):
                # Only spans that start after a - longest can reach into [a, b).
                lo, hi = np.searchsorted(start, a - longest), np.searchsorted(start, b)
                window = {"device": np.full(hi - lo, dev.device), "activity": activity[lo:hi],
                          "start": np.clip(start[lo:hi], a, b) - a, "end": np.clip(end[lo:hi], a, b) - a}
                per_window[i].append(breakdown(window, dev.device, b - a))
    if not per_window[0]:
        return []
    return [(label, Breakdown.mean(parts)) for label, parts in zip(labels, per_window)]


# -- charts --------------------------------------------------------------------


def _figure(width_in: float, height_in: float) -> Figure:
    from matplotlib.figure import Figure

    return Figure(figsize=(width_in, height_in), layout="constrained")


def _png(fig: Figure) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _time_unit(max_s: float) -> tuple[float, str]:
    if max_s >= 1:
        return 1.0, "s"
    if max_s >= 1e-3:
        return 1e3, "ms"
    return 1e6, "µs"


def _stacked_bars(entries: Sequence[tuple[str, Breakdown]], title: str, horizontal: bool = False,
                  mark: Sequence[int] = ()) -> str:
    """One bar per entry, stacked by the four parts of its wall time."""
    totals = [sum(getattr(b, part) for part, _, _ in _PARTS) for _, b in entries]
    scale, unit = _time_unit(max(totals, default=0.0))
    n = len(entries)
    fig = _figure(8, 0.9 + 0.35 * n) if horizontal else _figure(max(8.0, min(14.0, 2 + 0.25 * n)), 4)
    ax = fig.subplots()
    pos = np.arange(n)
    base = np.zeros(n)
    for part, name, color in _PARTS:
        values = np.array([getattr(b, part) for _, b in entries]) * scale
        (ax.barh if horizontal else ax.bar)(pos, values, 0.8, base, label=name, color=color)
        base += values
    names = [label for label, _ in entries]
    if horizontal:
        ax.set_yticks(pos, [f"★ {s}" if i in mark else s for i, s in enumerate(names)], fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel(f"modeled time ({unit})")
    else:
        if n <= 40:
            ax.set_xticks(pos, names, fontsize=8, rotation=0 if n <= 20 else 90)
        ax.set_xlabel("iteration (optimizer step)")
        ax.set_ylabel(f"modeled time ({unit})")
    ax.set_title(title)
    fig.legend(fontsize=8, loc="outside right upper")
    return _png(fig)


def _utilization_chart(busy: BusyOverTime, steps: Sequence[float]) -> str:
    scale, unit = _time_unit(float(busy.edges[-1]))
    x = busy.edges * scale
    mids = (x[:-1] + x[1:]) / 2
    rows = list(busy.tracks)
    fig = _figure(10, 3.2 + 0.22 * len(rows))
    top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=[3, max(1.2, 0.3 * len(rows))])
    for act, values in busy.by_activity.items():
        top.plot(mids, 100 * values, label=act, color=_ACTIVITY_COLORS[act])
    for t in steps:
        top.axvline(t * scale, color="#999999", linewidth=0.6, linestyle=":")
    top.set_ylim(0, 105)
    top.set_ylabel("busy, mean over\nzion devices (%)")
    top.set_title("device utilization over modeled time" + (" (dotted: optimizer steps)" if steps else ""))
    if busy.by_activity:
        top.legend(fontsize=8, loc="upper right")
    image = bottom.pcolormesh(x, np.arange(len(rows) + 1), 100 * np.array([busy.tracks[r] for r in rows]),
                              cmap="viridis", vmin=0, vmax=100)
    bottom.set_yticks(np.arange(len(rows)) + 0.5, rows, fontsize=8)
    bottom.invert_yaxis()
    bottom.set_xlabel(f"modeled time ({unit})")
    fig.colorbar(image, ax=bottom, label="busy (%)", pad=0.01)
    return _png(fig)


def _device_chart(report: RunReport) -> str:
    names = [f"zion:{d.device}" if report.ranks == 1 else f"rank {d.rank} zion:{d.device}" for d in report.devices]
    pos = np.arange(len(names))
    fig = _figure(10, 1.8 + 0.3 * len(names))
    busy_ax, hbm_ax = fig.subplots(1, 2)
    base = np.zeros(len(names))
    wall = report.wall_s if report.wall_s > 0 else 1.0
    for act, color in _ACTIVITY_COLORS.items():
        values = np.array([100 * d.busy_by_activity_s.get(act, 0.0) / wall for d in report.devices])
        busy_ax.barh(pos, values, 0.8, base, label=act, color=color)
        base += values
    busy_ax.set_yticks(pos, names, fontsize=8)
    busy_ax.invert_yaxis()
    busy_ax.set_xlabel("busy time, % of the modeled wall time")
    busy_ax.set_title("busy by activity")
    fig.legend(*busy_ax.get_legend_handles_labels(), fontsize=8, loc="outside lower center", ncols=3)
    hbm = [100 * d.peak_hbm_bytes / d.hbm_capacity_bytes if d.hbm_capacity_bytes else 0.0 for d in report.devices]
    hbm_ax.barh(pos, hbm, 0.8, color="#9467bd")
    for i, d in enumerate(report.devices):
        hbm_ax.annotate(f" {format_bytes(d.peak_hbm_bytes)} of {format_bytes(d.hbm_capacity_bytes)}",
                        (hbm[i], i), va="center", fontsize=8)
    hbm_ax.set_yticks(pos, names, fontsize=8)
    hbm_ax.invert_yaxis()
    hbm_ax.set_xlim(0, max(max(hbm, default=0.0) * 1.6, 1e-9))
    hbm_ax.set_xlabel("peak HBM, % of capacity")
    hbm_ax.set_title("peak HBM")
    return _png(fig)


_BYTE_SCALES = ((1 << 40, "TiB"), (1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB"))


def _byte_unit(max_bytes: float) -> tuple[float, str]:
    return next(((float(s), u) for s, u in _BYTE_SCALES if max_bytes >= s), (1.0, "B"))


def _hbm_chart(series: Sequence[tuple[str, HbmOverTime]], title: str, steps: Sequence[float] = ()) -> str:
    """Allocated HBM over modeled time, a line per (name, series), each with
    its peak marked and labeled; ``steps``, the optimizer steps, dotted."""
    end = max((max(h.end_s, h.time_s[-1] if h.time_s else 0.0) for _, h in series), default=0.0)
    scale, unit = _time_unit(end)
    bscale, bunit = _byte_unit(max((h.peak_bytes for _, h in series), default=0))
    fig = _figure(10, 3.6)
    ax = fig.subplots()
    for t in steps:
        ax.axvline(t * scale, color="#999999", linewidth=0.6, linestyle=":")
    # Past 8 lines only the highest peak is labeled (every peak is marked).
    highest = max(range(len(series)), key=lambda i: series[i][1].peak_bytes, default=0)
    for i, (name, h) in enumerate(series):
        x, y = h.steps()
        (line,) = ax.plot(np.asarray(x) * scale, np.asarray(y) / bscale, linewidth=1.0, label=name)
        ax.plot([h.peak_s * scale], [h.peak_bytes / bscale], marker="v", markersize=7, color=line.get_color())
        if len(series) > 8 and i != highest:
            continue
        ax.annotate(f" peak {format_bytes(h.peak_bytes)} at {format_time(h.peak_s)}",
                    (h.peak_s * scale, h.peak_bytes / bscale), fontsize=8, color=line.get_color(),
                    xytext=(0, 4), textcoords="offset points")
    ax.set_ylim(0, max((h.peak_bytes for _, h in series), default=0) / bscale * 1.25 or 1.0)
    ax.set_xlim(0, end * scale or 1.0)
    ax.set_xlabel(f"modeled time ({unit})")
    ax.set_ylabel(f"allocated HBM ({bunit})")
    ax.set_title(title)
    if len(series) <= 16:
        ax.legend(fontsize=8, loc="upper left")
    return _png(fig)


def _hbm_series(report: RunReport) -> list[tuple[str, HbmOverTime]]:
    return [(f"zion:{d.device}" if report.ranks == 1 else f"rank {d.rank} zion:{d.device}", d.hbm_over_time)
            for d in report.devices if d.hbm_over_time is not None]


def _links_chart(report: RunReport, busy: BusyOverTime | None) -> str:
    moving = [link for link in report.links if link.bytes > 0]
    over_time = busy is not None and busy.links
    fig = _figure(10, 1.6 + 0.3 * len(moving) + (2.6 if over_time else 0))
    axes = fig.subplots(2, 1, height_ratios=[1 + 0.3 * len(moving), 2.6]) if over_time else [fig.subplots()]
    pos = np.arange(len(moving))
    axes[0].barh(pos, [link.utilization_pct for link in moving], 0.8, color="#2ca02c")
    for i, link in enumerate(moving):
        axes[0].annotate(f" {format_bytes(link.bytes)} over {link.links} links", (link.utilization_pct, i),
                         va="center", fontsize=8)
    axes[0].set_yticks(pos, [link.name for link in moving], fontsize=8)
    axes[0].invert_yaxis()
    axes[0].set_xlim(0, max(max((link.utilization_pct for link in moving), default=0.0) * 1.6, 1e-9))
    axes[0].set_xlabel("utilization over the run (% of the class's links x wall time)")
    axes[0].set_title("link classes")
    if over_time:
        scale, unit = _time_unit(float(busy.edges[-1]))
        mids = (busy.edges[:-1] + busy.edges[1:]) / 2 * scale
        for name, values in busy.links.items():
            axes[1].plot(mids, 100 * values, label=name)
        axes[1].set_ylim(0, 105)
        axes[1].set_xlabel(f"modeled time ({unit})")
        axes[1].set_ylabel("time with a transfer\non the class (%)")
        axes[1].legend(fontsize=8, loc="upper right")
    return _png(fig)


def _top_ops_chart(report: RunReport) -> str:
    ops = report.top_ops
    scale, unit = _time_unit(max((op.busy_s for op in ops), default=0.0))
    fig = _figure(8, 1.0 + 0.3 * len(ops))
    ax = fig.subplots()
    ax.barh(np.arange(len(ops)), [op.busy_s * scale for op in ops], 0.8, color="#8c564b")
    ax.set_yticks(np.arange(len(ops)), [op.name for op in ops], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel(f"modeled time, all devices ({unit})")
    ax.set_title("top work by modeled time")
    return _png(fig)


def _sweep_chart(names: Sequence[str], per_iteration: Sequence[float], what: str, winners: Sequence[int]) -> str:
    """Bars of each variant's ``what``: a time, or samples/s (unscaled)."""
    scale, unit = (1.0, "samples/s") if what == "samples/s" else _time_unit(max(per_iteration, default=0.0))
    fig = _figure(8, 0.9 + 0.35 * len(names))
    ax = fig.subplots()
    colors = ["#2ca02c" if i in winners else "#1f77b4" for i in range(len(names))]
    ax.barh(np.arange(len(names)), [v * scale for v in per_iteration], 0.8, color=colors)
    for i in winners:
        ax.annotate(" best" if what == "samples/s" else " fastest", (per_iteration[i] * scale, i), va="center",
                    fontsize=8, color="#2ca02c")
    ax.set_yticks(np.arange(len(names)), [f"★ {n}" if i in winners else n for i, n in enumerate(names)], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, max(per_iteration, default=0.0) * scale * 1.2 or 1.0)
    ax.set_xlabel(f"modeled {what} ({unit})")
    ax.set_title(f"{what} per variant")
    return _png(fig)


# -- HTML ----------------------------------------------------------------------

_STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 1.5em auto; max-width: 1100px;
       padding: 0 1em; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 1.8em; border-bottom: 1px solid #ddd; }
code, .cmd { font-family: ui-monospace, Menlo, Consolas, monospace; font-size: 0.9em; }
.cmd { background: #f4f4f4; padding: 0.5em; overflow-x: auto; white-space: pre-wrap; }
table { border-collapse: collapse; margin: 0.5em 0; font-size: 0.9em; }
th, td { border: 1px solid #ddd; padding: 0.25em 0.6em; text-align: left; vertical-align: top; }
th { background: #f4f4f4; } td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
tr.winner td { background: #e6f4e6; font-weight: 600; }
figure { margin: 1em 0; } figure img { max-width: 100%; height: auto; display: block; }
figcaption, .note { color: #555; font-size: 0.9em; }
.warn { background: #fff6dd; border-left: 4px solid #e0a800; padding: 0.4em 0.8em; }
nav a { margin-right: 1em; }
"""


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _scalar(value: Any) -> str:
    if isinstance(value, float):
        return _e(f"{value:.6g}")
    return _e("-" if value is None else value)


def _generic(value: Any) -> str:
    """Any JSON value as HTML: objects as key/value tables, lists of objects
    as tables, other lists as bullet lists."""
    if isinstance(value, Mapping):
        if not value:
            return "<em>(none)</em>"
        return "<table>" + "".join(f"<tr><th>{_e(k)}</th><td>{_generic(v)}</td></tr>" for k, v in value.items()) + \
            "</table>"
    if isinstance(value, (list, tuple)):
        if not value:
            return "<em>(none)</em>"
        if all(isinstance(v, Mapping) for v in value):
            keys = list(dict.fromkeys(k for v in value for k in v))
            head = "".join(f"<th>{_e(k)}</th>" for k in keys)
            body = "".join("<tr>" + "".join(f"<td>{_generic(v.get(k))}</td>" for k in keys) + "</tr>" for v in value)
            return f"<table><tr>{head}</tr>{body}</table>"
        return "<ul>" + "".join(f"<li>{_generic(v)}</li>" for v in value) + "</ul>"
    return _scalar(value)


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]], numeric_from: int = 1,
           row_class: Callable[[int], str] = lambda i: "") -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = []
    for i, row in enumerate(rows):
        cells = "".join(f'<td class="num">{c}</td>' if j >= numeric_from else f"<td>{c}</td>"
                        for j, c in enumerate(row))
        cls = row_class(i)
        body.append(f'<tr class="{cls}">{cells}</tr>' if cls else f"<tr>{cells}</tr>")
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


def _chart(chart_id: str, png: str, caption: str) -> str:
    return (f'<figure id="{chart_id}"><img class="chart" alt="{_e(caption)}" src="data:image/png;base64,{png}">'
            f"<figcaption>{_e(caption)}</figcaption></figure>")


def _section(section_id: str, title: str, body: str) -> str:
    return f'<section id="{section_id}"><h2>{_e(title)}</h2>{body}</section>'


def _page(title: str, command: str | None, sections: Sequence[tuple[str, str, str]]) -> str:
    written = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    nav = "".join(f'<a href="#{sid}">{_e(t)}</a>' for sid, t, _ in sections)
    cmd = f'<p class="cmd">{_e(command)}</p>' if command else ""
    body = "".join(_section(*s) for s in sections)
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{_e(title)}</title>'
            f"<style>{_STYLE}</style></head><body><h1>{_e(title)}</h1>{cmd}"
            f'<p class="note">Written by zion-emu on {_e(written)}. All times are modeled (the emulated platform), '
            f"not this machine's.</p><nav>{nav}</nav>{body}</body></html>\n")


def _summary_rows(r: RunReport) -> list[tuple[str, str]]:
    rows = [("platform", _e(r.platform)), ("ranks", _e(r.ranks)), ("modeled wall time", _e(format_time(r.wall_s)))]
    if r.mode == "timing":
        rows.append(("mode", "timing-only (floating-point zion tensors had no host bytes)"))
    if r.iterations:
        rows.append(("iterations", f"{r.iterations} (optimizer steps)"))
    if r.iteration_s:
        rows.append(("time per iteration", _e(f"{format_time(r.iteration_s)} (mean after the first)")))
    t = r.throughput
    if t is not None:
        rows.append(("throughput", _e(f"{t.samples_per_s:,.0f} samples/s ({t.samples} samples in "
                                      f"{format_time(t.modeled_s)}, measured by rank "
                                      f"{', '.join(map(str, t.ranks))})")))
        if t.limit:
            util = "" if t.limit_utilization is None else f" ({t.limit_utilization * 100:.1f}% busy)"
            rows.append(("limited by", _e(t.limit + util)))
    elif r.samples_per_s:
        rows.append(("throughput", _e(f"{r.samples_per_s:,.0f} samples/s ({r.samples_per_iteration} per iteration)")))
    if r.status is not None:
        rows.append(("exit code", _e(f"{r.status.exit_code}" + (" (interrupted)" if r.status.interrupted else ""))))
        for rank, s in r.status.ranks.items():
            if s is None:
                rows.append((f"rank {rank}", "left no report (killed before writing it)"))
            elif s.exit != "ok":
                rows.append((f"rank {rank}", _e(f"{s.exit} {s.code}" + (f": {s.error}" if s.error else ""))))
    return rows


def _breakdown_table(b: Breakdown, wall_s: float) -> str:
    pct = (lambda t: f"{100 * t / wall_s:.1f} %") if wall_s > 0 else (lambda t: "-")
    rows = [(_e(name), _e(format_time(getattr(b, part))), pct(getattr(b, part))) for part, name, _ in _PARTS]
    rows.append(("communication, overlapped (hidden under compute)", _e(format_time(b.communication_overlapped_s)),
                 ""))
    return _table(["where the time goes (mean over devices)", "time", "share of wall"], rows)


def _extra_columns(records: Sequence[Mapping[str, Any]], known: set[str]) -> list[str]:
    return [k for k in dict.fromkeys(k for r in records for k in r) if k not in known]


def _run_tables(r: RunReport, doc: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """The sections every run page has, from the report alone (no spans)."""
    out = []
    facts = "<table>" + "".join(f"<tr><th>{k}</th><td>{v}</td></tr>" for k, v in _summary_rows(r)) + "</table>"
    out.append(("summary", "Summary", facts))
    notes = "".join(f"<h3>{_e(k)}</h3>{_generic(doc[k])}" for k in _PROMINENT if doc.get(k))
    if notes:
        out.append(("assumptions", "Assumptions and placeholders",
                    f'<div class="warn">{notes}</div>'))
    if r.devices:
        dev_docs = doc.get("devices", [])
        extra = _extra_columns(dev_docs, _DEVICE_COLUMNS)
        rows = [[f"zion:{d.device}", _e(d.rank), f"{d.busy_pct:.1f}", _e(format_bytes(d.peak_hbm_bytes, 2)),
                 _e(format_bytes(d.hbm_capacity_bytes, 2)), _e(d.ops), _e(d.guessed_ops), _e(d.compiled_kernels),
                 *(_generic(dd.get(k)) for k in extra)] for d, dd in zip(r.devices, dev_docs)]
        out.append(("devices", "Devices", _table(["device", "rank", "busy %", "peak HBM", "HBM capacity", "ops",
                                                  "guessed ops", "compiled kernels", *extra], rows)))
    if r.sockets:
        rows = [[f"socket {k.socket}", _e(k.rank), f"{k.busy_pct:.1f}", _e(format_bytes(k.peak_ddr_bytes, 2)),
                 _e(format_bytes(k.ddr_capacity_bytes, 2)), _e(k.ops)] for k in r.sockets]
        out.append(("sockets", "CPU sockets", _table(["socket", "rank", "busy %", "peak DDR", "DDR capacity", "ops"],
                                                     rows)))
    link_docs = doc.get("links", [])
    extra = _extra_columns(link_docs, _LINK_COLUMNS)
    rows = [[_e(link.name), _e(link.links), _e(format_bytes(link.bytes, 2)), _e(link.transfers),
             f"{link.utilization_pct:.4g} %", *(_generic(ld.get(k)) for k in extra)]
            for link, ld in zip(r.links, link_docs) if link.bytes > 0]
    out.append(("links", "Link classes", _table(["link class", "links", "bytes moved", "transfers", "utilization",
                                                 *extra], rows) if rows else
                '<p class="note">No bytes moved over any link class (no copies between devices or the host, '
                "no collectives).</p>"))
    if r.top_ops:
        rows = [[_e(op.name), _e(format_time(op.busy_s)), _e(op.count), _e(format_time(op.busy_s / op.count))]
                for op in r.top_ops if op.count]
        out.append(("top-ops", "Top work", _table(["op, copy or collective", "time (all devices)", "count",
                                                   "mean"], rows)))
    if r.guessed_ops:
        out.append(("guessed", "Ops priced by the default guess",
                    '<p class="note">No cost formula knew these ops; each was priced as one pass over its '
                    "tensors.</p>" + _generic(r.guessed_ops)))
    if r.fp32_matmul_counts:
        rows = [[_e(c["requested"]), _e(c["priced"]) + (" (no peak for the requested one)" if c["fell_back"] else ""),
                 _e(f"{c['ops']:,}"), _e(f"{c['flops'] / 1e9:,.1f}"), _e(format_time(c["device_s"]))]
                for c in r.fp32_matmul_counts]
        last = "".join(f'<p class="note">The last one: {_e(p["op"])}, priced at {_e(p["priced"])}.</p>'
                       for p in r.fp32_matmul_precision or [])
        out.append(("precision", "Float32 matmuls by precision",
                    _table(["settings asked for", "priced at", "ops", "GFLOP", "device time"], rows) + last))
    if r.cuda_compat_remapped:
        out.append(("cuda-compat", "Remapped by --cuda-compat", _generic(r.cuda_compat_remapped)))
    rest = {k: v for k, v in doc.items() if k not in _SHOWN}
    if rest:
        out.append(("more", "More report fields", _generic(rest)))
    return out


def _insert_after(sections: list[tuple[str, str, str]], after: str, new: tuple[str, str, str]) -> None:
    ids = [s[0] for s in sections]
    sections.insert(ids.index(after) + 1 if after in ids else len(sections), new)


def run_html(report: RunReport, snapshots: Sequence[RankSnapshot] = (), command: str | None = None) -> str:
    """The page of one run: its report, and charts over time from the ranks'
    spans when given (:func:`zion_emu.report.snapshot` keeps them)."""
    doc = report.to_json()
    sections = _run_tables(report, doc)
    steps = next((s.iterations for s in sorted(snapshots, key=lambda s: s.rank) if s.iterations), [])
    per_iteration = iteration_breakdowns(snapshots, report.wall_s)
    if per_iteration:
        body = _chart("chart-iterations", _stacked_bars(per_iteration, "where each iteration's time went"),
                      "Mean over zion devices. Iteration k runs from the end of step k-1's work to the end of step "
                      "k's; the first includes everything before it, 'after' is the time after the last step.")
    elif report.breakdown is not None:
        body = _chart("chart-iterations", _stacked_bars([("run", report.breakdown)], "where the run's time went"),
                      "Mean over zion devices, the whole run" + ("" if steps else " (the script took no optimizer "
                                                                                  "step)") + ".")
    else:
        body = f'<p class="note">No breakdown: {_e(report.breakdown_note or "no device did any work")}.</p>'
    if report.breakdown is not None:
        body += _breakdown_table(report.breakdown, report.wall_s)
    _insert_after(sections, "assumptions" if "assumptions" in {s[0] for s in sections} else "summary",
                  ("breakdown", "Where the time goes", body))
    busy = busy_over_time(snapshots, report.wall_s)
    if report.devices:
        charts = (_chart("chart-utilization", _utilization_chart(busy, steps),
                         "Top: the busy fraction of each activity, mean over zion devices, per time bin of "
                         f"{format_time(report.wall_s / BINS)}. Bottom: each device's busy fraction (any activity).")
                  if busy is not None else '<p class="note">No spans were recorded: no utilization over time.</p>')
        charts += _chart("chart-devices", _device_chart(report),
                         "Busy time by activity (activities can overlap) and peak HBM.")
        hbm = _hbm_series(report)
        if hbm:
            merged = [h.bin_s for _, h in hbm if h.merged]
            title = "allocated HBM over modeled time (▼: each device's peak" + ("; dotted: optimizer steps)" if steps
                                                                               else ")")
            charts += _chart("chart-hbm", _hbm_chart(hbm, title, steps),
                             "Each device's allocated HBM bytes at every allocation and free, on the modeled host "
                             "clock" + (f"; events within {format_time(max(merged))} of each other are merged, "
                                        "keeping the most allocated" if merged else "") +
                             ". The peak is the highest since the clock began; "
                             "the devices table's peak HBM is since the last reset_peak_memory_stats.")
        i = [s[0] for s in sections].index("devices")
        sections[i] = ("devices", "Devices", charts + sections[i][2])
    if any(link.bytes > 0 for link in report.links):
        i = [s[0] for s in sections].index("links")
        sections[i] = ("links", "Link classes", _chart(
            "chart-links", _links_chart(report, busy),
            "Utilization: busy time summed over the class's links, over links x wall time"
            + ("; below, the fraction of each time bin in which some transfer crosses the class." if busy and busy.links
               else ".")) + sections[i][2])
    if report.top_ops:
        i = [s[0] for s in sections].index("top-ops")
        sections[i] = ("top-ops", "Top work", _chart("chart-top-ops", _top_ops_chart(report),
                                                     "Modeled time summed over devices, by label.") + sections[i][2])
    return _page(f"zion-emu run on {report.platform}", command, sections)


def write_run(report: RunReport, snapshots: Sequence[RankSnapshot], path: str, command: str | None = None) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(run_html(report, snapshots, command))


def _per_iteration_s(r: RunReport) -> float:
    return r.iteration_s if r.iteration_s else r.wall_s


def sweep_html(variants: Sequence[tuple[str, RunReport]], command: str | None = None) -> str:
    """The page of a sweep: ``variants`` are (name, report) in the order run.
    The best is marked: the most samples/s when every variant has them,
    else the fastest (least modeled time per iteration; wall time when a
    variant has fewer than two steps)."""
    from zion_emu.report import limit_of

    if not variants:
        raise ValueError("a sweep page needs at least one variant")
    reports = [r for _, r in variants]
    by_samples = all(r.samples_per_s for r in reports)
    by_iteration = all(r.iteration_s for r in reports)
    what = "samples/s" if by_samples else "time per iteration" if by_iteration else "wall time"
    values = [r.samples_per_s if by_samples else r.iteration_s if by_iteration else r.wall_s for r in reports]
    best = max(values) if by_samples else min(values)
    winners = [i for i, v in enumerate(values) if v == best]
    names = [n for n, _ in variants]

    def shown(v: float) -> str:
        return f"{v:,.0f} samples/s" if by_samples else format_time(v)

    rows = []
    for (name, r), v in zip(variants, values):
        b = r.breakdown
        parts = [_e(format_time(getattr(b, p))) if b else "-" for p, _, _ in _PARTS]
        what_limited, share = limit_of(r)
        limit = "-" if what_limited is None else what_limited + ("" if share is None else f" ({share * 100:.1f}%)")
        ratio = (best / v if by_samples else v / best) if best > 0 and v > 0 else None
        rows.append([_e(name), _e(format_time(r.iteration_s) if by_samples and r.iteration_s else
                                  "-" if by_samples else format_time(v)),
                     _e(f"{ratio:.3f}x") if ratio is not None else "-",
                     _e(f"{r.samples_per_s:,.0f}") if r.samples_per_s else "-", _e(limit),
                     _e(format_time(r.wall_s)), *parts,
                     _e(format_bytes(max((d.peak_hbm_bytes for d in r.devices), default=0), 2))])
    table = _table(["variant", "time per iteration" if by_samples else what,
                    "best / this" if by_samples else "vs fastest", "samples/s", "limited by (utilization)",
                    "wall time", *(n for _, n, _ in _PARTS), "peak HBM (max device)"],
                   rows, row_class=lambda i: "winner" if i in winners else "")
    fastest = ", ".join(names[i] for i in winners)
    label = "Best" if by_samples else "Fastest"
    body = (f"<p><strong>{label}: {_e(fastest)}</strong> ({_e(shown(best))}"
            f"{'' if by_samples else ' ' + what}).</p>" + table +
            '<p class="note">The breakdown parts are means over devices and sum to the wall time.</p>')
    sections = [("variants", "Variants", body),
                ("charts", "Side by side",
                 _chart("chart-sweep-time", _sweep_chart(names, values, what, winners),
                        f"Modeled {what} of each variant; ★ marks the {'best' if by_samples else 'fastest'}.") +
                 (_chart("chart-sweep-breakdown",
                         _stacked_bars([(n, r.breakdown) for n, r in variants], "where each variant's run time went",
                                       horizontal=True, mark=winners),
                         "The whole run of each variant, mean over zion devices.")
                  if all(r.breakdown is not None for r in reports) else "") +
                 _sweep_hbm(variants))]
    details = []
    for i, (name, r) in enumerate(variants):
        inner = "".join(f"<h3>{_e(t)}</h3>{b}" for _, t, b in _run_tables(r, r.to_json()))
        if r.breakdown is not None:
            inner = _breakdown_table(r.breakdown, r.wall_s) + inner
        star = (" ★ best" if by_samples else " ★ fastest") if i in winners else ""
        details.append(f"<details><summary>{_e(name)}{star}</summary>{inner}</details>")
    sections.append(("reports", "Each variant's report", "".join(details)))
    return _page(f"zion-emu sweep on {reports[0].platform}", command, sections)


def _sweep_hbm(variants: Sequence[tuple[str, RunReport]]) -> str:
    """The HBM chart of a sweep: per variant, its device with the highest peak."""
    series = []
    for name, r in variants:
        hbm = _hbm_series(r)
        if hbm:
            device, h = max(hbm, key=lambda dh: dh[1].peak_bytes)
            series.append((f"{name} ({device})", h))
    if not series:
        return ""
    return _chart("chart-sweep-hbm", _hbm_chart(series, "allocated HBM over modeled time (▼: peak)"),
                  "For each variant, the allocated HBM of its device with the highest peak, on the modeled host "
                  "clock.")


def write_sweep(variants: Sequence[tuple[str, RunReport]], path: str, command: str | None = None) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(sweep_html(variants, command))
