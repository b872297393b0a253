"""``zion-emu bench-collectives``: nccl-tests on the zion torch.distributed backend.

Unlike ``collectives``, which asks the model alone, this spawns ``--nproc`` real
processes (torch.multiprocessing, a TCP rendezvous on a free loopback port),
creates a ``zion`` process group in each and runs the collective on zion
tensors, so every row passes through the whole backend: the handshake, gloo
moving the bytes, the model pricing the call and the communication stream.

Per size, as nccl-tests does: warmup calls, then timed calls. The time is
the modeled duration of one call (from the ranks' common start to their common
end on the communication stream; every call of a size is priced alike);
algbw = size / time and busbw = algbw x nccl-tests' factor for the op. The
host time is the wall-clock time per timed call on the slowest rank: what the
emulation costs to run that call here (gloo moving the bytes over loopback,
the handshake, the Python call).

Sizes round down to whole elements (per rank for all_gather, reduce_scatter
and all_to_all, as nccl-tests does); a size that leaves no element is skipped.
Large sizes run fewer calls so that a row moves about ``BYTES_PER_ROW`` bytes
per rank: at least one timed call, and no more warmup calls than timed ones.
"""

from __future__ import annotations

import contextlib
import argparse
import json
import os
import queue
import socket
import signal
import sys
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable, Iterator

from zion_emu import sim
from zion_emu._format import format_bytes
from zion_emu.cli import CliError, add_platform_arguments, platform_from
from zion_emu.cli.collectives import add_link_model_argument
from zion_emu.cli.nccl_table import Row, table
from zion_emu.cli.sizes import ELEMENT_BYTES, SPLIT_OPS, parse_size, size_sweep, whole_element_sizes
from zion_emu.cli.sizes import element_unit as element_unit_of

# Every collective of the model that is one torch.distributed call on a group;
# send_recv is a pair of point-to-point calls, not benchmarked here.
OPS = tuple(op for op in sim.collective_op_names() if op != "send_recv")
# The ops whose per-rank share is size / nproc: sizes round to nproc elements.
DTYPE = "float"
BYTES_PER_ROW = 256 << 20
# The group's timeout: a rank that dies leaves the others waiting at most this long.
GROUP_TIMEOUT_S = 300


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "bench-collectives", help="run a collective through the zion torch.distributed backend, like nccl-tests",
        description="Spawn --nproc ranks, run collectives on zion tensors through the zion process group for "
                    "each size and print an nccl-tests-like table: the modeled time, algbw and busbw "
                    "(GB/s = 1e9 bytes/s), the algorithm (with NCCL's protocol, ring/LL, where NCCL's tuning "
                    "model priced the call), and the host wall time per call (the emulation's own cost).")
    add_platform_arguments(p)
    p.add_argument("--nproc", type=int, default=None, metavar="N",
                   help="ranks, one process each (default: one node's OAMs)")
    p.add_argument("--op", choices=OPS, action="append", dest="ops", metavar="OP",
                   help=f"collective: {', '.join(OPS)}; repeat for several, one table each (default all_reduce)")
    p.add_argument("--min-bytes", type=parse_size, default="8", metavar="SIZE",
                   help="smallest size; K/M/G are powers of two, as nccl-tests (1K = 1024)")
    p.add_argument("--max-bytes", type=parse_size, default="64M", metavar="SIZE", help="largest size (default 64M)")
    p.add_argument("--step-factor", type=int, default=2, metavar="F", help="size multiplier between rows (default 2)")
    p.add_argument("--iters", type=int, default=20, metavar="N",
                   help="timed calls per size (default 20; fewer for large sizes, see the header)")
    p.add_argument("--warmup", type=int, default=5, metavar="N", help="untimed calls before them (default 5)")
    p.add_argument("--algo", choices=sim.algorithm_names(), default=None,
                   help="collective algorithm (default $ZION_COLLECTIVE_ALGO or auto)")
    add_link_model_argument(p, "$ZION_LINK_MODEL or fair")
    p.add_argument("--root", type=int, default=0, metavar="RANK", help="root rank of broadcast and reduce")
    p.add_argument("--vs-gloo", action="store_true",
                   help="also run each size through a plain gloo group on CPU tensors, side by side: the gloo "
                        "column is its wall time per call, x = host / gloo")
    p.add_argument("--json", action="store_true", help="print a JSON list of rows instead of the table")
    p.set_defaults(func=run)


@dataclass
class BenchRow(Row):
    """A table row plus what the backend run adds: host wall time per call, the
    calls timed and, with --vs-gloo, the same call through plain gloo on CPU tensors."""

    host_s: float = 0.0
    iters: int = 0
    gloo_s: float | None = None

    def to_json(self) -> dict[str, Any]:
        out = {**super().to_json(), "host_us": self.host_s * 1e6, "iters": self.iters}
        if self.gloo_s is not None:
            out["gloo_us"] = self.gloo_s * 1e6
        return out


def _base_width() -> int:
    """Where Row.line()'s algorithm column ends, padded to the longest algorithm name
    and NCCL protocol ("/Simple")."""
    empty = Row("all_reduce", 1, "fair", 0, DTYPE, 0, 1.0, 0.0, 0.0, "")
    return len(empty.line()) + max(len(a) for a in sim.algorithm_names()) + len("/Simple")


def _bench_line(row: BenchRow) -> str:
    line = f"{row.line():<{_base_width()}}  {row.host_s * 1e6:>10.1f}  {row.iters:>5}"
    if row.gloo_s is not None:
        line += f"  {row.gloo_s * 1e6:>10.1f}  {row.host_s / row.gloo_s:>5.2f}"
    return line


def bench_table(rows: list[BenchRow], header: list[str], vs_gloo: bool = False) -> str:
    """nccl_table.table's layout with more columns: host (us) per call and the calls
    timed; with ``vs_gloo`` also gloo's time per call and host / gloo."""
    lines = table(rows, header).splitlines()
    first = len(header) + 1  # the two column-title lines follow the header and a '#'
    lines[first] = f"{lines[first]:<{_base_width()}}  {'host':>10}  {'iters':>5}"
    lines[first + 1] = f"{lines[first + 1]:<{_base_width()}}  {'(us)':>10}  {'':>5}"
    if vs_gloo:
        lines[first] += f"  {'gloo':>10}  {'x':>5}"
        lines[first + 1] += f"  {'(us)':>10}  {'':>5}"
    for i, row in enumerate(rows):
        lines[first + 2 + i] = _bench_line(row)
    return "\n".join(lines)


def element_unit(op: str, nproc: int) -> int:
    """Bytes a size must be a multiple of: one element, per rank for the split ops."""
    return element_unit_of(op, nproc, DTYPE)


def bench_sizes(op: str, nproc: int, sizes: list[int]) -> list[int]:
    """``sizes`` rounded down to whole elements (per rank for split ops); empty ones dropped, repeats once."""
    return whole_element_sizes(op, nproc, sizes, DTYPE)


def calls_for(nbytes: int, iters: int, warmup: int) -> tuple[int, int]:
    """(warmup, timed) calls for a size: ``iters`` timed, fewer when a row would move
    more than BYTES_PER_ROW, never fewer than one; warmup no more than the timed calls."""
    timed = max(1, min(iters, BYTES_PER_ROW // nbytes))
    return min(warmup, timed), timed


def buffer_bytes(op: str, nproc: int, nbytes: int) -> int:
    """Host bytes one rank holds for a size: input plus output."""
    share = nbytes // nproc
    return {"all_reduce": nbytes, "broadcast": nbytes, "reduce": nbytes,
            "all_gather": share + nbytes, "reduce_scatter": nbytes + share, "all_to_all": 2 * nbytes}[op]


def _available_bytes() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class BenchConfig:
    """What every rank needs; plain data, pickled to the spawned processes."""

    sizes: dict[str, list[int]]  # op -> its sizes, run in this order
    nproc: int
    iters: int
    warmup: int
    root: int
    platform: str | None
    assignments: list[str]
    algorithm: str | None
    link_model: str | None
    port: int
    vs_gloo: bool = False


def _call(op: str, root: int, nbytes: int, nproc: int, send: Any, recv: Any, group: Any = None) -> Any:
    """One collective of ``nbytes`` (nccl-tests' size) on slices of the rank's buffers, in ``group``."""
    import torch.distributed as dist

    count = nbytes // ELEMENT_BYTES[DTYPE]
    if op == "all_reduce":
        return lambda: dist.all_reduce(send[:count], group=group)
    if op == "broadcast":
        return lambda: dist.broadcast(send[:count], src=root, group=group)
    if op == "reduce":
        return lambda: dist.reduce(send[:count], dst=root, group=group)
    if op == "all_gather":
        return lambda: dist.all_gather_into_tensor(recv[:count], send[:count // nproc], group=group)
    if op == "reduce_scatter":
        return lambda: dist.reduce_scatter_tensor(recv[:count // nproc], send[:count], group=group)
    if op == "all_to_all":
        return lambda: dist.all_to_all_single(recv[:count], send[:count], group=group)
    raise ValueError(f"bench-collectives: unknown op {op!r}; allowed: {', '.join(OPS)}")


def _time_calls(call: Callable[[], Any], warmup: int, iters: int) -> float:
    """Wall seconds per call of ``iters`` calls after ``warmup``, the ranks starting together."""
    import torch.distributed as dist

    for _ in range(warmup):
        call()
    dist.barrier()  # the ranks start the timed calls together, in wall time too
    wall = time.perf_counter()
    for _ in range(iters):
        call()
    return (time.perf_counter() - wall) / iters


def _measure(config: BenchConfig, op: str, nbytes: int, buffers: tuple[Any, Any],
             gloo: tuple[Any, Any, Any] | None) -> dict[str, Any]:
    """Times one size of ``op`` on this rank (and through ``gloo``: its group and CPU
    buffers); every rank gets the row, with the slowest rank's host times."""
    import torch
    import torch.distributed as dist

    import zion_emu.distributed as zd

    warmup, iters = calls_for(nbytes, config.iters, config.warmup)
    host = [_time_calls(_call(op, config.root, nbytes, config.nproc, *buffers), warmup, iters)]
    # Every call of a size is priced alike: the last one's duration is each one's.
    record = zd.last_collective()
    if record["bytes"] != nbytes:
        raise RuntimeError(f"bench-collectives: the backend recorded {record['bytes']} bytes for a {nbytes}-byte {op}")
    if gloo is not None:
        group, send, recv = gloo
        host.append(_time_calls(_call(op, config.root, nbytes, config.nproc, send, recv, group), warmup, iters))
    # CPU tensors through the zion group: gloo, unmodeled.
    mine = torch.tensor(host, dtype=torch.float64)
    every = [torch.empty_like(mine) for _ in range(config.nproc)]
    dist.all_gather(every, mine)
    slowest = torch.stack(every).amax(dim=0).tolist()
    return {"op": op, "bytes": nbytes, "time_s": record["time"], "host_s": slowest[0],
            "gloo_s": slowest[1] if gloo is not None else None,
            "algorithm": record["algorithm"], "protocol": record["protocol"], "iters": iters, "warmup": warmup}


def worker(rank: int, config: BenchConfig, results: Any) -> None:
    """One rank: joins the zion group and runs every op and size; rank 0 reports
    the group's model, then each row as it is measured."""
    import torch
    import torch.distributed as dist

    import zion_emu
    import zion_emu.distributed as zd

    # A Ctrl-C at the terminal reaches every rank too: the launcher alone
    # handles it, and stops the ranks.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // config.nproc))
    platform = zion_emu.load_platform(config.platform, assignments=config.assignments)
    zion_emu.set_platform(platform)
    dist.init_process_group("zion", init_method=f"tcp://127.0.0.1:{config.port}", rank=rank,
                            world_size=config.nproc, timeout=timedelta(seconds=GROUP_TIMEOUT_S),
                            pg_options=zd.Options(algorithm=config.algorithm, link_model=config.link_model))
    try:
        if rank == 0:
            results.put(("model", zd.group_model()))
        torch.zion.set_device(rank % platform.devices_per_node)
        elements = max(max(sizes) for sizes in config.sizes.values()) // ELEMENT_BYTES[DTYPE]
        split = bool(set(config.sizes) & SPLIT_OPS)
        buffers = (torch.ones(elements, device="zion"), torch.empty(elements, device="zion") if split else None)
        gloo = None
        if config.vs_gloo:
            gloo = (dist.new_group(backend="gloo"), torch.ones(elements), torch.empty(elements) if split else None)
        for op, sizes in config.sizes.items():
            for nbytes in sizes:
                row = _measure(config, op, nbytes, buffers, gloo)
                if rank == 0:
                    results.put(("row", row))
    finally:
        dist.destroy_process_group()


@contextlib.contextmanager
def spawned(fn: Callable[..., None], args: tuple, nprocs: int) -> Iterator[Any]:
    """Runs ``fn(rank, *args)`` in ``nprocs`` spawned processes and yields
    their ``ProcessContext``. On leaving, however it is left, kills the ranks
    still running, reaps them all and removes the traceback files that torch's
    spawn leaves in ``$TMPDIR`` for ranks that raised."""
    import torch.multiprocessing as mp

    ctx = mp.start_processes(fn, args=args, nprocs=nprocs, join=False, start_method="spawn")
    try:
        yield ctx
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()
            p.join(timeout=10)
        for path in ctx.error_files:
            with contextlib.suppress(OSError):
                os.unlink(path)


def _spawn(config: BenchConfig, on_model: Callable[[dict[str, str]], None],
           on_row: Callable[[dict[str, Any]], None]) -> None:
    """Runs the ranks, handing on what rank 0 reports as it comes."""
    import torch.multiprocessing as mp

    results = mp.get_context("spawn").Queue()

    def drain(wait_s: float) -> None:
        while True:
            try:
                kind, value = results.get(timeout=wait_s)
            except queue.Empty:
                return
            (on_row if kind == "row" else on_model)(value)

    with spawned(worker, (config, results), config.nproc) as ctx:
        try:
            while not ctx.join(timeout=0.2):
                drain(0)
        except mp.ProcessRaisedException as e:
            last = str(e).strip().splitlines()[-1]
            raise CliError(f"rank {e.error_index} failed: {last}") from None
        except mp.ProcessExitedException as e:
            hint = " (killed: out of host memory? lower --max-bytes or --nproc)" if e.exit_code in (-9, 137) else ""
            raise CliError(f"rank {e.error_index} exited with code {e.exit_code}{hint}") from None
    drain(0.5)  # what rank 0 put just before it ended


def _check(args: argparse.Namespace, ops: list[str], nproc: int, platform: Any, sizes: dict[str, list[int]]) -> None:
    if nproc < 1:
        raise CliError(f"--nproc must be at least 1, got {nproc}")
    if nproc > platform.total_devices:
        raise CliError(f"--nproc {nproc} does not fit platform '{platform.name}': it has {platform.total_devices} "
                       f"devices ({platform.nodes} node(s) x {platform.devices_per_node} OAMs); choose fewer ranks or "
                       "a platform with more nodes (--platform, --set nodes=N)")
    if args.iters < 1:
        raise CliError(f"--iters must be at least 1, got {args.iters}")
    if args.warmup < 0:
        raise CliError(f"--warmup must be 0 or more, got {args.warmup}")
    if set(ops) & {"broadcast", "reduce"} and not 0 <= args.root < nproc:
        raise CliError(f"--root {args.root} is not a rank (0..{nproc - 1})")
    for op in ops:
        if not sizes[op]:
            raise CliError(f"no size from --min-bytes to --max-bytes holds one {DTYPE} per rank for {op} over "
                           f"{nproc} ranks; the smallest is {element_unit(op, nproc)} bytes")
    if args.algo not in (None, "auto"):
        # An algorithm that cannot run over this many ranks is refused here, before any rank starts.
        for op in ops:
            try:
                sim.collective(platform, op, min(sizes[op]), nproc, args.algo, args.link_model or "fair",
                               root=args.root if op in ("broadcast", "reduce") else 0)
            except ValueError as e:
                raise CliError(f"--algo {args.algo}: {e}") from None
    op = max(ops, key=lambda o: buffer_bytes(o, nproc, max(sizes[o])))
    need = nproc * buffer_bytes(op, nproc, max(sizes[op]))
    available = _available_bytes()
    if available is not None and need > available:
        raise CliError(f"{op} of {format_bytes(max(sizes[op]))} over {nproc} ranks needs {format_bytes(need)} of host "
                       f"memory for its buffers; {format_bytes(available)} is available; lower --max-bytes")


def run(args: argparse.Namespace) -> int:
    import zion_emu.distributed as zd

    platform = platform_from(args)
    ops = list(dict.fromkeys(args.ops or ["all_reduce"]))
    nproc = platform.devices_per_node if args.nproc is None else args.nproc
    swept = size_sweep(args.min_bytes, args.max_bytes, args.step_factor)
    sizes = {op: bench_sizes(op, max(nproc, 1), swept) for op in ops}
    _check(args, ops, nproc, platform, sizes)
    zd.Options(algorithm=args.algo, link_model=args.link_model)  # the environment's values are checked by the ranks
    config = BenchConfig(sizes, nproc, args.iters, args.warmup, args.root, args.platform, list(args.assignments),
                         args.algo, args.link_model, _free_port(), args.vs_gloo)
    model: dict[str, str] = {}
    rows: dict[str, list[BenchRow]] = {op: [] for op in ops}

    def header(op: str) -> list[str]:
        return [f"zion-emu bench-collectives: {op} over {nproc} ranks (processes) through the zion backend, "
                f"link model {model.get('link_model')}, algorithm {model.get('algorithm')}",
                f"platform: {platform.name} ({platform.nodes} node(s) x {platform.devices_per_node} OAMs, "
                f"fabric {platform.get('fabric.topology')})",
                f"minBytes {args.min_bytes} maxBytes {args.max_bytes} step: {args.step_factor}(factor) type: {DTYPE}; "
                f"iters {args.iters} warmup {args.warmup} (fewer where a row would move over "
                f"{format_bytes(BYTES_PER_ROW)} per rank)",
                "time: modeled per call; host: wall-clock time per call on the slowest rank"]

    def footer(op: str) -> None:
        if not args.json and rows[op]:
            print("\n".join(bench_table(rows[op], header(op)).splitlines()[-2:]), flush=True)  # avg bus bandwidth

    def on_row(r: dict[str, Any]) -> None:
        op = r["op"]
        first = not rows[op]
        if first and op != ops[0]:
            footer(ops[ops.index(op) - 1])
        row = BenchRow(op, nproc, model.get("link_model", ""), r["bytes"], DTYPE, args.root, r["time_s"],
                       r["bytes"] / r["time_s"], r["bytes"] / r["time_s"] * sim.bus_bandwidth_factor(op, nproc),
                       r["algorithm"], r["protocol"] or "", host_s=r["host_s"], iters=r["iters"], gloo_s=r["gloo_s"])
        rows[op].append(row)
        if args.json:
            return
        if first:
            print(bench_table([], header(op), args.vs_gloo).rsplit("\n# Avg", 1)[0], flush=True)
        print(_bench_line(row), flush=True)

    interrupted = False
    try:
        _spawn(config, model.update, on_row)
    except KeyboardInterrupt:  # the ranks are stopped; the rows measured so far stand
        interrupted = True
    if args.json:
        print(json.dumps([r.to_json() for op in ops for r in rows[op]], indent=2))
    else:
        measured = [op for op in ops if rows[op]]
        if measured:
            footer(measured[-1])
    if interrupted:
        print(f"zion-emu: interrupted; {'the rows above were' if any(rows.values()) else 'no row was'} measured "
              "before it", file=sys.stderr)
        return 128 + signal.SIGINT
    return 0
