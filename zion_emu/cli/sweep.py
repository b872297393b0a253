"""``zion-emu sweep``: a training script on variants of the platform and of
its launch, side by side.

``--set fabric.topology=ring,fully_connected --set oam.hbm_bandwidth_gb_per_s=900,1800``
sweeps platform fields; ``--vary`` sweeps the launch: ``--vary nproc=2,4,8``
(the ranks), ``--vary arg:--servers=1,4`` (a script argument), or a name
(``--vary T=1,2,4``) that the launch options and script arguments use as
``{T}`` or in integer arithmetic, ``{T+1}``, ``{256*T}``. Every combination
runs once (as ``zion-emu run``). ``:::`` in the script's arguments starts
another command, ``[RUN OPTIONS] SCRIPT [ARGS]``, run on every combination
too, so that two scripts (asynchronous and synchronous training, say) share
one table; a command that fills in to the same run for two combinations (it
uses none of the names that differ) runs once. Each row gives the modeled time per iteration, samples/s, what
limited the run, wall time and the breakdown; the best row is marked (most
samples/s when every row has them, else least time per iteration, else
least wall time), in the text, the ``--json`` rows and the ``--html`` page.
"""

from __future__ import annotations

import argparse
import ast
import copy
import itertools
import json
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from zion_emu._format import Column, Table
from zion_emu.cli import CliError, Parser, platform_from
from zion_emu.cli.plot import check_writable
from zion_emu.cli.run import add_run_arguments, check_output_files, execute, input_files, write_outputs
from zion_emu.cli.run import check as check_run  # what `zion-emu run` refuses before it starts

if TYPE_CHECKING:
    from zion_emu.report import RunReport

# The separator between the commands of one sweep.
COMMANDS_SEPARATOR = ":::"
# ``--vary`` names that set a launch option of every command (dest, as an int?).
LAUNCH_KEYS = {"nproc": ("nproc", True), "world-size": ("world_size", True), "ranks": ("ranks", False),
               "samples-per-iteration": ("samples_per_iteration", True)}
# The launch options a command's text may hold {NAME} in, and the integers among them.
_TEMPLATED = ("nproc", "world_size", "ranks", "samples_per_iteration")
_INTEGERS = {"nproc": "--nproc", "world_size": "--world-size", "samples_per_iteration": "--samples-per-iteration"}
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_ARG = re.compile(r"arg:(-{1,2}[A-Za-z0-9][A-Za-z0-9_.-]*)\Z")
_ALLOWED_KEYS = ("nproc, world-size, ranks, samples-per-iteration, arg:--FLAG (a script argument), or a name "
                 "[A-Za-z_][A-Za-z0-9_]* used as {NAME} in the launch options or script arguments")


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


def _axis(item: str, option: str) -> tuple[str, list[str]]:
    if "=" not in item:
        raise CliError(f"{option} '{item}' is not {'PATH' if option == '--set' else 'KEY'}=VALUE[,VALUE...]")
    key, values = item.split("=", 1)
    options = [v.strip() for v in split_values(values)]
    if option == "--vary":
        # A launch option's or script argument's value that holds a comma is quoted: ranks='0,8'.
        options = [v[1:-1] if len(v) >= 2 and v[0] == v[-1] and v[0] in "\"'" else v for v in options]
    if any(not v for v in options):
        raise CliError(f"{option} {item}: an empty value in the list")
    return key.strip(), options


def variants(sweeps: list[str], fixed: list[str] | tuple[str, ...] = ()) -> list[list[str]]:
    """Every combination of the swept fields, as lists of PATH=VALUE. A
    field is swept once, and not also fixed (``fixed``: --fix PATH=VALUE):
    the last value given would win and the rows be mislabelled."""
    axes = []
    seen: set[str] = set()
    fixed_paths = {item.partition("=")[0].strip() for item in fixed}
    for item in sweeps:
        path, options = _axis(item, "--set")
        if path in seen:
            raise CliError(f"--set: '{path}' is swept twice; give all its values in one --set {path}=V1,V2,...")
        if path in fixed_paths:
            raise CliError(f"--set: '{path}' is swept and also fixed by --fix; drop one of them")
        seen.add(path)
        axes.append([f"{path}={v}" for v in options])
    return [list(c) for c in itertools.product(*axes)] if axes else [[]]


@dataclass(frozen=True)
class Axis:
    """One ``--vary KEY=V1,V2,...``."""

    key: str
    values: list[str]

    @property
    def kind(self) -> str:
        if self.key in LAUNCH_KEYS:
            return "launch"
        return "arg" if self.key.startswith("arg:") else "name"

    @property
    def name(self) -> str | None:
        """The name ``{...}`` refers to it by: nproc, world_size, T, ... (none for arg:)."""
        if self.kind == "arg":
            return None
        return LAUNCH_KEYS[self.key][0] if self.kind == "launch" else self.key


def parse_axes(items: list[str]) -> list[Axis]:
    """``--vary`` items, checked: a known key, each once, values of the right kind."""
    axes: list[Axis] = []
    for item in items:
        key, values = _axis(item, "--vary")
        if key not in LAUNCH_KEYS and not _ARG.match(key) and not _NAME.match(key):
            raise CliError(f"--vary: unknown key '{key}'; a key is {_ALLOWED_KEYS}")
        if any(a.key == key for a in axes):
            raise CliError(f"--vary: '{key}' is swept twice; give all its values in one --vary {key}=V1,V2,...")
        axis = Axis(key, values)
        if axis.kind == "name" and key.replace("_", "-") in LAUNCH_KEYS:
            raise CliError(f"--vary: '{key}' names a launch option; write --vary {key.replace('_', '-')}=...")
        integer = axis.kind == "name" or (axis.kind == "launch" and LAUNCH_KEYS[key][1])
        if integer:
            for v in values:
                try:
                    int(v)
                except ValueError:
                    what = f"--{key}" if axis.kind == "launch" else f"the name {key}"
                    raise CliError(f"--vary {key}: '{v}' is not an integer ({what} takes integers, e.g. "
                                   f"{key}=1,2,4)") from None
        axes.append(axis)
    return axes


def launch_combinations(axes: list[Axis]) -> list[list[tuple[Axis, str]]]:
    return [list(zip(axes, c)) for c in itertools.product(*(a.values for a in axes))] if axes else [[]]


class _Expression:
    """Integer arithmetic on swept names: + - * // % and parentheses."""

    _NODES = (ast.Expression, ast.BinOp, ast.UnaryOp, ast.Constant, ast.Name, ast.Load, ast.Add, ast.Sub, ast.Mult,
              ast.FloorDiv, ast.Mod, ast.USub, ast.UAdd)

    @classmethod
    def parse(cls, text: str) -> ast.Expression | None:
        """The expression, or None when ``text`` is not one (JSON in braces, say)."""
        try:
            tree = ast.parse(text.strip(), mode="eval")
        except SyntaxError:
            return None
        for node in ast.walk(tree):
            if not isinstance(node, cls._NODES) or (isinstance(node, ast.Constant) and type(node.value) is not int):
                return None
        return tree

    @staticmethod
    def names(tree: ast.Expression) -> set[str]:
        return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}

    @staticmethod
    def value(tree: ast.Expression, names: dict[str, int]) -> int:
        return int(eval(compile(tree, "<sweep>", "eval"), {"__builtins__": {}}, dict(names)))  # noqa: S307


_BRACES = re.compile(r"\{([^{}]*)\}")


def fill(text: str, names: dict[str, int], used: set[str]) -> str:
    """``text`` with each ``{expression}`` of swept names replaced by its value;
    braces holding anything else (JSON) are left as they are."""

    def one(m: re.Match[str]) -> str:
        tree = _Expression.parse(m.group(1))
        if tree is None:
            return m.group(0)
        wanted = _Expression.names(tree)
        unknown = sorted(wanted - set(names))
        if unknown:
            known = ", ".join(sorted(names)) or "none (sweep one with --vary NAME=V1,V2,...)"
            raise CliError(f"'{text}': {{{m.group(1)}}} names {', '.join(unknown)}, which is not swept; the swept "
                           f"names are {known}")
        used.update(wanted)
        try:
            return str(_Expression.value(tree, names))
        except ZeroDivisionError:
            raise CliError(f"'{text}': {{{m.group(1)}}} divides by zero with {names}") from None

    return _BRACES.sub(one, text)


def set_script_arg(script_args: list[str], flag: str, value: str) -> list[str]:
    """``script_args`` with ``flag value`` (or ``flag=value``) replaced, or appended."""
    out, i, found = [], 0, False
    while i < len(script_args):
        a = script_args[i]
        if a == flag and i + 1 < len(script_args):
            out += [flag, value]
            i, found = i + 2, True
            continue
        if a.startswith(flag + "="):
            out.append(f"{flag}={value}")
            i, found = i + 1, True
            continue
        out.append(a)
        i += 1
    return out if found else [*out, flag, value]


def _command_parser() -> Parser:
    p = Parser(prog=f"zion-emu sweep ... {COMMANDS_SEPARATOR}", add_help=False)
    add_run_arguments(p, with_platform=False, templated=True, launch_only=True)
    return p


def commands_of(args: argparse.Namespace) -> list[argparse.Namespace]:
    """The commands of the sweep: the first as the sweep's own options give
    it, then one per ``:::`` part, its options over the sweep's."""
    parts, current = [], []
    for a in args.script_args:
        if a == COMMANDS_SEPARATOR:
            parts.append(current)
            current = []
        else:
            current.append(a)
    parts.append(current)
    first = copy.copy(args)
    first.script_args = parts[0]
    commands = [first]
    parser = _command_parser()
    for part in parts[1:]:
        if not part:
            raise CliError(f"an empty command after '{COMMANDS_SEPARATOR}'; give [RUN OPTIONS] SCRIPT [ARGS]")
        given = parser.parse_args(part)
        one = copy.copy(args)
        for name, value in vars(given).items():
            default = parser.get_default(name)
            if name in ("script", "script_args") or value != default:
                setattr(one, name, value)
        commands.append(one)
    return commands


def command_labels(commands: list[argparse.Namespace]) -> list[str]:
    """A short name per command (its script, with its folder), unique."""
    names = []
    for c in commands:
        path = Path(c.script)
        names.append(f"{path.parent.name}/{path.name}" if path.parent.name else path.name)
    return [n if names.count(n) == 1 else f"{n} #{i + 1}" for i, n in enumerate(names)]


def instantiate(command: argparse.Namespace, combo: list[tuple[Axis, str]], used: set[str]) -> argparse.Namespace:
    """One command with the combination's values in place."""
    one = copy.copy(command)
    for axis, value in combo:
        if axis.kind == "launch":
            setattr(one, LAUNCH_KEYS[axis.key][0], value)
        elif axis.kind == "arg":
            one.script_args = set_script_arg(list(one.script_args), axis.key[len("arg:"):], value)
    names: dict[str, int] = {}
    for axis, value in combo:
        if axis.kind == "name" or (axis.kind == "launch" and LAUNCH_KEYS[axis.key][1]):
            names[axis.name] = int(value)  # type: ignore[index]
    for dest in _TEMPLATED:
        value = getattr(one, dest)
        if isinstance(value, str):
            setattr(one, dest, fill(value, names, used))
    one.script = fill(one.script, names, used)
    one.script_args = [fill(a, names, used) for a in one.script_args]
    for dest, flag in _INTEGERS.items():
        value = getattr(one, dest)
        if isinstance(value, str):
            try:
                setattr(one, dest, int(value))
            except ValueError:
                raise CliError(f"{flag} '{value}' is not an integer (put swept names in braces: {flag} '{{T+1}}')") \
                    from None
    return one


class _OneRunsOutput(argparse.Action):
    """``--report`` and ``--trace`` of ``zion-emu run``, which write one run's
    files: a sweep refuses them, saying what it writes instead."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        raise argparse.ArgumentError(self, "a sweep writes no report or trace of its own: --json OUT.json writes "
                                           "its rows and --html OUT.html every variant's report; for one "
                                           f"variant's, run it alone with `zion-emu run {option_string} OUT.json`")


def add_parser(subparsers: Any) -> None:
    # "resolve": the sweep's --report and --trace replace those of `zion-emu run`.
    p = subparsers.add_parser(
        "sweep", help="run a script on every combination of platform and launch variants and compare them",
        conflict_handler="resolve",
        description="Each --set PATH=V1,V2,... is a swept platform field and each --vary KEY=V1,V2,... a swept "
                    "launch: the ranks (--vary nproc=2,4,8), a script argument (--vary arg:--servers=1,4) or a "
                    "name that launch options and script arguments use in braces, with integer arithmetic "
                    "(--vary T=1,2,4 --world-size '{T+1}' train.py --batch '{256*T}'). Every combination runs "
                    "the script once (as `zion-emu run`); ':::' in the script's arguments starts another command "
                    "([RUN OPTIONS] SCRIPT [ARGS], its options over the sweep's) run on every combination too. "
                    "The table compares modeled time per iteration, samples/s and what limited each run, and "
                    "marks the best (most samples/s when every row has them, else least time per iteration, "
                    "else least wall time).")
    p.add_argument("--platform", metavar="NAME|FILE", default=None, help="the base platform (default $ZION_PLATFORM or zion)")
    p.add_argument("--set", metavar="PATH=V1,V2,...", dest="sweeps", action="append", default=[],
                   help="a swept field and its values, e.g. --set fabric.topology=ring,fully_connected (repeatable)")
    p.add_argument("--vary", metavar="KEY=V1,V2,...", dest="axes", action="append", default=[],
                   help="a swept launch (repeatable): KEY is nproc, world-size, ranks, samples-per-iteration, "
                        "arg:--FLAG (the script argument --FLAG VALUE, replaced or added) or a NAME for {NAME} "
                        "in launch options and script arguments (integers)")
    p.add_argument("--fix", metavar="PATH=VALUE", dest="assignments", action="append", default=[],
                   help="a field set in every variant")
    p.add_argument("--json", metavar="OUT.json", dest="json_out", default=None, help="write the rows as JSON")
    p.add_argument("--show-output", action="store_true", help="show the script's own output (hidden by default)")
    add_run_arguments(p, with_platform=False, templated=True)
    for option in ("--report", "--trace"):
        p.add_argument(option, action=_OneRunsOutput, help=argparse.SUPPRESS)
    # A sweep prints no variant's report, only its table: run's --quiet-report
    # is what it does already, taken and left out of the help.
    p.add_argument("--quiet-report", action="store_true", help=argparse.SUPPRESS)
    p.set_defaults(func=run)


# One run of the sweep: a command filled in for one combination, the values
# its row names, and its command's label (when the sweep has several).
Job = tuple[argparse.Namespace, list[str], str]


def run(args: argparse.Namespace) -> int:
    jobs = _jobs(args)
    inputs: list[tuple[str, str]] = []
    for job in jobs:
        inputs += [f for f in _check_job(job) if f not in inputs]
    _check_outputs(args, inputs)
    rows, code = _run_jobs(jobs, args.show_output)
    written = _write(rows, args) if rows else True
    if code:
        finished = (f"the table above has the {len(rows)} of {len(jobs)} variants that finished" if rows
                    else f"none of the {len(jobs)} variants finished, so nothing was written")
        print(f"zion-emu: error: variant {_title(jobs[len(rows)])} failed with exit code {code} (its errors are "
              f"above; `zion-emu run` with its values shows all its output); {finished}", file=sys.stderr)
    return code or (0 if written else 1)


def _jobs(args: argparse.Namespace) -> list[Job]:
    """Every command of every combination, filled in."""
    platform_combos = variants(args.sweeps, args.assignments)
    axes = parse_axes(args.axes)
    commands = commands_of(args)
    labels = command_labels(commands) if len(commands) > 1 else [""]
    launches = launch_combinations(axes)
    used: set[str] = set()
    jobs: list[Job] = []
    seen = set()
    for platform_combo in platform_combos:
        for launch in launches:
            for command, label in zip(commands, labels):
                mine: set[str] = set()
                one = instantiate(command, launch, mine)
                used |= mine
                one.assignments = list(args.assignments) + platform_combo
                one.plot = one.html = None
                one.quiet_report = True
                # A row names the values its command used: a name it does not
                # use leaves its run the same, which runs once.
                names = platform_combo + [f"{a.key}={v}" for a, v in launch if a.kind != "name" or a.key in mine]
                if (tuple(names), label) in seen:
                    continue
                seen.add((tuple(names), label))
                jobs.append((one, names, label))
    unused = [a.key for a in axes if a.kind == "name" and a.key not in used]
    if unused:
        raise CliError(f"--vary {unused[0]} is used nowhere: put {{{unused[0]}}} in a launch option (--nproc, "
                       f"--world-size, --ranks, --samples-per-iteration) or a script argument")
    return jobs


def _title(job: Job) -> str:
    _, names, label = job
    name = ", ".join(names) or "(base platform)"
    return f"{name} of {label}" if label else name


def _check_job(job: Job) -> list[tuple[str, str]]:
    """Refuses a variant whose platform or launch `zion-emu run` would refuse,
    before any variant runs: a bad last value must not cost the others' runs.
    Returns the files the variant reads (run.input_files)."""
    one = job[0]
    try:
        platform = platform_from(one)
        check_run(one, platform)
    except (CliError, ValueError) as e:  # the platform's ConfigError is a ValueError
        raise CliError(f"variant {_title(job)}: {e}; nothing ran") from None
    return input_files(one, platform)


def _run_jobs(jobs: list[Job], show_output: bool) -> tuple[list[Variant], int]:
    """Runs the jobs in order until one fails; returns the rows of those that
    finished and the failed one's exit code (0 when none failed)."""
    rows: list[Variant] = []
    for i, (one, names, label) in enumerate(jobs):
        name = ", ".join(names) or "(base platform)"
        print(f"[{i + 1}/{len(jobs)}] {name}{f' | {label}' if label else ''}", flush=True)
        report, code = execute(one, stdout=None if show_output else subprocess.DEVNULL)
        if code != 0 or report is None:
            return rows, code or 1
        rows.append(Variant(names, report, label))
    return rows, 0


def _write(rows: list[Variant], args: argparse.Namespace) -> bool:
    """The table of the rows, and the files asked for, each on its own: one
    that cannot be written is said and the others are still written.
    Returns whether every file was."""
    mark_best(rows)
    print()
    print(table(rows))

    def write_json(path: str) -> None:
        with open(path, "w") as f:
            json.dump([r.as_json() for r in rows], f, indent=1)

    def write_html(path: str) -> None:
        from zion_emu import report_html

        report_html.write_sweep([(r.name, r.report) for r in rows], path, report_html.invocation())

    return write_outputs([(args.json_out, "table as JSON", write_json), (args.plot, "plot", lambda p: plot(rows, p)),
                          (args.html, "HTML report", write_html)])


def _check_outputs(args: argparse.Namespace, inputs: list[tuple[str, str]]) -> None:
    """Refuses, before any variant runs, an output of the sweep that is a
    directory, lies in no folder, or is one of the variants' ``inputs`` (their
    scripts and platform files) or another output."""
    outputs = [(what, path) for what, path in (("--json", args.json_out), ("--html", args.html),
                                               ("--plot", args.plot)) if path]
    check_output_files(outputs, inputs)
    if args.plot:
        check_writable(args.plot)


@dataclass
class Variant:
    """One combination of the swept fields and launches, the command it ran
    (a label when the sweep has several) and the report of its run."""

    assignments: list[str]  # PATH=VALUE, then KEY=VALUE of --vary
    report: RunReport
    command: str = ""
    best: bool = field(default=False)

    @property
    def name(self) -> str:
        base = ", ".join(self.assignments) or "(base)"
        return f"{base} | {self.command}" if self.command else base

    def limit(self) -> tuple[str | None, float | None]:
        """What limited the run (``zion_emu.report.limit_of``)."""
        from zion_emu.report import limit_of

        return limit_of(self.report)

    def numbers(self) -> dict[str, Any]:
        """What a row shows (and ``--json`` writes), in seconds and bytes."""
        r, b = self.report, self.report.breakdown
        limit, utilization = self.limit()
        return {
            "iteration_s": r.iteration_s,
            "samples_per_s": r.samples_per_s,
            "limit": limit,
            "limit_utilization": utilization,
            "wall_s": r.wall_s,
            **{part: None if b is None else getattr(b, part)
               for part in ("compute_s", "communication_exposed_s", "copies_exposed_s", "host_s")},
            "peak_hbm_bytes": max((d.peak_hbm_bytes for d in r.devices), default=0),
        }

    def as_json(self) -> dict[str, Any]:
        return {"variant": self.assignments, **({"command": self.command} if self.command else {}),
                **self.numbers(), "best": self.best}


def ranking(reports: list[RunReport]) -> tuple[str, list[float], bool]:
    """How a sweep's rows compare: (what, value per row, higher is better):
    samples/s when every row has them, else time per iteration, else wall time."""
    if all(r.samples_per_s for r in reports):
        return "samples/s", [r.samples_per_s for r in reports], True  # type: ignore[misc]
    if all(r.iteration_s for r in reports):
        return "time per iteration", [r.iteration_s for r in reports], False  # type: ignore[misc]
    return "wall time", [r.wall_s for r in reports], False


def mark_best(rows: list[Variant]) -> None:
    if not rows:
        return
    _, values, higher = ranking([r.report for r in rows])
    best = max(values) if higher else min(values)
    for r, v in zip(rows, values):
        r.best = v == best


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:.3f}"


def table(rows: list[Variant]) -> str:
    width = max([len(r.name) for r in rows] + [20]) if rows else 20
    t = Table(Column("", 1, "<"), Column("variant", min(width, 64), "<"), Column("ms/iter", 10),
              Column("samples/s", 12), Column("limited by (utilization)", 44, "<"), Column("wall ms", 10),
              Column("compute", 9), Column("comm exp", 9), Column("copy exp", 9), Column("host", 9))
    head = t.header()
    lines = [*head, "-" * len(head[0])]
    for r in rows:
        n = r.numbers()
        sps = "-" if n["samples_per_s"] is None else f"{n['samples_per_s']:,.0f}"
        limit = "-" if n["limit"] is None else n["limit"] + (
            "" if n["limit_utilization"] is None else f" ({n['limit_utilization'] * 100:.1f}%)")
        lines.append(t.row("*" if r.best else "", r.name, _ms(n["iteration_s"]), sps, limit, _ms(n["wall_s"]),
                           _ms(n["compute_s"]), _ms(n["communication_exposed_s"]), _ms(n["copies_exposed_s"]),
                           _ms(n["host_s"])))
    what, _, higher = ranking([r.report for r in rows]) if rows else ("", [], False)
    lines.append(f"(* the best: {'most' if higher else 'least'} {what}; times in modeled ms; the breakdown parts are "
                 "means over devices and sum to the wall time)")
    return "\n".join(lines)


def plot(rows: list[Variant], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    what, values, _ = ranking([r.report for r in rows])
    names = [r.name for r in rows]
    values = [v if what == "samples/s" else v * 1e3 for v in values]
    fig, ax = plt.subplots(figsize=(8, 0.5 + 0.45 * len(rows)))
    ax.barh(range(len(rows)), values)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels(names, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("modeled samples/s" if what == "samples/s" else f"modeled ms, {what}")
    ax.set_title("zion-emu sweep")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
