"""The CPU sockets of the platform as places for work and memory.

``with zion_emu.socket(2): ...`` (or ``@zion_emu.socket(2)``, or
``ZION_SOCKET=2`` for a whole process) makes this thread's new CPU tensors
live in socket 2's DDR pool -- with its capacity, statistics and
``OutOfMemoryError`` like an HBM pool -- and charges the CPU ops it runs to
socket 2's track of the timeline, priced by the platform's socket model:
``socket.peak_flops`` (cores x FLOP/s per dtype), ``socket.ddr_bandwidth``,
and embedding-bag gathers at ``socket.ddr_random_access_efficiency``. The
host runs CPU ops, so the host clock waits for each. Ops are observed as
the profiler observes them (RecordFunction), including the backward of CPU
ops; each kernel is charged once (the leaves, not the composite ops that
call them), and an op on a zion tensor stays the device's.

Copies between such a tensor and an OAM take the real path: socket -> UPI
hops -> the OAM's PCIe switch -> the OAM (pageable memory through a staging
copy, pinned memory directly, as CUDA does). Without a socket scope, pinned
memory lives on the socket the current OAM's PCIe switch hangs off.

Formulas given with :func:`zion_emu.cost.register` price zion ops; socket
ops use the built-in table.

In timing-only mode the scope also makes this thread's new floating-point
CPU tensors storage-less socket tensors (:mod:`zion_emu.socket_tensor`):
their bytes are counted in the socket's pool and their ops priced as above,
with no host memory behind them.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Any, Callable, TypeVar

import torch

from zion_emu import _C

_native = _C.host_memory
_sim = _C.sim

F = TypeVar("F", bound=Callable[..., Any])



def socket_count() -> int:
    return _native.sockets()


def _check(index: int) -> int:
    if isinstance(index, bool) or not isinstance(index, int):
        raise TypeError(f"zion_emu.socket takes a socket index (int), got {type(index).__name__}")
    n = socket_count()
    if not 0 <= index < n:
        raise IndexError(f"zion: socket {index} does not exist; the platform has {n} sockets (0..{n - 1})")
    return index


class socket:
    """Context manager and decorator: CPU tensors and CPU ops of this thread
    go to socket ``index`` (see the module docstring). Scopes nest."""

    def __init__(self, index: int) -> None:
        self.index = _check(index)
        self._saved: list[int] = []
        self._modes: list[bool] = []  # per entry: whether it pushed the timing-only factory mode

    def __enter__(self) -> "socket":
        if _C.device.mode() == "timing":
            import zion_emu.socket_tensor  # noqa: F401  (its import makes a tensor: not in the scope's pool)
        self._saved.append(_native.scoped_socket())
        _native.set_scoped_socket(self.index)
        self._modes.append(_push_factory_mode())
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._modes.pop():
            from torch.overrides import _pop_mode

            _pop_mode()
        _native.set_scoped_socket(self._saved.pop())

    def __call__(self, fn: F) -> F:
        @functools.wraps(fn)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            with socket(self.index):
                return fn(*args, **kwargs)

        return wrapped  # type: ignore[return-value]


def _push_factory_mode() -> bool:
    """In timing-only mode: the mode that makes CPU factories socket tensors (see socket_tensor)."""
    if _C.device.mode() != "timing":
        return False
    from zion_emu.socket_tensor import SocketFactoryMode

    SocketFactoryMode().__enter__()
    return True


def current_socket() -> int:
    """The socket of this thread's new host memory: the zion_emu.socket scope,
    else the one the current OAM's PCIe switch hangs off."""
    return _native.current_socket()


def socket_of(t: torch.Tensor) -> int:
    """The socket whose DDR pool holds a CPU tensor's memory, or -1 for memory
    outside the pools (ordinary pageable memory)."""
    if t.device.type != "cpu":
        raise ValueError(f"socket_of takes a CPU tensor, got one on {t.device}")
    from zion_emu.socket_tensor import SocketTensor

    if isinstance(t, SocketTensor):
        return t.socket
    return _native.socket_of(t.data_ptr()) if t.numel() else -1


@dataclass(frozen=True)
class SocketMemory:
    capacity: int
    in_use: int
    peak: int
    allocations: int
    num_ooms: int


def memory(index: int) -> SocketMemory:
    """DDR use of one socket: pinned buffers and tensors placed there."""
    return SocketMemory(**_native.stats(_check(index)))


def counters(index: int) -> dict[str, float]:
    """Work charged to one socket's track: flops, bytes, busy_s, ops, guessed_ops."""
    return dict(_native.counters(_check(index)))


_process_scope: socket | None = None


def _apply_environment() -> None:
    """``ZION_SOCKET=i``: the main thread works in socket i for the whole process."""
    global _process_scope
    value = os.environ.get("ZION_SOCKET", "").strip()
    if not value or _process_scope is not None:
        return
    try:
        index = int(value)
    except ValueError:
        raise ValueError(f"ZION_SOCKET must be a socket index, got '{value}'") from None
    _process_scope = socket(index)
    _process_scope.__enter__()
