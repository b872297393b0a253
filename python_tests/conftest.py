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
