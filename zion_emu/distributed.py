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

Before the data, the ranks agree on each call (the handshake): through a
shared-memory segment when every rank of the group runs on this host, else,
or with ``ZION_HANDSHAKE=gloo`` on any rank, through a small gloo all-gather.
``backend(group).handshake`` says which (``"shm"`` or ``"gloo"``).

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
``{"base": "zion", "nodes": 2}``.

A world bigger than its processes: with ``ZION_PRESENT_RANKS`` (what
``zion-emu run --world-size N --ranks LIST`` sets in each rank) only the
listed global ranks run; a group's inner gloo holds its present ranks alone,
and every collective is priced for all of the group's ranks, the absent ones
placed by their rank (node by node). What absent ranks contribute to the
data, and that point-to-point with one is refused, is in csrc/dist
(process_group_zion.h); the README's "Worlds bigger than the processes"
states the assumptions.

The model: each group prices its collectives with one algorithm and one link
model. ``pg_options=Options(algorithm="ring", link_model="unaware")`` chooses
them for a group (``init_process_group`` or ``new_group``); what it leaves out
comes from ``ZION_COLLECTIVE_ALGO`` (default: the platform's ``auto``) and
``ZION_LINK_MODEL`` (``fair``, ``unaware`` or ``astra``; default ``fair``).
A group created without ``pg_options`` reads the environment alone; it does not
inherit another group's options. The link model's older spellings still work:
``Options(mode=...)`` (with a DeprecationWarning) and ``ZION_COLLECTIVE_MODE``
(read when ``ZION_LINK_MODEL`` is unset; the two set to different models is
an error).
"""

from __future__ import annotations

import copy
import os
import warnings
from dataclasses import dataclass
from datetime import timedelta
from types import ModuleType
from typing import Any

import torch
import torch.distributed as dist

import torch._C._distributed_c10d as _c10d

from zion_emu import _after_import

BACKEND = "zion"
LINK_MODEL_ENV = "ZION_LINK_MODEL"
# The link model's variable before it was named for it; read when LINK_MODEL_ENV is unset.
LEGACY_LINK_MODEL_ENV = "ZION_COLLECTIVE_MODE"
# The global ranks that run as processes, e.g. "0,8"; unset: every rank runs.
PRESENT_RANKS_ENV = "ZION_PRESENT_RANKS"
_registered = False


def _env_int(name: str) -> int:
    value = os.environ.get(name)
    return int(value) if value not in (None, "") else -1


@dataclass(frozen=True, init=False)
class Options:
    """A zion group's model, passed as ``pg_options`` to ``init_process_group``
    or ``new_group``. ``algorithm``: a collective algorithm of
    ``zion_emu.sim.algorithm_names()`` (``auto`` lets the platform choose);
    ``link_model``: one of ``zion_emu.sim.link_model_names()`` (``fair``,
    ``unaware``, ``astra``). None takes ``ZION_COLLECTIVE_ALGO`` /
    ``ZION_LINK_MODEL`` (then ``auto`` / ``fair``). A value the model does not
    know raises ``ValueError`` listing the allowed ones. ``mode`` is the old
    keyword for ``link_model``, deprecated."""

    algorithm: str | None = None
    link_model: str | None = None

    def __init__(self, algorithm: str | None = None, link_model: str | None = None, *, mode: str | None = None) -> None:
        from zion_emu._C import dist as _dist

        if mode is not None:
            if link_model is not None:
                raise TypeError("zion backend: Options got both link_model and its deprecated name mode; pass link_model")
            warnings.warn("zion_emu.distributed.Options(mode=...) is deprecated; use link_model=...",
                          DeprecationWarning, stacklevel=2)
            link_model = mode
        object.__setattr__(self, "algorithm", algorithm)
        object.__setattr__(self, "link_model", link_model)
        for field, value in (("algorithm", self.algorithm), ("link_model", self.link_model)):
            if value is not None and not isinstance(value, str):
                raise TypeError(f"zion backend: Options.{field} must be a string or None, got {type(value).__name__}")
        _dist.check_model(self.algorithm or "auto", self.link_model or "fair", "zion_emu.distributed.Options")

    def resolved(self) -> tuple[str, str]:
        """(algorithm, link_model) with the environment filling what was left out."""
        return (self.algorithm or _env_model("ZION_COLLECTIVE_ALGO", "auto"),
                self.link_model or _env_model(_link_model_env(), "fair"))


def _env_model(name: str, default: str) -> str:
    return os.environ.get(name) or default


def _link_model_env() -> str:
    """The variable the link model is read from: ZION_LINK_MODEL, or the old
    ZION_COLLECTIVE_MODE when only that one is set. Both set to different
    models is refused, as ``Options`` refuses both of its spellings."""
    new, old = os.environ.get(LINK_MODEL_ENV), os.environ.get(LEGACY_LINK_MODEL_ENV)
    if new and old and new.strip() != old.strip():
        raise ValueError(f"zion backend: {LINK_MODEL_ENV}={new!r} and its deprecated name {LEGACY_LINK_MODEL_ENV}="
                         f"{old!r} disagree; unset {LEGACY_LINK_MODEL_ENV}")
    if not new and old:
        return LEGACY_LINK_MODEL_ENV
    return LINK_MODEL_ENV


def _group_model(backend_options: Any) -> tuple[str, str]:
    """The (algorithm, link_model) a new group prices with: its ``pg_options``, then the environment."""
    from zion_emu._C import dist as _dist

    options = Options() if backend_options is None else backend_options
    if not isinstance(options, Options):
        raise TypeError(f"zion backend: pg_options must be zion_emu.distributed.Options, got "
                        f"{type(options).__module__}.{type(options).__qualname__}")
    algorithm, link_model = options.resolved()
    # Options checked its own values; what is wrong now came from the environment.
    _dist.check_model(algorithm, link_model, f"ZION_COLLECTIVE_ALGO / {_link_model_env()}")
    return algorithm, link_model


def present_ranks(world_size: int) -> list[int] | None:
    """The global ranks that run as processes (``ZION_PRESENT_RANKS``, checked
    against ``world_size``), or None when every rank runs."""
    value = os.environ.get(PRESENT_RANKS_ENV, "").strip()
    if not value:
        return None
    try:
        ranks = sorted({int(r) for r in value.split(",")})
    except ValueError:
        raise ValueError(f"zion backend: {PRESENT_RANKS_ENV}={value!r}: expected global ranks separated by commas, "
                         "e.g. 0,8") from None
    bad = [r for r in ranks if not 0 <= r < world_size]
    if bad:
        raise ValueError(f"zion backend: {PRESENT_RANKS_ENV} names rank(s) {bad} outside the world of {world_size} "
                         f"(0..{world_size - 1})")
    return ranks


def _create(opts: Any, backend_options: Any = None) -> "dist.Backend":
    """torch.distributed's factory (extended API): one ProcessGroupZion per group;
    ``backend_options`` is the group's ``pg_options`` (an :class:`Options` or None)."""
    from zion_emu._C import dist as _dist

    algorithm, link_model = _group_model(backend_options)
    rank, size = opts.group_rank, opts.group_size
    timeout = opts.timeout if isinstance(opts.timeout, timedelta) else timedelta(seconds=float(opts.timeout))
    global_ranks = list(opts.global_ranks_in_group or [])
    global_rank = global_ranks[rank] if global_ranks else rank
    # The group ranks that run: all, unless the world is bigger than its processes.
    world_present = present_ranks(dist.get_world_size() if dist.is_initialized() else
                                  (len(global_ranks) if global_ranks else size))
    present: list[int] = []
    if world_present is not None:
        if global_rank not in world_present:
            raise ValueError(f"zion backend: this process is rank {global_rank}, which {PRESENT_RANKS_ENV} "
                             f"({os.environ[PRESENT_RANKS_ENV]}) does not list")
        members, running = global_ranks or list(range(size)), set(world_present)
        present = [g for g, r in enumerate(members) if r in running]
        if len(present) == size:
            present = []
    return _backend(opts.store, rank, size, global_ranks, timeout, algorithm, link_model, present)


def _backend(store: Any, rank: int, size: int, global_ranks: list[int], timeout: timedelta, algorithm: str,
             link_model: str, present: list[int] | None = None) -> "dist.Backend":
    """One ProcessGroupZion: rank ``rank`` of ``size``, ``global_ranks`` its
    ranks' global ranks (empty: the same), ``present`` the group ranks that
    run (empty: all). A group split from it (``split_group``; DeviceMesh
    with a bound device) is made the same way, pricing as it does."""
    from zion_emu._C import dist as _dist

    present = present or []
    # The inner gloo backend gets a store namespace of its own, and holds the present ranks alone.
    gloo_rank, gloo_size = (present.index(rank), len(present)) if present else (rank, size)
    gloo = dist.ProcessGroupGloo(dist.PrefixStore("zion/gloo/", store), gloo_rank, gloo_size, timeout)

    def split(split_store: Any, split_rank: int, split_size: int, split_global: list[int],
              timeout_s: float) -> "dist.Backend":
        return _backend(split_store, split_rank, split_size, list(split_global), timedelta(seconds=timeout_s),
                        algorithm, link_model)

    return _dist.ProcessGroupZion(
        store, gloo, rank, size,
        global_rank=global_ranks[rank] if global_ranks else rank,
        local_rank=_env_int("LOCAL_RANK"),
        node_rank=_env_int("GROUP_RANK"),
        algorithm=algorithm,
        link_model=link_model,
        present=present,
        global_ranks=global_ranks,
        timeout_s=timeout.total_seconds(),
        split=split,
    )


def _sharded_tensor_device(sharded_tensor: ModuleType) -> None:
    """torch's ``ShardedTensor.device`` on a rank that holds no shard of it
    is the CPU on a gloo group and ``torch.cuda.current_device()`` on any
    other, which fails without CUDA (torch.distributed.checkpoint asks it
    when it loads a torchrec model whose table has no shard on this rank). On
    a zion group it is zion's current device, as on an NCCL group CUDA's."""
    ops = sharded_tensor._SHARDED_OPS
    get = torch.Tensor.device.__get__
    torchs = ops.get(get)
    if torchs is None:
        return

    def device(types: Any, args: Any = (), kwargs: Any = None, pg: Any = None) -> torch.device:
        st = args[0] if args else None
        if st is not None and not getattr(st, "_local_shards", True) \
                and _on_zion_group(pg):  # pg._get_backend_name() says "custom"
            return torch.device(BACKEND, torch.zion.current_device())
        return torchs(types, args, kwargs, pg)

    ops[get] = device
    _sharded_tensor_to(sharded_tensor.ShardedTensor)


def _on_zion_group(pg: Any) -> bool:
    return pg is not None and dist.get_backend(pg) == BACKEND


def _sharded_tensor_to(cls: type) -> None:
    """``ShardedTensor.to`` on a zion group, as torch runs it on an NCCL group
    with zion for CUDA: a device named without an index (``"zion"``) is the
    current zion device, as torch takes ``"cuda"``, and a rank that holds no
    shard starts from zion's current device where torch asks
    ``torch.cuda.current_device()``. Such a rank has no tensor to move: it
    takes the result's dtype and device from ``Tensor.to`` on an empty
    tensor of its own, and makes the result from the new metadata as torch
    does on the ranks that hold shards."""
    torchs = cls.to

    def current(device: Any) -> Any:
        if isinstance(device, str):
            device = torch.device(device)
        if isinstance(device, torch.device) and device.type == BACKEND and device.index is None:
            return torch.device(BACKEND, torch.zion.current_device())
        return device

    def to(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not _on_zion_group(self._process_group):
            return torchs(self, *args, **kwargs)
        args = tuple(current(a) for a in args)
        if "device" in kwargs:
            kwargs["device"] = current(kwargs["device"])
        if self._local_shards:
            return torchs(self, *args, **kwargs)
        here = torch.device(BACKEND, torch.zion.current_device())
        process_group = kwargs.pop("process_group", None)
        copy_tensor = kwargs.get("copy", False)
        target = torch.empty(0, dtype=self.dtype, device=here).to(*args, **kwargs)
        if not copy_tensor and target.dtype == self.dtype and target.device == here:
            return self
        metadata = copy.deepcopy(self.metadata())
        metadata.tensor_properties.dtype = target.dtype
        for shard in metadata.shards_metadata:
            shard.placement._device = target.device
        return cls._init_from_local_shards_and_global_metadata(
            [], sharded_tensor_metadata=metadata, process_group=process_group or self._process_group,
            init_rrefs=self._init_rrefs)

    to.__doc__ = torchs.__doc__
    cls.to = to


class _DistAsNccl(ModuleType):
    """``torch.distributed`` as ``torch.distributed.nn.functional`` sees it:
    there ``get_backend`` says ``nccl`` for a zion group, and every other name
    is torch.distributed's own. That module's autograd functions branch on the
    backend: on NCCL the backward of ``all_gather`` is a reduce_scatter and
    that of ``_all_gather_base`` a ``_reduce_scatter_base``; on any other
    backend the first runs an all_to_all and a sum, and the second raises
    "Backend not supported!". A zion group runs what NCCL runs, so it is
    priced as NCCL's collective, and torch's own code does it."""

    def __getattr__(self, name: str) -> Any:
        return getattr(dist, name)

    @staticmethod
    def get_backend(group: "dist.ProcessGroup | None" = None) -> str:
        name = dist.get_backend(group)
        return dist.Backend.NCCL if name == BACKEND else name


def _nn_functional_as_nccl(functional: ModuleType) -> None:
    functional.dist = _DistAsNccl(dist.__name__, dist.__doc__)


class _SplitOptions(_c10d.Backend.Options):
    """What ``split_group`` reads from a zion backend (``backend.options``) and
    hands back to its split: torch's backend options, which it deep-copies
    first (torch's own class cannot be copied). The split keeps the parent's
    algorithm and link model; of these options only the timeout counts."""

    def __deepcopy__(self, memo: dict[int, Any]) -> "_SplitOptions":
        return type(self)(self.backend, self._timeout)


def _split_options(backend: Any) -> _SplitOptions:
    return _SplitOptions(BACKEND, backend.timeout)


def register() -> None:
    """Registers the ``zion`` backend for zion tensors (idempotent)."""
    global _registered
    if _registered or BACKEND.upper() in dist.Backend._plugins:
        _registered = True
        return
    _after_import.after_import("torch.distributed._shard.sharded_tensor", _sharded_tensor_device)
    _after_import.after_import("torch.distributed.nn.functional", _nn_functional_as_nccl)
    from zion_emu._C import dist as _dist

    _dist.ProcessGroupZion.options = property(_split_options, doc="torch's backend options, for split_group")
    # cpu too, as gloo registers cuda and cpu: object collectives and host-side
    # reductions on a zion group go through the inner gloo, unmodeled.
    dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=[BACKEND, "cpu"])
    _registered = True


def backend(group: "dist.ProcessGroup | None" = None) -> Any:
    """The ProcessGroupZion behind ``group`` (the default group when None)."""
    if isinstance(group, int) and group == dist.GroupMember.NON_GROUP_MEMBER:
        raise ValueError("zion: this rank is not a member of the group (new_group gives the ranks outside it "
                         "GroupMember.NON_GROUP_MEMBER), so it has no zion backend there")
    group = group or dist.distributed_c10d._get_default_group()
    try:
        return group._get_backend(torch.device(BACKEND))
    except RuntimeError as e:
        raise ValueError(f"zion: the group has no zion backend (its backend is {dist.get_backend(group)!r}); "
                         "zion_emu.distributed reads groups made with backend 'zion'") from e


def group_model(group: "dist.ProcessGroup | None" = None) -> dict[str, str]:
    """The algorithm and link model ``group`` prices its collectives with."""
    b = backend(group)
    return {"algorithm": b.algorithm, "link_model": b.link_model}


def last_collective(group: "dist.ProcessGroup | None" = None) -> dict[str, Any]:
    """This rank's last communication in ``group``: op and call, bytes (nccl-tests
    convention), devices (global ids), algorithm, protocol, start, end and time
    (modeled seconds), the local device and its communication stream.

    ``protocol`` is NCCL's (``"LL"``, ``"LL128"`` or ``"Simple"``) when the
    platform's model of NCCL's tuner priced the call, and then ``algorithm`` is
    the one that tuner chose (``ring``, ``double_binary_tree``, ``in_switch``,
    or across nodes ``hierarchical`` for NCCL's NVLSTree).
    It is None when the topology model priced the call: the group forces an
    algorithm or a link model other than ``fair``, the platform has the tuner
    off (``collectives.nccl_tuner.enabled``) or a fabric other than an NVSwitch,
    the ranks span nodes in a way the tuner's model across nodes does not cover
    (one GPU per node, different GPUs on different nodes, no NIC at PIX distance
    from two of them, no GPUDirect RDMA), or the op is one NCCL does not tune
    (all_to_all, gather, scatter, send/recv)."""
    return backend(group).last_collective()


register()
