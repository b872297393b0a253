"""``torch.zion``: the zion device module, in the shape of ``torch.cuda``.

Registered by :func:`register` (run when ``zion_emu`` is imported, and by
torch's backend autoload on a bare ``import torch``).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping

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
    """OAMs per node of the active platform. Like ``torch.cuda.device_count``,
    it does not initialize the device (``is_initialized`` stays False)."""
    return _native.device_count_unstarted()


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
    """Sets the current device; a negative index does nothing, as in
    ``torch.cuda.set_device``."""
    if isinstance(device, int) and device < 0:
        return
    _native.set_device(_index(device))


# What a script reading torch.cuda's compute capability from a zion device's
# properties is told (an AttributeError, so getattr(props, "major", 0) works).
_NO_CAPABILITY = ("zion: an OAM has no CUDA compute capability (major, minor); what it runs fast is in "
                  "peak_flops (e.g. 'bf16' in props.peak_flops)")


@dataclass(frozen=True)
class DeviceProperties:
    """One zion device (an OAM of the platform), as ``get_device_properties``
    reports it; every number comes from the platform preset."""

    name: str
    index: int
    total_memory: int  # HBM bytes (oam.hbm_bytes)
    hbm_bandwidth_bytes_per_s: float
    # FLOP/s by the preset's dtype names: fp32, tf32, bf16, fp16, int8.
    peak_flops: Mapping[str, float] = field(hash=False)
    launch_overhead_s: float
    platform: str
    # The model prices an OAM as one roofline, not as a grid of cores; code
    # that sizes work by torch.cuda's multi_processor_count sees one.
    multi_processor_count: int = 1

    @property
    def major(self) -> int:
        raise AttributeError(_NO_CAPABILITY)

    @property
    def minor(self) -> int:
        raise AttributeError(_NO_CAPABILITY)

    def peak_flops_for(self, dtype: torch.dtype) -> float:
        """Peak FLOP/s for a torch dtype (float32 is fp32, not tf32)."""
        names = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16", torch.int8: "int8",
                 torch.uint8: "int8"}
        if dtype not in names:
            raise ValueError(f"zion: the platform has no peak FLOP/s for {dtype}; "
                             f"it prices {sorted(set(names.values()))}")
        return self.peak_flops[names[dtype]]


def get_device_properties(device: Any = None) -> DeviceProperties:
    index = _index(device)
    unit = _native.compute_unit()
    platform = _native.platform()
    return DeviceProperties(
        name=get_device_name(index),
        index=index,
        total_memory=platform.hbm_bytes,
        hbm_bandwidth_bytes_per_s=unit.memory_bandwidth,
        peak_flops=dict(unit.peak_flops),
        launch_overhead_s=unit.launch_overhead,
        platform=platform.name,
    )


def get_device_name(device: Any = None) -> str:
    _index(device)
    return f"{_native.platform_name()} OAM"


class device:
    """Context manager that makes ``device`` current, like
    ``torch.cuda.device``; -1 or None does nothing, as there."""

    def __init__(self, device: Any) -> None:
        self.index = -1 if device is None or (isinstance(device, int) and device == -1) else _index(device)
        self.previous = -1

    def __enter__(self) -> None:
        if self.index >= 0:
            self.previous = current_device()
            set_device(self.index)

    def __exit__(self, *exc: object) -> None:
        if self.index >= 0:
            set_device(self.previous)


def synchronize(device: Any = None) -> None:
    """The host waits until every stream of the device is done (virtual time).
    Before the device has started nothing was issued: it returns at once and
    leaves the device unstarted (torch.profiler calls it at every exit)."""
    if device is None and not _native.initialized():
        return
    _native.synchronize(_index(device))


class _OnZion(type):
    """torch.zion.Stream and Event are classes, as torch.cuda's are, for
    ``isinstance`` and annotations; calling one makes torch's generic
    torch.Stream or torch.Event on a zion device (``_make``), and every such
    object on a zion device is an instance."""

    _generic: type

    def __instancecheck__(cls, obj: Any) -> bool:
        return isinstance(obj, cls._generic) and torch.device(obj.device).type == "zion"

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        return cls._make(*args, **kwargs)  # type: ignore[attr-defined]


class Stream(metaclass=_OnZion):
    """A new stream on a zion device: its own virtual clock."""

    _generic = torch.Stream

    @staticmethod
    def _make(device: Any = None, priority: int = 0) -> torch.Stream:
        return torch.Stream(device=torch.device("zion", _index(device)), priority=priority)


class Event(metaclass=_OnZion):
    """An event on the current zion device; ``elapsed_time`` is in modeled milliseconds."""

    _generic = torch.Event

    @staticmethod
    def _make(enable_timing: bool = False, blocking: bool = False, interprocess: bool = False) -> torch.Event:
        if interprocess:
            # CUDA shares such an event through ipc_handle(); zion memory is
            # not shared between processes, so no other process could wait on it.
            raise ValueError("zion: interprocess events are not supported: zion tensors are not shared between "
                             "processes (one sent to another process is refused), so no other process has work "
                             "to wait on; use interprocess=False")
        return torch.Event(device=torch.device("zion", current_device()), enable_timing=enable_timing,
                           blocking=blocking, interprocess=interprocess)


def current_stream(device: Any = None) -> torch.Stream:
    return torch.accelerator.current_stream(torch.device("zion", _index(device)))


@contextlib.contextmanager
def stream(s: torch.Stream | None) -> Iterator[None]:
    if s is None:
        yield
        return
    # torch.Stream's own context, as torch.cuda.stream's: makes s and its
    # device current, then restores the device and that device's stream
    # (torch.accelerator.set_stream alone would leave s's device current).
    with s:
        yield


class StreamContext:
    """``torch.cuda.StreamContext``: makes ``stream`` current inside the block
    (and its device), then restores both; None does nothing."""

    def __init__(self, stream: torch.Stream | None) -> None:
        self.stream = stream
        self._context: contextlib.AbstractContextManager[None] | None = None

    def __enter__(self) -> None:
        self._context = stream(self.stream)
        self._context.__enter__()

    def __exit__(self, *exc: Any) -> None:
        assert self._context is not None
        self._context.__exit__(*exc)
        self._context = None


def default_stream(device: Any = None) -> torch.Stream:
    """The device's default stream (stream 0), which ops use unless a stream
    context or ``set_stream`` chose another."""
    current = current_stream(device)
    return torch.Stream(stream_id=0, device_index=current.device_index, device_type=current.device_type)


def set_stream(s: torch.Stream) -> None:
    """Makes ``s`` the current stream of its device (``torch.cuda.set_stream``)."""
    torch.accelerator.set_stream(s)


def is_current_stream_capturing() -> bool:
    """Always False: zion has no stream capture (CUDA graphs)."""
    return False


class device_of(device):  # noqa: N801  (torch.cuda.device_of)
    """Makes the device of ``obj`` current inside the block; a tensor not on
    zion does nothing."""

    def __init__(self, obj: torch.Tensor) -> None:
        super().__init__(obj.get_device() if obj.device.type == "zion" else -1)


# Random numbers: each device's default generator holds a CPU generator's
# state, so a seed draws the same numbers on zion as on the CPU.
def _default_generators() -> tuple[torch.Generator, ...]:
    """The generators ATen's random ops on zion use (not copies), built on
    first use so that set_platform can still change the device count."""
    generators = globals().get("default_generators")
    if generators is None:
        generators = tuple(torch.ops.zion.default_generator(i) for i in range(device_count()))
        globals()["default_generators"] = generators
    return generators


def _forget_default_generators() -> None:
    """Called by :func:`zion_emu.set_platform`: the next use builds one
    generator per device of the new platform."""
    globals().pop("default_generators", None)


def _get_generator(device: Any = None) -> torch.Generator:
    return _default_generators()[_index(device)]


def manual_seed(seed: int) -> None:
    _default_generators()[current_device()].manual_seed(int(seed))


def manual_seed_all(seed: int) -> None:
    for g in _default_generators():
        g.manual_seed(int(seed))


def seed() -> None:
    _default_generators()[current_device()].seed()


def seed_all() -> None:
    for g in _default_generators():
        g.seed()


def initial_seed() -> int:
    return _default_generators()[current_device()].initial_seed()


def get_rng_state(device: Any = None) -> torch.Tensor:
    return _default_generators()[_index(device)].get_state()


def set_rng_state(new_state: torch.Tensor, device: Any = None) -> None:
    _default_generators()[_index(device)].set_state(new_state)


def get_rng_state_all() -> list[torch.Tensor]:
    return [g.get_state() for g in _default_generators()]


def set_rng_state_all(states: list[torch.Tensor]) -> None:
    for g, s in zip(_default_generators(), states):
        g.set_state(s)


# Memory, as torch.cuda reports it.
def memory_stats(device: Any = None) -> dict[str, int]:
    """torch.cuda.memory_stats' keys (from the same allocator statistics
    torch.accelerator reads; ``small_pool`` counts the requests of up to
    1 MiB, ``large_pool`` the larger, as CUDA's caching allocator would
    serve them, and the two add up to ``all``), plus ``capacity_bytes``: the
    device's HBM; and
    beside it the DDR of every CPU socket (pinned memory and tensors placed
    by zion_emu.socket): ``ddr.socket_<i>.{in_use,peak,capacity}_bytes``."""
    index = _index(device)
    out = dict(torch.accelerator.memory_stats(index))
    out["capacity_bytes"] = _native.memory_stats(index)["capacity"]
    out.update(_ddr_stats())
    return out


def _ddr_stats() -> dict[str, int]:
    host = _C.host_memory
    out = {}
    for s in range(host.sockets()):
        ddr = host.stats(s)
        out[f"ddr.socket_{s}.in_use_bytes"] = ddr["in_use"]
        out[f"ddr.socket_{s}.peak_bytes"] = ddr["peak"]
        out[f"ddr.socket_{s}.capacity_bytes"] = ddr["capacity"]
        out[f"ddr.socket_{s}.allocations"] = ddr["allocations"]
    return out


def host_memory_stats() -> dict[str, int]:
    """The CPU sockets' DDR pools (pinned buffers, tensors placed by
    zion_emu.socket), as torch.cuda.host_memory_stats reports pinned host
    memory: ``allocated_bytes.current`` and ``allocations.current`` over all
    sockets, and each socket's ``ddr.socket_<i>.*`` as in memory_stats."""
    out = _ddr_stats()
    sockets = range(_C.host_memory.sockets())
    return {"allocated_bytes.current": sum(out[f"ddr.socket_{s}.in_use_bytes"] for s in sockets),
            "allocations.current": sum(out[f"ddr.socket_{s}.allocations"] for s in sockets), **out}


def reset_peak_host_memory_stats() -> None:
    """Every socket's DDR peak starts again from what it holds now."""
    for s in range(_C.host_memory.sockets()):
        _C.host_memory.reset_peak(s)


def memory_allocated(device: Any = None) -> int:
    return _native.memory_stats(_index(device))["allocated_bytes"]["current"]


def max_memory_allocated(device: Any = None) -> int:
    return _native.memory_stats(_index(device))["allocated_bytes"]["peak"]


def memory_reserved(device: Any = None) -> int:
    return _native.memory_stats(_index(device))["reserved_bytes"]["current"]


def max_memory_reserved(device: Any = None) -> int:
    return _native.memory_stats(_index(device))["reserved_bytes"]["peak"]


def reset_peak_memory_stats(device: Any = None) -> None:
    """The device's HBM peaks start again from what it holds now; the DDR
    peaks memory_stats also reports are reset_peak_host_memory_stats'."""
    _native.reset_peak_memory_stats(_index(device))


def reset_accumulated_memory_stats(device: Any = None) -> None:
    """The device's counts of allocations and bytes allocated and freed start again from zero."""
    torch.accelerator.reset_accumulated_memory_stats(_index(device))


def empty_cache() -> None:
    """Frees the host blocks kept for reuse by the CPU kernels of zion ops.
    The HBM pools cache nothing, so memory_reserved does not change."""
    torch.accelerator.empty_cache()


def mem_get_info(device: Any = None) -> tuple[int, int]:
    raw = _native.memory_stats(_index(device))
    return raw["capacity"] - raw["allocated_bytes"]["current"], raw["capacity"]


# The rows of torch.cuda.memory_summary's table, in its order: the stat key,
# the row's name and whether it counts bytes (else allocations).
_SUMMARY_ROWS = (
    ("allocated_bytes", "Allocated memory", True), ("active_bytes", "Active memory", True),
    ("requested_bytes", "Requested memory", True), ("reserved_bytes", "GPU reserved memory", True),
    ("inactive_split_bytes", "Non-releasable memory", True), ("allocation", "Allocations", False),
    ("active", "Active allocs", False), ("segment", "GPU reserved segments", False),
    ("inactive_split", "Non-releasable allocs", False))
_SUMMARY_OVERSIZE = (("oversize_allocations", "Oversize allocations"), ("oversize_segments", "Oversize GPU segments"))


def _summary_size(size: int, scale_by: float) -> str:
    """Bytes as torch.cuda.memory_summary prints them: the unit is the largest
    that leaves the row's first value (``scale_by``) at 768 or more of it."""
    unit = "B  "
    for next_unit in ("KiB", "MiB", "GiB", "TiB", "PiB"):
        if scale_by < 768 * 1024:
            break
        unit, size, scale_by = next_unit, size // 1024, scale_by / 1024
    return f"{size:6d} {unit}"


def _summary_count(count: int, scale_by: float) -> str:
    unit = " "
    for next_unit in ("K", "M"):
        if scale_by < 750 * 1000:
            break
        unit, count, scale_by = next_unit, count // 1000, scale_by / 1000
    return f"{count:7d} {unit} "


def memory_summary(device: Any = None, abbreviated: bool = False) -> str:
    """torch.cuda.memory_summary's table for a zion device, from
    :func:`memory_stats`: allocated, active, requested and reserved memory
    and the allocation counts, each current, at its peak, and allocated and
    freed in total; unless ``abbreviated``, split into the pool CUDA would
    serve them from (the small pool up to 1 MiB, the large above). The HBM
    pools cache nothing, so reserved equals allocated, every allocation is
    its own segment and nothing is non-releasable."""
    index = _index(device)
    stats = memory_stats(index)
    width = 75
    lines = ["=" * width, f" {'':16} PyTorch zion memory summary, device ID {index:<17d} ", "-" * width,
             f"  {'':9} zion OOMs: {stats['num_ooms']:<12d} | {'':6} zion alloc retries: "
             f"{stats['num_alloc_retries']:<8d}  ",
             "=" * width, "        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  "]
    pools = [("all", None)] if abbreviated else \
        [("all", None), ("large_pool", "      from large pool"), ("small_pool", "      from small pool")]
    for key, name, is_bytes in _SUMMARY_ROWS:
        fmt = _summary_size if is_bytes else _summary_count
        lines.append("-" * width)
        # Every row of a metric takes its unit from the metric's "all" values, as CUDA's does.
        scale = [stats[f"{key}.all.{w}"] for w in ("current", "peak", "allocated", "freed")]
        for pool, label in pools:
            values = [stats[f"{key}.{pool}.{w}"] for w in ("current", "peak", "allocated", "freed")]
            cells = " | ".join(fmt(v, s) for v, s in zip(values, scale))
            lines.append(f" {label or name:<21} | {cells} ")
    for key, name in _SUMMARY_OVERSIZE:
        lines.append("-" * width)
        values = [stats[f"{key}.{w}"] for w in ("current", "peak", "allocated", "freed")]
        lines.append(f" {name:<21} | {' | '.join(_summary_count(v, v) for v in values)} ")
    lines.append("=" * width)
    return "|" + "|\n|".join(lines) + "|\n"


def reset_max_memory_allocated(device: Any = None) -> None:
    """As ``torch.cuda.reset_max_memory_allocated``: ``reset_peak_memory_stats``."""
    reset_peak_memory_stats(device)


def reset_max_memory_cached(device: Any = None) -> None:
    """As ``torch.cuda.reset_max_memory_cached``: ``reset_peak_memory_stats``."""
    reset_peak_memory_stats(device)


def memory_stats_as_nested_dict(device: Any = None) -> dict[str, Any]:
    """``memory_stats`` with its dotted keys as nested dicts, as torch.cuda's."""
    nested: dict[str, Any] = {}
    for key, value in memory_stats(device).items():
        *path, last = key.split(".")
        node = nested
        for part in path:
            node = node.setdefault(part, {})
        node[last] = value
    return nested


def memory_snapshot(*_args: Any, **_kwargs: Any) -> list[dict[str, Any]]:
    """The segments of ``torch.zion.memory._snapshot()``, as ``torch.cuda.memory_snapshot``."""
    from zion_emu import memory

    return memory._snapshot()["segments"]


def is_bf16_supported(including_emulation: bool = True) -> bool:
    """Whether the platform's OAM has a bf16 peak (its roofline prices bf16)."""
    return "bf16" in get_device_properties().peak_flops


def get_amp_supported_dtype() -> list[torch.dtype]:
    return [torch.bfloat16, torch.float16]


def _is_in_bad_fork() -> bool:
    """True in a process forked from one that had zion loaded, as for CUDA:
    torch then leaves zion alone there (a DataLoader worker's manual_seed)."""
    return bool(_native.in_bad_fork())


def __getattr__(name: str) -> Any:
    # No torch.zion.Scheduling or *WrapperCodegen: inductor never generates
    # code for a zion device; zion_emu.inductor lowers zion graphs as CPU.
    if name == "default_generators":
        return _default_generators()
    raise AttributeError(f"module 'torch.zion' has no attribute {name!r}")
