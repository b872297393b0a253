"""``zion-emu run``: runs a training script on the emulated platform and
reports how fast it would train there.

One process (``--nproc 1``) or several through torchrun's own launcher
(``torch.distributed.run``), each running :mod:`zion_emu.launch`. The
platform (a preset or file plus ``--set`` overrides) is written as one
complete platform file that every rank loads through ``ZION_PLATFORM``.
At the end the ranks' snapshots are merged into the report
(:mod:`zion_emu.report`), printed (:mod:`zion_emu.report_text`), and
written as JSON, a trace, a plot and an HTML page when asked.

``--world-size N --ranks LIST`` runs a world bigger than its processes:
the script sees ``WORLD_SIZE=N`` and its own rank, only the listed ranks run
(as processes on this host), and the ``zion`` backend prices every
collective for all N ranks (:mod:`zion_emu.distributed`). ``--timing-only``
sets ``ZION_MODE=timing`` in every rank.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from zion_emu.cli import CliError, add_platform_arguments, platform_from
from zion_emu.cli.plot import check_writable
from zion_emu.launch import OPTIONS_FILE, RUN_DIR_ENV, Terminated, raise_terminated
from zion_emu.platform import platform_files

# The mode every rank runs in: real (unset) or timing-only ("timing").
MODE_ENV = "ZION_MODE"

if TYPE_CHECKING:
    from zion_emu.report import RankSnapshot, RunReport


def add_run_arguments(p: argparse.ArgumentParser, with_platform: bool = True, templated: bool = False,
                      launch_only: bool = False) -> None:
    """The options of ``zion-emu run``. ``templated``: the numbers are read as
    text (``zion-emu sweep`` fills in ``{NAME}`` first, then reads them);
    ``launch_only``: only how the ranks start, and the script."""
    number = str if templated else int
    if with_platform:
        add_platform_arguments(p, one_value_per_set=True)
    p.add_argument("--nproc", type=number, default=None, metavar="N",
                   help="ranks on this node (torchrun --nproc-per-node; default 1); each uses zion:LOCAL_RANK")
    if not launch_only:
        p.add_argument("--nnodes", type=int, default=1, metavar="N",
                       help="nodes of the run, at most the platform's (torchrun --nnodes)")
        p.add_argument("--node-rank", type=int, default=0, help="this node's rank, 0..N-1 (torchrun --node-rank)")
        p.add_argument("--master-addr", default="127.0.0.1", help="rendezvous host (torchrun --master-addr)")
        p.add_argument("--master-port", type=int, default=None,
                       help="rendezvous port, the same on every node (default on one node: a free one)")
    p.add_argument("--cuda-compat", action="store_true",
                   help="run a script written for CUDA unmodified: cuda devices, torch.cuda.* and nccl map to zion")
    p.add_argument("--timing-only", action="store_true",
                   help="timing-only mode (ZION_MODE=timing in every rank): floating-point zion tensors hold no "
                        "bytes, every op and collective is priced as in real mode")
    p.add_argument("--world-size", type=number, default=None, metavar="N",
                   help="the script sees a world of N ranks (WORLD_SIZE=N, RANK, LOCAL_RANK = RANK %% devices per "
                        "node); every collective is priced for all N; the platform needs N / devices-per-node nodes")
    p.add_argument("--ranks", default=None, metavar="LIST",
                   help="with --world-size: the ranks that run as processes on this host, e.g. 0,64 or 0-3,8 "
                        "(default: all N); fewer than N needs --timing-only")
    p.add_argument("--virtual-clock", action="store_true",
                   help="time.time / perf_counter / monotonic read the modeled host clock inside the script")
    p.add_argument("--samples-per-iteration", type=number, default=None, metavar="N",
                   help="samples one optimizer step processes over all ranks, for samples/s in the report")
    if launch_only:
        p.add_argument("script", help="the training script")
        p.add_argument("script_args", nargs=argparse.REMAINDER, help="its arguments")
        return
    p.add_argument("--report", metavar="OUT.json", default=None, help="write the report as JSON")
    p.add_argument("--trace", metavar="OUT.json", default=None,
                   help="write a Chrome/Perfetto trace of the modeled timeline")
    p.add_argument("--plot", metavar="OUT.png", default=None, help="plot device utilization over modeled time")
    p.add_argument("--html", metavar="OUT.html", default=None,
                   help="write the report and its charts as one self-contained HTML page (loads nothing)")
    p.add_argument("--profiler-host-time", choices=("wall", "modeled"), default=None,
                   help="the clock of torch.profiler's host events in every rank (ZION_PROFILER_HOST_TIME): wall, "
                        "the emulator's own time (default), or modeled, the modeled host clock")
    p.add_argument("--quiet-report", action="store_true", help="do not print the report (still written with --report)")
    p.add_argument("script", help="the training script")
    p.add_argument("script_args", nargs=argparse.REMAINDER, help="its arguments")


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "run", help="run a training script on the emulated platform and report modeled throughput",
        description="Runs SCRIPT on zion devices of the modeled platform (several ranks through torchrun) and prints "
                    "the modeled wall time, time per iteration, samples/s, the precision that priced float32 matmuls "
                    "and where the time goes.")
    add_run_arguments(p)
    p.set_defaults(func=run)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass(frozen=True)
class World:
    """The world a run's script sees (``--world-size``) and the ranks of it that run."""

    size: int
    ranks: list[int]  # ascending: the ranks that run as processes, in torchrun's order
    devices_per_node: int

    @property
    def absent(self) -> list[int]:
        running = set(self.ranks)
        return [r for r in range(self.size) if r not in running]

    def options(self) -> dict[str, Any]:
        return {"world_size": self.size, "ranks": self.ranks, "devices_per_node": self.devices_per_node}


def parse_ranks(text: str, world_size: int) -> list[int]:
    """``--ranks``: ranks and ranges (``0,64``, ``0-3,8``), ascending; a clear
    error for an empty item, a non-number, a backward range, a rank outside
    the world or one listed twice."""
    example = "give ranks and ranges separated by commas, e.g. 0,64 or 0-3,8"
    ranks: set[int] = set()
    for item in text.split(","):
        item = item.strip()
        if not item:
            raise CliError(f"--ranks {text!r} has an empty item; {example}")
        first, dash, last = item.partition("-")
        try:
            lo = int(first)
            hi = int(last) if dash else lo
        except ValueError:
            raise CliError(f"--ranks: {item!r} is not a rank or a range a-b; {example}") from None
        if hi < lo:
            raise CliError(f"--ranks: the range {item} runs backwards; write {hi}-{lo}")
        for r in (lo, hi):
            if not 0 <= r < world_size:
                raise CliError(f"--ranks: rank {r} is outside the world of --world-size {world_size} "
                               f"(ranks 0..{world_size - 1})")
        for r in range(lo, hi + 1):
            if r in ranks:
                raise CliError(f"--ranks: rank {r} is listed twice")
            ranks.add(r)
    return sorted(ranks)


# Settings under which torch.distributed waits, at init, for every rank of
# the world, which absent ranks never join.
_WAITS_FOR_EVERY_RANK = {"TORCH_DIST_INIT_BARRIER": "1", "TORCH_DISTRIBUTED_DEBUG": "DETAIL"}


def _world(args: argparse.Namespace, platform: Any) -> World | None:
    if args.world_size is None:
        if args.ranks is not None:
            raise CliError("--ranks needs --world-size: the ranks are ranks of that world")
        return None
    n, per_node = args.world_size, platform.devices_per_node
    if n < 1:
        raise CliError(f"--world-size must be at least 1, got {n}")
    if args.nproc is not None:
        raise CliError("--world-size and --nproc exclude each other: the processes are the --ranks "
                       "(default: every rank of the world)")
    if args.nnodes != 1 or args.node_rank != 0:
        raise CliError("--world-size runs its ranks on this host; leave out --nnodes and --node-rank")
    _check_platform_nodes(platform, math.ceil(n / per_node), f"--world-size {n}", f" of {per_node} devices")
    world = World(n, parse_ranks(args.ranks, n) if args.ranks is not None else list(range(n)), per_node)
    if world.absent:
        if not args.timing_only:
            raise CliError(f"--ranks runs {len(world.ranks)} of the {n} ranks: the absent ranks' data would be "
                           "missing from every collective, so real mode would compute wrong results; add "
                           "--timing-only, or list every rank")
        for name, value in _WAITS_FOR_EVERY_RANK.items():
            if os.environ.get(name) == value:
                raise CliError(f"{name}={value} makes torch.distributed wait at init for all {n} ranks, and the "
                               "absent ones never come; unset it for a run with --ranks")
    return world


def _check_platform_nodes(platform: Any, nodes: int, option: str, of: str = "") -> None:
    """Refuses ``option`` when it needs more nodes than the platform has."""
    if platform.nodes < nodes:
        raise CliError(f"{option} needs {nodes} node(s){of}, but platform '{platform.name}' has {platform.nodes}; "
                       f"choose a platform with more nodes (--platform zionex has 16) or add --set nodes={nodes}")


def _nproc(args: argparse.Namespace) -> int:
    return 1 if args.nproc is None else args.nproc


def check(args: argparse.Namespace, platform: Any) -> World | None:
    """What a run refuses before anything starts (``zion-emu sweep`` asks it
    of every variant); the world of a --world-size run, else None."""
    script = Path(args.script)
    if not script.is_file():
        raise CliError(f"script '{args.script}' " + ("is a directory, not a file" if script.is_dir() else
                                                    "does not exist"))
    world = _world(args, platform)
    if world is None:
        nproc = _nproc(args)
        if nproc < 1:
            raise CliError(f"--nproc must be at least 1, got {nproc}")
        if nproc > platform.devices_per_node:
            raise CliError(f"--nproc {args.nproc} is more ranks than platform '{platform.name}' has devices per "
                           f"node ({platform.devices_per_node}); use --nnodes for more nodes")
    _check_nodes(args, platform)
    _check_outputs(args, platform)
    return world


def _check_nodes(args: argparse.Namespace, platform: Any) -> None:
    """The nodes and their rendezvous, before torchrun would wait for nodes
    that never come."""
    if args.nnodes < 1:
        raise CliError(f"--nnodes must be at least 1, got {args.nnodes}")
    _check_platform_nodes(platform, args.nnodes, f"--nnodes {args.nnodes}")
    if not 0 <= args.node_rank < args.nnodes:
        raise CliError(f"--node-rank {args.node_rank} is not a node of --nnodes {args.nnodes}: "
                       f"give 0..{args.nnodes - 1}")
    if args.master_port is not None and not 1 <= args.master_port <= 65535:
        raise CliError(f"--master-port must be a port number 1..65535, got {args.master_port}")
    if args.nnodes > 1 and args.master_port is None:
        raise CliError(f"--nnodes {args.nnodes} needs --master-port: every node meets node 0 at that port of "
                       "--master-addr")


def _same_file(a: str, b: str) -> bool:
    """Whether paths ``a`` and ``b`` name one file: the same path once links
    are resolved, or, where both exist, the same file (hard links)."""
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _check_outputs(args: argparse.Namespace, platform: Any) -> None:
    """Refuses what ``check_output_files`` refuses of the run's outputs, and a
    plot in a format matplotlib does not write."""
    if args.samples_per_iteration is not None and args.samples_per_iteration <= 0:
        raise CliError(f"--samples-per-iteration must be positive, got {args.samples_per_iteration}")
    outputs = [(what, path) for what, path in (("--report", args.report), ("--trace", args.trace),
                                               ("--plot", args.plot), ("--html", args.html)) if path]
    check_output_files(outputs, input_files(args, platform))
    if args.plot:
        check_writable(args.plot)


def input_files(args: argparse.Namespace, platform: Any) -> list[tuple[str, str]]:
    """(option, path) of the files a run reads and no output may overwrite:
    the script, the platform file and every "base" file it reads in turn."""
    files = [("the script", args.script)]
    if Path(platform.origin).is_file():
        option = "--platform" if args.platform else "$ZION_PLATFORM"
        chain = platform_files(platform.origin)
        files.append((option, chain[0]))
        files += [(f"the \"base\" of {option}", path) for path in chain[1:] if Path(path).is_file()]
    return files


def check_output_files(outputs: list[tuple[str, str]], inputs: list[tuple[str, str]]) -> None:
    """Refuses an output (option, path) that is a directory, lies in a folder
    that does not exist, or is one of ``inputs`` or an earlier output: found
    only when the output is written, after the whole run, each would lose the
    run's result or overwrite the user's file."""
    files = list(inputs)
    for what, path in outputs:
        if Path(path).is_dir():
            raise CliError(f"{what} {path} is a directory; give a file name")
        folder = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(folder):
            raise CliError(f"{what} {path}: folder {folder} does not exist")
        for other, other_path in files:
            if _same_file(path, other_path):
                raise CliError(f"{what} {path} is the same file as {other} {other_path}, which it would "
                               f"overwrite; give {what} another file name")
        files.append((what, path))


def command(args: argparse.Namespace, run_dir: Path, world: World | None = None) -> list[str]:
    """The command line that starts the ranks. A ``world`` runs through
    torchrun's launcher even for one process: its store is the agent's, which
    no rank of the world has to host."""
    rank_main = [sys.executable, "-m", "zion_emu.launch", args.script, *args.script_args]
    nproc, nnodes, node_rank = (len(world.ranks), 1, 0) if world else (_nproc(args), args.nnodes, args.node_rank)
    if world is None and nproc == 1 and nnodes == 1:
        return rank_main
    # --log-dir: torchrun's own files (each rank's error file) go into the run's
    # folder, removed after the run, not into a torchelastic_* folder of
    # their own left in the temporary directory.
    return [sys.executable, "-m", "zion_emu.cli.agent", f"--nproc-per-node={nproc}",
            f"--nnodes={nnodes}", f"--node-rank={node_rank}", f"--master-addr={args.master_addr}",
            f"--master-port={args.master_port or _free_port()}", "--redirects=0", "--tee=0",
            f"--log-dir={run_dir / 'torchelastic'}",
            "-m", "zion_emu.launch", args.script, *args.script_args]


def start(args: argparse.Namespace, run_dir: Path, stdout: Any = None,
          world: World | None = None) -> "subprocess.Popen | ForkedAgent":
    from zion_emu.distributed import PRESENT_RANKS_ENV

    env = dict(os.environ)
    env[RUN_DIR_ENV] = str(run_dir)
    env["ZION_PLATFORM"] = str(run_dir / "platform.json")
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.pop(PRESENT_RANKS_ENV, None)  # each rank of a world sets its own (zion_emu.launch)
    if args.timing_only:
        env[MODE_ENV] = "timing"
    if args.profiler_host_time is not None:
        env["ZION_PROFILER_HOST_TIME"] = args.profiler_host_time
    if world is not None or _nproc(args) > 1:
        # What torchrun sets when it is unset, said here so that it does not
        # print its banner about it on every run.
        env.setdefault("OMP_NUM_THREADS", "1")
    if args.nnodes == 1 and args.master_addr in ("127.0.0.1", "localhost"):
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")  # one node: the ranks talk over loopback
    argv = command(args, run_dir, world)
    if _can_fork_agent(argv, stdout):
        return ForkedAgent(argv[1 + len(_AGENT):], env, stdout)
    # Its own process group: a Ctrl-C reaches this process alone, which passes
    # it on once to the child (see wait).
    return subprocess.Popen(argv, env=env, stdout=stdout, start_new_session=True)


_AGENT = ("-m", "zion_emu.cli.agent")


def _can_fork_agent(argv: list[str], stdout: Any) -> bool:
    return (sys.platform.startswith("linux") and threading.current_thread() is threading.main_thread()
            and tuple(argv[1:1 + len(_AGENT)]) == _AGENT and stdout in (None, subprocess.DEVNULL))


class ForkedAgent:
    """torchrun's agent (:mod:`zion_emu.cli.agent`) as a fork of this process
    rather than a fresh interpreter: the same process tree (the agent in a
    session of its own, the ranks its children, each dying with its parent)
    without importing torch a second time, about 3 s of every multi-rank
    run's start on 2 cores. Waited for and signalled as a ``Popen`` is."""

    def __init__(self, argv: list[str], env: dict[str, str], stdout: Any) -> None:
        self.returncode: int | None = None
        # What this process has buffered is written once, here, not again by the agent.
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):  # its reader has gone, or it is closed: nothing to write twice either
                pass
        pid = os.fork()
        if pid == 0:  # the agent: never returns
            self._agent(argv, env, stdout)
        self.pid = pid

    @staticmethod
    def _agent(argv: list[str], env: dict[str, str], stdout: Any) -> None:
        code = 1
        try:
            os.setsid()  # its own process group: a Ctrl-C reaches the launcher alone (see wait)
            if stdout == subprocess.DEVNULL:
                os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
            # As a fresh interpreter has them: the launcher's SIGTERM handler raises in its own frames.
            signal.signal(signal.SIGINT, signal.default_int_handler)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.environ.clear()
            os.environ.update(env)
            from zion_emu.cli import agent

            code = agent.main(argv)
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
        except BaseException:
            import traceback

            traceback.print_exc()
        finally:
            # Out without the launcher's own exit: its finally blocks (the run's
            # folder) and exit handlers are the launcher's.
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(code)

    def wait(self) -> int:
        if self.returncode is None:
            _, status = os.waitpid(self.pid, 0)
            self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, sig)


def wait(child: "subprocess.Popen | ForkedAgent") -> tuple[int, int]:
    """Waits for the ranks. A Ctrl-C or a SIGTERM is passed to the child as a
    Ctrl-C: the one rank, or torchrun's launcher, which passes it to every
    rank. The ranks write partial reports, which this waits for; a second one
    is passed on again. Returns (code, the signal that stopped the run or 0)."""
    interrupted = 0
    while True:
        try:
            return child.wait(), interrupted
        except KeyboardInterrupt as e:
            if not interrupted:
                print("zion-emu: interrupted; waiting for the ranks to write their partial reports", file=sys.stderr)
            interrupted = signal.SIGTERM if isinstance(e, Terminated) else signal.SIGINT
            try:
                child.send_signal(signal.SIGINT)
            except ProcessLookupError:
                pass


def gather(run_dir: Path) -> list[RankSnapshot]:
    """The snapshots the ranks left in the run directory, with their spans."""
    import numpy as np

    from zion_emu.report import RankSnapshot

    snaps = []
    for path in sorted(run_dir.glob("rank*.json")):
        spans = None
        spans_file = path.with_suffix(".npz")
        if spans_file.exists():
            with np.load(spans_file) as z:
                spans = {k: z[k] for k in z.files}
        snaps.append(RankSnapshot.from_json(json.loads(path.read_text()), spans))
    return snaps


def finish(args: argparse.Namespace, snaps: list[RankSnapshot], code: int,
           interrupted: int, world: World | None = None) -> tuple[RunReport | None, int]:
    """Merges, prints and writes what was asked; returns (report, exit code)."""
    from zion_emu import report as rep
    from zion_emu import report_html, trace
    from zion_emu.report_text import format_text

    if not snaps:
        print("zion-emu: no rank left a report (see the errors above)", file=sys.stderr)
        return None, code or 1
    merged = rep.merge(snaps, samples_per_iteration=args.samples_per_iteration or None)
    if interrupted:
        code = 128 + interrupted  # as a shell reports a run stopped by that signal
    ranks: dict[int, Any] = {s.rank: s.status for s in snaps}
    if world is None and args.nnodes == 1:
        # A rank that was killed before it could write leaves no snapshot: the
        # report covers the others, and says which are missing.
        missing = [r for r in range(_nproc(args)) if r not in ranks]
        for r in missing:
            ranks[r] = None
        if missing:
            print(f"zion-emu: rank(s) {', '.join(map(str, missing))} left no report (killed before writing it); the "
                  f"report covers the other {len(snaps)}", file=sys.stderr)
            code = code or 1
    merged.status = rep.RunStatus(code, bool(interrupted), dict(sorted(ranks.items())))
    if args.cuda_compat:
        remapped: dict[str, int] = {}
        for s in snaps:
            for name, n in ((s.status and s.status.cuda_compat_remapped) or {}).items():
                remapped[name] = remapped.get(name, 0) + n
        merged.cuda_compat_remapped = remapped
    if world is not None:
        merged.world = rep.world_summary(world.size, world.ranks)
        declared = {s.rank: s.samples_per_iteration for s in snaps}
        if args.samples_per_iteration is None and declared and all(declared.values()) and merged.world.modeled_ranks:
            # A modeled rank processes what its counterpart declared.
            merged.samples_per_iteration = sum(declared[c] for c in merged.world.counterparts if c in declared)
            merged.samples_per_s = (merged.samples_per_iteration / merged.iteration_s
                                    if merged.iteration_s else None)
            merged.world.assumptions.append("samples per iteration: each modeled rank's are its counterpart's")
    idle = all(s.wall_s == 0 and not s.labels and not s.iterations for s in snaps)
    if code and not interrupted and idle:
        # It failed before it ran anything modeled (its own argument parsing, say): a report of zeros says nothing.
        print(f"zion-emu: the script exited with code {code} before anything ran on the modeled platform; "
              "no report to print", file=sys.stderr)
    elif not args.quiet_report:
        print(format_text(merged), flush=True)
    written = write_outputs([
        (args.report, "report", lambda p: rep.write_json(merged, p)),
        (args.trace, "trace", lambda p: trace.write(snaps, p)),
        (args.plot, "plot", lambda p: trace.plot_utilization(snaps, p)),
        (args.html, "HTML report", lambda p: report_html.write_run(merged, snaps, p, report_html.invocation())),
    ])
    return merged, code or (0 if written else 1)


def write_outputs(outputs: list[tuple[str | None, str, Any]]) -> bool:
    """Writes each (path, what, write) whose path is set, on its own: one that
    cannot be written is said and the others are still written. Returns
    whether every one was."""
    ok = True
    for path, what, write in outputs:
        if not path:
            continue
        try:
            write(path)
            print(f"zion-emu: wrote the {what} to {path}", file=sys.stderr)
        except OSError as e:
            ok = False
            print(f"zion-emu: error: could not write the {what} to {path}: {e.strerror or e}", file=sys.stderr)
    return ok


def execute(args: argparse.Namespace, stdout: Any = None) -> tuple[RunReport | None, int]:
    """Runs the script as the arguments say; returns (report, exit code).
    ``stdout``: where the script's output goes (default: this process's)."""
    platform = platform_from(args)
    world = check(args, platform)
    run_dir = Path(tempfile.mkdtemp(prefix="zion-run-"))
    try:
        (run_dir / "platform.json").write_text(json.dumps(platform.fields))
        (run_dir / OPTIONS_FILE).write_text(json.dumps({"cuda_compat": args.cuda_compat,
                                                        "virtual_clock": args.virtual_clock,
                                                        "world": world.options() if world else None}))
        main_thread = threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGTERM, raise_terminated) if main_thread else None
        try:
            child = start(args, run_dir, stdout, world)
            code, interrupted = wait(child)
        finally:
            if main_thread:
                signal.signal(signal.SIGTERM, previous)
        return finish(args, gather(run_dir), code, interrupted, world)
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


def run(args: argparse.Namespace) -> int:
    return execute(args)[1]
