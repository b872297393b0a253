"""Checkpoints of the emulator's own state: what a training run has spent on
the modeled machine, so that a run saved and resumed in a new process
continues its modeled clock exactly where it stopped.

``state_dict()`` holds the host's clock, every stream's clock, each device's
counters (FLOPs, bytes, busy time per activity, op counts), the traffic per
link class, the busy time per label (operator, copy, collective), when each
link is free of the copies queued on it, each device's HBM peak statistics,
each socket's DDR pool peak (pinned buffers and tensors placed by
``zion_emu.socket``) and the zion generators' states. It is plain Python data (floats, ints,
lists, dicts, CPU tensors), so ``torch.save`` of a dict holding it next to a
model's and an optimizer's state needs nothing else.

``load_state_dict(sd)`` puts it back, on the same platform: the clocks and
counters are replaced, the peaks of HBM use become at least the saved ones
and of each socket's DDR pool become at least the saved ones (current use is
what the live tensors and buffers hold) and the generators are restored.
Streams created after the restore start at the restored host clock.

Take the snapshot before ``torch.save`` serializes zion tensors (their copies
to the host are then not part of the run), and call ``load_state_dict`` after
the model and optimizer are loaded (their copies are not either). Note that
``torch.load(..., map_location="zion")`` also moves an optimizer's step
counters (Adagrad, Adam) to zion, where it reads them back every step;
moving them back to the CPU, where the optimizer keeps them, makes the
resumed run time exactly like the uninterrupted one.

Not saved: recorded trace spans (a trace covers the process that recorded
it) and the per-op table of ``cost.guessed_ops`` (the counters keep their
total).
"""

from __future__ import annotations

from typing import Any, Mapping

import torch

from zion_emu import _C
from zion_emu.platform import current_platform

__all__ = ["load_state_dict", "state_dict"]

# Bumped when the layout changes. Version 1 had no "sockets" (DDR pool
# peaks); it is still read, and leaves those peaks as they are.
VERSION = 2
_READABLE = (1, 2)


def state_dict() -> dict[str, Any]:
    """The emulator's clocks, counters, memory peaks and generator states."""
    platform = current_platform()
    count = torch.zion.device_count()
    memory = []
    for index in range(count):
        stats = _C.device.memory_stats(index)
        memory.append({
            "peak_bytes": int(stats["allocated_bytes"]["peak"]),
            "peak_allocations": int(stats["allocation"]["peak"]),
            "num_ooms": int(stats["num_ooms"]),
        })
    sockets = []
    for socket in range(_C.host_memory.sockets()):
        stats = _C.host_memory.stats(socket)
        sockets.append({"peak_bytes": int(stats["peak"]), "num_ooms": int(stats["num_ooms"])})
    return {
        "version": VERSION,
        "platform": platform.name,
        "devices": count,
        "timeline": _C.timeline.state(),
        "memory": memory,
        "sockets": sockets,
        "rng": [state.clone() for state in torch.zion.get_rng_state_all()],
    }


def load_state_dict(state: Mapping[str, Any]) -> None:
    """Restores a :func:`state_dict` taken on the same platform. Raises
    ValueError naming what does not match (version, platform, device count,
    a missing or malformed field); nothing is changed then."""
    if not isinstance(state, Mapping):
        raise ValueError(f"zion_emu.load_state_dict takes the dict zion_emu.state_dict() returned, "
                         f"got {type(state).__name__}")
    missing = [k for k in ("version", "platform", "devices", "timeline", "memory", "rng") if k not in state]
    if missing:
        raise ValueError(f"zion_emu.load_state_dict: the state has no {', '.join(missing)} "
                         "(expected the dict zion_emu.state_dict() returned)")
    if state["version"] not in _READABLE:
        raise ValueError(f"zion_emu.load_state_dict: state version {state['version']!r} is not supported "
                         f"(this zion_emu reads versions {', '.join(map(str, _READABLE))})")
    platform = current_platform()
    count = torch.zion.device_count()
    if state["platform"] != platform.name or state["devices"] != count:
        raise ValueError(f"zion_emu.load_state_dict: the state was taken on platform {state['platform']!r} with "
                         f"{state['devices']} devices; this process runs {platform.name!r} with {count}. "
                         "Select the same platform first (zion_emu.set_platform or ZION_PLATFORM)")
    memory, rng = state["memory"], state["rng"]
    if not isinstance(memory, (list, tuple)) or len(memory) != count:
        raise ValueError(f"zion_emu.load_state_dict: 'memory' must hold one entry per device ({count})")
    if (not isinstance(rng, (list, tuple)) or len(rng) != count
            or not all(isinstance(r, torch.Tensor) and r.dtype == torch.uint8 for r in rng)):
        raise ValueError("zion_emu.load_state_dict: 'rng' must hold one generator state (a uint8 tensor) "
                         f"per device ({count})")
    peaks = []
    for index, entry in enumerate(memory):
        try:
            peaks.append((int(entry["peak_bytes"]), int(entry["peak_allocations"]), int(entry["num_ooms"])))
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"zion_emu.load_state_dict: memory[{index}] must be a dict of ints with peak_bytes, "
                             f"peak_allocations and num_ooms, got {entry!r}") from None
    socket_peaks = []
    if state["version"] >= 2:
        sockets, count_sockets = state.get("sockets"), _C.host_memory.sockets()
        if not isinstance(sockets, (list, tuple)) or len(sockets) != count_sockets:
            raise ValueError(f"zion_emu.load_state_dict: 'sockets' must hold one entry per CPU socket "
                             f"({count_sockets})")
        for index, entry in enumerate(sockets):
            try:
                socket_peaks.append((int(entry["peak_bytes"]), int(entry["num_ooms"])))
            except (KeyError, TypeError, ValueError):
                raise ValueError(f"zion_emu.load_state_dict: sockets[{index}] must be a dict of ints with "
                                 f"peak_bytes and num_ooms, got {entry!r}") from None
            if min(socket_peaks[-1]) < 0:
                raise ValueError(f"zion_emu.load_state_dict: sockets[{index}] holds a negative count: {entry!r}")
    # torch.load(map_location="zion") moves the generator states with everything
    # else; generators take CPU bytes. Copied back before the clocks are
    # restored, so the copies are not charged to the resumed run.
    rng = [r.cpu() for r in rng]
    _C.timeline.restore(dict(state["timeline"]))  # validates every field before changing anything
    for index, (peak_bytes, peak_allocations, num_ooms) in enumerate(peaks):
        _C.timeline.restore_peak_memory(index, peak_bytes, peak_allocations, num_ooms)
    for socket, (peak_bytes, num_ooms) in enumerate(socket_peaks):
        _C.host_memory.restore_peak(socket, peak_bytes, num_ooms)
    torch.zion.set_rng_state_all(rng)
