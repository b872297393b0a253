"""The ``zion`` torch.distributed backend: registration and placement.

``import zion_emu.distributed`` registers it; then::

    dist.init_process_group("zion", rank=r, world_size=n, ...)

The backend is named explicitly: torch 2.13's ``init_process_group()`` with no
backend picks gloo even though ``zion`` claims the zion device.

Data moves through an inner gloo backend on zero-copy CPU aliases of the zion
tensors, so results are gloo's. Time comes from the collective model: each
collective starts at the latest virtual start among its ranks, lasts what
``zion_emu.sim`` says for the ranks' devices, and ends at the same virtual time
on every rank's communication stream; ``Work.wait()`` makes the current stream
wait for it. The C++ lives in csrc/dist (ProcessGroupZion).

CPU tensors: the backend is registered for ``cpu`` too (as gloo is for cuda and
cpu), so a call whose tensors are all on the CPU, on every rank, goes through
the inner gloo with no modeled time; object collectives (``all_gather_object``,
``broadcast_object_list``) take that path. A call mixing CPU and zion tensors,
or ranks passing tensors on different devices, raises on every rank.

Placement: ``LOCAL_RANK`` is the OAM and ``GROUP_RANK`` the node when torchrun
sets them; otherwise ranks fill the platform node by node (rank r is OAM
r % devices_per_node of node r // devices_per_node). Ranks on different nodes
are priced over the platform's NICs; for more than one node pick a platform
that has them, e.g. ``ZION_PLATFORM=zionex`` or a file
``{"base": "zion", "nodes": 2}``. ``ZION_COLLECTIVE_ALGO``
picks the algorithm (default: the platform's ``auto``) and ``ZION_COLLECTIVE_MODE``
the link model (``fair``, ``unaware`` or ``astra``; default ``fair``).
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

BACKEND = "zion"
_registered = False


def _env_int(name: str) -> int:
    value = os.environ.get(name)
    return int(value) if value not in (None, "") else -1


def _create(opts: Any, backend_options: Any = None) -> "dist.Backend":
    """torch.distributed's factory (extended API): one ProcessGroupZion per group."""
    from zion_emu import _dist

    rank, size = opts.group_rank, opts.group_size
    timeout = opts.timeout if isinstance(opts.timeout, timedelta) else timedelta(seconds=float(opts.timeout))
    # The inner gloo backend gets a store namespace of its own.
    gloo = dist.ProcessGroupGloo(dist.PrefixStore("zion/gloo/", opts.store), rank, size, timeout)
    global_ranks = list(opts.global_ranks_in_group or [])
    global_rank = global_ranks[rank] if global_ranks else rank
    return _dist.ProcessGroupZion(
        opts.store, gloo, rank, size,
        global_rank=global_rank,
        local_rank=_env_int("LOCAL_RANK"),
        node_rank=_env_int("GROUP_RANK"),
        algorithm=os.environ.get("ZION_COLLECTIVE_ALGO", "auto"),
        mode=os.environ.get("ZION_COLLECTIVE_MODE", "fair"),
    )


def register() -> None:
    """Registers the ``zion`` backend for zion tensors (idempotent)."""
    global _registered
    if _registered or BACKEND.upper() in dist.Backend._plugins:
        _registered = True
        return
    # cpu too, as gloo registers cuda and cpu: object collectives and host-side
    # reductions on a zion group go through the inner gloo, unmodeled.
    dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=[BACKEND, "cpu"])
    _registered = True


def backend(group: "dist.ProcessGroup | None" = None) -> Any:
    """The ProcessGroupZion behind ``group`` (the default group when None)."""
    group = group or dist.distributed_c10d._get_default_group()
    return group._get_backend(torch.device(BACKEND))


def last_collective(group: "dist.ProcessGroup | None" = None) -> dict[str, Any]:
    """This rank's last communication in ``group``: op and call, bytes (nccl-tests
    convention), devices (global ids), algorithm, start, end and time (modeled
    seconds), the local device and its communication stream."""
    return backend(group).last_collective()


register()
