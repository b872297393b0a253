"""The run report: where the modeled time of a run went, as typed records.

Each process takes a :func:`snapshot` of its timeline at exit (what
``python -m zion_emu run`` does in every rank): a :class:`RankSnapshot`.
:func:`merge` combines the ranks' snapshots into a :class:`RunReport`;
:func:`zion_emu.report_text.format_text` prints it and :meth:`RunReport.to_json`
is what ``--report`` writes. How a device's wall time splits into compute,
communication, copies and host time is :mod:`zion_emu.breakdown`.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, fields, is_dataclass, replace
from typing import Any, ClassVar, Iterable, Mapping

import torch

from zion_emu import _C
from zion_emu.breakdown import COMMUNICATION, COMPUTE, COPY, Breakdown, Spans, breakdown, union_length
from zion_emu.inference import InferenceSnapshot, latency_stats
from zion_emu.iterations import Iterations, declared_throughput, mean_iteration_s

__all__ = [
    "COMMUNICATION", "COMPUTE", "COPY", "DEFAULT_MAX_SPANS", "Breakdown", "DeviceSnapshot", "DeviceSummary", "HbmOverTime",
    "LinkCounters", "LinkSummary", "OpSummary", "RankSnapshot", "RankStatus", "RunReport", "RunStatus",
    "SocketSnapshot", "SocketSummary", "ThroughputSummary", "WORLD_ASSUMPTIONS", "WorldSummary", "breakdown",
    "limit_of", "merge", "snapshot", "start_recording", "throughput_summary", "union_length", "world_summary",
    "write_json",
]

_timeline = _C.timeline

DEFAULT_MAX_SPANS = 2_000_000

# A field with this metadata is left out of the JSON while it is None (the
# key is absent, not null): how the report read before it had types.
_OMIT_NONE = {"omit_none": True}


def _in_json(f: Any, value: Any) -> bool:
    return f.metadata.get("json", True) and not (f.metadata.get("omit_none") and value is None)


def _json(value: Any) -> Any:
    """A record as plain JSON data, field by field in declaration order."""
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: _json(getattr(value, f.name)) for f in fields(value) if _in_json(f, getattr(value, f.name))}
    if isinstance(value, Mapping):
        return {k: _json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json(v) for v in value]
    return value


def _breakdown_or_none(d: Mapping[str, Any] | None) -> Breakdown | None:
    return None if d is None else Breakdown.from_json(d)


# -- what one process saw ------------------------------------------------------


@dataclass
class HbmOverTime:
    """One device's allocated HBM over the modeled host clock (the native
    allocator's series, ``_C.memory.hbm_over_time``): ``start_bytes`` at
    ``start_s``; then per bin of ``bin_s`` seconds, the time of its first
    allocation or free (``time_s``), the most allocated after any of its
    events (``max_bytes``: nothing exceeds it until the next bin) and what
    was allocated after its last (``end_bytes``); that holds until ``end_s``,
    when the snapshot was taken. ``peak_bytes`` is first reached at
    ``peak_s``. The bins begin ``FIRST_BIN_S`` (1 ns) wide, so events further
    apart are each their own bin; past ``MAX_BINS`` the width doubles and
    neighbours merge."""

    FIRST_BIN_S: ClassVar[float] = _C.memory.HBM_FIRST_BIN_S
    MAX_BINS: ClassVar[int] = _C.memory.HBM_MAX_BINS

    bin_s: float
    start_s: float
    start_bytes: int
    time_s: list[float]
    max_bytes: list[int]
    end_bytes: list[int]
    peak_bytes: int
    peak_s: float
    end_s: float

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> HbmOverTime:
        return cls(**d)

    @classmethod
    def of_device(cls, device: int) -> HbmOverTime:
        s = _C.memory.hbm_over_time(device)
        return cls(bin_s=s["bin_s"], start_s=s["start_s"], start_bytes=s["start_bytes"], time_s=list(s["time_s"]),
                   max_bytes=list(s["max_bytes"]), end_bytes=list(s["end_bytes"]), peak_bytes=s["peak_bytes"],
                   peak_s=s["peak_s"], end_s=s["now_s"])

    @property
    def merged(self) -> bool:
        """Whether some events closer than ``bin_s`` share a bin."""
        return self.bin_s > self.FIRST_BIN_S

    def steps(self) -> tuple[list[float], list[int]]:
        """The series as a polyline: at each bin's time a rise (or fall) from
        the level before to its most, then to its end level, held until the
        next bin; the last level is held until ``end_s``."""
        x, y = [self.start_s], [self.start_bytes]
        level = self.start_bytes
        for t, most, end in zip(self.time_s, self.max_bytes, self.end_bytes):
            x += [t, t, t]
            y += [level, most, end]
            level = end
        x.append(max(self.end_s, x[-1]))
        y.append(level)
        return x, y


def _hbm_or_none(d: Mapping[str, Any] | None) -> HbmOverTime | None:
    return None if d is None else HbmOverTime.from_json(d)


@dataclass
class DeviceSnapshot:
    """One zion device's counters at exit; ``breakdown`` when every span was recorded."""

    device: int
    busy_s: float
    busy_by_activity_s: dict[str, float]  # compute, copy, communication
    flops: float
    bytes: float
    copy_bytes: float
    ops: int
    guessed_ops: int
    peak_hbm_bytes: int
    hbm_capacity_bytes: int
    breakdown: Breakdown | None = field(default=None, metadata=_OMIT_NONE)
    # Of the ops, kernels torch.compile generated (zion_emu.inductor) and their modeled busy time.
    compiled_kernels: int = 0
    compiled_busy_s: float = 0.0
    # Allocated HBM over modeled time (absent from reports written before it was kept).
    hbm_over_time: HbmOverTime | None = field(default=None, metadata=_OMIT_NONE)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> DeviceSnapshot:
        return cls(**{**d, "breakdown": _breakdown_or_none(d.get("breakdown")),
                      "hbm_over_time": _hbm_or_none(d.get("hbm_over_time"))})


@dataclass
class SocketSnapshot:
    """One CPU socket's DDR pool and the CPU work charged to it."""

    socket: int
    peak_ddr_bytes: int
    ddr_capacity_bytes: int
    in_use_ddr_bytes: int
    busy_s: float
    ops: int
    flops: float
    bytes: float

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> SocketSnapshot:
        return cls(**d)


@dataclass
class LinkCounters:
    """The traffic over one link class, as the native timeline counts it."""

    name: str
    bandwidth: float  # bytes/s per link and direction
    links: int
    bytes: float
    busy_s: float  # summed over the class's links
    transfers: int

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> LinkCounters:
        return cls(**d)


@dataclass
class RankStatus:
    """How a rank's script ended: ``exit`` is ok, sys.exit, interrupted (Ctrl-C), terminated (SIGTERM) or exception."""

    exit: str
    code: int
    error: str | None = field(default=None, metadata=_OMIT_NONE)
    cuda_compat_remapped: dict[str, int] | None = field(default=None, metadata=_OMIT_NONE)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> RankStatus:
        return cls(**d)


@dataclass
class RankSnapshot:
    """One process's view of the run. ``spans`` (numpy columns) travel beside
    the JSON, not in it; ``span_labels`` name their labels."""

    rank: int
    platform: str
    wall_s: float
    oam_tracks: int  # devices per node: span devices at or past it are sockets
    devices: list[DeviceSnapshot]
    sockets: list[SocketSnapshot]
    labels: dict[str, tuple[float, int]]  # label -> (busy seconds, count)
    links: list[LinkCounters]
    guessed_ops: dict[str, int]
    dropped_spans: int
    iterations: list[float]  # when each optimizer step's work was done
    samples_per_iteration: int | None
    spans: Spans | None = field(default=None, metadata={"json": False})
    span_labels: list[str] | None = field(default=None, metadata=_OMIT_NONE)
    status: RankStatus | None = field(default=None, metadata=_OMIT_NONE)
    mode: str = "real"  # "timing": timing-only mode
    # Reads of storage-less values (timing-only mode): site, what, dtype, count.
    placeholders: list[dict[str, Any]] = field(default_factory=list)
    # The queries this process answered (zion_emu.inference), if it ran any.
    inference: InferenceSnapshot | None = field(default=None, metadata=_OMIT_NONE)
    # How its last float32 matmul-class op or convolution was priced
    # (torch.zion.last_matmul_precision(): op, requested, priced); None if none was.
    fp32_matmul_precision: dict[str, str] | None = field(default=None, metadata=_OMIT_NONE)
    # Every float32 matmul-class op and convolution it priced, by (requested,
    # priced) precision: requested, priced, ops, flops, device_s; None if none was.
    fp32_matmul_counts: list[dict[str, Any]] | None = field(default=None, metadata=_OMIT_NONE)
    # What the script measured (zion_emu.throughput): samples, start_s, end_s, limit, limit_utilization.
    throughput: dict[str, Any] | None = field(default=None, metadata=_OMIT_NONE)
    # Why each torch.compile graph of zion tensors ran op by op instead (zion_emu.inductor.fallbacks()).
    compile_fallbacks: list[str] | None = field(default=None, metadata=_OMIT_NONE)

    def to_json(self) -> dict[str, Any]:
        return _json(self)

    @classmethod
    def from_json(cls, d: Mapping[str, Any], spans: Spans | None = None) -> RankSnapshot:
        return cls(
            **{**d,
               "inference": None if d.get("inference") is None else InferenceSnapshot.from_json(d["inference"]),
               "devices": [DeviceSnapshot.from_json(x) for x in d["devices"]],
               "sockets": [SocketSnapshot.from_json(x) for x in d.get("sockets", [])],
               "labels": {k: (float(v[0]), int(v[1])) for k, v in d["labels"].items()},
               "links": [LinkCounters.from_json(x) for x in d["links"]],
               "status": None if d.get("status") is None else RankStatus.from_json(d["status"])},
            spans=spans,
        )


def start_recording(max_spans: int = DEFAULT_MAX_SPANS) -> None:
    """Keeps spans of stream time (for the breakdown and the trace); the
    counters are kept regardless."""
    _timeline.set_recording(int(max_spans))


def _devices_used() -> list[int]:
    used = []
    for d in range(torch.zion.device_count()):
        c = _C.device.counters(d)
        if c["ops"] or c["busy_s"] or torch.zion.max_memory_allocated(d):
            used.append(d)
    return used


def _socket_snapshots() -> list[SocketSnapshot]:
    from zion_emu import sockets

    out = []
    for s in range(sockets.socket_count()):
        mem, work = sockets.memory(s), sockets.counters(s)
        if mem.peak or work["ops"]:
            out.append(SocketSnapshot(socket=s, peak_ddr_bytes=mem.peak, ddr_capacity_bytes=mem.capacity,
                                      in_use_ddr_bytes=mem.in_use, busy_s=work["busy_s"], ops=work["ops"],
                                      flops=work["flops"], bytes=work["bytes"]))
    return out


def snapshot(rank: int = 0, iterations: Iterations | None = None, keep_spans: bool = True) -> RankSnapshot:
    """This process's view of the run, after waiting for its devices; with
    ``keep_spans`` the recorded spans and their labels too."""
    from zion_emu import cost, current_platform, inference

    devices = _devices_used()
    for d in devices:
        torch.zion.synchronize(d)
    wall = _C.device.host_time()
    spans = _timeline.spans()
    dropped = int(_timeline.dropped_spans())
    # A breakdown needs every span: none recorded, or some dropped, leaves it out.
    complete = (len(spans["start"]) > 0 or dropped > 0) and dropped == 0
    per_device = []
    for d in devices:
        c = _C.device.counters(d)
        per_device.append(DeviceSnapshot(
            device=d, busy_s=c["busy_s"], busy_by_activity_s=_timeline.busy_by_activity(d), flops=c["flops"],
            bytes=c["bytes"], copy_bytes=c["copy_bytes"], ops=c["ops"], guessed_ops=c["guessed_ops"],
            peak_hbm_bytes=torch.zion.max_memory_allocated(d),
            hbm_capacity_bytes=torch.zion.get_device_properties(d).total_memory,
            breakdown=breakdown(spans, d, wall) if complete else None,
            compiled_kernels=c["compiled_kernels"], compiled_busy_s=c["compiled_busy_s"],
            hbm_over_time=HbmOverTime.of_device(d)))
    guessed: dict[str, int] = {}
    for d in devices:
        for op, n in cost.guessed_ops(d).items():
            guessed[op] = guessed.get(op, 0) + n
    return RankSnapshot(
        rank=rank,
        platform=current_platform().name,
        wall_s=wall,
        oam_tracks=torch.zion.device_count(),
        devices=per_device,
        sockets=_socket_snapshots(),
        labels={k: (v[0], v[1]) for k, v in _timeline.label_totals().items()},
        links=[LinkCounters(**link) for link in _timeline.link_counters()],
        guessed_ops=guessed,
        dropped_spans=dropped,
        iterations=[] if iterations is None else list(iterations.times),
        samples_per_iteration=None if iterations is None else iterations.samples_per_iteration,
        spans=spans if keep_spans else None,
        span_labels=list(_timeline.labels()) if keep_spans else None,
        mode=_C.device.mode(),
        placeholders=list(_C.device.placeholder_reads()),
        inference=inference.snapshot(),
        fp32_matmul_precision=_C.device.last_fp32_matmul_pricing(),
        fp32_matmul_counts=list(_C.device.fp32_matmul_counts()) or None,
        throughput=declared_throughput(),
        compile_fallbacks=_compile_fallbacks() or None,
    )


def _compile_fallbacks() -> list[str]:
    from zion_emu import inductor

    return inductor.fallbacks()


# -- the whole run -------------------------------------------------------------


@dataclass
class DeviceSummary(DeviceSnapshot):
    """A device in the run: its snapshot, its rank and how busy it was."""

    rank: int = field(default=0, kw_only=True)
    busy_pct: float = field(default=0.0, kw_only=True)  # of the run's wall time

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> DeviceSummary:
        return cls(**{**d, "breakdown": _breakdown_or_none(d.get("breakdown")),
                      "hbm_over_time": _hbm_or_none(d.get("hbm_over_time"))})


@dataclass
class SocketSummary(SocketSnapshot):
    rank: int = field(default=0, kw_only=True)
    busy_pct: float = field(default=0.0, kw_only=True)


@dataclass
class LinkSummary(LinkCounters):
    """A link class's traffic summed over ranks."""

    utilization_pct: float = field(default=0.0, kw_only=True)  # busy_s over links x wall time


@dataclass
class OpSummary:
    """Modeled time of one label (an operator, a copy, a collective) over every device."""

    name: str
    busy_s: float
    count: int

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> OpSummary:
        return cls(**d)


@dataclass
class RunStatus:
    exit_code: int
    interrupted: bool
    ranks: dict[int, RankStatus | None]

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> RunStatus:
        return cls(d["exit_code"], d["interrupted"],
                   {int(r): None if s is None else RankStatus.from_json(s) for r, s in d["ranks"].items()})


# What a run with absent ranks (zion-emu run --world-size N --ranks LIST)
# assumes about them; csrc/dist (process_group_zion.h, handshake.h) does it.
WORLD_ASSUMPTIONS = (
    "every collective is priced for all ranks of the world on the platform's topology; an absent rank r sits on "
    "OAM r % devices-per-node of node r // devices-per-node",
    "an absent rank arrives at each collective when the latest running rank does",
    "an absent rank a stands on its counterpart p, the nearest running rank before it (a-1, a-2, ..., cyclically): "
    "it passes p's dtype, size, root and reduce op",
    "all-to-all sizes: an absent rank a sends a running rank what that rank expects from a, and an absent rank b "
    "what p sends b (exact when the receiver decides what it gets, as in a model-parallel exchange)",
    "data: all_reduce, reduce and reduce_scatter combine the running ranks' alone; an absent rank's all_gather "
    "and gather pieces, and a broadcast from an absent root, are its counterpart's; an all-to-all piece from an "
    "absent rank is the piece p sends the receiver (zeros if the receiver expects another size); send and recv "
    "with an absent rank are refused",
    "per-device figures, link traffic and top work cover the running ranks only",
)


@dataclass
class WorldSummary:
    """The world a run's script saw (``--world-size``): its size, the ranks
    that ran as processes, those modeled without one (each standing on its
    counterpart, a running rank), and the assumptions about them."""

    world_size: int
    ranks: list[int]  # ran as processes
    modeled_ranks: list[int]  # priced in every collective, with no process
    counterparts: list[int]  # for each rank of the world, the running rank it stands on (itself when it ran)
    assumptions: list[str]

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> WorldSummary:
        return cls(**d)


def world_summary(world_size: int, ranks: Iterable[int]) -> WorldSummary:
    """The summary of a world of ``world_size`` ranks of which ``ranks`` ran;
    the counterparts are the backend's (the nearest running rank before,
    cyclically)."""
    running = sorted(set(ranks))
    if not running:
        raise ValueError("a world needs at least one running rank")
    counterparts = list(_C.dist.counterparts(world_size, running))  # the backend's own rule
    present = set(running)
    modeled = [r for r in range(world_size) if r not in present]
    return WorldSummary(world_size, running, modeled, counterparts, list(WORLD_ASSUMPTIONS) if modeled else [])


@dataclass
class InferenceSummary:
    """The queries of a run: latency percentiles over every rank's timed
    queries, and queries/s summed over ranks (each rank serves its own)."""

    source: str  # explicit (zion_emu.inference.query) or forwards (forward hooks)
    queries: int
    p50_s: float | None
    p99_s: float | None
    mean_s: float | None
    qps: float | None
    ranks: list[int]
    warmup_queries: int = 0
    note: str | None = field(default=None, metadata=_OMIT_NONE)


def _inference_summary(snaps: list[RankSnapshot]) -> InferenceSummary | None:
    seen = [s for s in snaps if s.inference is not None]
    if not seen:
        return None
    latencies = [t for s in seen for t in s.inference.latencies_s]  # type: ignore[union-attr]
    stats = latency_stats(latencies) if latencies else {"p50_s": None, "p99_s": None, "mean_s": None}
    rates = [s.inference.qps for s in seen if s.inference.qps is not None]  # type: ignore[union-attr]
    notes = sorted({s.inference.note for s in seen if s.inference.note})  # type: ignore[union-attr]
    return InferenceSummary(
        source=",".join(sorted({s.inference.source for s in seen})),  # type: ignore[union-attr]
        queries=len(latencies), **stats, qps=sum(rates) if rates else None, ranks=[s.rank for s in seen],
        warmup_queries=sum(s.inference.warmup_queries for s in seen),  # type: ignore[union-attr]
        note="; ".join(notes) or None)


@dataclass
class ThroughputSummary:
    """What the ranks measured (``zion_emu.throughput``): their samples over
    the span from the earliest start to the latest end, in modeled seconds,
    and what limited them (the limit with the highest utilization among
    those declared)."""

    samples: int
    modeled_s: float
    samples_per_s: float
    ranks: list[int]  # those that declared
    limit: str | None = None
    limit_utilization: float | None = None


def throughput_summary(snaps: Iterable[RankSnapshot]) -> ThroughputSummary | None:
    seen = [s for s in snaps if s.throughput is not None]
    if not seen:
        return None
    ts = [s.throughput for s in seen]
    samples = sum(int(t["samples"]) for t in ts)  # type: ignore[index]
    span = max(t["end_s"] for t in ts) - min(t["start_s"] for t in ts)  # type: ignore[index]
    limits = [t for t in ts if t.get("limit")]  # type: ignore[union-attr]
    top = max(limits, key=lambda t: t.get("limit_utilization") or 0.0, default=None)
    return ThroughputSummary(samples, span, samples / span, [s.rank for s in seen],
                             None if top is None else top["limit"],
                             None if top is None else top.get("limit_utilization"))


@dataclass
class RunReport:
    """Every rank's snapshot merged: what ``zion-emu run`` prints and ``--report`` writes."""

    platform: str
    ranks: int
    wall_s: float  # the latest rank's
    iterations: int
    iteration_s: float | None  # modeled, mean after the first step
    samples_per_iteration: int | None  # over all ranks
    samples_per_s: float | None
    breakdown: Breakdown | None  # mean over devices
    breakdown_note: str | None  # why there is none
    devices: list[DeviceSummary]
    sockets: list[SocketSummary]
    links: list[LinkSummary]  # most bytes first
    top_ops: list[OpSummary]
    guessed_ops: dict[str, int]  # most often first
    status: RunStatus | None = field(default=None, metadata=_OMIT_NONE)
    cuda_compat_remapped: dict[str, int] | None = field(default=None, metadata=_OMIT_NONE)
    mode: str = "real"  # "timing" if any rank ran in timing-only mode
    # Placeholder reads over all ranks: site, what, dtype, count, ranks.
    placeholders: list[dict[str, Any]] = field(default_factory=list)
    # Inference queries over all ranks (zion_emu.inference), when any rank ran some.
    inference: InferenceSummary | None = field(default=None, metadata=_OMIT_NONE)
    world: WorldSummary | None = field(default=None, metadata=_OMIT_NONE)  # --world-size
    # Which precision priced float32 matmuls: see fp32_matmul_precision(). Absent when none was priced.
    fp32_matmul_precision: list[dict[str, Any]] | None = field(default=None, metadata=_OMIT_NONE)
    # The whole run's float32 matmuls by precision: see fp32_matmul_counts(). Absent when none was priced.
    fp32_matmul_counts: list[dict[str, Any]] | None = field(default=None, metadata=_OMIT_NONE)
    # What the ranks measured (zion_emu.throughput); samples_per_s is then its samples/s.
    throughput: ThroughputSummary | None = field(default=None, metadata=_OMIT_NONE)
    # torch.compile graphs that ran op by op (priced as eager ops, not as fused
    # kernels), over all ranks: reason, graphs, ranks. Absent when none did.
    compile_fallbacks: list[dict[str, Any]] | None = field(default=None, metadata=_OMIT_NONE)

    def to_json(self) -> dict[str, Any]:
        return _json(self)

    @classmethod
    def from_json(cls, d: Mapping[str, Any] | str | bytes | os.PathLike) -> RunReport:
        """The report ``--report`` wrote: its parsed JSON (a dict), its text, or the file's path
        (a ``pathlib.Path``)."""
        if isinstance(d, os.PathLike):
            with open(d, encoding="utf-8") as f:
                d = json.load(f)
        elif isinstance(d, (str, bytes)):
            try:
                d = json.loads(d)
            except json.JSONDecodeError as e:
                raise ValueError(f"RunReport.from_json: the text given is not JSON ({e}); pass the report's text, "
                                 "its parsed dict, or its path as a pathlib.Path") from None
        if not isinstance(d, Mapping):
            raise TypeError(f"RunReport.from_json takes the report's JSON object (a dict), its text or its path "
                            f"(a pathlib.Path), not {type(d).__name__}")
        return cls(**{
            **d,
            "throughput": None if d.get("throughput") is None else ThroughputSummary(**d["throughput"]),
            "inference": None if d.get("inference") is None else InferenceSummary(**d["inference"]),
            "breakdown": _breakdown_or_none(d["breakdown"]),
            "devices": [DeviceSummary.from_json(x) for x in d["devices"]],
            "sockets": [SocketSummary(**x) for x in d["sockets"]],
            "links": [LinkSummary(**x) for x in d["links"]],
            "top_ops": [OpSummary.from_json(x) for x in d["top_ops"]],
            "status": None if d.get("status") is None else RunStatus.from_json(d["status"]),
            "world": None if d.get("world") is None else WorldSummary.from_json(d["world"]),
        })


def _fields_of(record: Any) -> dict[str, Any]:
    """A record's fields by name, the values as they are (not copied into dicts)."""
    return {f.name: getattr(record, f.name) for f in fields(record)}


def _pct(busy_s: float, capacity_s: float) -> float:
    return 100.0 * busy_s / capacity_s if capacity_s > 0 else 0.0


def _device_busy_pct(device: DeviceSnapshot, breakdown: Breakdown | None, wall: float) -> float:
    """The share of the run's wall time in which some stream of the device was
    busy, as a GPU's utilization counts it: compute, communication and copies
    that overlap count once (the wall time less the breakdown's host time).
    Without a breakdown (spans not recorded), the streams' busy time summed,
    which overlap can only overstate, at most the wall time."""
    if breakdown is not None:
        return _pct(max(wall - breakdown.host_s, 0.0), wall)
    return _pct(min(device.busy_s, wall), wall)


def _to_run_wall(device: DeviceSnapshot, rank_wall: float, wall: float) -> Breakdown | None:
    """A device's breakdown over the run's wall time: a rank that finished
    early was idle (host) for the rest."""
    if device.breakdown is None:
        return None
    return replace(device.breakdown, host_s=device.breakdown.host_s + max(wall - rank_wall, 0.0))


def fp32_matmul_precision(snaps: Iterable[RankSnapshot]) -> list[dict[str, Any]] | None:
    """How the ranks' last float32 matmul-class op (or convolution) was priced,
    one entry per distinct (op, requested, priced): ``requested`` is the
    precision torch's settings asked for (fp32, tf32, bf16), ``priced`` the one
    whose peak priced it, ``fell_back`` True where the platform's OAM has no
    peak for the requested one and fp32 priced it instead; ``ranks`` lists the
    ranks. None when no rank priced one."""
    out: dict[tuple[str, str, str], dict[str, Any]] = {}
    for s in snaps:
        p = s.fp32_matmul_precision
        if p is None:
            continue
        key = (p["op"], p["requested"], p["priced"])
        acc = out.setdefault(key, {"op": key[0], "requested": key[1], "priced": key[2],
                                   "fell_back": key[1] != key[2], "ranks": []})
        acc["ranks"].append(s.rank)
    return list(out.values()) or None


def fp32_matmul_counts(snaps: Iterable[RankSnapshot]) -> list[dict[str, Any]] | None:
    """Every float32 matmul-class op and convolution the ranks priced, summed
    by (requested, priced) precision: ``ops``, ``flops`` and ``device_s`` (their
    modeled device time), ``fell_back`` as in :func:`fp32_matmul_precision`,
    and the ``ranks`` that priced some. Most device time first; None when no
    rank priced one."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for s in snaps:
        for c in s.fp32_matmul_counts or []:
            key = (c["requested"], c["priced"])
            acc = out.setdefault(key, {"requested": key[0], "priced": key[1], "fell_back": key[0] != key[1],
                                       "ops": 0, "flops": 0.0, "device_s": 0.0, "ranks": []})
            acc["ops"] += int(c["ops"])
            acc["flops"] += float(c["flops"])
            acc["device_s"] += float(c["device_s"])
            acc["ranks"].append(s.rank)
    return sorted(out.values(), key=lambda c: -c["device_s"]) or None


def merge(snapshots: Iterable[RankSnapshot], samples_per_iteration: int | None = None, top: int = 10) -> RunReport:
    """One report from every rank's snapshot (spans are not carried over).
    ``samples_per_iteration`` counts all ranks (``--samples-per-iteration``);
    without it, the sum of what the ranks declared, if every rank did.
    Samples/s is per iteration of the lead rank, or, where ranks declared a
    measured throughput (``zion_emu.throughput``: ranks that do not step in
    lockstep, some of which process no samples), that one."""
    snaps = sorted(snapshots, key=lambda s: s.rank)
    if not snaps:
        raise ValueError("no rank left a report (did every rank fail before its first step?)")
    wall = max(s.wall_s for s in snaps)
    devices = []
    for s in snaps:
        for d in s.devices:
            breakdown = _to_run_wall(d, s.wall_s, wall)
            devices.append(DeviceSummary(**{**_fields_of(d), "breakdown": breakdown}, rank=s.rank,
                                         busy_pct=_device_busy_pct(d, breakdown, wall)))
    sockets = [SocketSummary(**_fields_of(k), rank=s.rank, busy_pct=_pct(k.busy_s, wall))
               for s in snaps for k in s.sockets]

    labels: dict[str, list[float]] = {}
    for s in snaps:
        for name, (busy, count) in s.labels.items():
            acc = labels.setdefault(name, [0.0, 0])
            acc[0] += busy
            acc[1] += count
    top_ops = [OpSummary(k, v[0], int(v[1])) for k, v in sorted(labels.items(), key=lambda kv: -kv[1][0])[:top]]

    links: dict[str, LinkSummary] = {}
    for s in snaps:
        for link in s.links:
            acc = links.setdefault(link.name, LinkSummary(link.name, link.bandwidth, link.links, 0.0, 0.0, 0))
            acc.bytes += link.bytes
            acc.busy_s += link.busy_s
            acc.transfers += link.transfers
    for acc in links.values():
        acc.utilization_pct = _pct(acc.busy_s, acc.links * wall)

    guessed: dict[str, int] = {}
    for s in snaps:
        for op, n in s.guessed_ops.items():
            guessed[op] = guessed.get(op, 0) + n

    placeholders: dict[tuple[str, str, str], dict[str, Any]] = {}
    for s in snaps:
        for read in s.placeholders:
            key = (read["site"], read["what"], read["dtype"])
            acc = placeholders.setdefault(key, {"site": key[0], "what": key[1], "dtype": key[2], "count": 0,
                                                "ranks": []})
            acc["count"] += int(read["count"])
            acc["ranks"].append(s.rank)

    fallbacks: dict[str, dict[str, Any]] = {}
    for s in snaps:
        for reason in s.compile_fallbacks or ():
            acc = fallbacks.setdefault(reason, {"reason": reason, "graphs": 0, "ranks": []})
            acc["graphs"] += 1
            if s.rank not in acc["ranks"]:
                acc["ranks"].append(s.rank)

    breakdowns = [d.breakdown for d in devices if d.breakdown is not None]
    summary = Breakdown.mean(breakdowns) if breakdowns and len(breakdowns) == len(devices) else None

    lead = snaps[0]
    per_iter = mean_iteration_s(lead.iterations)
    if samples_per_iteration is None:
        declared = [s.samples_per_iteration for s in snaps]
        samples_per_iteration = sum(declared) if all(declared) else None  # type: ignore[arg-type]
    measured = throughput_summary(snaps)
    samples_per_s = samples_per_iteration / per_iter if samples_per_iteration and per_iter else None
    return RunReport(
        platform=lead.platform,
        ranks=len(snaps),
        wall_s=wall,
        iterations=len(lead.iterations),
        iteration_s=per_iter,
        samples_per_iteration=samples_per_iteration,
        samples_per_s=measured.samples_per_s if measured is not None else samples_per_s,
        breakdown=summary,
        breakdown_note=None if summary is not None else
        "spans were not recorded for every device (or some were dropped): no exposed/overlapped split",
        devices=devices,
        sockets=sockets,
        links=sorted(links.values(), key=lambda link: -link.bytes),
        top_ops=top_ops,
        guessed_ops=dict(sorted(guessed.items(), key=lambda kv: -kv[1])),
        mode="timing" if any(s.mode == "timing" for s in snaps) else "real",
        placeholders=sorted(placeholders.values(), key=lambda r: -r["count"]),
        inference=_inference_summary(snaps),
        fp32_matmul_precision=fp32_matmul_precision(snaps),
        fp32_matmul_counts=fp32_matmul_counts(snaps),
        throughput=measured,
        compile_fallbacks=sorted(fallbacks.values(), key=lambda f: -f["graphs"]) or None,
    )


def limit_of(report: RunReport) -> tuple[str | None, float | None]:
    """What limited a run, as (name, utilization in 0..1): what the script
    declared (``zion_emu.throughput``), else the report's busiest device,
    socket or link class (its links' mean utilization) over the wall time."""
    t = report.throughput
    if t is not None and t.limit:
        return t.limit, t.limit_utilization
    found: list[tuple[float, str]] = []
    found += [(d.busy_pct, f"zion:{d.device} of rank {d.rank} busy") for d in report.devices]
    found += [(s.busy_pct, f"socket {s.socket} of rank {s.rank} busy") for s in report.sockets]
    found += [(link.utilization_pct, f"link class {link.name}") for link in report.links if link.bytes > 0]
    if not found:
        return None, None
    pct, name = max(found, key=lambda f: f[0])
    return name, pct / 100.0


def write_json(report: RunReport, path: str) -> None:
    with open(path, "w") as f:
        json.dump(report.to_json(), f, indent=1)
