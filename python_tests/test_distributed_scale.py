"""The ``zion`` backend at scale: eight ranks on one node, and two emulated
nodes under torchrun.

Two nodes on one machine: two torchrun launches (``--nnodes 2
--nproc_per_node 2``) meet at a c10d rendezvous on 127.0.0.1. torchrun gives
each worker ``GROUP_RANK`` (its node) and ``LOCAL_RANK`` (its OAM), so the
four ranks are devices 0, 1, 8 and 9 of a two-node Zion, and a collective
between the nodes is priced over the NICs and the top-of-rack switch. The
same launch across real hosts is plain c10d rendezvous.

Run as a script (``python test_distributed_scale.py``) this file is the
torchrun worker.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from contextlib import ExitStack
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

import zion_emu
from processes import PYTHON, child_env, finish, started
from zion_emu import sim

TORCHRUN_TIMEOUT_S = 150


def _eight_rank_worker(rank: int, nprocs: int, store: str) -> None:
    from test_distributed import _Clock, _data, _init

    gloo = _init(rank, nprocs, store)
    clock = _Clock(rank, nprocs, gloo)
    devices = list(range(nprocs))

    # all_reduce over the whole node.
    x = _data(rank, (256,), seed=70)
    z = x.to("zion")
    record = clock.check(lambda: dist.all_reduce(z), "all_reduce", 256 * 4, devices)
    dist.all_reduce(x, group=gloo)
    assert torch.equal(z.cpu(), x)
    # The record names the algorithm the platform's `auto` chose; the model,
    # asked for that one, gives the same time.
    assert record["time"] == pytest.approx(
        sim.collective_time(clock.platform, "all_reduce", 256 * 4, devices, algo=record["algorithm"]), rel=1e-9)

    # all_to_all_single with uneven splits: rank i sends (i + j) % 4 + 1 rows
    # of 2 floats to rank j, priced as that exact matrix of bytes.
    rows = [[(i + j) % 4 + 1 for j in range(nprocs)] for i in range(nprocs)]
    send, recv = rows[rank], [rows[j][rank] for j in range(nprocs)]
    x = _data(rank, (sum(send), 2), seed=71)
    z, out = x.to("zion"), torch.empty(sum(recv), 2, device="zion")
    matrix = [[float(r * 2 * 4) for r in row] for row in rows]
    clock.check(lambda: dist.all_to_all_single(out, z, recv, send), "all_to_all", max(sum(row) for row in matrix), devices,
                all_to_all_bytes=matrix)
    ref = torch.empty(sum(recv), 2)
    dist.all_to_all_single(ref, x, recv, send, group=gloo)
    assert torch.equal(out.cpu(), ref)
    dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.multiproc
def test_eight_ranks_fill_one_node(tmp_path):
    from test_distributed import _spawn

    _spawn(_eight_rank_worker, 8, tmp_path)


# --- two nodes under torchrun -------------------------------------------------


def _torchrun_worker(out_dir: str) -> None:
    """One torchrun worker: checks placement and pricing, writes what it saw."""
    import zion_emu.distributed as zd

    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("zion", timeout=timedelta(seconds=60))
    rank, size = dist.get_rank(), dist.get_world_size()
    node, oam = int(os.environ["GROUP_RANK"]), int(os.environ["LOCAL_RANK"])
    torch.zion.set_device(oam)
    platform = zion_emu.current_platform()
    per_node = platform.get("oam.count")
    pg = zd.backend()
    assert (pg.node, pg.oam, pg.global_device) == (node, oam, node * per_node + oam)
    gloo = dist.new_group(backend="gloo")

    devices = [None] * size
    dist.all_gather_object(devices, pg.global_device)
    seen: dict[str, Any] = {"rank": rank, "node": node, "oam": oam, "devices": devices}

    nbytes = 4096
    x = torch.arange(nbytes // 4, dtype=torch.float32) * (rank + 1)
    z = x.to("zion")
    dist.all_reduce(z)
    dist.all_reduce(x, group=gloo)
    assert torch.equal(z.cpu(), x)
    seen["world"] = zd.last_collective()

    # One pair inside node 0 and one across the nodes (every rank takes part
    # in new_group; only members run the collective).
    for name, members in (("intra", [0, 1]), ("inter", [0, 2])):
        group = dist.new_group(members)
        if rank in members:
            t = torch.ones(nbytes // 4, device="zion")
            dist.all_reduce(t, group=group)
            assert torch.equal(t.cpu(), torch.full((nbytes // 4,), 2.0))
            seen[name] = zd.last_collective(group)
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(seen))
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun(node: int, port: int, out_dir: Path) -> list[str]:
    """One of the two launches; the first hosts the rendezvous store."""
    return [
        PYTHON, "-m", "torch.distributed.run",
        "--nnodes", "2", "--nproc_per_node", "2",
        "--rdzv_backend", "c10d", "--rdzv_endpoint", f"127.0.0.1:{port}", "--rdzv_id", "zion-two-nodes",
        "--rdzv_conf", f"is_host={1 if node == 0 else 0},join_timeout=60",
        "--local_addr", "127.0.0.1", "--max_restarts", "0", "--monitor_interval", "0.2",
        __file__, str(out_dir),
    ]


@pytest.mark.slow
@pytest.mark.multiproc
def test_torchrun_two_nodes_price_inter_node_collectives_over_the_nics(tmp_path):
    platform_file = tmp_path / "zion-2node.json"
    platform_file.write_text(json.dumps({"base": "zion", "name": "zion-2node", "nodes": 2}))
    env = child_env(ZION_PLATFORM=str(platform_file), OMP_NUM_THREADS="1")
    port = _free_port()
    deadline = time.monotonic() + TORCHRUN_TIMEOUT_S
    with ExitStack() as stack:
        launches = []
        for node in (0, 1):
            log = stack.enter_context(open(tmp_path / f"launch{node}.log", "w"))
            launches.append(stack.enter_context(started(_torchrun(node, port, tmp_path), env=env, stdout=log,
                                                        stderr=subprocess.STDOUT)))
            time.sleep(0.5)  # the host's store first
        for p in launches:
            finish(p, max(1.0, deadline - time.monotonic()))
    logs = "\n".join((tmp_path / f"launch{n}.log").read_text()[-3000:] for n in (0, 1))
    assert all(p.returncode == 0 for p in launches), logs

    seen = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(4)]
    # Global ranks are node-major: ranks 0 and 1 on node 0, 2 and 3 on node 1.
    assert [(s["node"], s["oam"]) for s in seen] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert seen[0]["devices"] == [0, 1, 8, 9]

    two_nodes = zion_emu.load_platform(str(platform_file))
    world = seen[0]["world"]
    assert world["devices"] == [0, 1, 8, 9]
    assert world["time"] == pytest.approx(sim.collective_time(two_nodes, "all_reduce", 4096, [0, 1, 8, 9]), rel=1e-9)
    assert all(s["world"]["end"] == pytest.approx(world["end"], rel=1e-12) for s in seen)

    intra, inter = seen[0]["intra"], seen[0]["inter"]
    assert intra["devices"] == [0, 1] and inter["devices"] == [0, 8]
    assert intra["time"] == pytest.approx(sim.collective_time(two_nodes, "all_reduce", 4096, [0, 1]), rel=1e-9)
    assert inter["time"] == pytest.approx(sim.collective_time(two_nodes, "all_reduce", 4096, [0, 8]), rel=1e-9)
    # Zion's NICs are host-staged 100 Gbit/s ports behind PCIe, with the
    # top-of-rack switch between: slower than the 25 GB/s fabric link.
    assert inter["time"] > intra["time"]


if __name__ == "__main__":
    _torchrun_worker(sys.argv[1])
