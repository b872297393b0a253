"""The run report as text: what ``zion-emu run`` prints at the end of a run.

:func:`format_text` reads a :class:`zion_emu.report.RunReport`; recording
and merging it is :mod:`zion_emu.report`.
"""

from __future__ import annotations

from zion_emu._format import Column, Table, format_bytes, format_time
from zion_emu.report import RunReport

_BREAKDOWN = Table(Column("where the time goes (mean over devices)", 37, "<"), Column("time", 12),
                   Column("share", 9), indent="  ")
_DEVICES = Table(Column("device", 9, "<"), Column("rank", 4), Column("busy %", 7, spec=".1f"),
                 Column("peak HBM", 12), Column("capacity", 12), Column("ops", 8), Column("guessed", 8), indent="  ")
_SOCKETS = Table(Column("socket", 9, "<"), Column("rank", 4), Column("busy %", 7, spec=".1f"),
                 Column("peak DDR", 12), Column("capacity", 12), Column("ops", 8), indent="  ")
_COMPILED = Table(Column("torch.compile kernels", 22, "<"), Column("rank", 4), Column("kernels", 8),
                  Column("time", 12), Column("of busy", 8), indent="  ")
_LINKS = Table(Column("link class", 22, "<"), Column("links", 5), Column("bytes moved", 15), Column("utilization", 12),
               indent="  ")
_TOP_OPS = Table(Column("top work by modeled time (all devices)", 40, "<"), Column("time", 10), Column("count", 8),
                 indent="  ")


def _bytes(n: float) -> str:
    return format_bytes(n, decimals=2)


def _summary(report: RunReport) -> list[str]:
    lines = [f"modeled wall time      {format_time(report.wall_s)}"]
    if report.iterations:
        lines.append(f"iterations             {report.iterations} (optimizer steps)")
    if report.iteration_s:
        lines.append(f"time per iteration     {format_time(report.iteration_s)} (modeled, after the first)")
    t = report.throughput
    if t is not None:
        who = ", ".join(map(str, t.ranks))
        lines.append(f"throughput             {t.samples_per_s:,.0f} samples/s (modeled: {t.samples} samples in "
                     f"{format_time(t.modeled_s)}, measured by rank {who})")
        if t.limit:
            util = "" if t.limit_utilization is None else f" ({t.limit_utilization * 100:.1f}% busy)"
            lines.append(f"limited by             {t.limit}{util}")
    elif report.samples_per_s:
        lines.append(f"throughput             {report.samples_per_s:,.0f} samples/s (modeled, "
                     f"{report.samples_per_iteration} samples per iteration)")
    return lines


def _precision(report: RunReport) -> list[str]:
    """Which precision priced float32 matmuls: each rank's last one, and the
    whole run's by precision."""
    lines = []
    for p in report.fp32_matmul_precision or []:
        ranks = "" if report.ranks == 1 else f", rank(s) {rank_ranges(p['ranks'])}"
        if p["fell_back"]:
            how = (f"fp32: the settings asked for {p['requested']}, which platform {report.platform}'s OAM has no "
                   "peak for")
        else:
            how = f"{p['priced']}, as the settings asked"
        lines.append(f"float32 matmuls        priced at {how} (the last one: {p['op']}{ranks})")
    for c in report.fp32_matmul_counts or []:
        asked = f"asked {c['requested']}, " if c["fell_back"] else ""
        lines.append(f"  {asked}priced at {c['priced']:<5} {c['ops']:>10,} ops  {c['flops'] / 1e9:>12,.1f} GFLOP  "
                     f"{format_time(c['device_s'])} of device time")
    return lines


def rank_ranges(ranks: list[int]) -> str:
    """``[0, 1, 2, 3, 8]`` as ``0-3, 8``."""
    parts: list[str] = []
    i = 0
    while i < len(ranks):
        j = i
        while j + 1 < len(ranks) and ranks[j + 1] == ranks[j] + 1:
            j += 1
        parts.append(str(ranks[i]) if i == j else f"{ranks[i]}-{ranks[j]}")
        i = j + 1
    return ", ".join(parts)


def _world(report: RunReport) -> list[str]:
    w = report.world
    if w is None:
        return []
    line = f"world                  {w.world_size} ranks; {len(w.ranks)} ran as processes ({rank_ranges(w.ranks)})"
    if not w.modeled_ranks:
        return [line]
    lines = [line + f", {len(w.modeled_ranks)} modeled without one ({rank_ranges(w.modeled_ranks)})",
             "assumptions about the modeled ranks:"]
    return lines + [f"  - {a}" for a in w.assumptions]


def _inference(report: RunReport) -> list[str]:
    inf = report.inference
    if inf is None:
        return []
    how = "zion_emu.inference.query()" if inf.source == "explicit" else inf.source
    if inf.source == "forwards":
        how = f"top-level forwards with gradients off, after {inf.warmup_queries} warm-up"
    lines = ["", f"inference              {inf.queries} queries ({how})"]
    if inf.p50_s is not None and inf.p99_s is not None:
        lines.append(f"  latency per query    p50 {format_time(inf.p50_s)}  p99 {format_time(inf.p99_s)}  "
                     f"mean {format_time(inf.mean_s or 0.0)} (modeled: input copy issued to scores on the host)")
    if inf.qps is not None:
        lines.append(f"  throughput           {inf.qps:,.1f} queries/s (modeled)")
    if inf.note:
        lines.append(f"  note: {inf.note}")
    return lines


def _breakdown(report: RunReport) -> list[str]:
    b = report.breakdown
    if b is None:
        return [f"breakdown: {report.breakdown_note}"] if report.breakdown_note else []
    wall = report.wall_s
    parts = [("compute", b.compute_s), ("communication, exposed", b.communication_exposed_s),
             ("copies, exposed", b.copies_exposed_s), ("host (device idle)", b.host_s)]
    rows = [(name, format_time(t), f"{100.0 * t / wall if wall > 0 else 0.0:.1f} %") for name, t in parts]
    rows.append(("communication, overlapped", format_time(b.communication_overlapped_s), "  (hidden under compute)"))
    return ["", *_BREAKDOWN.render(rows)]


def _devices(report: RunReport) -> list[str]:
    if not report.devices:
        return []
    return ["", *_DEVICES.render([(f"zion:{d.device}", d.rank, d.busy_pct, _bytes(d.peak_hbm_bytes),
                                   _bytes(d.hbm_capacity_bytes), d.ops, d.guessed_ops) for d in report.devices])]


def _compiled(report: RunReport) -> list[str]:
    compiled = [d for d in report.devices if d.compiled_kernels]
    if not compiled:
        return []
    return ["", *_COMPILED.render([(f"zion:{d.device}", d.rank, d.compiled_kernels, format_time(d.compiled_busy_s),
                                    f"{100.0 * d.compiled_busy_s / d.busy_s if d.busy_s > 0 else 0.0:.1f} %")
                                   for d in compiled])]


def _sockets(report: RunReport) -> list[str]:
    if not report.sockets:
        return []
    return ["", *_SOCKETS.render([(f"socket {k.socket}", k.rank, k.busy_pct, _bytes(k.peak_ddr_bytes),
                                   _bytes(k.ddr_capacity_bytes), k.ops) for k in report.sockets])]


def _links(report: RunReport) -> list[str]:
    moving = [link for link in report.links if link.bytes > 0]
    if not moving:
        return []
    return ["", *_LINKS.render([(link.name, link.links, _bytes(link.bytes), f"{link.utilization_pct:.2f} %")
                                for link in moving])]


def _top_ops(report: RunReport) -> list[str]:
    if not report.top_ops:
        return []
    return ["", *_TOP_OPS.render([(op.name, format_time(op.busy_s), op.count) for op in report.top_ops])]


def _guessed(report: RunReport) -> list[str]:
    if not report.guessed_ops:
        return []
    return ["", "priced by the default guess (memory-bound; give them a formula with zion_emu.cost.register):",
            *(f"  {op}  x{n}" for op, n in list(report.guessed_ops.items())[:10])]


def _timing_only(report: RunReport) -> list[str]:
    if report.mode != "timing":
        return []
    lines = ["timing-only mode: floating-point zion tensors had no host bytes; times and memory are modeled as in "
             "real mode" + (", except torch.compile's graphs, which ran op by op (below)" if report.compile_fallbacks
                            else "")]
    if report.placeholders:
        lines.append("placeholder reads (storage-less values read by the host, 0 stood in):")
        lines += [f"  {r['site'] or '(unknown site)'}  {r['what']}  {r['dtype']}  x{r['count']}"
                  for r in report.placeholders]
    return lines


def _compile_fallbacks(report: RunReport) -> list[str]:
    if not report.compile_fallbacks:
        return []
    lines = ["", "torch.compile graphs that ran op by op (priced as eager ops, not as fused kernels):"]
    lines += [f"  {f['reason']}  x{f['graphs']}" for f in report.compile_fallbacks[:10]]
    return lines


def format_text(report: RunReport) -> str:
    """The report as ``zion-emu run`` prints it: the summary, the world (with
    ``--world-size``), the inference queries (when there were any), where the
    time went, then devices, the kernels torch.compile generated, sockets,
    links, the top work and the guessed ops."""
    lines = []
    if report.status is not None and report.status.interrupted:
        lines.append("(partial: the run was interrupted)")
    missing = [r for r, s in (report.status.ranks.items() if report.status is not None else ()) if s is None]
    if missing:
        lines.append(f"(partial: rank(s) {', '.join(map(str, missing))} left no report)")
    lines.append(f"== zion-emu report: platform {report.platform}, {report.ranks} rank(s) ==")
    for section in (_summary, _precision, _world, _timing_only, _inference, _breakdown, _devices, _compiled, _sockets, _links,
                    _top_ops, _guessed, _compile_fallbacks):
        lines += section(report)
    if report.cuda_compat_remapped:
        lines += ["", "--cuda-compat remapped: " + ", ".join(f"{k} x{v}"
                                                              for k, v in sorted(report.cuda_compat_remapped.items()))]
    return "\n".join(lines)
