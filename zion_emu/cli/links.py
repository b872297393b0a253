"""The link classes of a platform's topology, counted per node."""

from __future__ import annotations

from dataclasses import dataclass

from zion_emu import sim
from zion_emu.platform import Platform


@dataclass
class LinkClass:
    name: str
    bandwidth_bytes_per_s: float  # per direction
    latency_s: float
    links_per_node: int  # bidirectional links with an end in node 0

    def to_json(self) -> dict[str, float | int | str]:
        return {
            "name": self.name,
            "bandwidth_gb_per_s": self.bandwidth_bytes_per_s / 1e9,
            "latency_ns": round(self.latency_s * 1e9, 6),
            "links_per_node": self.links_per_node,
            "bandwidth_bytes_per_s": self.bandwidth_bytes_per_s,
            "latency_s": self.latency_s,
        }


def link_classes(platform: Platform) -> list[LinkClass]:
    """Every link class in the topology's order, with how many links of it touch node 0."""
    topo = sim.build_topology(platform.native)
    node = [v["node"] for v in topo.vertices]
    pairs: dict[str, set[frozenset[int]]] = {}
    for link in topo.links:
        if 0 in (node[link["src"]], node[link["dst"]]):
            pairs.setdefault(link["link_class"], set()).add(frozenset((link["src"], link["dst"])))
    return [
        LinkClass(c["name"], c["bandwidth_bytes_per_s"], c["latency_s"], len(pairs.get(c["name"], ())))
        for c in topo.link_classes
    ]
