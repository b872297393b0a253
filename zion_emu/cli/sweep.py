"""``zion-emu sweep``: the same training script on variants of the platform.

``--set fabric.topology=ring,fully_connected --set oam.hbm_bandwidth_gb_per_s=900,1800``
runs every combination (here four) with ``zion-emu run`` and prints one row
per variant: modeled time per iteration, samples/s, wall time and the
breakdown, plus a bar plot with ``--plot`` and a page comparing the variants
(their charts, the fastest marked, each one's report) with ``--html``.
"""

from __future__ import annotations

import argparse
import copy
import itertools
import json
import os
import subprocess
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from zion_emu._format import Column, Table
from zion_emu.cli import CliError
from zion_emu.cli.run import add_run_arguments, execute

if TYPE_CHECKING:
    from zion_emu.report import RunReport


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
    rows: list[Variant] = []
    combos = variants(args.sweeps)
    if args.html:
        _check_writable(args.html, "--html")
    for i, combo in enumerate(combos):
        label = ", ".join(combo) or "(base platform)"
        print(f"[{i + 1}/{len(combos)}] {label}", flush=True)
        one = copy.copy(args)
        one.assignments = list(args.assignments) + combo
        one.report = one.trace = None
        one.plot = one.html = None
        one.quiet_report = True
        report, code = execute(one, stdout=None if args.show_output else subprocess.DEVNULL)
        if code != 0 or report is None:
            raise CliError(f"variant {label} failed (exit code {code}); rerun it with `zion-emu run` to see why")
        rows.append(Variant(combo, report))
    print()
    print(table(rows))
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump([{"variant": r.assignments, **r.numbers()} for r in rows], f, indent=1)
    if args.plot:
        plot(rows, args.plot)
    if args.html:
        from zion_emu import report_html

        report_html.write_sweep([(r.name, r.report) for r in rows], args.html, report_html.invocation())
        print(f"zion-emu: wrote the HTML report to {args.html}")
    return 0


def _check_writable(path: str, what: str) -> None:
    """Fails before any variant runs if ``path`` cannot take the file."""
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise CliError(f"{what} {path} is a directory; give a file name")
    if not os.path.isdir(folder):
        raise CliError(f"{what} {path}: folder {folder} does not exist")


@dataclass
class Variant:
    """One combination of the swept fields and the report of its run."""

    assignments: list[str]  # PATH=VALUE
    report: RunReport

    @property
    def name(self) -> str:
        return ", ".join(self.assignments) or "(base)"

    def numbers(self) -> dict[str, Any]:
        """What a row shows (and ``--json`` writes), in seconds and bytes."""
        r, b = self.report, self.report.breakdown
        return {
            "iteration_s": r.iteration_s,
            "samples_per_s": r.samples_per_s,
            "wall_s": r.wall_s,
            **{part: None if b is None else getattr(b, part)
               for part in ("compute_s", "communication_exposed_s", "copies_exposed_s", "host_s")},
            "peak_hbm_bytes": max((d.peak_hbm_bytes for d in r.devices), default=0),
        }


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:.3f}"


_TABLE = Table(Column("variant", 48, "<"), Column("ms/iter", 10), Column("samples/s", 12), Column("wall ms", 10),
               Column("compute", 9), Column("comm exp", 9), Column("copy exp", 9), Column("host", 9))


def table(rows: list[Variant]) -> str:
    head = _TABLE.header()
    lines = [*head, "-" * len(head[0])]
    for r in rows:
        n = r.numbers()
        sps = "-" if n["samples_per_s"] is None else f"{n['samples_per_s']:,.0f}"
        lines.append(_TABLE.row(r.name, _ms(n["iteration_s"]), sps, _ms(n["wall_s"]), _ms(n["compute_s"]),
                                _ms(n["communication_exposed_s"]), _ms(n["copies_exposed_s"]), _ms(n["host_s"])))
    lines.append("(times in modeled ms; the breakdown parts are means over devices and sum to the wall time)")
    return "\n".join(lines)


def plot(rows: list[Variant], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r.name for r in rows]
    values = [(r.report.iteration_s or r.report.wall_s) * 1e3 for r in rows]
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
