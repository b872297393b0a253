"""The run report: where the modeled time of a run went.

Each process takes a :func:`snapshot` of its timeline at exit (what
``python -m zion_emu run`` does in every rank); :func:`merge` combines the
ranks' snapshots and :func:`format_text` prints the result.

Breakdown of a device's modeled wall time T (from 0 to the host clock at
exit), from the recorded spans of its streams:

- compute: time when some compute span runs;
- communication, exposed: collective time when no compute runs;
  overlapped: collective time hidden under compute;
- copies, exposed: copy time when neither compute nor a collective runs;
- host: the rest of T, when the device does nothing (launch overhead,
  host-side work, waiting for data).

compute + exposed communication + exposed copies + host = T, exactly.
"""

from __future__ import annotations

import json
import math
from typing import Any, Iterable, Sequence

import numpy as np
import torch

from zion_emu import _C
from zion_emu.iterations import Iterations, mean_iteration_s

_timeline = _C.timeline

COMPUTE, COPY, COMMUNICATION = 0, 1, 2
DEFAULT_MAX_SPANS = 2_000_000


def start_recording(max_spans: int = DEFAULT_MAX_SPANS) -> None:
    """Keeps spans of stream time (for the breakdown and the trace); the
    counters are kept regardless."""
    _timeline.set_recording(int(max_spans))


# -- interval arithmetic -------------------------------------------------------


def union_length(starts: np.ndarray, ends: np.ndarray) -> float:
    """Total length covered by the intervals [starts[i], ends[i])."""
    if len(starts) == 0:
        return 0.0
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    reach = np.maximum.accumulate(e)
    # A new block starts where an interval begins after everything before it ended.
    new_block = np.empty(len(s), dtype=bool)
    new_block[0] = True
    new_block[1:] = s[1:] > reach[:-1]
    block_ids = np.cumsum(new_block) - 1
    block_start = s[new_block]
    block_end = np.zeros(len(block_start))
    np.maximum.at(block_end, block_ids, e)
    return float(np.sum(block_end - block_start))


def breakdown(spans: dict[str, np.ndarray], device: int, wall: float) -> dict[str, float]:
    """The breakdown of one device's wall time (see the module docstring)."""
    mine = spans["device"] == device
    start, end, kind = spans["start"][mine], np.minimum(spans["end"][mine], wall), spans["activity"][mine]
    keep = end > start
    start, end, kind = start[keep], end[keep], kind[keep]

    def covered(*kinds: int) -> float:
        m = np.isin(kind, kinds)
        return union_length(start[m], end[m])

    compute = covered(COMPUTE)
    comm = covered(COMMUNICATION)
    compute_or_comm = covered(COMPUTE, COMMUNICATION)
    anything = covered(COMPUTE, COMMUNICATION, COPY)
    exposed_comm = compute_or_comm - compute
    return {
        "compute_s": compute,
        "communication_exposed_s": exposed_comm,
        "communication_overlapped_s": comm - exposed_comm,
        "copies_exposed_s": anything - compute_or_comm,
        "host_s": max(wall - anything, 0.0),
    }


# -- one process ---------------------------------------------------------------


def _devices_used() -> list[int]:
    used = []
    for d in range(torch.zion.device_count()):
        c = _C.device.counters(d)
        if c["ops"] or c["busy_s"] or torch.zion.max_memory_allocated(d):
            used.append(d)
    return used


def snapshot(rank: int = 0, iterations: Iterations | None = None, keep_spans: bool = True) -> dict[str, Any]:
    """This process's view of the run, after waiting for its devices: JSON-ready
    except ``spans`` (numpy columns, present when ``keep_spans``)."""
    from zion_emu import cost, current_platform

    devices = _devices_used()
    for d in devices:
        torch.zion.synchronize(d)
    wall = _C.device.host_time()
    spans = _timeline.spans()
    dropped = int(_timeline.dropped_spans())
    recorded = len(spans["start"]) > 0 or dropped > 0
    per_device = []
    for d in devices:
        c = _C.device.counters(d)
        entry: dict[str, Any] = {
            "device": d,
            "busy_s": c["busy_s"],
            "busy_by_activity_s": _timeline.busy_by_activity(d),
            "flops": c["flops"],
            "bytes": c["bytes"],
            "copy_bytes": c["copy_bytes"],
            "ops": c["ops"],
            "guessed_ops": c["guessed_ops"],
            "peak_hbm_bytes": torch.zion.max_memory_allocated(d),
            "hbm_capacity_bytes": torch.zion.get_device_properties(d).total_memory,
        }
        if recorded and dropped == 0:
            entry["breakdown"] = breakdown(spans, d, wall)
        per_device.append(entry)
    guessed: dict[str, int] = {}
    for d in devices:
        for op, n in cost.guessed_ops(d).items():
            guessed[op] = guessed.get(op, 0) + n
    from zion_emu import sockets

    per_socket = []
    for s in range(sockets.socket_count()):
        mem, work = sockets.memory(s), sockets.counters(s)
        if mem.peak or work["ops"]:
            per_socket.append({"socket": s, "peak_ddr_bytes": mem.peak, "ddr_capacity_bytes": mem.capacity,
                               "in_use_ddr_bytes": mem.in_use, "busy_s": work["busy_s"], "ops": work["ops"],
                               "flops": work["flops"], "bytes": work["bytes"]})
    platform = current_platform()
    out: dict[str, Any] = {
        "rank": rank,
        "platform": platform.name,
        "wall_s": wall,
        "oam_tracks": torch.zion.device_count(),
        "devices": per_device,
        "sockets": per_socket,
        "labels": {k: list(v) for k, v in _timeline.label_totals().items()},
        "links": _timeline.link_counters(),
        "guessed_ops": guessed,
        "dropped_spans": dropped,
        "iterations": [] if iterations is None else list(iterations.times),
        "samples_per_iteration": None if iterations is None else iterations.samples_per_iteration,
    }
    if keep_spans:
        out["spans"] = spans
        out["span_labels"] = list(_timeline.labels())
    return out


# -- all ranks -----------------------------------------------------------------


def merge(snapshots: Iterable[dict[str, Any]], top: int = 10) -> dict[str, Any]:
    """One report from every rank's snapshot (spans are not carried over)."""
    snaps = sorted(snapshots, key=lambda s: s["rank"])
    if not snaps:
        raise ValueError("no rank left a report (did every rank fail before its first step?)")
    wall = max(s["wall_s"] for s in snaps)
    devices = []
    for s in snaps:
        for d in s["devices"]:
            entry = {k: v for k, v in d.items()}
            entry["rank"] = s["rank"]
            entry["busy_pct"] = 100.0 * d["busy_s"] / wall if wall > 0 else 0.0
            devices.append(entry)
    labels: dict[str, list[float]] = {}
    for s in snaps:
        for name, (busy, count) in s["labels"].items():
            acc = labels.setdefault(name, [0.0, 0])
            acc[0] += busy
            acc[1] += count
    top_ops = [{"name": k, "busy_s": v[0], "count": int(v[1])}
               for k, v in sorted(labels.items(), key=lambda kv: -kv[1][0])[:top]]
    links: dict[str, dict[str, Any]] = {}
    for s in snaps:
        for link in s["links"]:
            acc = links.setdefault(link["name"], {"name": link["name"], "bandwidth": link["bandwidth"],
                                                  "links": link["links"], "bytes": 0.0, "busy_s": 0.0, "transfers": 0})
            acc["bytes"] += link["bytes"]
            acc["busy_s"] += link["busy_s"]
            acc["transfers"] += link["transfers"]
    for link in links.values():
        capacity = link["links"] * wall
        link["utilization_pct"] = 100.0 * link["busy_s"] / capacity if capacity > 0 else 0.0
    guessed: dict[str, int] = {}
    for s in snaps:
        for op, n in s["guessed_ops"].items():
            guessed[op] = guessed.get(op, 0) + n

    breakdowns = [d["breakdown"] for d in devices if "breakdown" in d]
    summary: dict[str, float] | None = None
    if breakdowns and len(breakdowns) == len(devices):
        # The mean over devices of each part: still sums to the (common) wall time
        # when each device's breakdown is taken over the same wall time.
        summary = {k: sum(b[k] for b in breakdowns) / len(breakdowns) for k in breakdowns[0]}

    sockets = []
    for s in snaps:
        for k in s.get("sockets", []):
            entry = dict(k)
            entry["rank"] = s["rank"]
            entry["busy_pct"] = 100.0 * k["busy_s"] / wall if wall > 0 else 0.0
            sockets.append(entry)

    lead = snaps[0]
    n_iter, per_iter = len(lead["iterations"]), mean_iteration_s(lead["iterations"])
    samples = lead.get("samples_per_iteration")
    world = len(snaps)
    return {
        "platform": lead["platform"],
        "ranks": world,
        "wall_s": wall,
        "iterations": n_iter,
        "iteration_s": per_iter,
        "samples_per_iteration": samples,
        "samples_per_s": (samples / per_iter) if samples and per_iter else None,
        "breakdown": summary,
        "breakdown_note": None if summary is not None else
        "spans were not recorded for every device (or some were dropped): no exposed/overlapped split",
        "devices": devices,
        "sockets": sockets,
        "links": sorted(links.values(), key=lambda link: -link["bytes"]),
        "top_ops": top_ops,
        "guessed_ops": dict(sorted(guessed.items(), key=lambda kv: -kv[1])),
    }


def _rank_wall_breakdown(snap: dict[str, Any], wall: float) -> None:
    """Extends each device's breakdown of one rank to the run's wall time: a
    rank that finished early was idle (host) for the rest."""
    for d in snap["devices"]:
        if "breakdown" in d:
            d["breakdown"]["host_s"] += max(wall - snap["wall_s"], 0.0)


def merge_ranks(snapshots: Sequence[dict[str, Any]], top: int = 10) -> dict[str, Any]:
    """:func:`merge` after aligning every rank's breakdown to the run's wall time."""
    wall = max(s["wall_s"] for s in snapshots) if snapshots else 0.0
    for s in snapshots:
        _rank_wall_breakdown(s, wall)
    return merge(snapshots, top)


# -- text ----------------------------------------------------------------------


def _fmt_time(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "-"
    if seconds >= 1:
        return f"{seconds:.3f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3f} ms"
    return f"{seconds * 1e6:.1f} us"


def _fmt_bytes(n: float) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n:.0f} B"


def format_text(report: dict[str, Any]) -> str:
    lines = [f"== zion-emu report: platform {report['platform']}, {report['ranks']} rank(s) =="]
    wall = report["wall_s"]
    lines.append(f"modeled wall time      {_fmt_time(wall)}")
    if report["iterations"]:
        lines.append(f"iterations             {report['iterations']} (optimizer steps)")
    if report["iteration_s"]:
        lines.append(f"time per iteration     {_fmt_time(report['iteration_s'])} (modeled, after the first)")
    if report["samples_per_s"]:
        lines.append(f"throughput             {report['samples_per_s']:,.0f} samples/s (modeled, "
                     f"{report['samples_per_iteration']} samples per iteration)")
    b = report["breakdown"]
    if b:
        lines.append("")
        lines.append("where the time goes (mean over devices)     time      share")
        rows = [("compute", b["compute_s"]),
                ("communication, exposed", b["communication_exposed_s"]),
                ("copies, exposed", b["copies_exposed_s"]),
                ("host (device idle)", b["host_s"])]
        for name, t in rows:
            share = 100.0 * t / wall if wall > 0 else 0.0
            lines.append(f"  {name:<36} {_fmt_time(t):>12} {share:7.1f} %")
        lines.append(f"  {'communication, overlapped':<36} {_fmt_time(b['communication_overlapped_s']):>12}   "
                     "(hidden under compute)")
    elif report.get("breakdown_note"):
        lines.append(f"breakdown: {report['breakdown_note']}")
    if report["devices"]:
        lines.append("")
        lines.append("device     rank   busy %    peak HBM / capacity      ops   guessed")
        for d in report["devices"]:
            lines.append(f"  zion:{d['device']:<4} {d['rank']:>4} {d['busy_pct']:7.1f}   "
                         f"{_fmt_bytes(d['peak_hbm_bytes']):>10} / {_fmt_bytes(d['hbm_capacity_bytes']):<10} "
                         f"{d['ops']:>8} {d['guessed_ops']:>8}")
    if report.get("sockets"):
        lines.append("")
        lines.append("socket     rank   busy %    peak DDR / capacity      ops")
        for k in report["sockets"]:
            lines.append(f"  socket {k['socket']:<2} {k['rank']:>4} {k['busy_pct']:7.1f}   "
                         f"{_fmt_bytes(k['peak_ddr_bytes']):>10} / {_fmt_bytes(k['ddr_capacity_bytes']):<10} "
                         f"{k['ops']:>8}")
    moving = [link for link in report["links"] if link["bytes"] > 0]
    if moving:
        lines.append("")
        lines.append("link class              links     bytes moved   utilization")
        for link in moving:
            lines.append(f"  {link['name']:<22} {link['links']:>5} {_fmt_bytes(link['bytes']):>15} "
                         f"{link['utilization_pct']:10.2f} %")
    if report["top_ops"]:
        lines.append("")
        lines.append("top work by modeled time (all devices)        time    count")
        for op in report["top_ops"]:
            lines.append(f"  {op['name']:<40} {_fmt_time(op['busy_s']):>10} {op['count']:>8}")
    if report["guessed_ops"]:
        lines.append("")
        lines.append("priced by the default guess (memory-bound; give them a formula with zion_emu.cost.register):")
        for op, n in list(report["guessed_ops"].items())[:10]:
            lines.append(f"  {op}  x{n}")
    return "\n".join(lines)


def write_json(report: dict[str, Any], path: str) -> None:
    with open(path, "w") as f:
        json.dump(report, f, indent=1)
