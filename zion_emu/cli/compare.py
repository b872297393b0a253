"""The Zion paper's comparison: the accelerator fabric as a ring vs fully connected.

At p = 8 with equal per-link bandwidth, fully connected is 3.5x faster than a
bidirectional ring for all_reduce (each rank drives 7 links instead of 2) and
8x for all_to_all (the ring also carries each piece over its mean hop count);
the model should reproduce that at large sizes.
"""

from __future__ import annotations

from typing import Any

from zion_emu import sim
from zion_emu._format import Column, Table, format_bytes
from zion_emu.cli.nccl_table import Row, sweep
from zion_emu.platform import load_platform

TOPOLOGIES = ("ring", "fully_connected")
OPS = ("all_reduce", "all_to_all")

# op -> topology -> one row per size
Comparison = dict[str, dict[str, list[Row]]]


def compare_topologies(platform: str | None, assignments: list[str], ranks: int, sizes: list[int],
                       algo: str, mode: str, dtype: str) -> Comparison:
    out: Comparison = {op: {} for op in OPS}
    for topology in TOPOLOGIES:
        # Only a switch can reduce in the switch, so a switch preset (hgx-h100) drops that too.
        overrides = {"fabric.topology": topology, "fabric.in_switch_reduction": False}
        p = load_platform(platform, overrides=overrides, assignments=assignments)
        run = lambda op, n, p=p: sim.collective(p, op, n, ranks, algo, mode)  # noqa: E731
        for op in OPS:
            out[op][topology] = sweep(run, op, ranks, mode, sizes, dtype, 0)
    return out


def ratio(rows: dict[str, list[Row]]) -> float:
    """fully connected / ring bus bandwidth at the largest size."""
    return rows["fully_connected"][-1].busbw_gbps / rows["ring"][-1].busbw_gbps


def ratio_table(comparison: Comparison) -> list[str]:
    nbytes = next(iter(comparison.values()))["ring"][-1].nbytes
    table = Table(Column("op", 12), Column("ring", 10, spec=".2f"), Column("fully_connected", 16, spec=".2f"),
                  Column("fully_connected / ring", align="<"), gap="  ", header_prefix="# ")
    return [f"# busbw (GB/s) at the largest size, {nbytes} B ({format_bytes(nbytes)})", *table.render(
        [(op, rows["ring"][-1].busbw_gbps, rows["fully_connected"][-1].busbw_gbps, f"{ratio(rows):.2f}x")
         for op, rows in comparison.items()])]


def comparison_json(comparison: Comparison) -> list[dict[str, Any]]:
    return [{"op": op, "bytes": rows["ring"][-1].nbytes,
             "ring_busbw_gbps": rows["ring"][-1].busbw_gbps,
             "fully_connected_busbw_gbps": rows["fully_connected"][-1].busbw_gbps,
             "ratio": ratio(rows),
             "rows": {topology: [r.to_json() for r in by_size] for topology, by_size in rows.items()}}
            for op, rows in comparison.items()]


def verdict(op: str, rows: dict[str, list[Row]]) -> str:
    """One line: which fabric is faster for ``op`` at the largest size, and by how much."""
    r = ratio(rows)
    ring, full = rows["ring"][-1].busbw_gbps, rows["fully_connected"][-1].busbw_gbps
    faster, slower, factor = ("fully_connected", "ring", r) if r >= 1 else ("ring", "fully_connected", 1 / r)
    return (f"{op} at {format_bytes(rows['ring'][-1].nbytes)}: a {faster} fabric is {factor:.2f}x faster than "
            f"a {slower} one (busbw {full:.2f} GB/s fully connected vs {ring:.2f} GB/s ring)")
