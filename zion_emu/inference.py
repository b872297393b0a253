"""Ranking inference on the modeled platform: latency per query and queries/s.

A query is one request a ranking server answers: its batch (1 to a few
hundred candidates) is copied to where the model runs, the model scores it,
and the scores come back to the host. Its **latency** runs from the moment
the host begins issuing the query's work (its input copy) until its scores
are on the host. **QPS** is the queries answered over the modeled time from
the first query's start to the last one's completion.

Two ways to delimit queries, both on the modeled clocks of
:mod:`zion_emu.timeline` (the host's clock, and a clock per stream; the host
runs ahead of the devices, as on a GPU):

- **Explicit:** ``with zion_emu.inference.query(): ...`` around one query's
  work (copy in, forward, copy out). It starts at the host clock on entry
  and completes at the horizon on exit: the latest of the host clock and
  every stream's clock, i.e. when everything issued inside is done. A
  blocking ``.cpu()`` of the scores has already brought the host there; a
  ``non_blocking`` one is still counted to its end. Exiting does not move
  the host clock: a query issued before the previous one finished queues
  behind it on the device, and that wait is part of its latency.
- **Implicit** (:func:`track_forwards`, which ``python -m zion_emu run``
  turns on): the script is left as it is. Global module hooks see every
  top-level ``nn.Module`` forward run with gradients off (``torch.no_grad``,
  ``torch.inference_mode``, ``model.eval()`` under either). A query ends
  when its scores come back: the device-to-host copies issued after its
  forwards and before the next forward. Several top-level forwards with no
  such copy between them (a model split in two modules) are one query. A
  query's completion is the end of its last device-to-host copy on the
  modeled timeline (read from the recorded spans); the next query starts
  at that moment, when the host has the scores and issues the next input
  copy (a serving loop that waits for each query). The first query's start
  is not observable from a hook -- its input copy was issued before its
  forward, among whatever the script did before -- so it is the warm-up:
  it closes, and its completion opens the second. Latencies and QPS count
  the queries after it; forwards whose scores never come back to the host
  (no device-to-host copy after them) close no query. Forwards inside an explicit query are not counted
  again, and any explicit query makes the report use the explicit ones.

The pageable staging copy after a device-to-host copy (``bytes / DDR
bandwidth`` on the host, a few ns for a batch of scores) is inside an
explicit query's latency and outside an implicit one's, which ends with the
copy. CPU inference inside ``zion_emu.socket(i)`` has no copies: the host
runs each op, so both ways give the host clock's advance.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch

from zion_emu import _C

__all__ = ["InferenceSnapshot", "latency_stats", "query", "queries", "reset", "snapshot", "stop_tracking_forwards", "track_forwards"]

_timeline = _C.timeline
_D2H = "copy D2H"

_lock = threading.Lock()
_explicit: list[tuple[float, float]] = []  # (start, completion) per explicit query
_explicit_depth = 0
_forward_depth = 0
_forwards: list[int] = []  # per top-level inference forward: the D2H copies issued before it
_handles: list[Any] = []


def _d2h_count() -> int:
    entry = _timeline.label_totals().get(_D2H)
    return 0 if entry is None else int(entry[1])


class query:
    """Context manager (and decorator) delimiting one query; see the module
    docstring. Nested queries count once, as the outermost."""

    def __enter__(self) -> "query":
        global _explicit_depth
        with _lock:
            _explicit_depth += 1
            self._outer = _explicit_depth == 1
        self._start = _C.device.host_time() if self._outer else 0.0
        return self

    def __exit__(self, *exc: Any) -> None:
        global _explicit_depth
        end = _timeline.horizon()
        with _lock:
            _explicit_depth -= 1
            if self._outer and exc[0] is None:
                _explicit.append((self._start, end))

    def __call__(self, fn: Any) -> Any:
        import functools

        @functools.wraps(fn)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            with query():
                return fn(*args, **kwargs)

        return wrapped


def queries() -> list[tuple[float, float]]:
    """The explicit queries so far: (start, completion) in modeled seconds."""
    with _lock:
        return list(_explicit)


def _pre_hook(module: torch.nn.Module, args: Any) -> None:
    global _forward_depth
    # Inside a graph torch.compile traces (the submodules of a compiled
    # module) the hooks do nothing: a lock there would break the graph at
    # every module. The compiled module's own call, the top level, runs its
    # hooks eagerly and is counted.
    if torch.compiler.is_compiling():
        return
    with _lock:
        _forward_depth += 1
        top = _forward_depth == 1
        if not top or _explicit_depth or torch.is_grad_enabled():
            return
    count = _d2h_count()
    with _lock:
        _forwards.append(count)


def _post_hook(module: torch.nn.Module, args: Any, output: Any) -> None:
    global _forward_depth
    if torch.compiler.is_compiling():
        return
    with _lock:
        _forward_depth = max(_forward_depth - 1, 0)


def track_forwards() -> None:
    """Counts top-level forwards run with gradients off as queries (the
    implicit way; idempotent). Needs spans recorded
    (:func:`zion_emu.report.start_recording`) to find each query's
    completion."""
    from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

    if _handles:
        return
    _handles.append(register_module_forward_pre_hook(_pre_hook))
    _handles.append(register_module_forward_hook(_post_hook, always_call=True))


def stop_tracking_forwards() -> None:
    """Removes the global module hooks of :func:`track_forwards` (nothing
    when it is off), so later code sees no global hook: torch.compile warns
    about global hooks, for one."""
    while _handles:
        _handles.pop().remove()


def reset() -> None:
    """Forgets every query seen (explicit and implicit); tracking stays as it is."""
    global _explicit_depth, _forward_depth
    with _lock:
        _explicit.clear()
        _forwards.clear()
        _explicit_depth = _forward_depth = 0


def latency_stats(latencies: Sequence[float]) -> dict[str, float]:
    """p50, p99 and mean of a list of latencies. Percentiles interpolate
    linearly between the sorted values (numpy's default): the q-th of n
    sorted values sits at position q/100 * (n - 1)."""
    if not len(latencies):
        raise ValueError("latency_stats needs at least one latency")
    a = np.asarray(latencies, dtype=np.float64)
    return {"p50_s": float(np.percentile(a, 50)), "p99_s": float(np.percentile(a, 99)), "mean_s": float(a.mean())}


@dataclass
class InferenceSnapshot:
    """The queries one process answered. ``source``: ``explicit``
    (zion_emu.inference.query) or ``forwards`` (top-level forwards with
    gradients off, after the warm-up query). ``note`` says why there are no
    latencies when queries were seen but could not be timed."""

    source: str
    queries: int  # timed queries
    latencies_s: list[float]
    start_s: float  # the first timed query's start
    end_s: float  # the last one's completion
    warmup_queries: int = 0
    note: str | None = None

    @property
    def qps(self) -> float | None:
        span = self.end_s - self.start_s
        return self.queries / span if self.queries and span > 0 else None

    def to_json(self) -> dict[str, Any]:
        return {"source": self.source, "queries": self.queries, "latencies_s": list(self.latencies_s),
                "start_s": self.start_s, "end_s": self.end_s, "warmup_queries": self.warmup_queries,
                "note": self.note}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> InferenceSnapshot:
        return cls(**d)


def _implicit(forwards: list[int]) -> InferenceSnapshot | None:
    if not forwards:
        return None
    spans = _timeline.spans()
    labels = list(_timeline.labels())
    total = _d2h_count()
    empty = InferenceSnapshot("forwards", 0, [], 0.0, 0.0, warmup_queries=0)
    if _D2H not in labels:
        empty.note = "no scores came back to the host (no device-to-host copy after a forward)"
        return empty
    ends = spans["end"][spans["label"] == labels.index(_D2H)]
    if int(_timeline.dropped_spans()) or len(ends) != total:
        empty.note = ("the device-to-host copies were not all recorded (spans off or dropped): "
                      "use zion_emu.inference.query() to delimit queries")
        return empty
    # Queries: runs of forwards with no D2H copy between them; each closes
    # with the copies issued before the next run's first forward.
    firsts = [i for i, c in enumerate(forwards) if i == 0 or c != forwards[i - 1]]
    completions = []
    for q, i in enumerate(firsts):
        upto = forwards[firsts[q + 1]] if q + 1 < len(firsts) else total
        if upto > forwards[i]:
            completions.append(float(ends[upto - 1]))
    if len(completions) < 2:
        empty.warmup_queries = len(completions)
        empty.note = ("one query seen: forward hooks cannot see the first query's start (its warm-up); "
                      "run more queries or delimit them with zion_emu.inference.query()")
        return empty
    latencies = [b - a for a, b in zip(completions, completions[1:])]
    return InferenceSnapshot("forwards", len(latencies), latencies, completions[0], completions[-1], warmup_queries=1)


def snapshot() -> InferenceSnapshot | None:
    """The queries this process answered so far, or None when it ran none."""
    with _lock:
        explicit, forwards = list(_explicit), list(_forwards)
    if explicit:
        return InferenceSnapshot("explicit", len(explicit), [b - a for a, b in explicit],
                                 min(a for a, _ in explicit), max(b for _, b in explicit))
    return _implicit(forwards)
