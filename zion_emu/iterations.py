"""Iterations of a training run: the samples one processes, and when each is done.

A script says how many samples one of its iterations processes on this rank
with :func:`samples_per_iteration` (``zion_emu.samples_per_iteration``, also
reachable as ``zion_emu.launch.samples_per_iteration``); the run report then
gives samples/s. ``python -m zion_emu run`` counts optimizer steps as
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
