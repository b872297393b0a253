"""The hardware model from Python: collectives, topology, link model, op cost.

Everything in the native ``zion_emu._C.sim`` is re-exported here.
"""

from __future__ import annotations

import threading
import weakref
from typing import Sequence

from zion_emu import _C
from zion_emu._C.sim import *  # noqa: F401,F403  (the native model's public names)
from zion_emu.platform import Platform

_models: "weakref.WeakKeyDictionary[Platform, _C.sim.CollectiveModel]" = weakref.WeakKeyDictionary()
_models_lock = threading.Lock()


def collective_model(platform: Platform) -> "_C.sim.CollectiveModel":
    """The (cached) collective model of a platform."""
    with _models_lock:
        model = _models.get(platform)
        if model is None:
            model = _C.sim.CollectiveModel(platform.native)
            _models[platform] = model
        return model


def _devices(ranks: int | Sequence[int]) -> list[int]:
    if isinstance(ranks, int):
        if ranks < 1:
            raise ValueError(f"ranks must be >= 1, got {ranks}")
        return list(range(ranks))
    return [int(r) for r in ranks]


def collective(
    platform: Platform,
    op: str,
    nbytes: float,
    ranks: int | Sequence[int],
    algo: str = "auto",
    link_model: str = "fair",
    root: int = 0,
    all_to_all_bytes: Sequence[Sequence[float]] | None = None,
    force_simulation: bool = False,
) -> "_C.sim.CollectiveResult":
    """Times one collective; the result has time (s), algbw, busbw (bytes/s) and the algorithm used.
    ``op``, ``algo`` and ``link_model`` are names of ``collective_op_names()``,
    ``algorithm_names()`` and ``link_model_names()``."""
    return collective_model(platform).run(
        op, float(nbytes), _devices(ranks), algo, link_model, root,
        [list(map(float, row)) for row in all_to_all_bytes] if all_to_all_bytes else [],
        force_simulation,
    )


def collective_time(
    platform: Platform,
    op: str,
    nbytes: float,
    ranks: int | Sequence[int],
    algo: str = "auto",
    link_model: str = "fair",
) -> float:
    """Seconds one collective takes. ``ranks``: a count n (devices 0..n-1,
    node-major, OAM-minor) or a list of global device ids."""
    return collective(platform, op, nbytes, ranks, algo, link_model).time
