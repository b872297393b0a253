"""Worlds bigger than the processes: ``zion-emu run --timing-only
--world-size N --ranks LIST``.

The script sees a world of N ranks; only the listed ranks run, and the
``zion`` backend prices every collective for all N. A world of 16 on zionex
(8 OAMs per node) with ranks 0 and 8 running must give the modeled times of
the same script run by 16 processes when, as in a model-parallel exchange,
what a rank sends each peer is decided by the peer: an absent rank's sizes and
pieces, taken from its counterpart (the nearest running rank before it), are
then its real ones.
"""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import pytest

from processes import zion_emu_cli
from zion_emu import load_platform, sim
from zion_emu.__main__ import main
from zion_emu.cli import CliError
from zion_emu.cli.run import parse_ranks
from zion_emu.report import WORLD_ASSUMPTIONS, RunReport, world_summary
from zion_emu.report_text import rank_ranges

# Three steps of all_reduce, an exchange of lengths (int64, one per peer),
# all_to_all_single with uneven splits (every rank sends rank j 1 + j % 3 rows
# of 4 floats to rank j), all_gather and barrier; then rooted and reducing
# collectives of integers (rank 5 is a root) and all_gather_object. The
# all-to-alls (and gather and scatter, priced as all-to-alls) run in a group
# that prices them with `direct`, which applies at any n.
SCRIPT = """
import json, os, sys, torch, torch.distributed as dist
import zion_emu
import zion_emu.distributed as zd

dist.init_process_group("zion")
rank, n = dist.get_rank(), dist.get_world_size()
dev = f"zion:{int(os.environ['LOCAL_RANK'])}"
direct = dist.new_group(backend="zion", pg_options=zd.Options(algorithm="direct"))
w = torch.nn.Parameter(torch.ones(1024, device=dev))
opt = torch.optim.SGD([w], lr=0.1)
records = {}
for step in range(3):
    dist.all_reduce(torch.ones(1 << 16, device=dev))
    records["all_reduce"] = zd.last_collective()
    send = [1 + j % 3 for j in range(n)]
    lens = torch.empty(n, dtype=torch.int64, device=dev)
    dist.all_to_all_single(lens, torch.tensor(send, device=dev), group=direct)
    recv = lens.tolist()
    y = torch.empty(sum(recv), 4, device=dev)
    dist.all_to_all_single(y, torch.ones(sum(send), 4, device=dev), recv, send, group=direct)
    records["all_to_all_single"] = zd.last_collective(direct)
    dist.all_gather([torch.empty(256, device=dev) for _ in range(n)], torch.ones(256, device=dev))
    records["all_gather"] = zd.last_collective()
    dist.barrier()
    records["barrier"] = zd.last_collective()
    w.grad = torch.ones_like(w)
    opt.step()
# Integer data (real in timing-only mode too): what absent ranks contribute.
def ints(*values):
    return torch.tensor(values, dtype=torch.int64, device=dev)
root_value = ints(rank)
dist.broadcast(root_value, src=5)
gathered = torch.empty(n, dtype=torch.int64, device=dev)
dist.all_gather_into_tensor(gathered, ints(rank))
summed = ints(0)
dist.reduce_scatter_tensor(summed, torch.ones(n, dtype=torch.int64, device=dev))
listed = ints(0)
dist.reduce_scatter(listed, [ints(r) for r in range(n)])
pieces = [ints(-1) for _ in range(n)] if rank == 0 else None
dist.gather(ints(rank), pieces, dst=0, group=direct)  # priced as an all-to-all with one column
mine = ints(-1)
dist.scatter(mine, [ints(10 * r) for r in range(n)] if rank == 0 else None, src=0, group=direct)
dist.reduce(ints(rank), dst=5)
data = {"broadcast": root_value.tolist(), "all_gather_into_tensor": gathered.tolist(), "reduce_scatter_tensor":
        summed.tolist(), "reduce_scatter": listed.tolist(), "gather": [p.item() for p in pieces] if pieces else None,
        "scatter": mine.tolist()}
names = [None] * n
dist.all_gather_object(names, f"rank {rank}")
p2p, probe = None, torch.ones(2, device=dev)
if "--probe-p2p" in sys.argv and rank == 0:
    try:
        dist.send(probe, dst=1)
    except RuntimeError as e:
        p2p = str(e).splitlines()[0]
keep = ("time", "start", "end", "bytes", "devices", "algorithm")
with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w") as f:  # the ranks' stdout may interleave
    json.dump({"rank": rank, "mode": zion_emu.mode(), "world": n, "recv": recv, "names": names, "data": data,
               "p2p": p2p, "records": {k: {f: v[f] for f in keep} for k, v in records.items()}}, f)
dist.destroy_process_group()
"""


def _script(tmp_path: Path) -> Path:
    path = tmp_path / "world.py"
    path.write_text(textwrap.dedent(SCRIPT))
    return path


def _run(tmp_path: Path, name: str, *args: str, timeout_s: float = 180) -> tuple[dict[int, dict], RunReport, str]:
    """Runs the script; returns each rank's record, the report and stdout."""
    out, records = tmp_path / f"{name}.json", tmp_path / name
    records.mkdir()
    r = zion_emu_cli("run", "--platform", "zionex", "--report", str(out), *args, str(_script(tmp_path)), str(records),
                     *(["--probe-p2p"] if "--ranks" in args else []), timeout_s=timeout_s)
    ranks = {}
    for path in records.glob("rank*.json"):
        d = json.loads(path.read_text())
        ranks[d["rank"]] = d
    return ranks, RunReport.from_json(json.loads(out.read_text())), r.stdout


def _lengths(rank: int, n: int) -> list[int]:
    """Rows rank `rank` receives from each rank: 1 + rank % 3."""
    return [1 + rank % 3] * n


def _all_to_all_bytes(n: int) -> list[list[float]]:
    """Bytes rank i sends rank j: 1 + j % 3 rows of 4 fp32."""
    return [[(1 + j % 3) * 4 * 4.0 for j in range(n)] for _ in range(n)]


def test_ranks_lists_take_ranks_and_ranges_in_any_order():
    assert parse_ranks("0,64", 128) == [0, 64]
    assert parse_ranks("0-3,8", 16) == [0, 1, 2, 3, 8]
    assert parse_ranks(" 9 , 2-2", 16) == [2, 9]


@pytest.mark.parametrize("text, problem", [
    ("", "empty item"), ("0,,8", "empty item"), ("0,x", "'x' is not a rank"), ("-1", "'-1' is not a rank"),
    ("5-3", "runs backwards; write 3-5"), ("0,16", "rank 16 is outside the world of --world-size 16"),
    ("0-3,2", "rank 2 is listed twice"),
])
def test_bad_ranks_lists_say_what_is_wrong(text, problem):
    with pytest.raises(CliError, match=problem):
        parse_ranks(text, 16)


@pytest.mark.parametrize("args, problem", [
    (["--world-size", "16", "--ranks", "0,8"], "add --timing-only"),
    (["--ranks", "0,8", "--timing-only"], "--ranks needs --world-size"),
    (["--world-size", "16", "--ranks", "0,16", "--timing-only"], "rank 16 is outside"),
    (["--world-size", "16", "--nproc", "2", "--timing-only"], "exclude each other"),
    (["--world-size", "0"], "at least 1"),
    (["--world-size", "16", "--nnodes", "2"], "leave out --nnodes"),
    # zion has one node of 8 OAMs: a world of 16 needs two.
    (["--platform", "zion", "--world-size", "16"], r"needs 2 node\(s\) of 8 devices.*--set nodes=2"),
    (["--platform", "zionex", "--world-size", "129", "--ranks", "0", "--timing-only"], r"needs 17 node\(s\)"),
])
def test_bad_world_arguments_are_one_line_and_exit_code_2(tmp_path, capsys, args, problem):
    script = tmp_path / "s.py"
    script.write_text("print('never runs')\n")
    platform = [] if "--platform" in args else ["--platform", "zionex"]
    assert main(["run", *platform, *args, str(script)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("zion-emu: error: ")
    assert re.search(problem, err), err


def test_a_setting_that_waits_for_every_rank_at_init_is_refused_with_absent_ranks(tmp_path, capsys, monkeypatch):
    script = tmp_path / "s.py"
    script.write_text("print('never runs')\n")
    monkeypatch.setenv("TORCH_DIST_INIT_BARRIER", "1")
    assert main(["run", "--platform", "zionex", "--timing-only", "--world-size", "16", "--ranks", "0,8",
                 str(script)]) == 2
    assert "TORCH_DIST_INIT_BARRIER=1" in capsys.readouterr().err


def test_counterparts_are_the_nearest_running_rank_before_cyclically():
    assert world_summary(16, [0, 8]).counterparts == [0] * 8 + [8] * 8
    # Ranks 0..2 wrap past 0 to 15, 14, ..., the first running one being 9.
    assert world_summary(16, [3, 9]).counterparts == [9, 9, 9, 3, 3, 3, 3, 3, 3, 9, 9, 9, 9, 9, 9, 9]
    full = world_summary(4, [0, 1, 2, 3])
    assert full.modeled_ranks == [] and full.assumptions == []
    assert rank_ranges([0, 1, 2, 3, 8, 10, 11]) == "0-3, 8, 10-11"


@pytest.mark.slow
@pytest.mark.multiproc
def test_a_world_of_16_run_by_2_processes_is_priced_as_16_processes(tmp_path):
    two, two_report, two_text = _run(tmp_path, "two", "--timing-only", "--world-size", "16", "--ranks", "0,8")
    all16, all_report, _ = _run(tmp_path, "sixteen", "--world-size", "16", timeout_s=300)
    assert sorted(two) == [0, 8] and sorted(all16) == list(range(16))
    assert two[0]["mode"] == "timing" and all16[0]["mode"] == "real"
    for r in (0, 8):
        assert two[r]["world"] == 16
        # Every collective: the same devices, bytes, algorithm, start, end.
        assert two[r]["records"] == all16[r]["records"], r
        # The lengths from absent ranks are their counterparts', which here are their real ones.
        assert two[r]["recv"] == all16[r]["recv"] == _lengths(r, 16)
    assert two_report.iteration_s == all_report.iteration_s and two_report.iterations == 3
    assert two_report.wall_s == all_report.wall_s

    # Priced for all 16 on zionex: the model alone, asked for the same collective, gives the same times.
    zionex = load_platform("zionex")
    records = two[0]["records"]
    assert records["all_reduce"]["devices"] == list(range(16))
    assert records["all_reduce"]["time"] == pytest.approx(
        sim.collective_time(zionex, "all_reduce", 4 << 16, 16, algo=records["all_reduce"]["algorithm"]), rel=1e-12)
    matrix = _all_to_all_bytes(16)
    largest = max(sum(row) for row in matrix)  # the size of an uneven all-to-all: its largest per-rank input
    assert records["all_to_all_single"]["bytes"] == largest == (1 + 2 + 3) * 5 * 16 + 1 * 16
    assert records["all_to_all_single"]["time"] == pytest.approx(
        sim.collective(zionex, "all_to_all", largest, 16, algo="direct", all_to_all_bytes=matrix).time, rel=1e-12)
    assert records["all_gather"]["bytes"] == 256 * 4 * 16

    # Data. With 16 processes, each rank's own; with ranks 0 and 8, an absent rank's pieces are its
    # counterpart's (0 for 1..7, 8 for 9..15), reductions sum the two running ranks, a broadcast from
    # absent rank 5 carries rank 0's value, and the reduce to rank 5 moves nothing.
    counterpart = [0 if r < 8 else 8 for r in range(16)]
    for r in (0, 8):
        assert all16[r]["data"] == {"broadcast": [5], "all_gather_into_tensor": list(range(16)),
                                    "reduce_scatter_tensor": [16], "reduce_scatter": [16 * r],
                                    "gather": list(range(16)) if r == 0 else None, "scatter": [10 * r]}
        assert two[r]["data"] == {"broadcast": [0], "all_gather_into_tensor": counterpart,
                                  "reduce_scatter_tensor": [2], "reduce_scatter": [2 * r],
                                  "gather": counterpart if r == 0 else None, "scatter": [10 * r]}
        assert two[r]["names"] == [f"rank {p}" for p in counterpart]
        assert all16[r]["names"] == [f"rank {q}" for q in range(16)]
    assert "does not run as a process" in two[0]["p2p"] and "0, 8 of 16" in two[0]["p2p"]

    # The report names the world, the running and modeled ranks, and the assumptions.
    assert two_report.world is not None
    assert (two_report.world.world_size, two_report.world.ranks) == (16, [0, 8])
    assert two_report.world.modeled_ranks == [r for r in range(16) if r not in (0, 8)]
    assert two_report.world.assumptions == list(WORLD_ASSUMPTIONS)
    assert "16 ranks; 2 ran as processes (0, 8), 14 modeled without one (1-7, 9-15)" in two_text
    assert "assumptions about the modeled ranks:" in two_text
    assert all_report.world is not None and all_report.world.modeled_ranks == []


@pytest.mark.slow
@pytest.mark.multiproc
def test_a_world_of_128_on_zionex_runs_with_2_processes(tmp_path):
    ranks, report, text = _run(tmp_path, "wide", "--timing-only", "--world-size", "128", "--ranks", "0,64")
    assert sorted(ranks) == [0, 64]
    zionex = load_platform("zionex")  # 16 nodes of 8: ranks 0 and 64 are OAM 0 of nodes 0 and 8
    for r in (0, 64):
        records = ranks[r]["records"]
        assert records["all_reduce"]["devices"] == list(range(128))
        assert records["all_reduce"]["time"] == pytest.approx(
            sim.collective_time(zionex, "all_reduce", 4 << 16, 128, algo=records["all_reduce"]["algorithm"]),
            rel=1e-12)
        assert ranks[r]["recv"] == _lengths(r, 128)
    assert report.world is not None and report.world.ranks == [0, 64] and len(report.world.modeled_ranks) == 126
    assert report.iterations == 3 and report.iteration_s and report.iteration_s > 0
    assert "128 ranks; 2 ran as processes (0, 64), 126 modeled without one (1-63, 65-127)" in text


MIXED = """
import os, warnings, torch, torch.distributed as dist, zion_emu
warnings.simplefilter("ignore")
dist.init_process_group("zion")
rank = dist.get_rank()
dev = f"zion:{int(os.environ['LOCAL_RANK'])}"

def ints(unknown):
    t = torch.arange(8, device=dev)
    if unknown:
        t.copy_(torch.ones(8, device=dev))  # written from a float result: its values are unknown now
    return t

def known(t):
    before = sum(r["count"] for r in zion_emu.placeholder_reads())
    values = t.tolist()
    return None if sum(r["count"] for r in zion_emu.placeholder_reads()) > before else values

a = ints(rank == 0)
dist.all_reduce(a)  # rank 0 has no bytes: nothing moves, rank 1's sum is unknown too
b = ints(False)
dist.all_reduce(b)
if rank == 0:
    dist.send(ints(False), 1)
    c = ints(False)
    dist.recv(c, 1)
else:
    c = ints(True)
    dist.recv(c, 0)  # bytes sent to a receiver without bytes: received into scratch
    dist.send(ints(True), 0)
os.write(1, f"MIXED {rank} {known(a)} {known(b)} {known(c)}\\n".encode())  # one write: the ranks share stdout
dist.barrier()
dist.destroy_process_group()
"""


@pytest.mark.slow
@pytest.mark.multiproc
def test_tensors_without_bytes_on_one_side_move_no_payload_and_leave_no_rank_waiting(tmp_path):
    script = tmp_path / "mixed.py"
    script.write_text(textwrap.dedent(MIXED))
    r = zion_emu_cli("run", "--nproc", "2", "--timing-only", "--quiet-report", str(script), timeout_s=180)
    lines = sorted(line for line in r.stdout.splitlines() if line.startswith("MIXED"))
    # all_reduce of [0..7] on both ranks: 2x; the rest unknown.
    assert lines == ["MIXED 0 None [0, 2, 4, 6, 8, 10, 12, 14] None",
                     "MIXED 1 None [0, 2, 4, 6, 8, 10, 12, 14] None"], r.stdout


@pytest.mark.slow
@pytest.mark.multiproc
@pytest.mark.timeout(600)
def test_torchrec_sharded_dlrm_in_a_world_of_4_run_by_ranks_0_and_2_is_priced_as_4_processes(tmp_path):
    # torchrec's DMP, table-wise and row-wise tables: each rank sends a peer
    # the lengths and indices of the peer's own tables and shards, so an
    # absent rank's pieces must be its counterpart's for that same peer
    # (other pieces give fbgemm lengths that do not add up to the indices).
    # With every rank drawing the same batches they are its real ones, and
    # every all-to-all is priced as with 4 processes.
    script = Path(__file__).resolve().parent.parent / "examples" / "torchrec_dlrm.py"
    reports = {}
    for name, world in (("two", ["--world-size", "4", "--ranks", "0,2"]), ("four", ["--nproc", "4"])):
        out = tmp_path / f"{name}.json"
        zion_emu_cli("run", "--timing-only", *world, "--quiet-report", "--report", str(out), str(script),
                     "--device", "zion", "--iters", "3", "--batches", "shared", timeout_s=280)
        reports[name] = RunReport.from_json(json.loads(out.read_text()))
    two, four = reports["two"], reports["four"]
    assert two.world is not None and (two.world.world_size, two.world.ranks) == (4, [0, 2])
    assert four.world is None or four.world.ranks == [0, 1, 2, 3]
    assert two.iterations == four.iterations == 3
    assert two.iteration_s == pytest.approx(four.iteration_s, rel=1e-9)


@pytest.mark.slow
@pytest.mark.multiproc
@pytest.mark.timeout(600)
def test_torchrec_sharded_dlrm_on_128_ranks_of_zionex_runs_with_2_processes(tmp_path):
    # ZionEX's published scale, 16 nodes of 8: torchrec's planner and DMP unchanged; the all-to-alls
    # cross the NICs; the report names the world and its assumptions.
    script = Path(__file__).resolve().parent.parent / "examples" / "torchrec_dlrm.py"
    out = tmp_path / "wide.json"
    r = zion_emu_cli("run", "--timing-only", "--platform", "zionex", "--world-size", "128", "--ranks", "0,64",
                     "--report", str(out), str(script), "--device", "zion", "--iters", "3", timeout_s=400)
    report = RunReport.from_json(json.loads(out.read_text()))
    assert report.world is not None and report.world.world_size == 128 and report.world.ranks == [0, 64]
    assert len(report.world.modeled_ranks) == 126 and report.iterations == 3 and report.iteration_s > 0
    assert "128 ranks; 2 ran as processes (0, 64), 126 modeled without one (1-63, 65-127)" in r.stdout
    assert "assumptions about the modeled ranks:" in r.stdout
    nic = next(link for link in json.loads(out.read_text())["links"] if link["name"] == "nic")
    assert nic["bytes"] > 0 and nic["transfers"] > 0
    pooled = [line for line in r.stdout.splitlines() if line.startswith("pooled_all_to_all")]
    assert pooled, r.stdout
