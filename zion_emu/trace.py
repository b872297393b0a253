"""The modeled timeline as a Chrome / Perfetto trace (JSON "traceEvents").

Open the file in https://ui.perfetto.dev or chrome://tracing. One process
per rank; in it one track per device stream (compute on stream 0, further
streams as the script made them, the communication stream), and one track
per link class showing when work moved bytes over that class. Times are
modeled microseconds.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from zion_emu.breakdown import COMMUNICATION, COMPUTE, COPY

if TYPE_CHECKING:
    from zion_emu.report import RankSnapshot

_CATEGORY = {COMPUTE: "compute", COPY: "copy", COMMUNICATION: "communication"}
_LINK_TID_BASE = 100_000


def events(snapshots: Sequence[RankSnapshot]) -> list[dict[str, Any]]:
    """Trace events of every rank's recorded spans."""
    out: list[dict[str, Any]] = []
    for snap in snapshots:
        spans = snap.spans
        if spans is None:
            continue
        pid = snap.rank
        labels = snap.span_labels or []
        link_names = [link.name for link in snap.links]
        out.append({"ph": "M", "name": "process_name", "pid": pid,
                    "args": {"name": f"rank {pid} ({snap.platform})"}})
        out.append({"ph": "M", "name": "process_sort_index", "pid": pid, "args": {"sort_index": pid}})
        tracks: dict[int, str] = {}
        oams = snap.oam_tracks
        start = np.asarray(spans["start"]) * 1e6
        dur = (np.asarray(spans["end"]) - np.asarray(spans["start"])) * 1e6
        for i in range(len(start)):
            device, stream, kind = int(spans["device"][i]), int(spans["stream"][i]), int(spans["activity"][i])
            tid = device * 100 + stream
            if tid not in tracks:
                tracks[tid] = f"zion:{device} stream {stream}" if device < oams else f"socket {device - oams}"
            label = int(spans["label"][i])
            name = labels[label] if 0 <= label < len(labels) else _CATEGORY[kind]
            event = {"ph": "X", "pid": pid, "tid": tid, "ts": float(start[i]), "dur": float(dur[i]), "name": name,
                     "cat": _CATEGORY[kind]}
            out.append(event)
            mask = int(spans["link_classes"][i])
            c = 0
            while mask:
                if mask & 1:
                    link_tid = _LINK_TID_BASE + c
                    if link_tid not in tracks:
                        tracks[link_tid] = f"link {link_names[c] if c < len(link_names) else c}"
                    out.append({**event, "tid": link_tid, "args": {"device": device}})
                mask >>= 1
                c += 1
        for tid, name in tracks.items():
            out.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}})
            out.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "args": {"sort_index": tid}})
    return out


def write(snapshots: Sequence[RankSnapshot], path: str) -> int:
    """Writes the trace; returns the number of events."""
    evs = events(snapshots)
    with open(path, "w") as f:
        json.dump({"traceEvents": evs, "displayTimeUnit": "ms"}, f)
    return len(evs)


def plot_utilization(snapshots: Sequence[RankSnapshot], path: str, bins: int = 200) -> None:
    """A PNG of each device's busy fraction over modeled time, by activity."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    wall = max((s.wall_s for s in snapshots), default=0.0)
    edges = np.linspace(0.0, wall if wall > 0 else 1.0, bins + 1)
    width = edges[1] - edges[0]
    fig, ax = plt.subplots(figsize=(10, 4))
    for kind, name in _CATEGORY.items():
        busy = np.zeros(bins)
        count = 0
        for snap in snapshots:
            spans = snap.spans
            if spans is None:
                continue
            for device in sorted({int(d) for d in spans["device"]}):
                m = (spans["device"] == device) & (spans["activity"] == kind)
                count += 1
                for s, e in zip(spans["start"][m], spans["end"][m]):
                    lo, hi = int(s // width), min(int(e // width), bins - 1)
                    for b in range(lo, hi + 1):
                        busy[b] += max(0.0, min(e, edges[b + 1]) - max(s, edges[b]))
        if count:
            ax.plot((edges[:-1] + width / 2) * 1e3, 100 * busy / (width * count), label=name)
    ax.set_xlabel("modeled time (ms)")
    ax.set_ylabel("busy, mean over devices (%)")
    ax.set_ylim(0, 105)
    ax.legend()
    ax.set_title("zion-emu: device utilization over modeled time")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
