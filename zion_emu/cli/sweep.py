"""``zion-emu sweep``: the same training script on variants of the platform.

``--set fabric.topology=ring,fully_connected --set oam.hbm_bandwidth_gb_per_s=900,1800``
runs every combination (here four) with ``zion-emu run`` and prints one row
per variant: modeled time per iteration, samples/s, wall time and the
breakdown, plus a bar plot with ``--plot``.
"""

from __future__ import annotations

import argparse
import copy
import itertools
import json
import subprocess
from typing import Any

from zion_emu.cli import CliError
from zion_emu.cli.run import add_run_arguments, execute


def split_values(text: str) -> list[str]:
    """'a,b,[1,2]' -> ['a', 'b', '[1,2]']: commas inside brackets or quotes
    belong to the value."""
    values, depth, quote, current = [], 0, "", []
    for ch in text:
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        elif ch == "," and depth == 0:
            values.append("".join(current))
            current = []
            continue
        current.append(ch)
    values.append("".join(current))
    return values


def variants(sweeps: list[str]) -> list[list[str]]:
    """Every combination of the swept fields, as lists of PATH=VALUE."""
    axes = []
    for item in sweeps:
        if "=" not in item:
            raise CliError(f"--set '{item}' is not PATH=VALUE[,VALUE...]")
        path, values = item.split("=", 1)
        options = [v.strip() for v in split_values(values)]
        if any(not v for v in options):
            raise CliError(f"--set {item}: an empty value in the list")
        axes.append([f"{path.strip()}={v}" for v in options])
    return [list(c) for c in itertools.product(*axes)] if axes else [[]]


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "sweep", help="run a script on every combination of platform variants and compare iteration times",
        description="Each --set PATH=V1,V2,... is a swept field; every combination runs the script once "
                    "(as `zion-emu run`) and the table compares their modeled iteration times.")
    p.add_argument("--platform", metavar="NAME|FILE", default=None, help="the base platform (default $ZION_PLATFORM or zion)")
    p.add_argument("--set", metavar="PATH=V1,V2,...", dest="sweeps", action="append", default=[],
                   help="a swept field and its values, e.g. --set fabric.topology=ring,fully_connected (repeatable)")
    p.add_argument("--fix", metavar="PATH=VALUE", dest="assignments", action="append", default=[],
                   help="a field set in every variant")
    p.add_argument("--json", metavar="OUT.json", dest="json_out", default=None, help="write the rows as JSON")
    p.add_argument("--show-output", action="store_true", help="show the script's own output (hidden by default)")
    add_run_arguments(p, with_platform=False)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    rows = []
    combos = variants(args.sweeps)
    for i, combo in enumerate(combos):
        label = ", ".join(combo) or "(base platform)"
        print(f"[{i + 1}/{len(combos)}] {label}", flush=True)
        one = copy.copy(args)
        one.assignments = list(args.assignments) + combo
        one.report = one.trace = None
        one.plot = None
        one.quiet_report = True
        report, code = execute(one, stdout=None if args.show_output else subprocess.DEVNULL)
        if code != 0 or report is None:
            raise CliError(f"variant {label} failed (exit code {code}); rerun it with `zion-emu run` to see why")
        rows.append({"variant": combo, "report": report})
    print()
    print(table(rows))
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump([{"variant": r["variant"], **_row_numbers(r["report"])} for r in rows], f, indent=1)
    if args.plot:
        plot(rows, args.plot)
    return 0


def _row_numbers(report: dict[str, Any]) -> dict[str, Any]:
    b = report.get("breakdown") or {}
    return {
        "iteration_s": report["iteration_s"],
        "samples_per_s": report["samples_per_s"],
        "wall_s": report["wall_s"],
        "compute_s": b.get("compute_s"),
        "communication_exposed_s": b.get("communication_exposed_s"),
        "copies_exposed_s": b.get("copies_exposed_s"),
        "host_s": b.get("host_s"),
        "peak_hbm_bytes": max((d["peak_hbm_bytes"] for d in report["devices"]), default=0),
    }


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:.3f}"


def table(rows: list[dict[str, Any]]) -> str:
    head = f"{'variant':<48} {'ms/iter':>10} {'samples/s':>12} {'wall ms':>10} {'compute':>9} {'comm exp':>9} " \
           f"{'copy exp':>9} {'host':>9}"
    lines = [head, "-" * len(head)]
    for r in rows:
        n = _row_numbers(r["report"])
        sps = "-" if n["samples_per_s"] is None else f"{n['samples_per_s']:,.0f}"
        lines.append(f"{', '.join(r['variant']) or '(base)':<48} {_ms(n['iteration_s']):>10} {sps:>12} "
                     f"{_ms(n['wall_s']):>10} {_ms(n['compute_s']):>9} {_ms(n['communication_exposed_s']):>9} "
                     f"{_ms(n['copies_exposed_s']):>9} {_ms(n['host_s']):>9}")
    lines.append("(times in modeled ms; the breakdown parts are means over devices and sum to the wall time)")
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [", ".join(r["variant"]) or "(base)" for r in rows]
    values = [(_row_numbers(r["report"])["iteration_s"] or _row_numbers(r["report"])["wall_s"]) * 1e3 for r in rows]
    fig, ax = plt.subplots(figsize=(8, 0.5 + 0.45 * len(rows)))
    ax.barh(range(len(rows)), values)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels(names, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("modeled ms per iteration")
    ax.set_title("zion-emu sweep")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
