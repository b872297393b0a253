"""``zion-emu collectives``: an nccl-tests-like sweep of one collective on the model."""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass
from typing import Any

from zion_emu import astra, sim
from zion_emu.cli import CliError, add_platform_arguments, platform_from
from zion_emu.cli.compare import compare_topologies, comparison_json, ratio_table
from zion_emu.cli.plot import check_writable, plot_busbw
from zion_emu.cli.nccl_table import RunCollective, sweep, table
from zion_emu.cli.sizes import ELEMENT_BYTES, element_unit, parse_size, size_sweep, whole_element_sizes

# --mode values beyond the link models: ASTRA-sim's congestion-unaware backend.
ASTRA_UNAWARE = "astra-unaware"


def add_link_model_argument(p: argparse.ArgumentParser, default_help: str, astra_modes: bool = False) -> None:
    """--link-model, one of the model's link models, and --mode, the same
    choice by its other name; with ``astra_modes`` --mode also takes
    astra-unaware and is documented (collectives with ASTRA-sim input).
    Giving both is refused, as zion_emu.distributed.Options refuses link_model
    with mode."""
    choices = sim.link_model_names()
    one = p.add_mutually_exclusive_group()
    one.add_argument("--link-model", choices=choices, default=None, metavar="MODEL",
                     help=f"how transfers share the links: {', '.join(choices)} (the README describes each); "
                          f"default {default_help}")
    if astra_modes:
        one.add_argument("--mode", dest="link_model", choices=[*choices, ASTRA_UNAWARE], default=argparse.SUPPRESS,
                         help="as --link-model (not with it); with --astra-network, astra is ASTRA-sim 2.0's "
                              "congestion-aware analytical backend and astra-unaware its congestion-unaware one, "
                              "emulated event by event (one-dimensional networks, ring or direct implementations)")
    else:
        one.add_argument("--mode", dest="link_model", choices=choices, default=argparse.SUPPRESS,
                         help=argparse.SUPPRESS)


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "collectives", help="time a collective over a range of sizes, like nccl-tests",
        description="Time one collective over message sizes from --min-bytes to --max-bytes on the modeled "
                    "machine and print an nccl-tests-like table (GB/s = 1e9 bytes/s).")
    add_platform_arguments(p)
    p.add_argument("--op", choices=sim.collective_op_names(), default="all_reduce")
    p.add_argument("--ranks", type=int, default=None, metavar="N",
                   help="participating devices 0..ranks-1 (default: one node's OAMs; the NPU count with ASTRA input)")
    p.add_argument("--min-bytes", type=parse_size, default="8", metavar="SIZE",
                   help="smallest size; K/M/G are powers of two, as nccl-tests (1K = 1024)")
    p.add_argument("--max-bytes", type=parse_size, default="8G", metavar="SIZE",
                   help="largest size (default 8G = 8 x 2^30)")
    p.add_argument("--step-factor", type=int, default=2, metavar="F", help="size multiplier between rows (default 2)")
    p.add_argument("--algo", choices=sim.algorithm_names(), default="auto")
    add_link_model_argument(p, "fair, or astra with ASTRA-sim input", astra_modes=True)
    p.add_argument("--dtype", choices=list(ELEMENT_BYTES), default="float", help="element type for the count column")
    p.add_argument("--root", type=int, default=0, metavar="RANK", help="root rank of broadcast and reduce")
    p.add_argument("--json", action="store_true", help="print a JSON list of rows instead of the table")
    p.add_argument("--plot", metavar="OUT.png", help="also write busbw vs size to this image")
    p.add_argument("--compare-topologies", metavar="OUT.png",
                   help="instead: all_reduce and all_to_all with the fabric as ring vs fully_connected; "
                        "plot them and print the large-message ratio")
    p.add_argument("--astra-network", metavar="NET.yml", help="ASTRA-sim analytical network file as the machine")
    p.add_argument("--astra-system", metavar="SYS.json", help="ASTRA-sim system file (with --astra-network)")
    p.set_defaults(func=run)


@dataclass
class _Machine:
    name: str
    title: str
    ranks: int
    run: RunCollective


def _machine(args: argparse.Namespace, link_model: str) -> _Machine:
    if args.astra_network:
        m = astra.load(args.astra_network, args.astra_system)
        if args.ranks is not None and args.ranks != m.npus:
            raise CliError(f"--ranks {args.ranks} does not match the ASTRA-sim network's {m.npus} NPUs "
                           f"(npus_count in {args.astra_network}); leave --ranks out")
        devices = list(range(m.npus))
        net = m.network
        dims = " x ".join(f"{t}({n})" for t, n in zip(net.topology, net.npus_count))
        title = f"machine: ASTRA-sim {args.astra_network}" + (f" + {args.astra_system}" if args.astra_system else "")
        refusal = m.emulation_refusal(args.op, args.algo)
        if link_model in ("astra", ASTRA_UNAWARE) and refusal is None:
            aware = link_model == "astra"
            backend = "congestion-aware" if aware else "congestion-unaware"
            return _Machine(os.path.basename(args.astra_network),
                            f"{title}: {dims}, {m.npus} NPUs; ASTRA-sim's system layer and {backend} backend, emulated",
                            m.npus, lambda op, n: m.emulated(op, n, aware))
        if link_model == ASTRA_UNAWARE:
            raise CliError(f"--mode {ASTRA_UNAWARE}: {refusal}")
        return _Machine(os.path.basename(args.astra_network), f"{title}: {dims}, {m.npus} NPUs", m.npus,
                        lambda op, n: m.model(op).run(op, float(n), devices, args.algo, link_model, args.root))
    if link_model == ASTRA_UNAWARE:
        raise CliError(f"--mode {ASTRA_UNAWARE} is ASTRA-sim's congestion-unaware backend: it needs --astra-network")
    p = platform_from(args)
    ranks = p.devices_per_node if args.ranks is None else args.ranks
    if ranks < 1:
        raise CliError(f"--ranks must be at least 1, got {ranks}")
    if ranks > p.total_devices:
        raise CliError(f"--ranks {ranks} does not fit platform '{p.name}': it has {p.total_devices} devices "
                       f"({p.nodes} node(s) x {p.devices_per_node} OAMs)")
    return _Machine(p.name, f"platform: {p.name} ({p.nodes} node(s) x {p.devices_per_node} OAMs, "
                    f"fabric {p.get('fabric.topology')})", ranks,
                    lambda op, n: sim.collective(p, op, n, ranks, args.algo, link_model, args.root))


def _header(args: argparse.Namespace, machine: _Machine, link_model: str) -> list[str]:
    return [f"zion-emu collectives: {args.op} over {machine.ranks} ranks, link model {link_model}, algorithm {args.algo}",
            machine.title,
            f"minBytes {args.min_bytes} maxBytes {args.max_bytes} step: {args.step_factor}(factor) type: {args.dtype}"]


def _compare(args: argparse.Namespace, sizes: list[int], link_model: str) -> int:
    if args.astra_network:
        raise CliError("--compare-topologies sets the platform's fabric.topology; it cannot use --astra-network")
    if any(a.split("=", 1)[0].strip() == "fabric.topology" for a in args.assignments):
        raise CliError("--compare-topologies sets fabric.topology itself; drop --set fabric.topology=...")
    machine = _machine(args, link_model)  # validates --platform, --set and --ranks
    comparison = compare_topologies(args.platform, args.assignments, machine.ranks, sizes, args.algo, link_model,
                                    args.dtype)
    plot_busbw(args.compare_topologies,
               f"{machine.name}: fabric as ring vs fully connected, {machine.ranks} ranks, link model {link_model}",
               [(op, {topo: [(r.nbytes, r.busbw_gbps) for r in rows] for topo, rows in by_topo.items()})
                for op, by_topo in comparison.items()])
    if args.json:
        print(json.dumps(comparison_json(comparison), indent=2))
        return 0
    print(f"# zion-emu collectives --compare-topologies: {machine.ranks} ranks, link model {link_model}, "
          f"algorithm {args.algo}")
    print(f"# {machine.title}; fabric.topology set to ring and to fully_connected")
    print("\n".join(ratio_table(comparison)))
    print(f"# plot: {args.compare_topologies}")
    return 0


def run(args: argparse.Namespace) -> int:
    if args.astra_system and not args.astra_network:
        raise CliError("--astra-system needs --astra-network")
    platform_options = [option for option, given in (("--platform", args.platform), ("--set", args.assignments))
                        if given]
    if args.astra_network and platform_options:
        raise CliError(f"--astra-network is the machine, so {' and '.join(platform_options)} would be ignored: "
                       "give --astra-network or the platform options, not both")
    link_model = args.link_model or ("astra" if args.astra_network else "fair")
    sizes = size_sweep(args.min_bytes, args.max_bytes, args.step_factor)
    for path in filter(None, (args.plot, args.compare_topologies)):
        check_writable(path)
    if args.compare_topologies:
        return _compare(args, sizes, link_model)
    machine = _machine(args, link_model)
    if not args.astra_network:  # ASTRA-sim's sizes are its own bytes
        # Whole elements (per rank for the split ops), as nccl-tests counts them.
        swept = sizes
        sizes = whole_element_sizes(args.op, machine.ranks, sizes, args.dtype)
        if not sizes:
            raise CliError(f"no size from {swept[0]} to {swept[-1]} bytes holds one {args.dtype} per rank for "
                           f"{args.op} over {machine.ranks} ranks; the smallest is "
                           f"{element_unit(args.op, machine.ranks, args.dtype)} bytes")
    rows = sweep(machine.run, args.op, machine.ranks, link_model, sizes, args.dtype, args.root)
    if args.plot:
        plot_busbw(args.plot, f"{args.op}, {machine.ranks} ranks, link model {link_model}",
                   [(machine.title, {f"algorithm {args.algo}": [(r.nbytes, r.busbw_gbps) for r in rows]})])
    if args.json:
        print(json.dumps([r.to_json() for r in rows], indent=2))
        return 0
    print(table(rows, _header(args, machine, link_model)))
    if args.plot:
        print(f"# plot: {args.plot}")
    return 0

