"""zion in ``torch.profiler``: which clock the host track shows.

zion's device events (every priced op, copy and collective, on its OAM and
stream) are modeled time; the Kineto activity profiler that makes them lives
in ``csrc/device/runtime/profiler.cpp``. The host events (CPU ops,
``record_function`` ranges, Python functions) are stamped by torch's profiler
with the wall clock: what the emulation itself took to run them, which is the
emulator's cost and not the modeled machine's.

``set_host_time("modeled")`` puts the host events on the modeled host clock
instead, so the host track reads like a profile taken on the modeled
machine: an op lasts as long as the modeled host spent issuing it (its
launch cost, and any wait for the device), and a ``record_function`` range
as long as the modeled host took over it. Device events do not move. It
applies to profiles that stop while it is set, and to everything read from
them: ``events()``, ``key_averages()`` (the CPU time columns) and
``export_chrome_trace()`` (so ``tensorboard_trace_handler`` too).
``ZION_PROFILER_HOST_TIME=modeled`` sets it for a process, and
``python -m zion_emu run --profiler-host-time modeled`` for every rank.

How: the profiling session notes the modeled host clock when each op and
``record_function`` range begins and ends (torch's profiler tells it both,
by the event's correlation id), and an event with a correlation id takes
those two times. Other host events (Python functions, the profile's own
span) are mapped through the wall clock and modeled host clock the session
noted at every op boundary: linear between two notes, held at the first and
last note outside them. Each is placed where a device event issued at that
modeled time is placed. A ``zion_emu.reset_clock()`` inside the profile moves the modeled
clock back, and the host events after it land over the earlier ones.
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

HOST_TIMES = ("wall", "modeled")
HOST_TIME_ENV = "ZION_PROFILER_HOST_TIME"

# The trace categories of device events: modeled time already.
_DEVICE_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation"})

_host_time = "wall"
_installed = False


def set_host_time(clock: str) -> None:
    """The clock of the host events of profiles that stop from now on:
    ``"wall"`` (torch's own, the default) or ``"modeled"`` (the modeled host clock)."""
    global _host_time
    if clock not in HOST_TIMES:
        raise ValueError(f"zion profiler host time must be one of {', '.join(HOST_TIMES)}, got {clock!r}")
    _host_time = clock
    if clock == "modeled":
        _install()


def host_time() -> str:
    """The clock host events are put on: ``"wall"`` or ``"modeled"``."""
    return _host_time


class HostClock:
    """The modeled host clock of one profiling session at its op boundaries,
    as a map from the wall clock of torch's host events (ns since the epoch)
    to where the trace puts modeled time."""

    def __init__(self, wall0_ns: int, host_start_s: float, wall_ns: np.ndarray, host_s: np.ndarray,
                 spans: dict[int, tuple[float, float]] | None = None) -> None:
        if len(wall_ns) == 0 or len(wall_ns) != len(host_s):
            raise ValueError("a host clock map needs one modeled time per wall time, and at least one")
        self.spans = spans or {}  # correlation id -> modeled host clock at its push and its pop
        self.wall0_ns = int(wall0_ns)
        self.host_start_s = float(host_start_s)
        self._origin = int(wall_ns[0])
        # Relative to the first note, so that float64 keeps the nanoseconds.
        self._wall = np.maximum.accumulate(np.asarray(wall_ns, dtype=np.int64) - self._origin).astype(np.float64)
        self._host = np.asarray(host_s, dtype=np.float64)

    @classmethod
    def last_session(cls) -> "HostClock | None":
        """The map of the last profiling session that saw zion work, if any."""
        from zion_emu import _C

        state = _C.timeline.profiler_host_clock()
        if state is None or len(state["wall_ns"]) == 0:
            return None
        spans = {int(i): (float(b), float(e)) for i, b, e in zip(state["ids"], state["begin_s"], state["end_s"])}
        return cls(state["wall0_ns"], state["host_start_s"], state["wall_ns"], state["host_s"], spans)

    def modeled_at(self, wall_ns: Any) -> np.ndarray:
        """The modeled host clock (s) at wall times (ns since the epoch)."""
        rel = np.asarray(wall_ns, dtype=np.int64) - self._origin
        return np.interp(rel.astype(np.float64), self._wall, self._host)

    def place(self, wall_ns: Any) -> np.ndarray:
        """Where the trace puts host events stamped at these wall times (ns
        since the epoch, int64): at their modeled host time, on the device
        events' axis."""
        return self.place_modeled(self.modeled_at(wall_ns))

    def place_modeled(self, host_s: Any) -> np.ndarray:
        """Where the trace puts modeled host times (s), as ns since the epoch."""
        return self.wall0_ns + np.rint((np.asarray(host_s, dtype=np.float64) - self.host_start_s) * 1e9).astype(np.int64)

    def place_events(self, ids: list[int | None], start_ns: np.ndarray, end_ns: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The placed (start, end) of host events: by their correlation ids
        where the session saw them begin and end, else by their wall times."""
        start, end = self.place(start_ns), self.place(end_ns)
        for k, i in enumerate(ids):
            span = self.spans.get(i) if i is not None else None
            if span is not None and not np.isnan(span[1]):
                start[k], end[k] = self.place_modeled(span)
        return start, end


def _install() -> None:
    """Wraps torch.autograd.profiler.profile (which torch.profiler.profile
    drives) so that host events of profiles that stop in modeled host time
    are read and exported at their modeled times. Once."""
    global _installed
    if _installed:
        return
    import torch
    import torch.autograd.profiler as autograd_profiler
    from torch.autograd.profiler_util import Interval

    profile = autograd_profiler.profile
    cpu = torch.autograd.DeviceType.CPU
    exit_, ensure, export = profile.__exit__, profile._ensure_function_events, profile.export_chrome_trace

    def __exit__(self: Any, *exc: Any) -> Any:
        out = exit_(self, *exc)
        self._zion_host_clock = HostClock.last_session() if _host_time == "modeled" else None
        return out

    # After torch has nested the events by their wall times (a child's
    # interval inside its parent's), which the map keeps, being monotonic.
    def _ensure_function_events(self: Any) -> Any:
        out = ensure(self)
        clock = getattr(self, "_zion_host_clock", None)
        if clock is not None and self._function_events is not None:
            host = [e for e in self._function_events
                    if e.device_type == cpu and not getattr(e, "_zion_modeled_host_time", False)]
            if host:
                origin = self.kineto_results.trace_start_ns()
                ends = origin + np.rint(np.array([[e.time_range.start, e.time_range.end] for e in host]) * 1000)
                start, end = clock.place_events([e.id for e in host], ends[:, 0].astype(np.int64),
                                                ends[:, 1].astype(np.int64))
                for e, b, n in zip(host, start - origin, end - origin):
                    e.time_range = Interval(int(b) / 1000, int(n) / 1000)
                    e._zion_modeled_host_time = True
        return out

    def export_chrome_trace(self: Any, path: str, *args: Any, **kwargs: Any) -> Any:
        out = export(self, path, *args, **kwargs)
        clock = getattr(self, "_zion_host_clock", None)
        if clock is not None and os.path.exists(path):
            _rewrite_trace(path, clock)
        return out

    profile.__exit__ = __exit__
    profile._ensure_function_events = _ensure_function_events
    profile.export_chrome_trace = export_chrome_trace
    _installed = True


def _rewrite_trace(path: str, clock: HostClock) -> None:
    """Moves a Chrome trace's host events to their modeled host times."""
    with open(path) as f:
        trace = json.load(f)
    base = int(trace.get("baseTimeNanoseconds", 0))
    moved = [e for e in trace.get("traceEvents", [])
             if "ts" in e and e.get("ph") not in ("M", "f") and e.get("cat") not in _DEVICE_CATEGORIES]
    if moved:
        starts = np.array([float(e["ts"]) for e in moved])
        durs = np.array([float(e.get("dur", 0.0)) for e in moved])
        ids = [e.get("args", {}).get("External id") for e in moved]
        begin, end = clock.place_events(ids, base + np.rint(starts * 1000).astype(np.int64),
                                        base + np.rint((starts + durs) * 1000).astype(np.int64))
        for e, b, n in zip(moved, begin, end):
            e["ts"] = (int(b) - base) / 1000
            if "dur" in e:
                e["dur"] = (int(n) - int(b)) / 1000
    trace["zionHostTime"] = "modeled"
    with open(path, "w") as f:
        json.dump(trace, f)


def _apply_environment() -> None:
    value = os.environ.get(HOST_TIME_ENV, "").strip()
    if value:
        if value not in HOST_TIMES:
            raise ValueError(f"{HOST_TIME_ENV} must be one of {', '.join(HOST_TIMES)}, got '{value}'")
        set_host_time(value)
