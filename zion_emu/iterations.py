"""Iterations of a training run: the samples one processes, and when each is done.

A script says how many samples one of its iterations processes on this rank
with :func:`samples_per_iteration` (``zion_emu.samples_per_iteration``, also
reachable as ``zion_emu.launch.samples_per_iteration``); the run report then
gives samples/s. A script whose ranks do not step in lockstep declares
what it measured instead, with :func:`throughput`. ``python -m zion_emu run`` counts optimizer steps as
iterations with a :class:`StepClock`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from zion_emu import _C

_declared_samples: int | None = None


def samples_per_iteration(n: int) -> None:
    """Declares the samples one iteration processes on this rank (the
    report's samples/s sums them over ranks). Only read inside a run."""
    global _declared_samples
    if isinstance(n, bool) or int(n) != n or int(n) <= 0:
        raise ValueError(f"samples_per_iteration must be a positive integer, got {n!r}")
    _declared_samples = int(n)


def declared_samples_per_iteration() -> int | None:
    """What :func:`samples_per_iteration` declared in this process, if anything."""
    return _declared_samples


_declared_throughput: dict[str, Any] | None = None


def throughput(samples: int, start_s: float, end_s: float, limit: str | None = None,
               limit_utilization: float | None = None) -> None:
    """Declares what this rank measured: ``samples`` processed between the
    modeled times ``start_s`` and ``end_s`` (seconds on the modeled clock),
    and optionally what limited them (``limit``, e.g. a busy server or a
    link, with its utilization in 0..1). For runs whose ranks do not step an
    optimizer in lockstep (asynchronous training): the report's samples/s
    is then the declared samples over the declared time. Several ranks'
    declarations add up: their samples summed over the span from the
    earliest start to the latest end. A later call replaces an earlier one.
    Only read inside a run."""
    global _declared_throughput
    if isinstance(samples, bool) or int(samples) != samples or int(samples) <= 0:
        raise ValueError(f"throughput: samples must be a positive integer, got {samples!r}")
    if not end_s > start_s:
        raise ValueError(f"throughput: end_s ({end_s!r}) must be after start_s ({start_s!r})")
    if limit_utilization is not None and not 0 <= limit_utilization:
        raise ValueError(f"throughput: limit_utilization must be 0 or more (a share: 1 is 100%), "
                         f"got {limit_utilization!r}")
    if limit_utilization is not None and limit is None:
        raise ValueError("throughput: limit_utilization needs the limit it measures (limit='...')")
    _declared_throughput = {"samples": int(samples), "start_s": float(start_s), "end_s": float(end_s),
                            "limit": limit, "limit_utilization": None if limit_utilization is None
                            else float(limit_utilization)}


def declared_throughput() -> dict[str, Any] | None:
    """What :func:`throughput` declared in this process, if anything."""
    return None if _declared_throughput is None else dict(_declared_throughput)


@dataclass
class Iterations:
    """Optimizer steps of one process, on the modeled clock: when each step's
    work was done, and the samples one of them processes."""

    times: list[float]
    samples_per_iteration: int | None = None


class StepClock:
    """When each optimizer step's work is done, per optimizer: the modeled
    time by which everything issued up to that step has run (the host runs
    ahead of the devices, as on a GPU, so the host clock alone would not
    say). The optimizer that steps most often paces the iterations.
    :meth:`hook` is an optimizer step post-hook."""

    def __init__(self) -> None:
        self.steps: dict[int, list[float]] = {}

    def hook(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.steps.setdefault(id(optimizer), []).append(_C.timeline.horizon())

    def times(self) -> list[float]:
        return max(self.steps.values(), key=len, default=[])

    def iterations(self) -> Iterations:
        """The steps seen so far, with the samples this process declared."""
        return Iterations(self.times(), declared_samples_per_iteration())


def mean_iteration_s(times: Sequence[float]) -> float | None:
    """Modeled seconds per iteration: ``times`` are when each optimizer
    step's work was done; the mean interval after the first step (warm-up).
    None with fewer than two steps."""
    if len(times) < 2:
        return None
    return (times[-1] - times[0]) / (len(times) - 1)
