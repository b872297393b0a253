"""A script's own clock reads modeled time: after :func:`enable`,
``time.time``, ``time.perf_counter``, ``time.monotonic`` and their ``_ns``
forms follow the zion host's virtual clock (:func:`zion_emu.clock`), so a
script written to time itself::

    t0 = time.perf_counter(); step(); torch.cuda.synchronize()
    print(time.perf_counter() - t0)

prints the modeled duration of ``step`` on the platform, not how long the
emulator took. ``perf_counter`` and ``monotonic`` read the host's virtual clock itself;
``time.time()`` is the wall time at :func:`enable` plus the modeled time
elapsed since. The clocks never go backwards: ``zion_emu.reset_clock()`` (or ``set_platform``)
restarts the host clock at zero, and the modeled time read before the reset
is kept.

What keeps real time:
- code that waits with a deadline: calls from the standard library's
  concurrency and I/O modules and from torch's distributed (store barriers,
  rendezvous), process, data-loading and compiler code
  (:data:`REAL_TIME_CALLERS`) read the real clocks, or a
  ``Queue.get(timeout=...)`` would never time out while no modeled time
  passes; modules that bound ``from time import monotonic`` before
  :func:`enable` (``threading``, ``queue``, ``subprocess``) keep real time too;
- C++ clocks (torch.distributed store and collective timeouts), ``datetime``,
  ``time.sleep`` (which sleeps for real and does not advance modeled time),
  ``time.process_time`` and ``time.thread_time``.

Scoped to the process that calls :func:`enable`; off unless enabled.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Callable

from zion_emu import _C

_native = _C.device

# Module-name prefixes whose calls read the real clocks: they use time for
# deadlines (select/poll loops, queue and lock timeouts, rendezvous, worker
# watchdogs), not to measure the script's work.
REAL_TIME_CALLERS: tuple[str, ...] = (
    "asyncio", "concurrent", "http", "multiprocessing", "queue", "selectors", "socket", "socketserver", "ssl",
    "subprocess", "threading", "urllib",
    "torch.distributed", "torch.multiprocessing", "torch.utils.data", "torch._dynamo", "torch._inductor",
)

# The real clocks, as they were before any patching.
_REAL: dict[str, Callable[[], float] | Callable[[], int]] = {
    "time": time.time, "time_ns": time.time_ns,
    "perf_counter": time.perf_counter, "perf_counter_ns": time.perf_counter_ns,
    "monotonic": time.monotonic, "monotonic_ns": time.monotonic_ns,
}


class VirtualClock:
    """The zion host's virtual clock, kept monotonic: it reads
    :func:`zion_emu.clock` until the host clock is reset, then continues from
    where it was."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._banked = 0.0  # modeled time of host-clock segments before resets
        self._last = self._host()

    @staticmethod
    def _host() -> float:
        # Reading the clock must not start the device runtime: that would fix
        # the platform before the script's set_platform. No runtime, no time.
        return _native.host_time() if _native.initialized() else 0.0

    def now(self) -> float:
        host = self._host()
        with self._lock:
            if host < self._last:  # the host clock restarted at zero since the last read
                self._banked += self._last
            self._last = host
            return self._banked + host


_clock: VirtualClock | None = None
_decided: dict[str, bool] = {}  # module name -> reads real time
_enabled = False


def _real_caller(depth: int = 2) -> bool:
    """Whether the function ``depth`` frames up belongs to a module of
    :data:`REAL_TIME_CALLERS`."""
    name = sys._getframe(depth).f_globals.get("__name__", "")
    real = _decided.get(name)
    if real is None:
        real = any(name == p or name.startswith(p + ".") for p in REAL_TIME_CALLERS)
        _decided[name] = real
    return real


def _virtual(name: str, offset_s: float) -> Callable[[], float] | Callable[[], int]:
    """time.<name> reading ``offset_s`` + the virtual clock (in ns for ``*_ns``)."""
    real = _REAL[name]
    clock = _clock
    assert clock is not None
    if name.endswith("_ns"):
        offset_ns = int(offset_s * 1e9)

        def read() -> float | int:
            if _real_caller():
                return real()
            return offset_ns + int(round(clock.now() * 1e9))
    else:
        def read() -> float | int:
            if _real_caller():
                return real()
            return offset_s + clock.now()

    read.__name__ = read.__qualname__ = name
    read.__doc__ = f"time.{name}, read from the zion host's virtual clock (zion_emu.virtual_clock)."
    return read


def enable() -> None:
    """Points the ``time`` module's clocks at modeled time, in this process
    (idempotent): ``perf_counter`` and ``monotonic`` read the host's virtual
    clock (:func:`zion_emu.clock` until a reset), ``time`` reads the wall
    time at this call plus the modeled time elapsed since."""
    global _clock, _enabled
    if _enabled:
        return
    _clock = VirtualClock()
    wall_offset = _REAL["time"]() - _clock.now()
    for name, offset in (("perf_counter", 0.0), ("monotonic", 0.0), ("time", wall_offset)):
        setattr(time, name, _virtual(name, offset))
        setattr(time, name + "_ns", _virtual(name + "_ns", offset))
    _enabled = True


def enabled() -> bool:
    return _enabled


def real_time(name: str = "perf_counter") -> float | int:
    """A real clock while the virtual one is on: ``real_time("time")``,
    ``real_time("perf_counter_ns")``..."""
    if name not in _REAL:
        raise ValueError(f"zion: no real clock {name!r}; the clocks are {sorted(_REAL)}")
    return _REAL[name]()
