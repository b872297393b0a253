"""``zion-emu tour`` (what ``make tour`` runs): the platform, two collective
size sweeps, and which fabric wins. The hardware model alone: no device, no
processes.
"""

from __future__ import annotations

import argparse
from typing import Any

from zion_emu import sim
from zion_emu.cli import add_platform_arguments, platform_from
from zion_emu.cli.compare import OPS, compare_topologies, verdict
from zion_emu.cli.info import summary
from zion_emu.cli.nccl_table import sweep, table
from zion_emu.cli.sizes import size_sweep

RANKS = 8
SIZES = size_sweep(8, 1 << 30, 8)  # 8 B .. 1 GiB, x8 per row to keep it short


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser("tour",
                              help="a short tour of the model: the platform, two collectives, ring vs fully connected",
                              description="Print the platform, all_reduce and all_to_all over 8 ranks from 8 B to "
                                          "1 GiB, and whether a fully connected or a ring fabric is faster.")
    add_platform_arguments(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    platform = platform_from(args)
    ranks = min(RANKS, platform.total_devices)
    print(summary(platform))
    for op in OPS:
        rows = sweep(lambda o, n: sim.collective(platform, o, n, ranks), op, ranks, "fair", SIZES, "float", 0)
        print()
        print(table(rows, [f"{op} over {ranks} ranks on {platform.name}, link model fair (max-min fair link sharing)"]))
    # The comparison sets fabric.topology to each fabric in turn; a --set of it would make both sides one fabric.
    others = [a for a in args.assignments if a.split("=", 1)[0].strip() != "fabric.topology"]
    comparison = compare_topologies(args.platform, others, ranks, SIZES[-1:], "auto", "fair", "float")
    print()
    for op, rows in comparison.items():
        print(verdict(op, rows))
    return 0
