"""Trains DLRM on synthetic data and says how fast it trains: on the modeled
Zion (``--device zion``, modeled time), on the CPU or on CUDA (wall time).

    python examples/dlrm/dlrm.py --config tiny --device zion
    torchrun --nproc-per-node 8 examples/dlrm/dlrm.py --config small --device zion
    python examples/dlrm/dlrm.py --config paper --device cpu --num-batches 3
    python -m zion_emu run --nproc 8 examples/dlrm/dlrm.py --config dcnv2 --table-placement auto --batch-size 4096
    python examples/dlrm/dlrm.py --config small --inference --batch-sizes 1,64,512,4096   # serve: OAM vs socket

Flags follow the public facebookresearch/dlrm reference (``--arch-*``,
``--mini-batch-size``, ...); ``--config`` sets them all at once and explicit
flags override it. Under torchrun (WORLD_SIZE > 1) tables are model parallel,
table-wise, and the MLPs data parallel under DDP; the process group is ``zion``
for ``--device zion``, ``gloo`` for ``cpu`` and ``nccl`` for ``cuda``.

Tables are owned whole, balanced by bytes over the ranks (largest first to
the least-loaded rank). On zion each lives in the rank's HBM or in the DDR of
its CPU socket (``--table-placement``); ``auto`` keeps in HBM the hottest tables
that fit the device's capacity less a reserve for the rest of a step
(examples/dlrm/placement.py says what the reserve counts).

Output (rank 0): a header, a line per rank with its tables and their bytes,
then a line per ``--print-freq`` iterations,

    iter 3 loss 0.6931471824645996 modeled_ms_per_iter 1.234 modeled_samples_per_s 1659000.1 wall_ms_per_iter 56.7

(the loss is the global batch's mean, exact; ``modeled_*`` only on zion), and
a last ``summary`` line with the samples/s over the whole run.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Callable, ContextManager, Iterable, Sequence

import torch
import torch.distributed as dist
# Before any process group exists: this module's functions take the default
# group as a default argument, and DDP imports it. Imported later, it holds
# that group (and gloo's worker threads) until the interpreter is torn down.
import torch.distributed.nn  # noqa: F401
import torch.nn.functional as F
import torch.utils.data
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from configs import CONFIGS, DEFAULTS  # noqa: E402
from data import CRITEO_DENSE_FEATURES, KINDS, Batch, SyntheticData  # noqa: E402
from model import INTERACTIONS, DenseArch, EmbeddingArch  # noqa: E402
from placement import OPTIMIZER_STATE_SLOTS, PLACEMENTS, TablePlan, plan_tables, table_bytes  # noqa: E402

DEVICES = ("cpu", "zion", "cuda")
OPTIMIZERS = tuple(OPTIMIZER_STATE_SLOTS)
BACKENDS = {"cpu": "gloo", "zion": "zion", "cuda": "nccl"}


class UsageError(ValueError):
    """A flag or the launch environment asks for something the run cannot do."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dlrm.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", choices=tuple(CONFIGS), default="small",
                   help="named shape that sets the arch and run flags (default: small)")
    # None = take the config's value.
    p.add_argument("--arch-sparse-feature-size", type=int, help="embedding dimension")
    p.add_argument("--arch-embedding-size", help="rows per table, e.g. 1000-1000-1000")
    p.add_argument("--arch-mlp-bot", help="bottom MLP widths from the dense features, e.g. 13-512-256-64")
    p.add_argument("--arch-mlp-top", help="top MLP widths after the interaction, e.g. 512-256-1")
    p.add_argument("--arch-interaction-op", choices=INTERACTIONS,
                   help="dot (DLRM's pairwise dots) or dcn (DCN-v2's low-rank cross layers)")
    p.add_argument("--dcn-num-layers", type=int, help="cross layers of --arch-interaction-op dcn (default 3)")
    p.add_argument("--dcn-low-rank-dim", type=int, help="rank of each cross layer's weights (default 512)")
    p.add_argument("--table-placement", choices=PLACEMENTS, default="hbm",
                   help="where the embedding tables live on zion: hbm (the device), ddr (the rank's socket DDR, "
                        "looked up by the CPU), auto (the hottest tables, by lookups per byte, in HBM while they fit "
                        "--hbm-budget, the rest in DDR)")
    p.add_argument("--hbm-budget",
                   help="HBM bytes per rank for the tables and their optimizer state under --table-placement auto "
                        "(K/M/G suffixes are powers of two; default: the device's capacity less a reserve for the "
                        "dense part, activations and the step's sparse gradients)")
    p.add_argument("--mini-batch-size", "--batch-size", dest="mini_batch_size", type=int,
                   help="global batch, split evenly over the ranks")
    p.add_argument("--num-batches", type=int, help="training iterations")
    p.add_argument("--num-indices-per-lookup",
                   help="indices pooled per table per sample: one count, or one per table (e.g. 3-2-1)")
    p.add_argument("--learning-rate", type=float)
    p.add_argument("--data", choices=KINDS)
    p.add_argument("--max-rows", type=int, help="cap on rows per table (0: no cap, the full tables; "
                                                "mlperf and dcnv2 cap at 1000000 unless told)")
    p.add_argument("--device", choices=DEVICES, default="zion")
    p.add_argument("--platform", help="zion only: the modeled machine (a preset name or a .json file; "
                                      "default: $ZION_PLATFORM or zion)")
    p.add_argument("--optimizer", choices=OPTIMIZERS, help="default: the config's (sgd; adagrad for dcnv2)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--print-freq", type=int, default=1, help="print a line every N iterations")
    p.add_argument("--num-workers", type=int, default=0,
                   help="make the batches in N data-loader worker processes (torch DataLoader, in order, as the "
                        "reference DLRM's --num-workers); 0 makes each on the training thread before its step")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (none when stderr is not a TTY)")
    p.add_argument("--inference", action="store_true",
                   help="zion only: serve instead of train. For each of --batch-sizes, --num-batches queries "
                        "(copy the batch in, score it, copy the scores out) on the rank's OAM, tables in HBM, and "
                        "the same model on the CPU socket the OAM hangs off (zion_emu.socket); prints p50/p99 "
                        "latency and queries/s for both, and the batch size from which the OAM is faster")
    p.add_argument("--batch-sizes", default="1,8,64,512",
                   help="--inference: comma-separated batch sizes of one query (default 1,8,64,512)")
    return p


def _widths(flag: str, text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split("-")]
    except ValueError:
        values = []
    if not values or any(v < 1 for v in values):
        raise UsageError(f"{flag} {text!r}: expected positive integers separated by dashes, e.g. 13-512-256-64")
    return values


def resolve(args: argparse.Namespace) -> argparse.Namespace:
    """Fills the flags left unset from ``--config`` and checks that the shapes fit together."""
    for name, value in {**DEFAULTS, **CONFIGS[args.config]}.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    dim = args.arch_sparse_feature_size
    for flag, value in (("--arch-sparse-feature-size", dim), ("--mini-batch-size", args.mini_batch_size),
                        ("--num-batches", args.num_batches), ("--print-freq", args.print_freq),
                        ("--dcn-num-layers", args.dcn_num_layers), ("--dcn-low-rank-dim", args.dcn_low_rank_dim)):
        if value < 1:
            raise UsageError(f"{flag} is {value}; it must be at least 1")
    if args.max_rows < 0:
        raise UsageError(f"--max-rows is {args.max_rows}; it must be 0 (no cap) or a row count")
    if args.num_workers < 0:
        raise UsageError(f"--num-workers is {args.num_workers}; it must be 0 (batches made on the training thread) "
                         f"or a number of worker processes")
    if not args.learning_rate > 0:
        raise UsageError(f"--learning-rate is {args.learning_rate}; it must be positive")
    args.table_rows = _widths("--arch-embedding-size", args.arch_embedding_size)
    if args.max_rows:
        args.table_rows = [min(r, args.max_rows) for r in args.table_rows]
    lookups = _widths("--num-indices-per-lookup", str(args.num_indices_per_lookup))
    if len(lookups) == 1:
        lookups *= len(args.table_rows)
    if len(lookups) != len(args.table_rows):
        raise UsageError(f"--num-indices-per-lookup {args.num_indices_per_lookup} gives {len(lookups)} counts for "
                         f"{len(args.table_rows)} tables (--arch-embedding-size); give one count, or one per table")
    args.table_lookups = lookups
    args.bottom = _widths("--arch-mlp-bot", args.arch_mlp_bot)
    args.top = _widths("--arch-mlp-top", args.arch_mlp_top)
    if len(args.bottom) < 2:
        raise UsageError(f"--arch-mlp-bot {args.arch_mlp_bot}: give the dense feature count and at least one layer")
    if args.bottom[-1] != dim:
        raise UsageError(f"--arch-mlp-bot {args.arch_mlp_bot} ends in {args.bottom[-1]}, but "
                         f"--arch-sparse-feature-size is {dim}: the bottom MLP's output meets the embeddings in the "
                         f"{args.arch_interaction_op} interaction, so the two must be equal")
    if args.top[-1] != 1:
        raise UsageError(f"--arch-mlp-top {args.arch_mlp_top} ends in {args.top[-1]}; the top MLP gives one "
                         f"logit per sample, so it must end in 1")
    if args.data == "criteo-synthetic" and args.bottom[0] != CRITEO_DENSE_FEATURES:
        raise UsageError(f"--arch-mlp-bot {args.arch_mlp_bot} starts with {args.bottom[0]} dense features, but "
                         f"--data criteo-synthetic has {CRITEO_DENSE_FEATURES}; start it with {CRITEO_DENSE_FEATURES} "
                         f"or use --data random")
    args.hbm_budget_bytes = None if args.hbm_budget is None else _bytes("--hbm-budget", args.hbm_budget)
    if args.hbm_budget is not None and args.table_placement != "auto":
        raise UsageError(f"--hbm-budget {args.hbm_budget} is the HBM for tables under --table-placement auto; "
                         f"with --table-placement {args.table_placement} it would do nothing")
    if args.table_placement != "hbm" and args.device != "zion":
        raise UsageError(f"--table-placement {args.table_placement} places tables on the modeled Zion's sockets; "
                         f"it needs --device zion, not --device {args.device}")
    if args.platform is not None and args.device != "zion":
        raise UsageError(f"--platform {args.platform} picks the modeled machine; it needs --device zion, "
                         f"not --device {args.device}")
    return args


def _bytes(flag: str, text: str) -> int:
    """'512M' -> 536870912; K, M, G are powers of two."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    t = text.strip().upper()
    try:
        value = float(t[:-1]) * units[t[-1]] if t and t[-1] in units else float(t)
    except ValueError:
        raise UsageError(f"{flag} {text!r} is not a size; give bytes, e.g. 1073741824, 512M or 2G") from None
    if value < 0:
        raise UsageError(f"{flag} {text!r} is negative")
    return int(value)


def _batch_sizes(args: argparse.Namespace) -> list[int]:
    try:
        sizes = [int(v) for v in args.batch_sizes.split(",")]
    except ValueError:
        sizes = []
    if not sizes or any(v < 1 for v in sizes):
        raise UsageError(f"--batch-sizes {args.batch_sizes!r}: expected positive integers separated by commas, "
                         f"e.g. 1,8,64,512")
    if not args.inference:
        raise UsageError("--batch-sizes is the query sizes of --inference; without --inference it would do nothing")
    if args.device != "zion":
        raise UsageError(f"--inference compares the modeled Zion's OAM and CPU socket; it needs --device zion, "
                         f"not --device {args.device}")
    if args.table_placement != "hbm":
        raise UsageError("--inference places the tables itself (in HBM for the OAM, in the socket's DDR for the "
                         "CPU); leave --table-placement at hbm")
    return sizes


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        args = resolve(args)
        if args.inference or args.batch_sizes != parser.get_default("batch_sizes"):
            args.query_sizes = _batch_sizes(args)
        return args
    except UsageError as e:
        parser.error(str(e))
        raise  # parser.error exits


@dataclass
class Run:
    """One rank's training state."""

    args: argparse.Namespace
    rank: int
    world_size: int
    device: torch.device
    embeddings: EmbeddingArch
    dense: nn.Module
    optimizer: torch.optim.Optimizer
    data: SyntheticData
    plan: TablePlan

    @property
    def local_batch(self) -> int:
        return self.args.mini_batch_size // self.world_size

    def step(self, batch: Batch) -> torch.Tensor:
        """One training iteration on a batch already on the device; returns this rank's loss (on the device).
        With tables in DDR, the CPU's part of the step (their lookups, gradients and updates) runs in the
        rank's socket, which prices it."""
        if not self.embeddings.host_tables:
            return self._step(batch)
        import zion_emu

        with zion_emu.socket(self.embeddings.socket):
            return self._step(batch)

    def _step(self, batch: Batch) -> torch.Tensor:
        pooled = self.embeddings(batch.indices, batch.offsets, self.local_batch)
        logits = self.dense(batch.dense, pooled)
        loss = F.binary_cross_entropy_with_logits(logits, batch.labels)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        return loss.detach()

    def global_loss(self, loss: torch.Tensor) -> float:
        """The global batch's mean loss: the ranks' means summed through the
        process group (on the host: no modeled time) and divided by their number."""
        value = loss.to("cpu" if self.args.device != "cuda" else self.device, torch.float32).reshape(1)
        if self.world_size > 1:
            dist.all_reduce(value)
            value = value / self.world_size
        return float(value.item())

    def synchronize(self) -> None:
        if self.device.type == "zion":
            torch.zion.synchronize(self.device)
        elif self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def modeled_clock(self) -> float | None:
        """The host's virtual clock in seconds after waiting for the device (zion only)."""
        if self.device.type != "zion":
            return None
        import zion_emu

        self.synchronize()
        return zion_emu.clock()


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name, "")
    try:
        return int(value) if value else default
    except ValueError:
        raise UsageError(f"environment variable {name}={value!r} is not an integer") from None


def table_plan(args: argparse.Namespace, world: int, dense: DenseArch, capacity: int | None) -> TablePlan:
    """Every rank's tables and where they live, for these flags (``capacity``:
    the device's HBM bytes, which auto needs without --hbm-budget)."""
    return plan_tables(args.table_rows, args.arch_sparse_feature_size, args.table_lookups, args.optimizer,
                       args.table_placement, world, args.mini_batch_size, args.hbm_budget_bytes, capacity,
                       sum(p.numel() * p.element_size() for p in dense.parameters()),
                       dense.activation_floats_per_sample())


def setup(args: argparse.Namespace) -> Run:
    """Device, process group (when WORLD_SIZE > 1), model, optimizer and data for this rank."""
    world, rank = _env_int("WORLD_SIZE", 1), _env_int("RANK", 0)
    local_rank = _env_int("LOCAL_RANK", rank)
    if args.mini_batch_size % world:
        raise UsageError(f"--mini-batch-size {args.mini_batch_size} does not split evenly over {world} ranks; "
                         f"give a multiple of {world}")
    capacity = None
    if args.device == "zion":
        import zion_emu
        import zion_emu.distributed  # noqa: F401  (registers the zion process-group backend)

        if args.platform is not None:
            try:
                zion_emu.set_platform(args.platform)
            except zion_emu.ConfigError as e:
                raise UsageError(f"--platform {args.platform}: {e}") from None
        if local_rank >= torch.zion.device_count():
            raise UsageError(f"LOCAL_RANK {local_rank} has no device: the platform "
                             f"'{zion_emu.current_platform().name}' has {torch.zion.device_count()} per node")
        device = torch.device("zion", local_rank)
        torch.zion.set_device(device)
        capacity = torch.zion.get_device_properties(device).total_memory
    elif args.device == "cuda":
        if not torch.cuda.is_available():
            raise UsageError("--device cuda: CUDA is not available here; use --device zion or --device cpu")
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if world > 1:
        dist.init_process_group(BACKENDS[args.device], rank=rank, world_size=world)

    dense_arch = DenseArch(args.bottom, args.top, len(args.table_rows), args.seed, device, args.arch_interaction_op,
                           args.dcn_num_layers, args.dcn_low_rank_dim)
    tables = table_plan(args, world, dense_arch, capacity)
    owners, placement = tables.owners, tables.where[rank]
    socket = None
    if "ddr" in placement:
        from zion_emu import sockets

        socket = sockets.current_socket()  # the socket this rank's OAM's PCIe switch hangs off
    embeddings = EmbeddingArch(args.table_rows, args.arch_sparse_feature_size, owners, rank, args.seed, device,
                               placement, socket)
    dense: nn.Module = dense_arch
    if world > 1:
        dense = nn.parallel.DistributedDataParallel(dense, device_ids=[local_rank] if device.type == "cuda" else None)
    params = list(embeddings.parameters()) + list(dense.parameters())
    # foreach=False: one code path on every device, so results match bit for bit
    # (and the only one torch.optim has for the tables' sparse gradients).
    # Optimizer state takes its parameter's place: for a DDR table, the socket's DDR.
    with _socket_scope(socket):
        if args.optimizer == "sgd":
            optimizer: torch.optim.Optimizer = torch.optim.SGD(params, lr=args.learning_rate, foreach=False)
        else:
            # eps and the zero initial accumulator as the MLPerf DLRMv2 reference (and torch's defaults).
            optimizer = torch.optim.Adagrad(params, lr=args.learning_rate, eps=1e-10, initial_accumulator_value=0.0,
                                            foreach=False)
    data = SyntheticData(args.data, args.table_rows, args.bottom[0], args.table_lookups, args.mini_batch_size, rank,
                         world, owners[rank], args.seed)
    return Run(args, rank, world, device, embeddings, dense, optimizer, data, tables)


def _socket_scope(socket: int | None) -> ContextManager[object]:
    if socket is None:
        return nullcontext()
    import zion_emu

    return zion_emu.socket(socket)


def describe(run: Run) -> str:
    a = run.args
    owned = "-".join(str(len(t)) for t in run.plan.owners)
    where = a.device
    if a.device == "zion":
        import zion_emu

        where += f" platform {zion_emu.current_platform().name}"
    interaction = a.arch_interaction_op
    if interaction == "dcn":
        interaction += f" layers {a.dcn_num_layers} rank {a.dcn_low_rank_dim}"
    return (f"# dlrm config {a.config} device {where} ranks {run.world_size} tables {len(a.table_rows)} "
            f"(per rank {owned}) rows {a.arch_embedding_size if not a.max_rows else '-'.join(map(str, a.table_rows))} "
            f"dim {a.arch_sparse_feature_size} bot {a.arch_mlp_bot} interaction {interaction} top {a.arch_mlp_top} "
            f"global_batch {a.mini_batch_size} lookups {a.num_indices_per_lookup} data {a.data} "
            f"optimizer {a.optimizer} lr {a.learning_rate} placement {a.table_placement}")


def placement_lines(run: Run) -> list[str]:
    """Where this rank's tables live, one line each."""
    a, emb = run.args, run.embeddings
    lines = []
    for t, where in zip(emb.owners[run.rank], emb.placement):
        size = table_bytes(a.table_rows[t], a.arch_sparse_feature_size)
        place = f"ddr socket {emb.socket}" if where == "ddr" else f"hbm {run.device}"
        lines.append(f"# rank {run.rank} table {t} rows {a.table_rows[t]} bytes {size} place {place}")
    return lines


class _BatchesOf(torch.utils.data.Dataset):
    """The run's batches by index, for a DataLoader's workers (each batch a pure function of its index)."""

    def __init__(self, data: SyntheticData, count: int) -> None:
        self.data, self.count = data, count

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, i: int) -> tuple[torch.Tensor, ...]:
        return self.data.batch(i).packed()


def batches(run: Run) -> Iterable[Batch]:
    """The ``--num-batches`` batches in order: made on this thread one before each step, or with
    ``--num-workers N`` by N worker processes ahead of the steps (the same batches either way)."""
    a = run.args
    if a.num_workers == 0:
        return (run.data.batch(i) for i in range(a.num_batches))
    loader = torch.utils.data.DataLoader(_BatchesOf(run.data, a.num_batches), batch_size=None, shuffle=False,
                                         num_workers=a.num_workers)
    return (Batch.unpacked(*packed) for packed in loader)


def train(run: Run, emit: Callable[[str], None]) -> dict[str, float]:
    """Runs ``--num-batches`` iterations; ``emit`` gets rank 0's lines. Returns the summary figures."""
    from tqdm import tqdm

    a = run.args
    lead = run.rank == 0
    bar = tqdm(total=a.num_batches, unit="it", disable=not lead or a.no_progress or not sys.stderr.isatty())
    say = (lambda line: bar.write(line, file=sys.stdout)) if not bar.disable else emit
    if os.environ.get("ZION_RUN_DIR"):  # under `python -m zion_emu run`: its report gives samples/s too
        from zion_emu import samples_per_iteration

        samples_per_iteration(a.mini_batch_size // run.world_size)
    run.synchronize()
    wall_start = wall_last = time.perf_counter()
    clock_start = clock_last = run.modeled_clock()
    last_iter = 0
    for i, batch in enumerate(batches(run)):
        batch = batch.to(run.device, run.embeddings.host_tables)
        loss = run.step(batch)
        bar.update(1)
        if (i + 1) % a.print_freq and i + 1 != a.num_batches:
            continue
        value = run.global_loss(loss)
        clock, wall = run.modeled_clock(), time.perf_counter()
        iters = i + 1 - last_iter
        line = f"iter {i + 1} loss {value!r}"
        if clock is not None:
            modeled = (clock - clock_last) / iters
            line += f" modeled_ms_per_iter {modeled * 1e3:.6f} modeled_samples_per_s {a.mini_batch_size / modeled:.1f}"
        line += f" wall_ms_per_iter {(wall - wall_last) / iters * 1e3:.3f}"
        if lead:
            say(line)
        last_iter, clock_last, wall_last = i + 1, clock, wall
    bar.close()
    wall_s = time.perf_counter() - wall_start
    summary = {"iters": a.num_batches, "global_batch": a.mini_batch_size,
               "wall_samples_per_s": a.mini_batch_size * a.num_batches / wall_s}
    line = f"summary device {a.device} ranks {run.world_size} iters {a.num_batches} global_batch {a.mini_batch_size}"
    if clock_start is not None:
        modeled_s = (run.modeled_clock() - clock_start) / a.num_batches
        summary["modeled_ms_per_iter"] = modeled_s * 1e3
        summary["modeled_samples_per_s"] = a.mini_batch_size / modeled_s
        summary["peak_hbm_bytes"] = torch.zion.max_memory_allocated(run.device)
        line += (f" modeled_ms_per_iter {modeled_s * 1e3:.6f} modeled_samples_per_s "
                 f"{summary['modeled_samples_per_s']:.1f} peak_hbm_bytes {summary['peak_hbm_bytes']}")
    line += f" wall_samples_per_s {summary['wall_samples_per_s']:.1f}"
    if lead:
        emit(line)
    return summary


def serve(args: argparse.Namespace, emit: Callable[[str], None]) -> list[dict[str, float]]:
    """``--inference``: one process, no optimizer, gradients off. For each
    query size, ``--num-batches`` queries timed with zion_emu.inference.query
    on the OAM (the batch's dense features, indices and offsets copied in, the
    model, sigmoid, the scores copied out) and on the CPU socket the OAM hangs
    off (the same model built in the socket's DDR: no copies, every op priced
    on the socket). Emits a line per size and a last ``crossover`` line."""
    import zion_emu
    from zion_emu import inference, sockets

    if _env_int("WORLD_SIZE", 1) > 1:
        raise UsageError("--inference serves from one process; run it without torchrun or --nproc")
    if args.platform is not None:
        zion_emu.set_platform(args.platform)
    device = torch.device("zion", _env_int("LOCAL_RANK", 0))
    torch.zion.set_device(device)
    socket = sockets.current_socket()  # the socket the OAM's PCIe switch hangs off
    owners = [list(range(len(args.table_rows)))]
    cpu = torch.device("cpu")
    with zion_emu.socket(socket):
        on_socket = (EmbeddingArch(args.table_rows, args.arch_sparse_feature_size, owners, 0, args.seed, cpu),
                     DenseArch(args.bottom, args.top, len(args.table_rows), args.seed, cpu, args.arch_interaction_op,
                               args.dcn_num_layers, args.dcn_low_rank_dim))
    on_oam = (EmbeddingArch(args.table_rows, args.arch_sparse_feature_size, owners, 0, args.seed, device),
              DenseArch(args.bottom, args.top, len(args.table_rows), args.seed, device, args.arch_interaction_op,
                        args.dcn_num_layers, args.dcn_low_rank_dim))
    for module in (*on_socket, *on_oam):
        module.eval()

    def one_query(model: tuple[nn.Module, nn.Module], batch: Batch, size: int, to: torch.device | None) -> torch.Tensor:
        with inference.query():
            dense, indices, offsets = batch.dense, batch.indices, batch.offsets
            if to is not None:
                moved = {id(o): o.to(to) for o in offsets}
                dense, indices, offsets = dense.to(to), [i.to(to) for i in indices], [moved[id(o)] for o in offsets]
            scores = torch.sigmoid(model[1](dense, model[0](indices, offsets, size)))
            return scores.cpu()

    rows = []
    emit(f"# dlrm inference device zion:{device.index} vs socket {socket} platform "
         f"{zion_emu.current_platform().name} queries per size {args.num_batches} (latencies modeled)")
    for size in args.query_sizes:
        data = SyntheticData(args.data, args.table_rows, args.bottom[0], args.table_lookups, size, 0, 1, owners[0],
                             args.seed)
        batches = [data.batch(i) for i in range(args.num_batches)]
        row: dict[str, float] = {"batch": size}
        for name, model, to in (("oam", on_oam, device), ("socket", on_socket, None)):
            inference.reset()
            torch.zion.synchronize(device)
            with torch.inference_mode(), zion_emu.socket(socket):
                scores = [one_query(model, b, size, to) for b in batches]
            latencies = [end - start for start, end in inference.queries()]
            stats = inference.latency_stats(latencies)
            row[f"{name}_p50_ms"], row[f"{name}_p99_ms"] = stats["p50_s"] * 1e3, stats["p99_s"] * 1e3
            row[f"{name}_qps"] = len(latencies) / sum(latencies)
            row[f"{name}_scores"] = float(torch.cat(scores).sum())
        inference.reset()
        rows.append(row)
        emit(f"inference batch {size} " + " ".join(
            f"{name}_p50_ms {row[name + '_p50_ms']:.6f} {name}_p99_ms {row[name + '_p99_ms']:.6f} "
            f"{name}_qps {row[name + '_qps']:.1f} {name}_samples_per_s {row[name + '_qps'] * size:.1f}"
            for name in ("oam", "socket")))
    wins = [r["batch"] for r in rows if r["oam_p50_ms"] < r["socket_p50_ms"]]
    # The crossover: the smallest size from which the OAM is faster at every larger size measured.
    crossover = next((r["batch"] for k, r in enumerate(rows) if all(x["batch"] in wins for x in rows[k:])), None)
    emit(f"crossover oam_faster_from_batch {int(crossover) if crossover is not None else 'none'} "
         f"(p50 latency; sizes where the OAM wins: {','.join(str(int(b)) for b in wins) or 'none'})")
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.inference:
        try:
            serve(args, lambda line: print(line, flush=True))
        except UsageError as e:
            print(f"dlrm.py: error: {e}", file=sys.stderr)
            return 2
        return 0
    try:
        run = setup(args)
    except UsageError as e:
        print(f"dlrm.py: error: {e}", file=sys.stderr)
        return 2
    except torch.OutOfMemoryError as e:
        return _out_of_memory(e, args, "building the model")

    def emit(line: str) -> None:
        print(line, flush=True)

    if run.rank == 0:
        emit(describe(run))
        for line in run.plan.lines(args.table_rows, args.arch_sparse_feature_size, args.device != "cpu"):
            emit(line)
    if args.table_placement != "hbm":
        for line in placement_lines(run):
            emit(line)
    try:
        train(run, emit)
    except torch.OutOfMemoryError as e:
        return _out_of_memory(e, args, "training")
    world_size = run.world_size
    del run
    if world_size > 1:
        close_process_group()
    return 0


def close_process_group() -> None:
    """Destroys the process group once nothing else holds it, so that its
    backend is freed and gloo's worker threads are joined here. Left to the
    interpreter's teardown, a worker that drops its last reference to a
    finished collective's tensor then needs the GIL, which Python no longer
    hands out, and the process aborts ("terminate called without an active
    exception"). The caller drops the DDP model first."""
    gc.collect()  # the model's reference cycles hold the group too
    dist.destroy_process_group()


def _out_of_memory(error: torch.OutOfMemoryError, args: argparse.Namespace, stage: str) -> int:
    """The allocator's message (device, request, use and capacity), then what the flags can change."""
    print(f"dlrm.py: error: out of memory while {stage}: {error}", file=sys.stderr)
    if args.device == "zion" and args.table_placement != "auto":
        print("dlrm.py: --table-placement auto keeps the tables that do not fit a device's HBM in its socket's DDR; "
              "--max-rows caps the rows per table, --batch-size shrinks the step", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
