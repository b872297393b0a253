"""Runs scripts written for CUDA on zion, unmodified: after :func:`enable`,
"cuda" means the zion device, the way GPU-migration layers of other
accelerators (Gaudi's ``gpu_migration``, Ascend's ``transfer_to_npu``,
ipex's xpu hijacks) map CUDA calls to their device.

What is remapped, in this process and every process started from it
(opt-in; nothing changes until :func:`enable`, which sets ``ZION_CUDA_COMPAT=1``
in the environment: a child that loads zion_emu, as torch's backend autoload
does on ``import torch``, enables it too -- ``mp.spawn`` ranks, spawned
DataLoader workers):
- device strings ``"cuda"`` / ``"cuda:N"`` and ``torch.device("cuda", N)``
  wherever a device is taken: ``torch.device(...)`` itself (construction
  returns a zion device; ``isinstance(x, torch.device)`` still holds), tensor
  factories (``device=``), ``Tensor.to/.cuda/.new_*/.type``, ``Module.to/.cuda/
  .to_empty``, ``torch.load(map_location=...)`` (and checkpoints saved on CUDA,
  whose storages restore to the zion device of the same index),
  ``torch.Generator(device=...)``, ``torch.set_default_device``;
- ``torch.cuda``: availability, devices, streams, events, synchronize, seeds
  and RNG state, memory statistics, device properties and name, the legacy
  typed constructors (``torch.cuda.FloatTensor(...)``), ``torch.cuda.amp``;
- ``Tensor.is_cuda`` is true for zion tensors when read by the script (torch's
  own code still sees False, so it takes no CUDA-only kernel path);
- ``torch.autocast("cuda")`` / ``torch.amp.GradScaler("cuda")``;
- the ``nccl`` backend (and ``backend=None``) of ``init_process_group``,
  ``new_group``, ``new_subgroups``; ``init_device_mesh("cuda", ...)``;
- profiler ``use_cuda`` / ``ProfilerActivity.CUDA``: the zion device's events
  (``ProfilerActivity.PrivateUse1``, see :mod:`zion_emu.profiler`);
- ``torch.cuda.comm`` and ``torch._C._broadcast_coalesced``: zion's
  (:mod:`zion_emu.comm`, ``torch.zion.comm``), which ``nn.DataParallel``
  reaches through ``torch.nn.parallel.comm`` with or without cuda-compat;
- ``torch.cuda.nvtx`` ranges are ``record_function`` ranges (they show in a
  torch.profiler trace), marks do nothing; ``torch.cuda.profiler.start/stop``
  and ``torch.autograd.profiler.emit_nvtx`` do nothing;
  ``torch.cuda.set_sync_debug_mode`` is kept and read back;
- ``CUDA_VISIBLE_DEVICES``: ``0,1,...,k-1`` shows zion:0..k-1 as
  cuda:0..k-1, ``""`` none; a list that would renumber the devices is refused
  (ValueError naming the variable).

CUDA-only calls with no zion equivalent (CUDA graphs, ``torch.cuda.nccl``,
the other comm kernels of ``torch._C``, compute capability, NVML queries,
``Stream.cuda_stream``, ``ExternalStream``, ``torch.cuda.tunable``, ...)
raise :class:`CudaOnlyError` naming the call.
cuDNN flags (``torch.backends.cudnn.*``) are left alone: setting them does
nothing on zion.

:func:`enable` returns the process's :class:`CompatReport`, which counts the
calls it remapped by name.
"""

from __future__ import annotations

import collections
import functools
import os
import re
import sys
import threading
import types
from typing import Any, Callable, Iterable

import torch

from zion_emu import _after_import

ZION = "zion"
# Set by enable(): every process started from this one (mp.spawn ranks, spawned
# DataLoader workers, subprocesses) enables cuda-compat when it loads zion_emu
# (torch's backend autoload does on `import torch`).
ENV = "ZION_CUDA_COMPAT"


class CudaOnlyError(RuntimeError):
    """A CUDA-only call that zion cannot stand in for."""


class CompatReport:
    """What the CUDA compatibility layer remapped in this process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: collections.Counter[str] = collections.Counter()
        self.patched: list[str] = []  # every name enable() replaced

    def record(self, name: str) -> None:
        with self._lock:
            self._counts[name] += 1

    def remapped(self) -> dict[str, int]:
        """Calls that went to zion instead of CUDA: name -> count."""
        with self._lock:
            return dict(sorted(self._counts.items()))

    def __str__(self) -> str:
        counts = self.remapped()
        if not counts:
            return "cuda-compat: nothing remapped"
        width = max(map(len, counts))
        return "\n".join(["cuda-compat: calls remapped to zion"] + [f"  {k:<{width}}  {v}" for k, v in counts.items()])


_report = CompatReport()
_enabled = False
_TorchDevice = torch._C.device  # the C type; torch.device is replaced by a wrapper
_TorchGenerator = torch._C.Generator


def report() -> CompatReport:
    return _report


def enabled() -> bool:
    return _enabled


def _cuda_only(call: str, instead: str = "") -> Callable[..., Any]:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise CudaOnlyError(f"{call} is CUDA-only and has no zion equivalent (cuda-compat maps CUDA to the zion "
                            f"device){'; ' + instead if instead else ''}")

    refuse.__name__ = call.rsplit(".", 1)[-1]
    return refuse


# Devices.
def _zion_str(device: str) -> str | None:
    """``"cuda"`` -> ``"zion"``, ``"cuda:3"`` -> ``"zion:3"``; None if not a CUDA string."""
    if device == "cuda":
        return ZION
    if device.startswith("cuda:"):
        return ZION + device[4:]
    return None


# CUDA_VISIBLE_DEVICES, read once by enable() as CUDA reads it at its start:
# the script sees zion:0..k-1 as cuda:0..k-1 (None: every zion device).
VISIBLE_ENV = "CUDA_VISIBLE_DEVICES"
_visible: int | None = None
_visible_value = ""


def _parse_visible(value: str, n: int) -> int:
    """How many of ``n`` devices ``CUDA_VISIBLE_DEVICES=value`` shows, read as
    CUDA reads it: ordinals up to the first that is negative, unparsable or
    past the devices; a repeated one shows none. A list that is not 0, 1, ...
    would renumber the devices (cuda:0 another zion device than zion:0), which
    cuda-compat cannot do: ValueError naming the variable."""
    if value.strip().startswith(("GPU-", "MIG-")):
        raise ValueError(f"{VISIBLE_ENV}={value!r}: zion devices have no UUIDs; cuda-compat honours a list of "
                         f"ordinals 0,1,...,k-1 (the first k of zion's {n} devices) or '' (none); unset it to see all")
    ordinals: list[int] = []
    for elem in value.split(","):
        number = re.match(r"[+-]?[0-9]+", elem.strip())  # as strtoul: "1gpu" is 1
        x = int(number.group()) if number else -1
        if x in ordinals:
            return 0
        if x < 0 or x >= n:
            break
        ordinals.append(x)
    if ordinals != list(range(len(ordinals))):
        raise ValueError(f"{VISIBLE_ENV}={value!r} would make cuda:0 zion:{ordinals[0]}, and cuda-compat cannot "
                         f"renumber zion's devices: it honours 0,1,...,k-1 (the first k of zion's {n} devices) or "
                         f"'' (none); unset it to see all {n}")
    return len(ordinals)


def _check_visible(index: int | None) -> None:
    """Refuses a CUDA device index CUDA_VISIBLE_DEVICES hides (None: the current one)."""
    if _visible is None or (index is not None and 0 <= index < _visible) or (index is None and _visible > 0):
        return
    if _visible == 0:
        raise RuntimeError(f"No CUDA GPUs are available (cuda-compat: {VISIBLE_ENV}={_visible_value!r} hides every "
                           "device)")
    raise RuntimeError(f"CUDA error: invalid device ordinal: cuda:{index} (cuda-compat: {VISIBLE_ENV}="
                       f"{_visible_value!r} shows cuda:0..cuda:{_visible - 1})")


def _cuda_device_count() -> int:
    n = torch.zion.device_count()
    return n if _visible is None else min(n, _visible)


def translate(device: Any, where: str | None = None) -> Any:
    """The zion device standing for ``device`` when it names CUDA (a string
    or a torch.device); anything else unchanged. Counts the remap under
    ``where`` when given."""
    cls = device.__class__
    if cls is str:
        mapped = _zion_str(device)
    elif cls is _TorchDevice and device.type == "cuda":
        mapped = _TorchDevice(ZION, device.index) if device.index is not None else _TorchDevice(ZION)
    else:
        return device
    if mapped is None:
        return device
    if _visible is not None:
        _check_visible(_TorchDevice(mapped).index)
    if where:
        _report.record(where)
    return mapped


def _index(device: Any) -> int | None:
    """A device argument of a torch.cuda function as a zion index (None: current)."""
    if device is None or isinstance(device, int):
        if _visible is not None and (device is None or device >= 0):
            _check_visible(device)
        return device
    d = _TorchDevice(translate(device))
    if d.type != ZION:
        raise ValueError(f"cuda-compat: expected a CUDA device (mapped to zion), got {device!r}")
    if _visible is not None:
        _check_visible(d.index)
    return d.index


class _Alias(type):
    """Metaclass of a stand-in for a C type (torch.device, torch.Generator):
    calling it translates the arguments and builds the C type; isinstance and
    issubclass checks and class attributes go to the C type."""

    def __instancecheck__(cls, obj: Any) -> bool:
        return isinstance(obj, cls.__wrapped__)

    def __subclasscheck__(cls, sub: type) -> bool:
        return issubclass(sub, cls.__wrapped__)

    def __getattr__(cls, name: str) -> Any:
        return getattr(cls.__wrapped__, name)

    # Equal to the C type, with its hash: tables keyed by it (torch.fx's
    # builtins, dynamo's rules) find the stand-in too.
    def __eq__(cls, other: object) -> bool:
        return other is cls or other is cls.__wrapped__

    def __ne__(cls, other: object) -> bool:
        return not (other is cls or other is cls.__wrapped__)

    def __hash__(cls) -> int:
        return hash(cls.__wrapped__)


class _DeviceMeta(_Alias):
    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        mapped = None
        if args and args[0].__class__ is str:
            mapped = _zion_str(args[0])
            if mapped is not None:
                _report.record("torch.device('cuda')")
                args = (mapped, *args[1:])
        elif kwargs.get("type") is not None and kwargs["type"].__class__ is str:
            mapped = _zion_str(kwargs["type"])
            if mapped is not None:
                _report.record("torch.device('cuda')")
                kwargs["type"] = mapped
        d = _TorchDevice(*args, **kwargs)
        if mapped is not None and _visible is not None:  # a CUDA device CUDA_VISIBLE_DEVICES may hide
            _check_visible(d.index)
        return d


class _GeneratorMeta(_Alias):
    def __call__(cls, device: Any = "cpu") -> Any:
        return _TorchGenerator(device=translate(device, "torch.Generator(device=cuda)"))


class _Factory(_Alias):
    """A stand-in class whose call is a factory function (``_make``)."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        return cls._make(*args, **kwargs)


def _device_kwarg(fn: Callable[..., Any], where: str, key: str = "device") -> Callable[..., Any]:
    """``fn`` with its ``device=`` (or ``key=``) keyword translated."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        d = kwargs.get(key)
        if d is not None:
            kwargs[key] = translate(d, where)
        return fn(*args, **kwargs)

    return wrapper


def _first_arg_or_kwarg(fn: Callable[..., Any], where: str, key: str) -> Callable[..., Any]:
    """``fn`` with its first positional argument or ``key=`` translated."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if args:
            args = (translate(args[0], where), *args[1:])
        elif kwargs.get(key) is not None:
            kwargs[key] = translate(kwargs[key], where)
        return fn(*args, **kwargs)

    return wrapper


def _patch(owner: Any, name: str, value: Any, label: str) -> None:
    setattr(owner, name, value)
    _report.patched.append(label)


def _zion_device_of(device: Any) -> "torch.device":
    """The zion device a ``.cuda(device)`` call means."""
    index = _index(device)
    return _TorchDevice(ZION, torch.zion.current_device() if index is None else index)


def _patch_devices() -> None:
    torch.device = _DeviceMeta("device", (), {"__wrapped__": _TorchDevice, "__module__": "torch",
                                              "__doc__": _TorchDevice.__doc__})
    _report.patched.append("torch.device")
    # A device pickles as a call of torch.device (the stand-in, found under the
    # same name), so torch.save and weights_only loads keep working.
    import copyreg
    copyreg.dispatch_table[_TorchDevice] = lambda d: (
        torch.device, (d.type,) if d.index is None else (d.type, d.index))
    torch.Generator = _GeneratorMeta("Generator", (), {"__wrapped__": _TorchGenerator, "__module__": "torch",
                                                         "__doc__": _TorchGenerator.__doc__})
    _report.patched.append("torch.Generator")

    from torch.utils._device import _device_constructors
    for fn in _device_constructors():
        name = getattr(fn, "__name__", None)
        if name and getattr(torch, name, None) is fn:
            _patch(torch, name, _device_kwarg(fn, f"torch.{name}(device=cuda)"), f"torch.{name}")
    _patch(torch, "set_default_device", _first_arg_or_kwarg(torch.set_default_device, "torch.set_default_device",
                                                            "device"), "torch.set_default_device")

    T = torch.Tensor
    for name in ("new_empty", "new_zeros", "new_ones", "new_full", "new_tensor", "new_empty_strided"):
        _patch(T, name, _device_kwarg(getattr(T, name), f"Tensor.{name}(device=cuda)"), f"Tensor.{name}")
    _tensor_to = T.to

    @functools.wraps(_tensor_to)
    def to(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        if args:
            args = (translate(args[0], "Tensor.to(cuda)"), *args[1:])
        d = kwargs.get("device")
        if d is not None:
            kwargs["device"] = translate(d, "Tensor.to(cuda)")
        return _tensor_to(self, *args, **kwargs)

    _patch(T, "to", to, "Tensor.to")

    def cuda(self: torch.Tensor, device: Any = None, non_blocking: bool = False,
             memory_format: torch.memory_format = torch.preserve_format) -> torch.Tensor:
        _report.record("Tensor.cuda")
        return _tensor_to(self, _zion_device_of(device), non_blocking=non_blocking, memory_format=memory_format)

    _patch(T, "cuda", cuda, "Tensor.cuda")
    _is_cuda = torch._C.TensorBase.is_cuda

    def is_cuda(self: torch.Tensor) -> bool:
        if _is_cuda.__get__(self):
            return True
        # torch's own code asks is_cuda to pick CUDA-only kernels: it sees the truth.
        caller = sys._getframe(1).f_globals.get("__name__", "")
        if caller == "torch" or caller.startswith("torch."):
            return False
        return self.device.type == ZION

    _patch(T, "is_cuda", property(is_cuda, doc="True on zion tensors, seen from the script (cuda-compat)."),
           "Tensor.is_cuda")
    _tensor_type = T.type

    def type_(self: torch.Tensor, dtype: Any = None, non_blocking: bool = False, **kwargs: Any) -> Any:
        if isinstance(dtype, _LegacyType):
            dtype = "torch.cuda." + dtype.__name__
        if isinstance(dtype, str) and dtype.startswith("torch.cuda."):
            legacy = _LEGACY.get(dtype[len("torch.cuda."):])
            if legacy is None:
                raise ValueError(f"cuda-compat: unknown tensor type {dtype!r}; known: "
                                 f"{sorted('torch.cuda.' + n for n in _LEGACY)}")
            _report.record("Tensor.type(torch.cuda.*)")
            return _tensor_to(self, _zion_device_of(None), legacy, non_blocking=non_blocking)
        return _tensor_type(self, dtype, non_blocking, **kwargs)

    _patch(T, "type", functools.wraps(_tensor_type)(type_), "Tensor.type")

    M = torch.nn.Module
    _module_to = M.to

    @functools.wraps(_module_to)
    def module_to(self: torch.nn.Module, *args: Any, **kwargs: Any) -> torch.nn.Module:
        if args:
            args = (translate(args[0], "Module.to(cuda)"), *args[1:])
        if kwargs.get("device") is not None:
            kwargs["device"] = translate(kwargs["device"], "Module.to(cuda)")
        return _module_to(self, *args, **kwargs)

    _patch(M, "to", module_to, "Module.to")

    def module_cuda(self: torch.nn.Module, device: Any = None) -> torch.nn.Module:
        _report.record("Module.cuda")
        return _module_to(self, _zion_device_of(device))

    _patch(M, "cuda", module_cuda, "Module.cuda")
    _patch(M, "to_empty", _device_kwarg(M.to_empty, "Module.to_empty(device=cuda)"), "Module.to_empty")

    _load = torch.load

    @functools.wraps(_load)
    def load(f: Any, map_location: Any = None, *args: Any, **kwargs: Any) -> Any:
        return _load(f, _map_location(map_location), *args, **kwargs)

    _patch(torch, "load", load, "torch.load")


def _map_location(map_location: Any) -> Any:
    """torch.load's map_location with CUDA places turned into zion ones; for
    None, storages saved on ``cuda:i`` restore to ``zion:i``. A dict names
    saved locations: those it leaves out restore as for None (on CUDA they stay
    on their saved device), and a key ``cuda:i`` also names ``zion:i``, the tag
    of a checkpoint saved under cuda-compat."""
    if map_location is None or isinstance(map_location, dict):
        n = _cuda_device_count()
        locations = _CudaLocations({**{f"cuda:{i}": f"{ZION}:{i}" for i in range(n)}, "cuda": ZION})
        if map_location is None:
            return locations
        given = {k: translate(v, "torch.load(map_location=cuda)") for k, v in map_location.items()}
        for key, value in given.items():
            zion_key = _zion_str(key) if isinstance(key, str) else None
            if zion_key is not None and zion_key not in given:
                locations[zion_key] = value
        locations.update(given)
        return locations
    return translate(map_location, "torch.load(map_location=cuda)")


class _CudaLocations(dict):
    """A map_location that counts what it remapped."""

    def get(self, key: Any, default: Any = None) -> Any:
        if key in self and isinstance(key, str) and key.startswith("cuda"):
            _report.record("torch.load(cuda storage)")
        return super().get(key, default)


# Legacy typed constructors: torch.cuda.FloatTensor(2, 3), torch.cuda.LongTensor([1, 2]).
_LEGACY = {"FloatTensor": torch.float32, "DoubleTensor": torch.float64, "HalfTensor": torch.float16,
           "BFloat16Tensor": torch.bfloat16, "LongTensor": torch.int64, "IntTensor": torch.int32,
           "ShortTensor": torch.int16, "CharTensor": torch.int8, "ByteTensor": torch.uint8,
           "BoolTensor": torch.bool}


class _LegacyType(type):
    def __call__(cls, *args: Any, device: Any = None) -> torch.Tensor:
        _report.record(f"torch.cuda.{cls.__name__}")
        where = _zion_device_of(device)
        if len(args) == 1 and isinstance(args[0], torch.Tensor):
            return args[0].to(where, cls.dtype)
        if len(args) == 1 and not isinstance(args[0], int) and not isinstance(args[0], torch.Size):
            return torch._C._VariableFunctions.tensor(args[0], dtype=cls.dtype, device=where)
        size = args[0] if len(args) == 1 and isinstance(args[0], torch.Size) else args
        return torch._C._VariableFunctions.empty(size, dtype=cls.dtype, device=where)

    def __instancecheck__(cls, obj: Any) -> bool:
        return isinstance(obj, torch.Tensor) and obj.dtype == cls.dtype and obj.device.type == ZION


def _legacy_types() -> dict[str, type]:
    return {name: _LegacyType(name, (), {"dtype": dtype, "__module__": "torch.cuda"})
            for name, dtype in _LEGACY.items()}


# torch.cuda, answered by torch.zion.
def _cuda_module_functions() -> dict[str, Any]:
    z = torch.zion
    from zion_emu import memory as zion_memory

    def is_available() -> bool:
        return _cuda_device_count() > 0

    def current_device() -> int:
        _check_visible(None)
        return z.current_device()

    def get_rng_state_all() -> list[torch.Tensor]:
        return [z.get_rng_state(i) for i in range(_cuda_device_count())]

    def set_rng_state_all(new_states: Iterable[torch.Tensor]) -> None:
        for i, state in enumerate(new_states):
            z.set_rng_state(state, _index(i))

    def set_device(device: Any) -> None:
        index = _index(device)
        if index is not None and index >= 0:  # torch.cuda.set_device(-1) does nothing
            z.set_device(index)

    class device(z.device):  # noqa: N801  (torch.cuda.device)
        """torch.zion.device, taking CUDA's device names; -1 or None does nothing."""

        def __init__(self, device: Any) -> None:
            index = _index(device)
            super().__init__(-1 if index is None else index)

    def with_index(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapper(device: Any = None, *args: Any, **kwargs: Any) -> Any:
            return fn(_index(device), *args, **kwargs)

        return wrapper

    def new_stream(device: Any = None, priority: int = 0, **kwargs: Any) -> torch.Stream:
        return _cuda_stream(z.Stream(_index(device), priority))

    def stream_of(fn: Callable[..., torch.Stream]) -> Callable[..., torch.Stream]:
        @functools.wraps(fn)
        def wrapper(device: Any = None) -> torch.Stream:
            return _cuda_stream(fn(_index(device)))

        return wrapper

    # Classes to the script (isinstance, torch.cuda.Stream.wait_stream), torch's
    # generic Stream and Event on a zion device when called.
    Stream = _Factory("Stream", (), {"__wrapped__": torch.Stream, "_make": staticmethod(new_stream),
                                     "__module__": "torch.cuda"})
    Event = _Factory("Event", (), {"__wrapped__": torch.Event, "_make": staticmethod(z.Event),
                                   "__module__": "torch.cuda"})

    def set_rng_state(new_state: torch.Tensor, device: Any = "cuda") -> None:
        z.set_rng_state(new_state, _index(device))

    names: dict[str, Any] = {
        "is_available": is_available, "is_initialized": z.is_initialized, "init": z._lazy_init,
        "_lazy_init": z._lazy_init, "_is_in_bad_fork": z._is_in_bad_fork, "device_count": _cuda_device_count,
        "current_device": current_device, "set_device": set_device, "device": device, "device_of": z.device_of,
        "get_device_name": with_index(z.get_device_name), "get_device_properties": with_index(z.get_device_properties),
        "synchronize": with_index(z.synchronize), "Stream": Stream, "Event": Event,
        "current_stream": stream_of(z.current_stream), "default_stream": stream_of(z.default_stream),
        "stream": z.stream, "StreamContext": z.StreamContext,
        "set_stream": z.set_stream, "manual_seed": z.manual_seed, "manual_seed_all": z.manual_seed_all,
        "seed": z.seed, "seed_all": z.seed_all, "initial_seed": z.initial_seed,
        "get_rng_state": with_index(z.get_rng_state), "set_rng_state": set_rng_state,
        "get_rng_state_all": get_rng_state_all, "set_rng_state_all": set_rng_state_all,
        "memory_allocated": with_index(z.memory_allocated), "max_memory_allocated": with_index(z.max_memory_allocated),
        "memory_reserved": with_index(z.memory_reserved), "max_memory_reserved": with_index(z.max_memory_reserved),
        "memory_cached": with_index(z.memory_reserved), "max_memory_cached": with_index(z.max_memory_reserved),
        "memory_stats": with_index(z.memory_stats), "memory_summary": with_index(z.memory_summary),
        "mem_get_info": with_index(z.mem_get_info), "reset_peak_memory_stats": with_index(z.reset_peak_memory_stats),
        "reset_max_memory_allocated": with_index(z.reset_max_memory_allocated),
        "reset_max_memory_cached": with_index(z.reset_max_memory_cached), "empty_cache": z.empty_cache,
        "is_bf16_supported": z.is_bf16_supported, "is_current_stream_capturing": z.is_current_stream_capturing,
        # torch.cuda.memory's history and snapshots: zion's (zion_emu.memory).
        "_record_memory_history": zion_memory._record_memory_history, "_snapshot": zion_memory._snapshot,
        "_dump_snapshot": zion_memory._dump_snapshot,
        "memory_snapshot": z.memory_snapshot, "memory_stats_as_nested_dict": with_index(z.memory_stats_as_nested_dict),
        "reset_accumulated_memory_stats": with_index(z.reset_accumulated_memory_stats),
        "host_memory_stats": z.host_memory_stats, "reset_peak_host_memory_stats": z.reset_peak_host_memory_stats,
        # The DDR pools keep no counts of what was allocated and freed over time: nothing to reset.
        "reset_accumulated_host_memory_stats": lambda: None,
        "set_sync_debug_mode": set_sync_debug_mode, "get_sync_debug_mode": get_sync_debug_mode,
    }
    return names


class CudaOnlyAttributeError(CudaOnlyError, AttributeError):
    """A CUDA-only attribute: a CudaOnlyError, and an AttributeError for
    ``hasattr`` / ``getattr(x, name, default)``."""


class _CudaStream(torch.Stream):
    """A zion stream as torch.cuda hands it to the script: a torch.Stream
    (equal to the same stream from torch.zion) whose CUDA handle has no zion
    meaning."""

    @property
    def cuda_stream(self) -> int:
        raise CudaOnlyAttributeError("torch.cuda.Stream.cuda_stream is CUDA-only and has no zion equivalent "
                                     "(cuda-compat maps CUDA to the zion device); a zion stream has no cudaStream_t")


def _cuda_stream(s: torch.Stream) -> torch.Stream:
    if isinstance(s, _CudaStream):
        return s
    return _CudaStream(stream_id=s.stream_id, device_index=s.device_index, device_type=s.device_type)


# torch.cuda.set_sync_debug_mode: kept and read back, as on CUDA; zion warns of
# no synchronizing operation whatever the mode.
_sync_debug_mode = 0
_SYNC_DEBUG_MODES = {"default": 0, "warn": 1, "error": 2}


def set_sync_debug_mode(debug_mode: int | str) -> None:
    global _sync_debug_mode
    if isinstance(debug_mode, str):
        if debug_mode not in _SYNC_DEBUG_MODES:
            raise RuntimeError("invalid value of debug_mode, expected one of `default`, `warn`, `error`")
        debug_mode = _SYNC_DEBUG_MODES[debug_mode]
    if debug_mode not in (0, 1, 2):
        raise RuntimeError("invalid value of debug_mode, expected one of 0,1,2")
    _sync_debug_mode = int(debug_mode)


def get_sync_debug_mode() -> int:
    return _sync_debug_mode


class _Nvtx:
    """torch.cuda.nvtx's native calls (``torch.cuda.nvtx._nvtx``) on zion:
    ranges are the profiler's ``record_function`` ranges, so they show in a
    torch.profiler trace as NVTX ranges show in Nsight; marks and device
    ranges do nothing."""

    def __init__(self) -> None:
        self._local = threading.local()
        self._lock = threading.Lock()
        self._started: dict[int, Any] = {}
        self._next_id = 1

    def _stack(self) -> list[Any]:
        stack = getattr(self._local, "stack", None)
        if stack is None:
            stack = self._local.stack = []
        return stack

    @staticmethod
    def _begin(msg: str) -> Any:
        from torch.autograd.profiler import record_function

        r = record_function(msg)
        r.__enter__()
        return r

    def rangePushA(self, msg: str) -> int:  # noqa: N802 (the names of torch._C._nvtx)
        _report.record("torch.cuda.nvtx range")
        stack = self._stack()
        stack.append(self._begin(msg))
        return len(stack) - 1

    def rangePop(self) -> int:  # noqa: N802
        stack = self._stack()
        if not stack:
            return -1
        stack.pop().__exit__(None, None, None)
        return len(stack)

    def rangeStartA(self, msg: str) -> int:  # noqa: N802
        _report.record("torch.cuda.nvtx range")
        r = self._begin(msg)
        with self._lock:
            range_id, self._next_id = self._next_id, self._next_id + 1
            self._started[range_id] = r
        return range_id

    def rangeEnd(self, range_id: int) -> None:  # noqa: N802
        with self._lock:
            r = self._started.pop(range_id, None)
        if r is not None:
            r.__exit__(None, None, None)

    def markA(self, msg: str) -> None:  # noqa: N802
        return None

    def deviceRangeStart(self, msg: str, stream: int = 0) -> object:  # noqa: N802
        return object()

    def deviceRangeEnd(self, handle: object, stream: int = 0) -> None:  # noqa: N802
        return None


class _EmitNvtx:
    """torch.autograd.profiler.emit_nvtx on zion: does nothing (zion ops have
    no NVTX ranges; torch.profiler records them)."""

    def __init__(self, enabled: bool = True, record_shapes: bool = False) -> None:
        self.enabled = enabled

    def __enter__(self) -> "_EmitNvtx":
        _report.record("torch.autograd.profiler.emit_nvtx (nothing)")
        return self

    def __exit__(self, *exc: object) -> bool:
        return False


def _patch_nvtx_and_cuda_profiler() -> None:
    import torch.autograd.profiler as autograd_profiler
    import torch.cuda.nvtx
    import torch.cuda.profiler

    _patch(torch.cuda.nvtx, "_nvtx", _Nvtx(), "torch.cuda.nvtx")
    # Profiler capture ranges for nsys / nvprof: nothing to start or stop on zion.
    _patch(torch.cuda.profiler, "start", lambda: None, "torch.cuda.profiler.start")
    _patch(torch.cuda.profiler, "stop", lambda: None, "torch.cuda.profiler.stop")
    _patch(autograd_profiler, "emit_nvtx", _EmitNvtx, "torch.autograd.profiler.emit_nvtx")


# CUDA-only calls: name -> what to use instead (empty: nothing).
_CUDA_ONLY_CUDA = {
    "get_device_capability": "zion OAMs have no compute capability; torch.cuda.get_device_properties() gives the "
                             "modeled OAM (peak_flops per dtype, HBM)",
    "get_arch_list": "", "get_gencode_flags": "", "current_blas_handle": "", "cudart": "", "ipc_collect": "",
    "list_gpu_processes": "", "utilization": "NVML queries have no zion equivalent",
    "memory_usage": "use torch.cuda.memory_allocated()", "temperature": "", "power_draw": "", "clock_rate": "",
    "graph": "", "graph_pool_handle": "", "make_graphed_callables": "", "CUDAGraph": "",
    "caching_allocator_alloc": "", "caching_allocator_delete": "", "set_per_process_memory_fraction": "",
    "get_per_process_memory_fraction": "", "ExternalStream": "a zion stream has no cudaStream_t",
}
_COMM_KERNEL = "torch.cuda.comm (torch.zion.comm) broadcasts, scatters and gathers on zion"
_CUDA_COMM = ("broadcast", "broadcast_coalesced", "reduce_add", "reduce_add_coalesced", "scatter", "gather")
_CUDA_ONLY_C = ("_broadcast", "_broadcast_out", "_scatter", "_scatter_out", "_gather", "_gather_out")
_CUDA_ONLY_NCCL = ("all_reduce", "reduce", "broadcast", "all_gather", "reduce_scatter", "version", "unique_id",
                   "init_rank", "is_available")


def _patch_cuda_only() -> None:
    import torch.cuda.comm
    import torch.cuda.graphs
    import torch.cuda.memory
    import torch.cuda.nccl

    for name, instead in _CUDA_ONLY_CUDA.items():
        _patch(torch.cuda, name, _cuda_only(f"torch.cuda.{name}", instead), f"torch.cuda.{name} (error)")
        for sub in (torch.cuda.graphs, torch.cuda.memory):
            if hasattr(sub, name):
                setattr(sub, name, getattr(torch.cuda, name))
    from zion_emu import comm as zion_comm

    # torch.nn.parallel.comm already sends zion tensors to zion's (comm.install).
    for name in _CUDA_COMM:
        _patch(torch.cuda.comm, name, _counted(getattr(zion_comm, name), f"torch.cuda.comm.{name}"),
               f"torch.cuda.comm.{name}")
    _patch(torch._C, "_broadcast_coalesced", _counted(zion_comm.broadcast_coalesced, "torch._C._broadcast_coalesced"),
           "torch._C._broadcast_coalesced")
    for name in _CUDA_ONLY_C:
        _patch(torch._C, name, _cuda_only(f"torch._C.{name}", _COMM_KERNEL), f"torch._C.{name} (error)")
    import torch.cuda.tunable

    for name in getattr(torch.cuda.tunable, "__all__", ()):
        _patch(torch.cuda.tunable, name, _cuda_only(f"torch.cuda.tunable.{name}", "TunableOp tunes CUDA GEMM "
                                                    "kernels; zion prices each op from the platform model"),
               f"torch.cuda.tunable.{name} (error)")
    for name in _CUDA_ONLY_NCCL:
        _patch(torch.cuda.nccl, name, _cuda_only(f"torch.cuda.nccl.{name}", "use torch.distributed with the 'nccl' "
                                                 "backend name, which cuda-compat maps to 'zion'"),
               f"torch.cuda.nccl.{name} (error)")


class _CudaModule(types.ModuleType):
    """torch.cuda's module type under cuda-compat: ``default_generators`` is the
    zion devices' (built on first read, so set_platform may still run)."""

    @property
    def default_generators(self) -> tuple[torch.Generator, ...]:
        generators = torch.zion.default_generators
        return generators if _visible is None else tuple(generators[:_cuda_device_count()])


def _patch_cuda_module() -> None:
    import torch.cuda.random
    import torch.cuda.memory

    for name, fn in _cuda_module_functions().items():
        counted = _counted(fn, f"torch.cuda.{name}")
        _patch(torch.cuda, name, counted, f"torch.cuda.{name}")
        for sub in (torch.cuda.random, torch.cuda.memory):
            if hasattr(sub, name):
                setattr(sub, name, counted)
    for name, cls in _legacy_types().items():
        _patch(torch.cuda, name, cls, f"torch.cuda.{name}")
    torch.cuda.__class__ = _CudaModule
    _report.patched.append("torch.cuda.default_generators")


def _counted(fn: Any, name: str) -> Any:
    """``fn`` counting its calls under ``name`` (a class is counted when built)."""
    if isinstance(fn, _Factory):
        fn._make = staticmethod(_counted(fn._make, name))
        return fn
    if isinstance(fn, type):
        return type(fn.__name__, (fn,), {"__init__": _counting_init(fn.__init__, name), "__module__": "torch.cuda"})

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        _report.record(name)
        return fn(*args, **kwargs)

    return wrapper


def _counting_init(init: Callable[..., None], name: str) -> Callable[..., None]:
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        _report.record(name)
        init(self, *args, **kwargs)

    return __init__


# Mixed precision.
def _patch_amp() -> None:
    import torch.amp.autocast_mode as autocast_mode
    import torch.amp.grad_scaler as grad_scaler
    import torch.cuda.amp

    base = autocast_mode.autocast

    class autocast(base):  # noqa: N801
        def __init__(self, device_type: str, *args: Any, **kwargs: Any) -> None:
            if device_type == "cuda":
                _report.record("torch.autocast('cuda')")
                device_type = ZION
            super().__init__(device_type, *args, **kwargs)

    class cuda_autocast(base):  # noqa: N801
        def __init__(self, enabled: bool = True, dtype: torch.dtype = torch.float16, cache_enabled: bool = True) -> None:
            _report.record("torch.cuda.amp.autocast")
            super().__init__(ZION, enabled=enabled, dtype=dtype, cache_enabled=cache_enabled)

    autocast.__name__ = autocast.__qualname__ = "autocast"
    cuda_autocast.__name__ = cuda_autocast.__qualname__ = "autocast"
    for owner in (torch, torch.amp, autocast_mode):
        _patch(owner, "autocast", autocast, f"{owner.__name__}.autocast")
    _patch(torch.cuda.amp, "autocast", cuda_autocast, "torch.cuda.amp.autocast")

    scaler = grad_scaler.GradScaler

    class GradScaler(scaler):
        def __init__(self, device: str = "cuda", *args: Any, **kwargs: Any) -> None:
            if device == "cuda":
                _report.record("torch.amp.GradScaler('cuda')")
                device = ZION
            super().__init__(device, *args, **kwargs)

    class CudaGradScaler(scaler):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            _report.record("torch.cuda.amp.GradScaler")
            super().__init__(ZION, *args, **kwargs)

    GradScaler.__qualname__ = CudaGradScaler.__name__ = CudaGradScaler.__qualname__ = "GradScaler"
    for owner in (torch.amp, grad_scaler):
        _patch(owner, "GradScaler", GradScaler, f"{owner.__name__}.GradScaler")
    _patch(torch.cuda.amp, "GradScaler", CudaGradScaler, "torch.cuda.amp.GradScaler")
    _patch_autocast_state()
    for name in ("custom_fwd", "custom_bwd"):
        fn = getattr(autocast_mode, name)
        _patch(torch.cuda.amp, name, functools.partial(fn, device_type=ZION), f"torch.cuda.amp.{name}")
        _patch(autocast_mode, name, _device_kwarg(fn, f"torch.amp.{name}(device_type=cuda)", "device_type"),
               f"torch.amp.{name}")
        setattr(torch.amp, name, getattr(autocast_mode, name))


def _patch_autocast_state() -> None:
    """The autocast state's queries and setters answer for zion where a script
    names "cuda", or names no device (torch's older forms, which mean CUDA's):
    inside ``torch.autocast("cuda")`` (a zion region here) a script reading
    ``torch.is_autocast_enabled()`` must see it on, as on CUDA."""

    def device_first(fn: Callable[..., Any], name: str, arity: int) -> Callable[..., Any]:
        # arity: how many arguments the form without a device type takes.
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            given = kwargs.pop("device_type", args[0] if len(args) > arity else None)
            rest = args[1:] if len(args) > arity else args
            if given is None or given == "cuda":
                _report.record(f"torch.{name}({'cuda' if given else ''})")
                given = ZION
            return fn(given, *rest, **kwargs)

        return wrapper

    def gpu_form(fn: Callable[..., Any], name: str) -> Callable[..., Any]:
        def wrapper(*args: Any) -> Any:
            _report.record(f"torch.{name}")
            return fn(ZION, *args)

        wrapper.__name__ = wrapper.__qualname__ = name
        return wrapper

    for name, arity in (("is_autocast_enabled", 0), ("set_autocast_enabled", 1), ("get_autocast_dtype", 0),
                        ("set_autocast_dtype", 1)):
        _patch(torch, name, device_first(getattr(torch, name), name, arity), f"torch.{name}")
    _patch(torch, "get_autocast_gpu_dtype", gpu_form(torch.get_autocast_dtype, "get_autocast_gpu_dtype"),
           "torch.get_autocast_gpu_dtype")
    _patch(torch, "set_autocast_gpu_dtype", gpu_form(torch.set_autocast_dtype, "set_autocast_gpu_dtype"),
           "torch.set_autocast_gpu_dtype")


# torch.distributed: "nccl" is the zion backend.
def translate_backend(backend: Any, where: str | None = None) -> Any:
    """``nccl`` -> ``zion`` (also inside ``"cpu:gloo,cuda:nccl"``); None -> ``zion``."""
    if backend is None:
        if where:
            _report.record(f"{where}(backend=None)")
        return ZION
    if not isinstance(backend, str):
        return backend
    parts = []
    for part in backend.split(","):
        dev, sep, name = part.partition(":")
        if not sep:
            dev, name = "", dev
        if name.strip().lower() == "nccl":
            name = ZION
        if dev.strip() == "cuda":
            dev = ZION
        parts.append(f"{dev}:{name}" if sep else name)
    mapped = ",".join(parts)
    if mapped != backend and where:
        _report.record(f"{where}(backend={backend!r})")
    return mapped


def _patch_distributed() -> None:
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    _init = c10d.init_process_group

    @functools.wraps(_init)
    def init_process_group(backend: Any = None, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("device_id") is not None:
            kwargs["device_id"] = translate(kwargs["device_id"], "init_process_group(device_id=cuda)")
        return _init(translate_backend(backend, "init_process_group"), *args, **kwargs)

    def backend_kwarg(fn: Callable[..., Any], name: str) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if kwargs.get("backend") is not None:
                kwargs["backend"] = translate_backend(kwargs["backend"], name)
            return fn(*args, **kwargs)

        return wrapper

    for owner in (dist, c10d):
        _patch(owner, "init_process_group", init_process_group, f"{owner.__name__}.init_process_group")
        _patch(owner, "new_group", backend_kwarg(c10d.new_group, "new_group"), f"{owner.__name__}.new_group")
        _patch(owner, "new_subgroups", backend_kwarg(c10d.new_subgroups, "new_subgroups"),
               f"{owner.__name__}.new_subgroups")
        _patch(owner, "is_nccl_available", lambda: True, f"{owner.__name__}.is_nccl_available")
    _after_import.after_import("torch.distributed.checkpoint.filesystem", _patch_checkpoint_writer)
    import torch.distributed.device_mesh as device_mesh

    fn = _first_arg_or_kwarg(device_mesh.init_device_mesh, "init_device_mesh('cuda')", "device_type")
    _patch(device_mesh, "init_device_mesh", fn, "torch.distributed.device_mesh.init_device_mesh")
    if hasattr(dist, "init_device_mesh"):
        setattr(dist, "init_device_mesh", fn)


def _patch_checkpoint_writer(filesystem: types.ModuleType) -> None:
    """torch.distributed.checkpoint's file writer copies to the host the
    tensors on the available accelerator type, which torch finds is "cuda"
    here while the tensors are zion's: it would copy none of them and stop on
    "Tensor must be on CPU". The writer sees the type of the tensors."""
    available = filesystem._get_available_device_type

    def device_type() -> Any:
        found = available()
        return ZION if found == "cuda" else found

    _patch(filesystem, "_get_available_device_type", device_type,
           "torch.distributed.checkpoint.filesystem._get_available_device_type")


# Profiler: the CUDA activity is zion's (PrivateUse1), whose device events
# carry modeled times (zion_emu.profiler).
def _patch_profiler() -> None:
    import torch.autograd.profiler as autograd_profiler
    import torch.profiler.profiler as profiler

    zion = torch.profiler.ProfilerActivity.PrivateUse1
    legacy = autograd_profiler.profile
    legacy_init = legacy.__init__

    @functools.wraps(legacy_init)
    def legacy_profile_init(self: Any, *args: Any, **kwargs: Any) -> None:
        if kwargs.pop("use_cuda", False) or kwargs.get("use_device") == "cuda":
            _report.record("profiler(use_cuda) -> zion device events")
            kwargs["use_device"] = "zion"
            kwargs["use_kineto"] = True  # zion's events come through Kineto
        legacy_init(self, *args, **kwargs)

    _patch(legacy, "__init__", legacy_profile_init, "torch.autograd.profiler.profile")
    kineto_init = profiler.profile.__init__

    @functools.wraps(kineto_init)
    def profile_init(self: Any, *args: Any, **kwargs: Any) -> None:
        activities = kwargs.get("activities")
        if activities is not None and torch.profiler.ProfilerActivity.CUDA in activities:
            _report.record("profiler(ProfilerActivity.CUDA) -> zion device events")
            kept = [a for a in activities if a != torch.profiler.ProfilerActivity.CUDA]
            kwargs["activities"] = kept + ([zion] if zion not in kept else [])
        if kwargs.pop("use_cuda", None):
            _report.record("profiler(use_cuda) -> zion device events")
            kwargs["activities"] = list(kwargs.get("activities") or [torch.profiler.ProfilerActivity.CPU, zion])
            if zion not in kwargs["activities"]:
                kwargs["activities"].append(zion)
        kineto_init(self, *args, **kwargs)

    _patch(profiler.profile, "__init__", profile_init, "torch.profiler.profile")


def enable() -> CompatReport:
    """Maps CUDA to the zion device in this process and the processes it
    starts (idempotent); returns the report of what was remapped, which fills
    as the script runs. ValueError for a CUDA_VISIBLE_DEVICES it cannot honour."""
    global _enabled
    if _enabled:
        return _report
    import zion_emu  # noqa: F401  (registers the zion device and backend)

    global _visible, _visible_value
    value = os.environ.get(VISIBLE_ENV)
    if value is not None:
        _visible = _parse_visible(value, torch.zion.device_count())  # before anything is patched
        _visible_value = value
    os.environ[ENV] = "1"
    _patch_devices()
    _patch_cuda_module()
    _patch_cuda_only()
    _patch_amp()
    _patch_distributed()
    _patch_profiler()
    _patch_nvtx_and_cuda_profiler()
    _enabled = True
    return _report
