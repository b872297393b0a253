"""Reads ASTRA-sim 2.0 inputs (analytical network YAML, system JSON) into a
collective model, so its worked cases can be run side by side with ours.

Units as ASTRA-sim converts them: network ``bandwidth`` in GB/s with
GB = 2^30 bytes, ``latency`` in ns; ``local-mem-bw`` in GB/s with GB = 10^9;
``endpoint-delay`` in ns.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from typing import Any

import yaml

from zion_emu import _C
from zion_emu.platform import ConfigError

GIB = 1 << 30

_BLOCKS = tuple(_C.sim.dimension_kind_names())
# ASTRA-sim's *-implementation names -> ours.
_IMPLEMENTATIONS = {
    "ring": "ring",
    "direct": "direct",
    "halvingDoubling": "halving_doubling",
    "doubleBinaryTree": "double_binary_tree",
}
_OPS = {
    "all_reduce": "all-reduce-implementation",
    "all_gather": "all-gather-implementation",
    "reduce_scatter": "reduce-scatter-implementation",
    "all_to_all": "all-to-all-implementation",
}
# Implementations the event-by-event emulation (AstraMachine.emulate) covers.
_EMULATED = ("ring", "direct")
# System-file keys that steer ASTRA-sim's scheduler and have no counterpart
# in the analytical timing reproduced here; accepted and listed as ignored.
_SCHEDULING_KEYS = {
    "scheduling-policy", "collective-optimization", "boost-mode", "intra-dimension-scheduling",
    "inter-dimension-scheduling", "roofline-enabled", "peak-perf", "replay-only", "track-local-mem",
    "local-mem-trace-filename", "L", "o", "g", "G", "model-shared-bus", "trace-enabled",
}


@dataclass
class AstraNetwork:
    topology: list[str]
    npus_count: list[int]
    bandwidth_gbps: list[float]  # GB/s, GB = 2^30
    latency_ns: list[float]

    @property
    def npus(self) -> int:
        total = 1
        for n in self.npus_count:
            total *= n
        return total


@dataclass
class AstraSystem:
    endpoint_delay_ns: float = 10.0
    preferred_dataset_splits: int = 1
    active_chunks_per_dimension: int = 1
    local_mem_bw_gbps: float = 0.0  # GB/s, GB = 10^9
    implementations: dict[str, list[str]] = field(default_factory=dict)
    ignored: list[str] = field(default_factory=list)


def _fail(origin: str, key: str, what: str) -> None:
    raise ConfigError(f"ASTRA-sim input {origin}: '{key}' {what}")


def _list_of(doc: dict[str, Any], key: str, kind: type, origin: str) -> list[Any]:
    if key not in doc:
        _fail(origin, key, "is missing")
    value = doc[key]
    if not isinstance(value, list):
        value = [value]
    if not value:
        _fail(origin, key, "must list one value per dimension")
    out = []
    for v in value:
        if kind is str:
            if not isinstance(v, str):
                _fail(origin, key, f"must hold names, got {v!r}")
            out.append(v)
        else:
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                _fail(origin, key, f"must hold numbers, got {v!r}")
            try:
                finite = math.isfinite(v)
            except OverflowError:  # an int beyond any float
                finite = False
            if not finite:
                _fail(origin, key, f"must hold finite numbers, got {v!r}")
            if kind is int and int(v) != v:
                _fail(origin, key, f"must hold whole numbers, got {v!r}")
            out.append(kind(v))
    return out


def parse_network(text: str, origin: str = "network") -> AstraNetwork:
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"ASTRA-sim input {origin}: not valid YAML: {e}") from None
    if not isinstance(doc, dict):
        raise ConfigError(f"ASTRA-sim input {origin}: expected a mapping with topology, npus_count, bandwidth, latency")
    unknown = set(doc) - {"topology", "npus_count", "bandwidth", "latency"}
    if unknown:
        _fail(origin, sorted(unknown)[0], "is not a network field; allowed: topology, npus_count, bandwidth, latency")
    net = AstraNetwork(
        topology=_list_of(doc, "topology", str, origin),
        npus_count=_list_of(doc, "npus_count", int, origin),
        bandwidth_gbps=_list_of(doc, "bandwidth", float, origin),
        latency_ns=_list_of(doc, "latency", float, origin),
    )
    dims = len(net.topology)
    for key, values in (("npus_count", net.npus_count), ("bandwidth", net.bandwidth_gbps), ("latency", net.latency_ns)):
        if len(values) != dims:
            _fail(origin, key, f"has {len(values)} entries but topology has {dims} dimensions")
    for kind in net.topology:
        if kind not in _BLOCKS:
            _fail(origin, "topology", f"names {kind!r}; allowed: {', '.join(_BLOCKS)}")
    for n in net.npus_count:
        if n < 2:
            _fail(origin, "npus_count", f"must be >= 2 per dimension, got {n}")
    for b in net.bandwidth_gbps:
        if not 0 < b < math.inf:  # NaN fails too
            _fail(origin, "bandwidth", f"must be > 0 GB/s and finite, got {b}")
    for lat in net.latency_ns:
        if not 0 <= lat < math.inf:
            _fail(origin, "latency", f"must be >= 0 ns and finite, got {lat}")
    if net.npus > 1 << 16:
        _fail(origin, "npus_count", f"multiplies to {net.npus} NPUs; at most 65536 are supported")
    return net


def parse_system(text: str, origin: str = "system") -> AstraSystem:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"ASTRA-sim input {origin}: not valid JSON: {e}") from None
    if not isinstance(doc, dict):
        raise ConfigError(f"ASTRA-sim input {origin}: expected a JSON object")
    sysc = AstraSystem()

    def number(key: str, kind: type, minimum: float) -> Any:
        v = doc[key]
        if (isinstance(v, bool) or not isinstance(v, (int, float)) or not minimum <= v < 2.0 ** 53
                or (kind is int and int(v) != v)):
            _fail(origin, key, f"must be a {'whole ' if kind is int else ''}number >= {minimum} and < 2^53, got {v!r}")
        return kind(v)

    for key in doc:
        if key == "endpoint-delay":
            sysc.endpoint_delay_ns = number(key, float, 0)
        elif key == "preferred-dataset-splits":
            sysc.preferred_dataset_splits = number(key, int, 1)
        elif key == "active-chunks-per-dimension":
            sysc.active_chunks_per_dimension = number(key, int, 1)
        elif key == "local-mem-bw":
            sysc.local_mem_bw_gbps = number(key, float, 0)
        elif key in _OPS.values():
            names = _list_of(doc, key, str, origin)
            for n in names:
                if n not in _IMPLEMENTATIONS:
                    _fail(origin, key, f"names {n!r}; allowed: {', '.join(_IMPLEMENTATIONS)}")
            sysc.implementations[key] = [_IMPLEMENTATIONS[n] for n in names]
        elif key in _SCHEDULING_KEYS:
            sysc.ignored.append(key)
        else:
            _fail(origin, key, "is not an ASTRA-sim system field known here; known: endpoint-delay, "
                  "preferred-dataset-splits, active-chunks-per-dimension, local-mem-bw, "
                  + ", ".join(_OPS.values()) + " (scheduler-only fields are accepted and ignored)")
    return sysc


class AstraMachine:
    """An ASTRA-sim network + system as a collective model (one per operation,
    since the system file picks the algorithm per operation and dimension)."""

    def __init__(self, network: AstraNetwork, system: AstraSystem) -> None:
        self.network = network
        self.system = system
        dims = [
            (kind, n, bw * GIB, lat * 1e-9)
            for kind, n, bw, lat in zip(network.topology, network.npus_count, network.bandwidth_gbps, network.latency_ns)
        ]
        self.topology = _C.sim.build_dimension_topology(dims)
        self._models: dict[str, Any] = {}

    @property
    def npus(self) -> int:
        return self.network.npus

    def model(self, op: str) -> Any:
        if op not in self._models:
            levels = self.system.implementations.get(_OPS.get(op, ""), [])
            dims = len(self.network.topology)
            if levels and len(levels) != dims:
                raise ConfigError(f"ASTRA-sim input: {_OPS[op]} lists {len(levels)} implementations "
                                  f"for a {dims}-dimensional network")
            if dims == 1:
                algorithm = levels[0] if levels else "auto"
            else:
                algorithm = "hierarchical"
            settings = {
                "endpoint_delay_s": self.system.endpoint_delay_ns * 1e-9,
                "preferred_dataset_splits": self.system.preferred_dataset_splits,
                "active_chunks_per_dimension": self.system.active_chunks_per_dimension,
                "local_memory_bandwidth_bytes_per_s": self.system.local_mem_bw_gbps * 1e9,
                "algorithm": algorithm,
                "level_algorithms": levels,
            }
            self._models[op] = _C.sim.CollectiveModel(self.topology, list(self.network.npus_count), settings)
        return self._models[op]

    def run(self, op: str, nbytes: float, link_model: str = "astra", algo: str = "auto") -> Any:
        return self.model(op).run(op, float(nbytes), list(range(self.npus)), algo, link_model)

    def emulation_refusal(self, op: str, algo: str = "auto") -> str | None:
        """Why :meth:`emulate` cannot run ``op`` on this machine, or None if it can."""
        if len(self.network.topology) != 1:
            return f"the network has {len(self.network.topology)} dimensions; the emulation covers one"
        if op not in _OPS:
            return f"{op} is not emulated; allowed: {', '.join(_OPS)}"
        levels = self.system.implementations.get(_OPS[op], [])
        if len(levels) != 1 or levels[0] not in _EMULATED:
            named = levels[0] if levels else "none"
            return (f"{_OPS[op]} is {named}; the emulation covers "
                    f"{' and '.join(_EMULATED)} (set it in the system file)")
        if algo not in ("auto", levels[0]):
            return f"--algo {algo} differs from the system file's {_OPS[op]} ({levels[0]})"
        return None

    def emulate(self, op: str, astra_bytes: int, congestion_aware: bool = True) -> int:
        """ASTRA-sim 2.0's time for ``op`` in nanoseconds, event by event through its
        system layer and its congestion-aware (or -unaware) analytical backend.
        ``astra_bytes`` is ASTRA-sim's size: for all_gather, each NPU's contribution."""
        refusal = self.emulation_refusal(op)
        if refusal:
            raise ConfigError(f"ASTRA-sim emulation: {refusal}")
        net, sysc = self.network, self.system
        try:
            time_ns, _ = _C.sim.emulate_astra(
                op, int(astra_bytes), net.topology[0], net.npus_count[0], net.bandwidth_gbps[0], net.latency_ns[0],
                self.system.implementations[_OPS[op]][0], -1, sysc.endpoint_delay_ns, sysc.preferred_dataset_splits,
                sysc.active_chunks_per_dimension, sysc.local_mem_bw_gbps, congestion_aware)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        return time_ns

    def emulated(self, op: str, nbytes: int, congestion_aware: bool = True) -> "EmulatedResult":
        """:meth:`emulate` for an nccl-tests size (all_gather: the gathered output,
        npus x ASTRA-sim's size), as a result with time, algbw and busbw."""
        astra_bytes = nbytes // self.npus if op == "all_gather" else nbytes
        time = self.emulate(op, astra_bytes, congestion_aware) * 1e-9
        algbw = nbytes / time if time > 0 else 0.0
        return EmulatedResult(time, algbw, algbw * _C.sim.bus_bandwidth_factor(op, self.npus),
                              self.system.implementations[_OPS[op]][0])


@dataclass
class EmulatedResult:
    """One emulated ASTRA-sim collective, shaped like the model's CollectiveResult."""

    time: float  # seconds
    algbw: float  # bytes per second
    busbw: float
    algorithm: str
    protocol: str = ""


def load(network_path: str | os.PathLike[str], system_path: str | os.PathLike[str] | None = None) -> AstraMachine:
    def read(path: str | os.PathLike[str]) -> str:
        try:
            with open(path) as f:
                return f.read()
        except OSError as e:
            raise ConfigError(f"ASTRA-sim input '{os.fspath(path)}' cannot be read: {e.strerror}") from None

    network = parse_network(read(network_path), os.fspath(network_path))
    system = parse_system(read(system_path), os.fspath(system_path)) if system_path else AstraSystem()
    return AstraMachine(network, system)
