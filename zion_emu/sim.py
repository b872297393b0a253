"""The hardware model from Python: collectives, topology, link model, op cost.

Everything in the native ``zion_emu._C.sim`` is re-exported here.
"""

from __future__ import annotations

import operator
import threading
import weakref
from collections.abc import Iterable
from typing import Sequence

from zion_emu import _C
from zion_emu._C.sim import *  # noqa: F401,F403  (the native model's public names)
from zion_emu.platform import Platform

_models: "weakref.WeakKeyDictionary[Platform, _C.sim.CollectiveModel]" = weakref.WeakKeyDictionary()
_models_lock = threading.Lock()


def collective_model(platform: Platform) -> "_C.sim.CollectiveModel":
    """The (cached) collective model of a platform."""
    if not isinstance(platform, Platform):
        raise TypeError(f"expected a Platform (zion_emu.load_platform(name)), got {type(platform).__name__} "
                        f"{platform!r}")
    with _models_lock:
        model = _models.get(platform)
        if model is None:
            model = _C.sim.CollectiveModel(platform.native)
            _models[platform] = model
        return model


def _devices(ranks: int | Sequence[int]) -> list[int]:
    """``ranks`` as device ids: a count n (devices 0..n-1) or the ids themselves."""
    if isinstance(ranks, Iterable) and not isinstance(ranks, (str, bytes)):
        ids = list(ranks)
        try:
            return [operator.index(r) for r in ids]
        except TypeError:
            raise TypeError(f"ranks must be device ids (integers), got {ids!r}") from None
    try:
        count = operator.index(ranks)
    except TypeError:
        raise TypeError(f"ranks must be a device count (an integer) or a list of device ids, "
                        f"got {type(ranks).__name__} {ranks!r}") from None
    if count < 1:
        raise ValueError(f"ranks must be >= 1, got {count}")
    return list(range(count))


def _peer_bytes(all_to_all_bytes: Sequence[Sequence[float]] | None, ranks: int) -> list[list[float]]:
    """``all_to_all_bytes`` as rows of floats ([] when not given); its shape is the model's to check."""
    if all_to_all_bytes is None:
        return []
    rows = list(all_to_all_bytes)
    for i, row in enumerate(rows):
        if not isinstance(row, Iterable) or isinstance(row, (str, bytes)):
            raise TypeError(f"all_to_all_bytes must be a {ranks}x{ranks} matrix, row i the bytes rank i sends to "
                            f"each rank; row {i} is {row!r}")
    return [[float(b) for b in row] for row in rows]


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
    model = collective_model(platform)
    devices = _devices(ranks)
    return model.run(op, float(nbytes), devices, algo, link_model, root,
                     _peer_bytes(all_to_all_bytes, len(devices)), force_simulation)


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
