"""The modeled machine: presets loaded by name or file with fields
overridden, read back, and the one the zion device models
(:func:`set_platform`, :func:`current_platform`)."""

from __future__ import annotations

import json
import os
import warnings
from functools import cached_property
from pathlib import Path
from typing import Any, Mapping

from zion_emu import _C

PRESET_DIR = Path(__file__).resolve().parent / "platforms"
DEFAULT_PLATFORM = "zion"

ConfigError = _C.sim.ConfigError
_C.sim.set_default_preset_dirs([str(PRESET_DIR)])


class Platform:
    """A modeled machine. ``fields`` holds every preset field as given."""

    def __init__(self, native: Any, origin: str) -> None:
        self.native = native
        self.origin = origin

    @cached_property
    def fields(self) -> dict[str, Any]:
        return json.loads(self.native.to_json())

    @property
    def name(self) -> str:
        return self.native.name

    @property
    def nodes(self) -> int:
        return self.native.nodes

    @property
    def devices_per_node(self) -> int:
        return self.native.devices_per_node

    @property
    def total_devices(self) -> int:
        return self.native.total_devices

    def get(self, path: str) -> Any:
        """A field by its dotted path, e.g. ``platform.get("oam.hbm_bytes")``
        (list items by index: ``"pcie.switches.0.oams"``). A path the platform
        does not have raises :class:`ConfigError` naming what it has there."""
        if not isinstance(path, str):
            raise TypeError(f"platform field paths are dotted strings (e.g. 'oam.hbm_bytes'), got {path!r}")
        node: Any = self.fields
        parts = path.split(".")
        for n, part in enumerate(parts):
            if isinstance(node, dict) and part in node:
                node = node[part]
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                raise ConfigError(f"platform {self.name!r}: no field {path!r}{_what_is_at(node, parts[:n])}")
        return node

    def source(self, path: str) -> str | None:
        """The citation of a field: its own entry in ``sources`` or its nearest parent's."""
        sources = self.fields.get("sources", {})
        parts = path.split(".")
        for n in range(len(parts), 0, -1):
            key = ".".join(parts[:n])
            if key in sources:
                return sources[key]
        return None

    def __repr__(self) -> str:
        return f"Platform({self.name!r}, nodes={self.nodes}, devices_per_node={self.devices_per_node})"


def _what_is_at(node: Any, parent: list[str]) -> str:
    """What ``Platform.get`` found at ``parent``, for its error: the fields there, or that it is a value."""
    at = f" (at {'.'.join(parent)!r})" if parent else ""
    if isinstance(node, dict):
        return f"{at}; allowed: {', '.join(sorted(node))}"
    if isinstance(node, list) and node:
        return f"{at}; allowed: an index 0..{len(node) - 1}"
    return f": {'.'.join(parent)!r} is {'an empty list' if isinstance(node, list) else 'a value'}, not an object"


def _override_pairs(overrides: Mapping[str, Any] | None) -> list[tuple[str, str]]:
    if overrides is not None and not isinstance(overrides, Mapping):
        raise TypeError("overrides maps dotted field paths to values, e.g. {'fabric.topology': 'ring'}; got "
                        f"{type(overrides).__name__} {overrides!r} (command-line 'path=value' strings go in "
                        "assignments=)")
    pairs = []
    for path, value in (overrides or {}).items():
        if not isinstance(path, str):
            raise ConfigError(f"override keys are dotted field paths (str), got {path!r}")
        pairs.append((path, json.dumps(value)))
    return pairs


def preset_names() -> list[str]:
    return _C.sim.preset_names(_search_dirs())


def _search_dirs() -> list[str]:
    extra = [d for d in os.environ.get("ZION_PLATFORM_PATH", "").split(":") if d]
    return extra + [str(PRESET_DIR)]


def load_platform(
    name_or_path: str | os.PathLike[str] | None = None,
    overrides: Mapping[str, Any] | None = None,
    assignments: list[str] | None = None,
) -> Platform:
    """Loads a preset (``"zion"``, ``"hgx-h100"``, ...) or a ``.json`` file.

    ``overrides`` maps dotted field paths to values
    (``{"fabric.topology": "ring"}``); ``assignments`` are command-line
    ``path=value`` strings. Without a name, ``ZION_PLATFORM`` or ``zion``.
    A wrong name, file or field raises :class:`ConfigError` naming it.
    """
    name = os.fspath(name_or_path) if name_or_path is not None else os.environ.get("ZION_PLATFORM", DEFAULT_PLATFORM)
    pairs = _override_pairs(overrides)
    if isinstance(assignments, str):
        raise TypeError(f"assignments is a list of 'path=value' strings, got the string {assignments!r}; "
                        f"pass [{assignments!r}]")
    pairs += [tuple(_C.sim.parse_override(a)) for a in assignments or []]
    native = _C.sim.load_platform(name, pairs, _search_dirs())
    return Platform(native, name)


def platform_files(name_or_path: str | os.PathLike[str]) -> list[str]:
    """The files a platform reads: the one named (a preset's file for a
    preset name) and each ``"base"`` it names in turn."""
    return list(_C.sim.platform_files(os.fspath(name_or_path), _search_dirs()))


def set_platform(platform: str | os.PathLike[str] | Platform, overrides: Mapping[str, Any] | None = None) -> Platform:
    """Makes ``platform`` (a preset name, a ``.json`` file or a loaded
    :class:`Platform`) the machine the zion device models; what
    ``ZION_PLATFORM`` does from the environment. Only before the first zion
    tensor: the HBM pools of the old platform may not hold memory, nor may its
    sockets' DDR pools (pinned buffers, tensors made under
    :func:`zion_emu.socket`), whose counts start afresh too. Clocks,
    counters and streams start afresh; formulas registered with
    :func:`zion_emu.cost.register` carry over."""
    # The device module and the op cost registry sit above this module (they
    # price on a platform), so they are told here that it changed rather than
    # imported at the top.
    from zion_emu import cost
    from zion_emu import device as zion_device

    if isinstance(platform, Platform):
        if overrides:
            raise ValueError("zion: set_platform takes overrides only with a preset name or file; a loaded Platform "
                             "already has its fields (use load_platform(name, overrides=...))")
        chosen = platform
    else:
        chosen = load_platform(platform, overrides)
    _warn_if_replacing_the_runs(chosen)
    _C.device.set_platform(chosen.native)
    zion_device._forget_default_generators()
    cost._register_all()
    return chosen


def _warn_if_replacing_the_runs(chosen: Platform) -> None:
    """Under ``zion-emu run`` (which sets ``ZION_RUN_DIR``), a script that
    sets another platform than the run's own ``--platform`` and ``--set``
    chose is told so: the rank models the script's, and the report names it."""
    run_platform = os.environ.get("ZION_PLATFORM") if os.environ.get("ZION_RUN_DIR") else None
    if not run_platform:
        return
    try:
        run = load_platform(run_platform)
    except ConfigError:
        return  # not the run's file: the launcher checked it before starting the script
    if run.fields != chosen.fields:
        warnings.warn(f"zion: set_platform replaces the platform `zion-emu run` chose ('{run.name}', from its --platform "
                      f"and --set) with '{chosen.name}'; this rank now models '{chosen.name}', and the run's report "
                      "names the platform the ranks ran on", stacklevel=3)


def current_platform() -> Platform:
    """The platform the zion device models (a copy: changing it changes nothing)."""
    native = _C.device.platform()
    return Platform(native, native.name)
