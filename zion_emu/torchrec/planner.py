"""torchrec's sharding planner on zion.

torchrec's ``Topology`` accepts the compute devices cpu, cuda and mtia, and
plans an accelerator (HBM capacities, fused kernels, row-wise sharding) only
for cuda and mtia; a shard's placement is written ``rank:r/cuda:i``. A zion
topology is planned with torchrec's accelerator ("cuda") model, and where the
caller does not give them, it takes the machine's numbers from the platform
zion models: HBM and DDR per device, HBM and DDR bandwidth, and the intra- and
inter-node bandwidths. Its shards are placed on ``zion:i``.

Under ``--cuda-compat`` a script's "cuda" means zion, so a "cuda" topology
gets the platform's numbers too (and keeps "cuda" placements, which the
compatibility layer maps to zion).
"""

from __future__ import annotations

import contextvars
import functools
import inspect
from dataclasses import dataclass
from typing import Any, Callable

ZION = "zion"
MS_PER_S = 1000  # torchrec's bandwidths are bytes per millisecond
ALL_TO_ALL_PROBE_BYTES = 256 << 20  # large enough that latency is negligible in the bus bandwidth

# Set while torchrec writes the plan of a zion topology: its "cuda" placements are zion's.
_planning_zion = contextvars.ContextVar("planning_zion", default=False)


@dataclass(frozen=True)
class PlannerHardware:
    """What torchrec's Topology takes from the machine, in its units."""

    hbm_cap: int            # bytes per device
    ddr_cap: int            # bytes per device: the node's DDR shared by its devices
    hbm_mem_bw: float       # bytes/ms per device
    ddr_mem_bw: float       # bytes/ms per device: the node's DDR bandwidth shared by its devices
    intra_host_bw: float    # bytes/ms: the modeled all-to-all bus bandwidth within one node
    inter_host_bw: float    # bytes/ms per device: the node's NIC bandwidth shared by its devices
    local_world_size: int   # devices per node


def planner_hardware(platform: Any = None) -> PlannerHardware:
    """The Topology numbers of ``platform`` (default: the one zion models)."""
    import zion_emu
    from zion_emu import sim

    p = platform if platform is not None else zion_emu.current_platform()
    devices = p.devices_per_node
    sockets = p.get("socket.count")
    all_to_all = sim.collective(p, "all_to_all", ALL_TO_ALL_PROBE_BYTES, devices) if devices > 1 else None
    nic_bytes_per_s = p.get("nic.count") * p.get("nic.bandwidth_gbit_per_s") * 1e9 / 8
    return PlannerHardware(
        hbm_cap=int(p.get("oam.hbm_bytes")),
        ddr_cap=int(p.get("socket.ddr_bytes")) * sockets // devices,
        hbm_mem_bw=p.get("oam.hbm_bandwidth_gb_per_s") * 1e9 / MS_PER_S,
        ddr_mem_bw=p.get("socket.ddr_bandwidth_gb_per_s") * 1e9 * sockets / devices / MS_PER_S,
        intra_host_bw=(all_to_all.busbw if all_to_all else p.get("oam.hbm_bandwidth_gb_per_s") * 1e9) / MS_PER_S,
        inter_host_bw=nic_bytes_per_s / devices / MS_PER_S,
        local_world_size=devices,
    )


def _plans_zion(compute_device: str) -> bool:
    if compute_device == ZION:
        return True
    if compute_device == "cuda":
        from zion_emu import cuda_compat

        return cuda_compat.enabled()
    return False


def _topology_init(init: Callable[..., None]) -> Callable[..., None]:
    signature = inspect.signature(init)

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        bound = signature.bind(self, *args, **kwargs)
        compute_device = bound.arguments.get("compute_device")
        if not _plans_zion(compute_device):
            return init(self, *args, **kwargs)
        hardware = planner_hardware()
        given = dict(bound.arguments)
        given.pop("self")
        extra = given.pop("kwargs", {}) if "kwargs" in signature.parameters else {}
        for field in ("hbm_cap", "ddr_cap", "hbm_mem_bw", "ddr_mem_bw", "intra_host_bw", "inter_host_bw"):
            if given.get(field) is None:
                given[field] = getattr(hardware, field)
        given["compute_device"] = "cuda"  # torchrec's accelerator model: HBM, fused kernels
        init(self, **given, **extra)
        self._zion_placements = compute_device == ZION
        self._zion_devices = True

    return __init__


def _zion_placement(placement: Callable[[str, int, int], str]) -> Callable[[str, int, int], str]:
    @functools.wraps(placement)
    def zion_placement(compute_device: str, rank: int, local_size: int) -> str:
        if compute_device == ZION or (compute_device == "cuda" and _planning_zion.get()):
            return f"rank:{rank}/{ZION}:{rank % local_size}"
        return placement(compute_device, rank, local_size)

    zion_placement._zion = True  # type: ignore[attr-defined]
    return zion_placement


def _zion_sharding_plan(to_sharding_plan: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(to_sharding_plan)
    def to_zion_sharding_plan(sharding_options: Any, topology: Any, *args: Any, **kwargs: Any) -> Any:
        token = _planning_zion.set(getattr(topology, "_zion_placements", False))
        try:
            return to_sharding_plan(sharding_options, topology, *args, **kwargs)
        finally:
            _planning_zion.reset(token)

    return to_zion_sharding_plan


# torchrec's kernels that keep a table in UVM (host memory the GPU reads over
# PCIe, with or without an HBM cache). zion models no UVM: such a table would
# be allocated, and priced, in HBM.
UVM_KERNELS = ("fused_uvm", "fused_uvm_caching")


def _no_uvm_init(init: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(init)
    def __init__(self: Any, topology: Any, *args: Any, **kwargs: Any) -> None:
        init(self, topology, *args, **kwargs)
        self._zion_devices = getattr(topology, "_zion_devices", False)

    return __init__


def _no_uvm_kernels(filter_kernels: Callable[..., list[str]]) -> Callable[..., list[str]]:
    @functools.wraps(filter_kernels)
    def _filter_compute_kernels(self: Any, name: str, allowed: list[str], sharding_type: str) -> list[str]:
        kernels = filter_kernels(self, name, allowed, sharding_type)
        if not getattr(self, "_zion_devices", False):
            return kernels
        kept = [k for k in kernels if k not in UVM_KERNELS]
        if kernels and not kept:
            raise ValueError(
                f"zion: table {name!r} may only use the compute kernels {sorted(kernels)}, which keep it in UVM, "
                "and zion models no UVM (the table would be allocated and priced in HBM). Allow 'fused' (HBM); a "
                "table that does not fit HBM goes in a socket's DDR from the script (README, \"Tables in a "
                "socket's DDR\")")
        return kept

    return _filter_compute_kernels


def install_enumerators(enumerators: Any) -> None:
    """torchrec.distributed.planner.enumerators: a zion topology's plan offers no UVM kernels."""
    cls = enumerators.EmbeddingEnumerator
    cls.__init__ = _no_uvm_init(cls.__init__)
    cls._filter_compute_kernels = _no_uvm_kernels(cls._filter_compute_kernels)


def install_topology(types: Any) -> None:
    """torchrec.distributed.planner.types: Topology plans zion."""
    types.Topology.__init__ = _topology_init(types.Topology.__init__)


def install_placement(module: Any) -> None:
    """A module with a ``placement`` function (torchrec.distributed.sharding_plan,
    and planner.planners, which imported it by name): zion placements."""
    if not getattr(module.placement, "_zion", False):
        module.placement = _zion_placement(module.placement)


def install_planners(planners: Any) -> None:
    """torchrec.distributed.planner.planners: plans of zion topologies place on zion."""
    install_placement(planners)
    planners.to_sharding_plan = _zion_sharding_plan(planners.to_sharding_plan)
