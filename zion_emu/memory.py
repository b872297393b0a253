"""``torch.zion.memory``: HBM memory history and snapshots in
``torch.cuda.memory``'s format, so ``torch.cuda._memory_viz`` (and
https://pytorch.org/memory_viz) renders them.

Times (``time_us``) are the modeled host clock. Every allocation is its own
segment: the HBM pools cache nothing, so reserved memory equals allocated.
"""

from __future__ import annotations

import pickle
from typing import Any, Literal

from zion_emu import _C
from zion_emu.device import (  # noqa: F401  (torch.cuda.memory has these too)
    empty_cache, max_memory_allocated, max_memory_reserved, mem_get_info, memory_allocated, memory_reserved,
    memory_stats, memory_summary, reset_peak_memory_stats)

_native = _C.memory

DEFAULT_MAX_ENTRIES = 1_000_000  # torch.cuda.memory's default, a sys.maxsize, would be unbounded


def _record_memory_history(enabled: Literal["state", "all"] | bool | None = "all", *args: Any, **kwargs: Any) -> None:
    """Starts (``enabled="all"`` or ``"state"``) or stops (``None``) recording:
    :func:`_record_memory_history_current`. As torch.cuda's, a bool
    ``enabled`` is the older signature, :func:`_record_memory_history_legacy`."""
    if isinstance(enabled, bool):
        _record_memory_history_legacy(enabled, *args, **kwargs)
    else:
        _record_memory_history_current(enabled, *args, **kwargs)


def _record_memory_history_legacy(enabled: bool, record_context: bool = True, trace_alloc_max_entries: int = 1,
                                  trace_alloc_record_context: bool = False, device: Any = None,
                                  record_context_cpp: bool = False, clear_history: bool = False,
                                  **_ignored: Any) -> None:
    """torch.cuda.memory's older signature: ``enabled`` a bool, the stacks
    kept with ``record_context``, the last ``trace_alloc_max_entries``
    events (1, its default, keeps the live blocks and the last event)."""
    if not isinstance(trace_alloc_max_entries, int) or trace_alloc_max_entries <= 0:
        raise ValueError(f"zion: _record_memory_history(trace_alloc_max_entries={trace_alloc_max_entries!r}): must "
                         "be a positive int")
    _record_memory_history_current("all" if enabled else None, "all" if record_context else None,
                                   max_entries=trace_alloc_max_entries, clear_history=clear_history)


def _record_memory_history_current(enabled: Literal["state", "all"] | None = "all",
                                   context: Literal["state", "alloc", "all"] | None = "all",
                                   stacks: Literal["python", "all"] = "all",
                                   max_entries: int = DEFAULT_MAX_ENTRIES, device: Any = None,
                                   clear_history: bool = False) -> None:
    """Starts (``enabled="all"``, or ``"state"``: the segments alive without a
    trace of events) or stops (``None``) recording
    every HBM allocation, free and out-of-memory error of every zion device,
    with the Python stack that made it (``context=None``: no stacks; zion
    has no C++ frames worth showing, so ``stacks="all"`` is ``"python"``).
    The last ``max_entries`` events are kept. ``device`` is accepted for
    torch.cuda's signature; recording covers every device."""
    if enabled not in (None, "state", "all"):
        raise ValueError(f"zion: _record_memory_history(enabled={enabled!r}): allowed are None, 'state' and 'all'")
    if context not in (None, "state", "alloc", "all"):
        raise ValueError(f"zion: _record_memory_history(context={context!r}): allowed are None, 'state', 'alloc', 'all'")
    if stacks not in ("python", "all"):
        raise ValueError(f"zion: _record_memory_history(stacks={stacks!r}): allowed are 'python' and 'all'")
    if not isinstance(max_entries, int) or max_entries <= 0:
        raise ValueError(f"zion: _record_memory_history(max_entries={max_entries!r}): must be a positive int")
    global _with_trace
    if clear_history:
        _native.record_history(False, 0, False)
        _native.record_history(False, max_entries + 1, False)  # a new size drops what was kept
    _native.record_history(enabled is not None, max_entries, context is not None)
    if enabled is not None:
        _with_trace = enabled == "all"


# "state" keeps what is alive (the segments, with their stacks) and no trace of events, as torch.cuda's does.
_with_trace = True


def _snapshot(device: Any = None) -> dict[str, Any]:
    """``{"segments": [...], "device_traces": [[...] per device], ...}`` as
    torch.cuda.memory._snapshot() returns. Segments are the allocations
    made while recording that are still alive (tensors allocated before
    recording started are counted by memory_allocated() but not listed).
    Recording started with ``enabled="state"`` has empty device traces."""
    snapshot = _native.snapshot()
    if not _with_trace:
        snapshot["device_traces"] = [[] for _ in snapshot["device_traces"]]
    return snapshot


def _dump_snapshot(filename: str = "dump_snapshot.pickle") -> None:
    """Pickles :func:`_snapshot` to ``filename``, for memory_viz."""
    with open(filename, "wb") as f:
        pickle.dump(_snapshot(), f)


def peak_from_trace(snapshot: dict[str, Any], device: int, start_bytes: int = 0) -> int:
    """The highest allocated bytes the trace of one device reaches, replaying
    its allocs and frees from ``start_bytes``, what was allocated when
    recording began (``memory_allocated()`` then)."""
    live = peak = start_bytes
    for e in snapshot["device_traces"][device]:
        if e["action"] == "alloc":
            live += e["size"]
            peak = max(peak, live)
        elif e["action"] == "free_completed":
            live -= e["size"]
    return peak
