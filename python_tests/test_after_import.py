"""zion_emu._after_import: additions to a library run when it is imported,
without importing it."""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType

import pytest

from zion_emu import _after_import


@pytest.fixture
def module_dir(tmp_path: Path):
    sys.path.insert(0, str(tmp_path))
    try:
        yield tmp_path
    finally:
        sys.path.remove(str(tmp_path))


def test_every_function_waiting_for_a_module_runs_once_when_it_is_imported(module_dir: Path):
    (module_dir / "zion_after_import_probe.py").write_text("VALUE = 1\n")
    seen: list[tuple[str, int]] = []

    def first(module: ModuleType) -> None:
        seen.append(("first", module.VALUE))

    def second(module: ModuleType) -> None:
        seen.append(("second", module.VALUE))

    _after_import.after_import("zion_after_import_probe", first)
    _after_import.after_import("zion_after_import_probe", second)
    _after_import.after_import("zion_after_import_probe", first)  # again: nothing more
    assert seen == [] and "zion_after_import_probe" not in sys.modules
    try:
        import zion_after_import_probe  # noqa: F401

        assert seen == [("first", 1), ("second", 1)]
        assert "zion_after_import_probe" in _after_import.done()
        _after_import.after_import("zion_after_import_probe", first)  # already ran: not again
        assert seen == [("first", 1), ("second", 1)]

        def third(module: ModuleType) -> None:
            seen.append(("third", module.VALUE))

        _after_import.after_import("zion_after_import_probe", third)  # imported already: runs at once
        assert seen == [("first", 1), ("second", 1), ("third", 1)]
    finally:
        sys.modules.pop("zion_after_import_probe", None)
