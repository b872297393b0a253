"""Installs zion's torchrec and fbgemm_gpu support when those modules are
imported in a process where zion is registered (or at once, for those
imported before zion_emu). Importing this module imports neither library."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import threading
from types import ModuleType
from typing import Any, Callable


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


# Module -> what to install once it has run. fbgemm_gpu's __init__ loads the
# libraries that register its ops.
AFTER_IMPORT: dict[str, Callable[[ModuleType], None]] = {
    "fbgemm_gpu": _tbe,
    "fbgemm_gpu.split_table_batched_embeddings_ops_training": _dense_fbgemm,
    "torchrec.distributed.batched_embedding_kernel": _dense_torchrec,
    "torchrec.distributed.planner.types": _topology,
    "torchrec.distributed.sharding_plan": _placement,
    "torchrec.distributed.planner.planners": _planners,
}

_lock = threading.Lock()
_done: set[str] = set()


def installed() -> list[str]:
    """The modules zion's support has been installed into, so far."""
    with _lock:
        return sorted(_done)


def _install(name: str, module: ModuleType) -> None:
    with _lock:
        if name in _done:
            return
        _done.add(name)
    AFTER_IMPORT[name](module)


class _Loader(importlib.abc.Loader):
    """The module's own loader, then the installation."""

    def __init__(self, loader: Any, name: str) -> None:
        self._loader = loader
        self._name = name

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        _install(self._name, module)

    def __getattr__(self, name: str) -> Any:  # get_source, is_package, ... of the wrapped loader
        return getattr(self._loader, name)


class _AfterImportFinder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: wraps the loader the other finders give for the
    modules of AFTER_IMPORT."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name not in AFTER_IMPORT or name in _done:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _Loader(spec.loader, name)
                return spec
        return None


_finder = _AfterImportFinder()


def watch() -> None:
    """Installs into the watched modules already imported, and into the
    others when they are. Idempotent."""
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)
    for name in AFTER_IMPORT:
        module = sys.modules.get(name)
        if module is not None and getattr(module, "__spec__", None) is not None and not _initializing(module):
            _install(name, module)


def _initializing(module: ModuleType) -> bool:
    return bool(getattr(module.__spec__, "_initializing", False))
