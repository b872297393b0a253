"""Asynchronous DLRM training with parameter servers (zion_emu.async_ps).

Ranks 0..T-1 are trainers, on OAMs (trainer i on OAM i % 8 of node i // 8);
ranks T..T+S-1 are parameter servers, on CPU sockets. The embedding tables
are sharded by row over the servers; the MLPs live on the servers too
(each parameter whole on one server, balanced by bytes)
(``--dense server``) or each trainer trains its own copy (``--dense local``).
Every step a trainer pulls the rows its batch touches and the MLPs, computes
forward and backward, and pushes the gradients without waiting, Hogwild-style.

    python -m zion_emu run --nproc 3 examples/async_ps/train.py --servers 1 --shape tiny
    torchrun --nproc-per-node 3 examples/async_ps/train.py --servers 1 --device cpu

The first server prints the throughput (samples/s over every trainer, in
modeled time), each server's utilization and the busiest link of each class
its messages crossed, and what limits the run; under ``zion-emu run`` it
declares that throughput and limit to the run's report
(``zion_emu.throughput``), which ``zion-emu sweep`` compares. The servers
share the links' clocks (``zion_emu.async_ps.SharedLinkClocks``). ``--out DIR`` writes each
trainer's losses and RPC timings (``trainerI.json``) and the summary
(``summary.json``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Any, Sequence

import torch
import torch.distributed.rpc as rpc

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ps_model import SHAPES, batch, init_dense, init_tables, loss_of, table_names, unique_rows  # noqa: E402

import zion_emu  # noqa: E402
from zion_emu import async_ps  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--servers", type=int, default=1, help="parameter servers: the last S ranks (default 1)")
    p.add_argument("--shape", choices=tuple(SHAPES), default="small", help="model and batch shape (default small)")
    p.add_argument("--steps", type=int, default=4, help="steps per trainer (default 4)")
    p.add_argument("--batch", type=int, default=None, help="samples per trainer per step (default: the shape's)")
    p.add_argument("--device", choices=("zion", "cpu"), default="zion", help="where trainers compute")
    p.add_argument("--dense", choices=("server", "local"), default="server",
                   help="MLPs on the servers (default) or a copy per trainer")
    p.add_argument("--schedule", choices=async_ps.SCHEDULES, default="ordered",
                   help="ordered: servers serve the trainers' k-th calls in turn (deterministic); free: as they come")
    p.add_argument("--server-node", type=int, default=0, help="the node whose sockets hold the servers (default 0)")
    p.add_argument("--server-sockets", default=None,
                   help="comma-separated socket of each server (default: spread over the node's sockets)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=300.0, help="seconds any RPC may wait (default 300)")
    p.add_argument("--out", default=None, help="folder for trainerI.json and summary.json")
    return p


def _shape(args: argparse.Namespace):  # noqa: ANN202
    shape = SHAPES[args.shape]
    return shape if args.batch is None else dataclasses.replace(shape, batch=args.batch)


def _env(name: str, default: int | None = None) -> int:
    value = os.environ.get(name)
    if value is None:
        if default is None:
            raise SystemExit(f"train.py: {name} is not set; start it with torchrun or "
                             f"`python -m zion_emu run --nproc N`")
        return default
    return int(value)


def server_places(args: argparse.Namespace, platform: zion_emu.Platform) -> list[async_ps.Place]:
    sockets = platform.native.sockets_per_node
    if args.server_sockets:
        indices = [int(s) for s in args.server_sockets.split(",")]
        if len(indices) != args.servers:
            raise SystemExit(f"train.py: --server-sockets names {len(indices)} sockets for {args.servers} servers")
    else:
        if args.servers > sockets:
            raise SystemExit(f"train.py: {args.servers} servers on one node need --server-sockets "
                             f"(platform '{platform.name}' has {sockets} sockets per node)")
        indices = [s * (sockets // args.servers) for s in range(args.servers)]
    return [async_ps.Place("socket", i, args.server_node).check(platform) for i in indices]


def run_server(args: argparse.Namespace, index: int, trainers: int, rank: int, world: int,
               options: rpc.TensorPipeRpcBackendOptions) -> None:
    shape = SHAPES[args.shape]
    platform = zion_emu.current_platform()
    place = server_places(args, platform)[index]
    tables = {name: async_ps.row_shard(t, index, args.servers) for name, t in init_tables(shape, args.seed).items()}
    dense = {}
    if args.dense == "server":
        params = dict(init_dense(shape, args.seed).named_parameters())
        homes = async_ps.dense_homes({n: p.numel() * p.element_size() for n, p in params.items()}, args.servers)
        dense = {name: p.detach() for name, p in params.items() if homes[name] == index}
    # The servers share one busy-until clock per link (server 0 creates
    # them here, before any trainer can send).
    links_file = async_ps.links_file_for_run()
    server = async_ps.ParameterServer(index, place, tables, dense, shape.lr, trainers, args.schedule,
                                      timeout_s=args.timeout, platform=platform, servers=args.servers,
                                      links_file=links_file)
    async_ps.install(server)
    rpc.init_rpc(f"ps{index}", rank=rank, world_size=world, rpc_backend_options=options)
    try:
        stats = [async_ps.serve()]
        if index == 0:
            stats += [async_ps.server_stats(f"ps{s}") for s in range(1, args.servers)]
            summary = summarize(args, trainers, _shape(args).batch, stats)
            print(report(summary), flush=True)
            if args.out:
                Path(args.out).mkdir(parents=True, exist_ok=True)
                (Path(args.out) / "summary.json").write_text(json.dumps(summary, indent=1))
            if os.environ.get("ZION_RUN_DIR"):  # under `zion-emu run`: its report and sweep show the throughput
                zion_emu.throughput(summary["samples"], summary["start_s"], summary["end_s"],
                                    limit=summary["limit"], limit_utilization=summary["limit_utilization"])
    finally:
        rpc.shutdown()
        server.links.close()
        if index == 0:
            Path(links_file).unlink(missing_ok=True)


def run_trainer(args: argparse.Namespace, index: int, rank: int, world: int,
                options: rpc.TensorPipeRpcBackendOptions) -> None:
    shape = _shape(args)
    platform = zion_emu.current_platform()
    per_node = platform.devices_per_node
    place = async_ps.Place("oam", index % per_node, index // per_node).check(platform)
    device = torch.device("zion", index % per_node) if args.device == "zion" else torch.device("cpu")
    model = init_dense(shape, args.seed).to(device)
    params = dict(model.named_parameters())
    local_opt = torch.optim.SGD(model.parameters(), lr=shape.lr) if args.dense == "local" else None
    homes = async_ps.dense_homes({n: p.numel() * p.element_size() for n, p in params.items()}, args.servers)
    trainer = async_ps.Trainer(index, place, [f"ps{s}" for s in range(args.servers)], device,
                               dense_homes=homes if args.dense == "server" else None, timeout_s=args.timeout)
    rpc.init_rpc(f"trainer{index}", rank=rank, world_size=world, rpc_backend_options=options)
    losses: list[float] = []
    try:
        start = trainer.ready_s()
        tables = table_names(shape)
        for step in range(args.steps):
            b = batch(shape, args.seed, index, step)
            pairs = [unique_rows(ids) for ids in b.ids]
            rows, _ = trainer.pull(rows={t: u for t, (u, _) in zip(tables, pairs)},
                                   dense=params if args.dense == "server" else ())
            leaves = [rows[t].requires_grad_() for t in tables]
            inverse = [inv.to(device) for _, inv in pairs]
            loss = loss_of(model, leaves, inverse, b.x.to(device), b.y.to(device))
            loss.backward()
            trainer.push(rows={t: (u, leaf.grad) for t, (u, _), leaf in zip(tables, pairs, leaves)},
                         dense={n: p.grad for n, p in params.items()} if args.dense == "server" else None)
            if local_opt is not None:
                local_opt.step()
            model.zero_grad(set_to_none=True)
            losses.append(loss.item())
        end = trainer.ready_s()
        samples = args.steps * shape.batch
        # A pull is one message per server, each call numbered alike at every
        # server: it waits from its sending to the last reply.
        pulls: dict[int, list[async_ps.RpcRecord]] = {}
        for r in trainer.records:
            if r.kind == "pull":
                pulls.setdefault(r.seq, []).append(r)
        pull_wait = sum(max(r.reply_arrival_s for r in call) - call[0].send_s for call in pulls.values())
        trainer.done(summary={"samples": samples, "start_s": start, "end_s": end, "steps": args.steps,
                              "pull_wait_s": pull_wait})
        end = max(end, trainer.ready_s())
        for step, value in enumerate(losses):
            print(f"trainer {index} step {step} loss {value!r}", flush=True)
        if args.out:
            Path(args.out).mkdir(parents=True, exist_ok=True)
            (Path(args.out) / f"trainer{index}.json").write_text(json.dumps(
                {"trainer": index, "place": str(place), "losses": losses, "start_s": start, "end_s": end,
                 "records": trainer.records_as_dicts()}, indent=1))
    finally:
        rpc.shutdown()


def summarize(args: argparse.Namespace, trainers: int, per_step: int, stats: list[dict[str, Any]]) -> dict[str, Any]:
    """Throughput over every trainer and what limits it, from the servers' stats."""
    runs = stats[0]["trainers"]
    start = min(r["start_s"] for r in runs.values())
    end = max(r["end_s"] for r in runs.values())
    samples = sum(r["samples"] for r in runs.values())
    step_s = sum((r["end_s"] - r["start_s"]) / r["steps"] for r in runs.values()) / len(runs)
    # The share of a trainer's time spent waiting for its pulls (send to
    # reply): the rest is its own compute and the sending of pushes.
    pull_wait = sum(r["pull_wait_s"] / (r["end_s"] - r["start_s"]) for r in runs.values()) / len(runs)
    # The busiest resource: a server's work, or a link its messages crossed.
    busiest = max(((s["utilization"], f"server {s['server']} ({s['place']}) busy") for s in stats), default=(0, ""))
    for s in stats:
        # Shared clocks: every server's messages on each link (all servers see the same).
        for c in s.get("shared_links", s["links"]):
            if c["busiest_utilization"] > busiest[0]:
                busiest = (c["busiest_utilization"], f"link {c['busiest_link']} ({c['link_class']})")
    return {"trainers": trainers, "servers": len(stats), "schedule": args.schedule, "dense": args.dense,
            "samples_per_step": per_step, "samples": samples, "start_s": start, "end_s": end,
            "modeled_s": end - start, "pull_wait_share": pull_wait,
            "samples_per_s": samples / (end - start) if end > start else None, "step_s": step_s,
            "limit": busiest[1], "limit_utilization": busiest[0], "server_stats": stats}


def report(s: dict[str, Any]) -> str:
    mlps = "the MLPs on the servers" if s["dense"] == "server" else "the MLPs on each trainer"
    lines = [f"async_ps: {s['trainers']} trainers, {s['servers']} servers, schedule {s['schedule']}, {mlps}",
             f"  modeled {s['modeled_s'] * 1e3:.3f} ms, {s['samples_per_s']:.1f} samples/s, "
             f"{s['step_s'] * 1e3:.3f} ms per trainer step, {s['pull_wait_share'] * 100:.0f}% of it waiting for pulls",
             f"  busiest: {s['limit']} at {s['limit_utilization'] * 100:.1f}%"]
    for st in s["server_stats"]:
        lines.append(f"  server {st['server']} on {st['place']}: {st['served']} messages, busy "
                     f"{st['utilization'] * 100:.1f}%")
        for c in st["links"]:
            lines.append(f"    {c['link_class']:<14} {c['bytes'] / 1e6:10.3f} MB  busiest {c['busiest_link']} "
                         f"{c['busiest_utilization'] * 100:.1f}%")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    rank, world = _env("RANK", 0), _env("WORLD_SIZE", 1)
    if world < 2:
        raise SystemExit(f"train.py: a world of {world} rank has no room for a trainer and a server; "
                         f"start at least 2 ranks (torchrun or `python -m zion_emu run --nproc N`)")
    if not 1 <= args.servers < world:
        raise SystemExit(f"train.py: --servers {args.servers} in a world of {world} ranks leaves no trainer "
                         f"(allowed: 1..{world - 1})")
    trainers = world - args.servers
    # Rendezvous through MASTER_ADDR:MASTER_PORT (env://), torchrun's store.
    options = rpc.TensorPipeRpcBackendOptions(num_worker_threads=max(16, 4 * trainers + 4), rpc_timeout=args.timeout)
    if rank < trainers:
        run_trainer(args, rank, rank, world, options)
    else:
        run_server(args, rank - trainers, trainers, rank, world, options)
    return 0


if __name__ == "__main__":
    sys.exit(main())
