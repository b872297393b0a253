"""``zion-emu info``: the modeled machine, its links and a drawing of one node."""

from __future__ import annotations

import argparse
import json
from typing import Any

from zion_emu._format import Column, Table
from zion_emu.cli import add_platform_arguments, gb, num, platform_from
from zion_emu.cli.drawing import draw_node
from zion_emu.cli.links import LinkClass, link_classes
from zion_emu.platform import Platform

GIB = 1 << 30


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser("info", help="describe the modeled machine",
                              description="Describe the modeled machine: devices, memories, FLOP/s, links, "
                                          "PCIe switches, NICs, and a drawing of one node.")
    add_platform_arguments(p)
    p.add_argument("--json", action="store_true", help="print every preset field plus the link classes as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    platform = platform_from(args)
    links = link_classes(platform)
    if args.json:
        print(json.dumps({**platform.fields, "link_classes": [c.to_json() for c in links]}, indent=2))
    else:
        print(describe(platform, links))
    return 0


def _ids(prefix: str, ids: list[int]) -> str:
    return ",".join(f"{prefix}{i}" for i in ids) or "none"


def _nics(f: dict[str, Any]) -> str:
    nic = f["nic"]
    path = "GPUDirect (NIC <-> HBM)" if nic["gpudirect"] else "host-staged (through socket DDR)"
    return f"{nic['count']} per node x {num(nic['bandwidth_gbit_per_s'])} Gb/s, {path}"


def summary(platform: Platform) -> str:
    """A few lines: what the machine is, its devices, memory and fabric."""
    f = platform.fields
    oam, sock = f["oam"], f["socket"]
    return "\n".join([
        f"{platform.name}: {f['description']}",
        f"  {f['nodes']} node(s) x {oam['count']} OAMs = {platform.total_devices} devices; "
        f"{sock['count']} sockets per node",
        f"  HBM {num(oam['hbm_bytes'] / GIB)} GiB per OAM at {num(oam['hbm_bandwidth_gb_per_s'])} GB/s; "
        f"fabric {f['fabric']['topology']} at {num(f['fabric']['link_bandwidth_gb_per_s'])} GB/s per link",
        f"  NICs: {_nics(f)}",
    ])


_DTYPE_ORDER = ("fp64", "fp32", "tf32", "bf16", "fp16", "fp8", "int8")


def _flops_table(f: dict[str, Any]) -> list[str]:
    given = {*f["oam"]["peak_flops"], *f["socket"]["peak_flops"]}
    dtypes = [d for d in _DTYPE_ORDER if d in given] + sorted(given - set(_DTYPE_ORDER))
    table = Table(Column("Peak TFLOP/s", 13, "<"), *(Column(d, 8) for d in dtypes), indent="  ", gap="")
    return table.render([(unit, *(num(f[unit]["peak_flops"][d] / 1e12) if d in f[unit]["peak_flops"] else "-"
                                  for d in dtypes)) for unit in ("oam", "socket")])


def _link_table(links: list[LinkClass]) -> list[str]:
    table = Table(Column("Link classes (per direction)", 29, "<"), Column("GB/s", 8), Column("latency ns", 11),
                  Column("links/node", 11), indent="  ")
    return table.render([(c.name, num(gb(c.bandwidth_bytes_per_s)), num(c.latency_s * 1e9), c.links_per_node)
                         for c in links])


def _pcie_lines(f: dict[str, Any]) -> list[str]:
    rows = ["PCIe switches"]
    for i, sw in enumerate(f["pcie"]["switches"]):
        rows.append(f"  PCIe{i}: {sw['generation']}; uplinks {sw['uplink_generation']} x{sw['uplink_lanes']} to "
                    f"{_ids('CPU', sw['sockets'])}; {_ids('OAM', sw['oams'])} (x{sw['oam_lanes']}); "
                    f"{_ids('NIC', sw['nics'])} (x{sw['nic_lanes']})")
    return rows


def describe(platform: Platform, links: list[LinkClass]) -> str:
    f = platform.fields
    oam, sock, coll = f["oam"], f["socket"], f["collectives"]
    fe = f["frontend_nic"]
    astra = coll["astra"]
    lines = [
        f"{platform.name}: {f['description']}",
        f"Nodes: {f['nodes']}",
        f"Devices: {oam['count']} OAMs per node, {platform.total_devices} in all; "
        f"{sock['count']} CPU sockets per node ({sock['cores']} cores each)",
        "Memory",
        f"  HBM {num(oam['hbm_bytes'] / GIB)} GiB per OAM, {num(oam['hbm_bandwidth_gb_per_s'])} GB/s",
        f"  DDR {num(sock['ddr_bytes'] / GIB)} GiB per socket, {num(sock['ddr_bandwidth_gb_per_s'])} GB/s",
        *_flops_table(f),
        *_link_table(links),
        *_pcie_lines(f),
        f"NICs: {_nics(f)}, {num(f['nic']['latency_ns'])} ns",
        f"Front-end NICs: {fe['count']} x {num(fe['bandwidth_gbit_per_s'])} Gb/s on {_ids('CPU', fe['sockets'])}",
        f"ToR switch: {num(f['tor_switch']['latency_ns'])} ns",
        f"Collectives: algorithm {coll['algorithm']}, base latency {num(coll['base_latency_ns'])} ns, "
        f"{coll['pipeline_chunks']} pipeline chunks; ASTRA mode: endpoint delay {num(astra['endpoint_delay_ns'])} ns, "
        f"{astra['preferred_dataset_splits']} splits, {astra['active_chunks_per_dimension']} active chunks",
        "",
        "One node:",
        draw_node(f, {c.name: c for c in links}),
    ]
    return "\n".join(lines)
