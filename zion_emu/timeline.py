"""The modeled timeline's clock and counters: the host's virtual clock and
what each device has done. (:mod:`zion_emu.virtual_clock` is another thing:
it makes ``time.*`` read this clock.)

Issuing an op costs the host its launch overhead; the op then runs on its
stream's clock. ``clock()`` reads the host's clock: it includes device work
only once the host has waited for it (``torch.zion.synchronize()``,
``.item()``, ``.cpu()``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from zion_emu import _C
from zion_emu.device import _index

_native = _C.device


@dataclass(frozen=True)
class DeviceCounters:
    """What one device has done since the last :func:`reset_clock`."""

    flops: float
    bytes: float  # memory traffic of ops
    copy_bytes: float  # bytes copied into or out of the device
    busy_s: float  # summed durations of ops and copies on the device's streams
    ops: int
    guessed_ops: int  # ops no formula knew, priced by the default guess (one pass over their tensors)
    compiled_kernels: int  # of the ops, kernels torch.compile generated (each priced as one fused kernel)
    compiled_busy_s: float  # their summed durations


def clock() -> float:
    """The host's virtual clock, in seconds."""
    return _native.host_time()


def reset_clock() -> None:
    """Sets the host's clock and every stream's clock to zero and zeroes every
    device's counters. Events recorded before keep their old times."""
    _native.reset_clock()


def counters(device: Any = None) -> DeviceCounters:
    """Counters of a zion device (an index, ``"zion:3"`` or a torch.device;
    the current device by default)."""
    c = _native.counters(_index(device))
    return DeviceCounters(flops=c["flops"], bytes=c["bytes"], copy_bytes=c["copy_bytes"], busy_s=c["busy_s"],
                          ops=c["ops"], guessed_ops=c["guessed_ops"], compiled_kernels=c["compiled_kernels"],
                          compiled_busy_s=c["compiled_busy_s"])
