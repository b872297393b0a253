"""``torch.zion``: the zion device module, in the shape of ``torch.cuda``.

Registered by :func:`register` (run when ``zion_emu`` is imported, and by
torch's backend autoload on a bare ``import torch``).
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch

from zion_emu import _C

_native = _C.device


def is_available() -> bool:
    return True


def is_initialized() -> bool:
    return _native.initialized()


def _lazy_init() -> None:
    _native.device_count()


def device_count() -> int:
    """OAMs per node of the active platform."""
    return _native.device_count()


def current_device() -> int:
    return _native.current_device()


def _index(device: Any = None) -> int:
    if device is None:
        return current_device()
    if isinstance(device, int):
        index = device
    else:
        d = torch.device(device)
        if d.type != "zion":
            raise ValueError(f"expected a zion device, got {d}")
        index = current_device() if d.index is None else d.index
    if not 0 <= index < device_count():
        raise IndexError(f"zion: device index {index} is out of range; platform '{_native.platform_name()}' has "
                         f"{device_count()} devices per node (zion:0 .. zion:{device_count() - 1})")
    return index


def set_device(device: Any) -> None:
    _native.set_device(_index(device))


class device:
    """Context manager that makes ``device`` current, like ``torch.cuda.device``."""

    def __init__(self, device: Any) -> None:
        self.index = _index(device)
        self.previous = -1

    def __enter__(self) -> None:
        self.previous = current_device()
        set_device(self.index)

    def __exit__(self, *exc: object) -> None:
        set_device(self.previous)


def synchronize(device: Any = None) -> None:
    """The host waits until every stream of the device is done (virtual time)."""
    _native.synchronize(_index(device))


def Stream(device: Any = None, priority: int = 0) -> torch.Stream:  # noqa: N802  (torch.cuda.Stream's name)
    """A new stream on a zion device: its own virtual clock."""
    return torch.Stream(device=torch.device("zion", _index(device)), priority=priority)


def Event(enable_timing: bool = False, blocking: bool = False, interprocess: bool = False) -> torch.Event:  # noqa: N802
    """An event on the current zion device; ``elapsed_time`` is in modeled milliseconds."""
    return torch.Event(device=torch.device("zion", current_device()), enable_timing=enable_timing,
                       blocking=blocking, interprocess=interprocess)


def current_stream(device: Any = None) -> torch.Stream:
    return torch.accelerator.current_stream(torch.device("zion", _index(device)))


@contextlib.contextmanager
def stream(s: torch.Stream | None) -> Iterator[None]:
    if s is None:
        yield
        return
    previous = torch.accelerator.current_stream(s.device)
    torch.accelerator.set_stream(s)
    try:
        yield
    finally:
        torch.accelerator.set_stream(previous)


# Random numbers: each device's generator holds a CPU generator's state.
def manual_seed(seed: int) -> None:
    torch.zion.default_generators[current_device()].manual_seed(int(seed))


def manual_seed_all(seed: int) -> None:
    for g in torch.zion.default_generators:
        g.manual_seed(int(seed))


def seed() -> None:
    torch.zion.default_generators[current_device()].seed()


def seed_all() -> None:
    for g in torch.zion.default_generators:
        g.seed()


def initial_seed() -> int:
    return torch.zion.default_generators[current_device()].initial_seed()


def get_rng_state(device: Any = None) -> torch.Tensor:
    return torch.zion.default_generators[_index(device)].get_state()


def set_rng_state(new_state: torch.Tensor, device: Any = None) -> None:
    torch.zion.default_generators[_index(device)].set_state(new_state)


def get_rng_state_all() -> list[torch.Tensor]:
    return [g.get_state() for g in torch.zion.default_generators]


def set_rng_state_all(states: list[torch.Tensor]) -> None:
    for g, s in zip(torch.zion.default_generators, states):
        g.set_state(s)


# Memory, as torch.cuda reports it.
def memory_stats(device: Any = None) -> dict[str, int]:
    raw = _native.memory_stats(_index(device))
    out: dict[str, int] = {}
    for name in ("allocated_bytes", "reserved_bytes", "active_bytes", "requested_bytes", "allocation"):
        for field in ("current", "peak", "allocated", "freed"):
            out[f"{name}.all.{field}"] = raw[name][field]
    out["num_ooms"] = raw["num_ooms"]
    out["capacity_bytes"] = raw["capacity"]
    return out


def memory_allocated(device: Any = None) -> int:
    return _native.memory_stats(_index(device))["allocated_bytes"]["current"]


def max_memory_allocated(device: Any = None) -> int:
    return _native.memory_stats(_index(device))["allocated_bytes"]["peak"]


def memory_reserved(device: Any = None) -> int:
    return _native.memory_stats(_index(device))["reserved_bytes"]["current"]


def max_memory_reserved(device: Any = None) -> int:
    return _native.memory_stats(_index(device))["reserved_bytes"]["peak"]


def reset_peak_memory_stats(device: Any = None) -> None:
    _native.reset_peak_memory_stats(_index(device))


def mem_get_info(device: Any = None) -> tuple[int, int]:
    raw = _native.memory_stats(_index(device))
    return raw["capacity"] - raw["allocated_bytes"]["current"], raw["capacity"]


def memory_summary(device: Any = None, abbreviated: bool = False) -> str:
    index = _index(device)
    s = memory_stats(index)
    gib = 1 << 30
    lines = [
        f"zion:{index} memory ({_native.platform_name()}, HBM pool; backing is host memory)",
        f"  allocated: {s['allocated_bytes.all.current'] / gib:10.3f} GiB   peak {s['allocated_bytes.all.peak'] / gib:10.3f} GiB",
        f"  reserved:  {s['reserved_bytes.all.current'] / gib:10.3f} GiB   (no caching: equals allocated)",
        f"  capacity:  {s['capacity_bytes'] / gib:10.3f} GiB   allocations live: {s['allocation.all.current']}",
        f"  out-of-memory errors: {s['num_ooms']}",
    ]
    return "\n".join(lines)


def get_amp_supported_dtype() -> list[torch.dtype]:
    return [torch.bfloat16, torch.float16]


def _is_in_bad_fork() -> bool:
    return False
