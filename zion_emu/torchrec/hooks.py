"""Installs zion's torchrec and fbgemm_gpu support when those modules are
imported in a process where zion is registered (or at once, for those
imported before zion_emu). Importing this module imports neither library."""

from __future__ import annotations

from types import ModuleType
from typing import Callable

from zion_emu import _after_import


def _tbe(module: ModuleType) -> None:
    from zion_emu.torchrec import tbe_autograd

    tbe_autograd.install()


def _dense_fbgemm(module: ModuleType) -> None:
    from zion_emu.torchrec import dense_tables

    dense_tables.install_fbgemm(module)


def _dense_torchrec(module: ModuleType) -> None:
    from zion_emu.torchrec import dense_tables

    dense_tables.install_torchrec(module)


def _topology(module: ModuleType) -> None:
    from zion_emu.torchrec import planner

    planner.install_topology(module)


def _placement(module: ModuleType) -> None:
    from zion_emu.torchrec import planner

    planner.install_placement(module)


def _planners(module: ModuleType) -> None:
    from zion_emu.torchrec import planner

    planner.install_planners(module)


def _enumerators(module: ModuleType) -> None:
    from zion_emu.torchrec import planner

    planner.install_enumerators(module)


# Module -> what to install once it has run. fbgemm_gpu's __init__ loads the
# libraries that register its ops.
AFTER_IMPORT: dict[str, Callable[[ModuleType], None]] = {
    "fbgemm_gpu": _tbe,
    "fbgemm_gpu.split_table_batched_embeddings_ops_training": _dense_fbgemm,
    "torchrec.distributed.batched_embedding_kernel": _dense_torchrec,
    "torchrec.distributed.planner.types": _topology,
    "torchrec.distributed.sharding_plan": _placement,
    "torchrec.distributed.planner.planners": _planners,
    "torchrec.distributed.planner.enumerators": _enumerators,
}


def installed() -> list[str]:
    """The modules zion's support has been installed into, so far."""
    return [name for name in _after_import.done() if name in AFTER_IMPORT]


def watch() -> None:
    """Installs into the watched modules already imported, and into the
    others when they are. Idempotent."""
    for name, fn in AFTER_IMPORT.items():
        _after_import.after_import(name, fn)
