"""A text drawing of one node: sockets over PCIe switches over OAMs, then the fabric.

Columns follow the PCIe switches: each switch sits under the sockets it is
the first to reach and over its OAMs. A socket that feeds several switches
is drawn once, and the later switches name it in their box, e.g. ``(CPU0)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from zion_emu.cli import gb, num
from zion_emu.cli.links import LinkClass

_CELL = 6  # "CPU0  " / "OAM0  "


@dataclass
class _Column:
    sockets: list[int]
    label: str  # "" for parts on no switch
    oams: list[int]

    @property
    def width(self) -> int:
        return max(_CELL * max(len(self.sockets), len(self.oams), 1), len(self.label) + 3)


def _columns(fields: dict[str, Any]) -> list[_Column]:
    cols: list[_Column] = []
    seen_sockets: set[int] = set()
    seen_oams: set[int] = set()
    for i, sw in enumerate(fields["pcie"]["switches"]):
        own = [s for s in sw["sockets"] if s not in seen_sockets]
        shared = [s for s in sw["sockets"] if s in seen_sockets]
        oams = [o for o in sw["oams"] if o not in seen_oams]
        seen_sockets.update(own)
        seen_oams.update(oams)
        label = f"PCIe{i}"
        if shared:
            label += " (" + ",".join(f"CPU{s}" for s in shared) + ")"
        if sw["nics"]:
            label += " NIC" + ",".join(str(n) for n in sw["nics"])
        cols.append(_Column(own, label, oams))
    rest_sockets = [s for s in range(fields["socket"]["count"]) if s not in seen_sockets]
    rest_oams = [o for o in range(fields["oam"]["count"]) if o not in seen_oams]
    if rest_sockets or rest_oams:
        cols.append(_Column(rest_sockets, "", rest_oams))
    return cols


def _row(cols: list[_Column], items: str, name: str | None) -> str:
    """Names (``name`` = "CPU") or "|" connectors (``name`` = None) of each column's sockets or OAMs."""
    out = ""
    for col in cols:
        cells = (f" {name}{i}" if name else "   |" for i in getattr(col, items))
        out += "".join(c.ljust(_CELL) for c in cells).ljust(col.width)
    return out.rstrip()


def _boxes(cols: list[_Column]) -> str:
    out = ""
    for col in cols:
        out += ("[" + col.label.center(col.width - 3) + "] ") if col.label else " " * col.width
    return out.rstrip()


def _banner(text: str, width: int, fill: str) -> str:
    text = f" {text} "
    side = max(3, (width - len(text)) // 2)
    return fill * side + text + fill * side


def draw_node(fields: dict[str, Any], links: dict[str, LinkClass]) -> str:
    cols = _columns(fields)
    width = sum(c.width for c in cols)
    fabric = fields["fabric"]
    nic = fields["nic"]

    def link(name: str) -> str:
        c = links.get(name)
        if c is None:
            return "no links"
        plural = "s" if c.links_per_node != 1 else ""
        return f"{c.links_per_node} link{plural} x {num(gb(c.bandwidth_bytes_per_s))} GB/s"

    margin = " " * 9
    lines = [
        margin + _banner(f"UPI: {link('upi')}", width, "~"),
        "sockets  " + _row(cols, "sockets", "CPU"),
        margin + _row(cols, "sockets", None),
        "PCIe     " + _boxes(cols),
        margin + _row(cols, "oams", None),
        "OAMs     " + _row(cols, "oams", "OAM"),
        margin + _banner(f"fabric: {fabric['topology']}, {link('fabric')}", width, "="),
        f"scale-out: {nic['count']} NICs x {num(nic['bandwidth_gbit_per_s'])} Gb/s -> ToR switch "
        f"({fields['nodes']} node{'s' if fields['nodes'] != 1 else ''})",
    ]
    return "\n".join(lines)
