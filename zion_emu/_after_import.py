"""Runs zion's additions to another library once that library's module has
been imported, without importing it: torch.compile's inductor and torchrec /
fbgemm_gpu cost seconds to import, and a process that never uses them should
not pay for them.

``after_import(name, fn)`` calls ``fn(module)`` once: at once if the module
is already imported, else right after it first runs. One finder at the front
of ``sys.meta_path`` does it for every registered name: it finds nothing
itself, only wraps the loader the other finders give for those modules.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import threading
from types import ModuleType
from typing import Any, Callable

_lock = threading.Lock()
_pending: dict[str, list[Callable[[ModuleType], None]]] = {}
_registered: set[tuple[str, Callable[[ModuleType], None]]] = set()
_done: set[str] = set()


def after_import(name: str, fn: Callable[[ModuleType], None]) -> None:
    """Calls ``fn(module)`` once ``name`` is imported (now, if it already is).
    Several functions may wait for one module; registering the same one again
    does nothing."""
    with _lock:
        if (name, fn) in _registered:
            return
        _registered.add((name, fn))
        _pending.setdefault(name, []).append(fn)
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)
    module = sys.modules.get(name)
    # A module still running its own body is finished by its loader, which
    # calls us then.
    if module is not None and getattr(module, "__spec__", None) is not None and not _initializing(module):
        _run(name, module)


def done() -> list[str]:
    """The modules whose additions have run, so far."""
    with _lock:
        return sorted(_done)


def _initializing(module: ModuleType) -> bool:
    return bool(getattr(module.__spec__, "_initializing", False))


def _run(name: str, module: ModuleType) -> None:
    with _lock:
        fns = _pending.pop(name, [])
        if not fns:
            return
        _done.add(name)
    for fn in fns:
        fn(module)


class _Loader(importlib.abc.Loader):
    """The module's own loader, then the addition."""

    def __init__(self, loader: Any, name: str) -> None:
        self._loader = loader
        self._name = name

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        _run(self._name, module)

    def __getattr__(self, name: str) -> Any:  # get_source, get_filename, ... for tracebacks and inspect
        return getattr(self._loader, name)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name not in _pending:
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


_finder = _Finder()
