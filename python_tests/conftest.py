"""Shared fixtures: platforms with round numbers, so tests can work closed forms by hand."""

from __future__ import annotations

from typing import Any, Callable

import pytest

import zion_emu
from zion_emu.platform import Platform

GB = 1e9
GIB = 1 << 30


@pytest.fixture
def platform() -> Callable[..., Platform]:
    """``platform("zion", **{"fabric.topology": "ring"})``: a preset with
    overrides, and no fixed collective latency unless a test asks for one."""

    def make(name: str = "zion", **overrides: Any) -> Platform:
        merged = {"collectives.base_latency_ns": 0}
        merged.update(overrides)
        return zion_emu.load_platform(name, overrides=merged)

    return make


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--first-case-of-slow", action="store_true",
        help="of a slow test parametrized several ways, run only its first slow case (make sanitize: every test "
             "function runs, on the sanitized build, in the time CI allows)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.getoption("--first-case-of-slow"):
        return
    seen: set[tuple[str, str]] = set()
    kept: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    for item in items:
        if item.get_closest_marker("slow") is not None:
            function = (str(item.path), getattr(item, "originalname", item.name))
            if function in seen:
                dropped.append(item)
                continue
            seen.add(function)
        kept.append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept
