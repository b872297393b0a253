"""Which rank owns each table and where it lives: HBM or socket DDR
(examples/dlrm/placement.py, dlrm.py --table-placement)."""

import json
import sys
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "dlrm" / "dlrm.py"
sys.path.insert(0, str(EXAMPLE.parent))

import dlrm  # noqa: E402
from model import EmbeddingArch  # noqa: E402
from placement import HbmReserve, hbm_reserve, place_tables, table_owners  # noqa: E402
from processes import PYTHON, run, zion_emu_cli  # noqa: E402

TINY = ["--config", "tiny", "--device", "zion", "--num-batches", "3", "--no-progress"]
TINY_ROWS = [50, 80, 120, 60, 90, 40, 70, 100, 30]  # the tiny config's tables, dim 4: 16 bytes a row


def _train(tmp_path, placement, *extra):
    report = tmp_path / f"{placement}.json"
    r = zion_emu_cli("run", "--quiet-report", "--report", str(report), str(EXAMPLE), *TINY, "--table-placement",
                     placement, *extra, timeout_s=240)
    losses = [line.split()[3] for line in r.stdout.splitlines() if line.startswith("iter ")]
    return losses, json.loads(report.read_text()), r.stdout


def _losses(out: str) -> list[str]:
    return [line.split()[3] for line in out.splitlines() if line.startswith("iter ")]


# --- owners: balanced by bytes --------------------------------------------------------

def test_tables_go_largest_first_to_the_least_loaded_rank():
    # Two ranks: 120 -> r0; 100 -> r1; 90 -> r1 (100 < 120: 190); 80 -> r0 (200);
    # 70 -> r1 (260); 60 -> r0 (260); 50 -> r0 (tie at 260, the lower rank: 310);
    # 40 -> r1 (300); 30 -> r1 (330).
    assert table_owners(TINY_ROWS, 2) == [[0, 1, 2, 3], [4, 5, 6, 7, 8]]
    # Eight ranks: the 8 largest one each; the smallest (table 8) joins the
    # rank holding the lightest of them, table 5 (40 rows) on rank 7.
    assert table_owners(TINY_ROWS, 8) == [[2], [7], [4], [1], [6], [3], [0], [5, 8]]
    # Equal sizes: round robin in table order; ranks past the table count own none.
    assert table_owners([7, 7, 7], 2) == [[0, 2], [1]]
    assert table_owners([5, 9], 4) == [[1], [0], [], []]


def test_byte_balance_keeps_the_busiest_rank_within_one_table_of_the_rest():
    # The MLPerf DLRM tables on 8 ranks: the 8 largest one each (the smallest
    # of them, table 11, 403,346 rows), then the 18 small ones (121,165 rows
    # together) all to that rank: it stays below the 7th largest (585,935).
    from configs import MLPERF_TABLE_ROWS

    owners = table_owners(MLPERF_TABLE_ROWS, 8)
    assert [tables[0] for tables in owners[:7]] == [19, 0, 21, 9, 20, 10, 22]
    assert owners[7] == [1, 2, 3, 4, 5, 6, 7, 8, 11, 12, 13, 14, 15, 16, 17, 18, 23, 24, 25]
    assert sum(MLPERF_TABLE_ROWS[t] for t in owners[7]) == 403346 + 121165


# --- placement on one rank ------------------------------------------------------------

def test_auto_placement_fills_the_budget_with_the_hottest_tables():
    footprints = [1600, 160, 16000, 800]
    # Equal lookups per table: the smaller table has more lookups per byte.
    assert place_tables(footprints, [2] * 4, [0, 1, 2, 3], "auto", 160 + 800) == ["ddr", "hbm", "ddr", "hbm"]
    assert place_tables(footprints, [2] * 4, [0, 1, 2, 3], "auto", 0) == ["ddr"] * 4
    assert place_tables(footprints, [2] * 4, [2, 3], "hbm", 0) == ["hbm", "hbm"]
    # Lookups per byte: table 0 takes 100 lookups (1/16 per byte), table 1 one
    # (1/160), table 3 two (1/400): 0 first, then 1 and 3 while they fit.
    assert place_tables(footprints, [100, 1, 1, 2], [0, 1, 3], "auto", 1600 + 160) == ["hbm", "hbm", "ddr"]
    # A table that does not fit leaves room for a colder one that does.
    assert place_tables([100, 900, 50], [1, 1, 0], [0, 1, 2], "auto", 200) == ["hbm", "ddr", "hbm"]


def test_the_hbm_reserve_counts_the_margin_the_dense_part_activations_and_each_tables_step():
    res = hbm_reserve(capacity=1_000_000, dense_param_bytes=1000, activation_floats_per_sample=100, local_batch=8,
                      global_batch=16, dim=4, owned_lookups=[1, 3], optimizer="adagrad", world_size=2)
    # margin: 5% of 1e6. dense: weights, gradients, Adagrad's sum, DDP's buckets: 4 x 1000.
    # activations: 2 (and their gradients) x 8 samples x 100 floats x 4 bytes.
    # per table, 16 samples x lookups x (8-byte index + 16-byte gradient row + 8-byte
    # gradient index) + 4 x 16 x 16 (pooled rows, send buffer and their gradients):
    # 512 + 1024 and 1536 + 1024; Adagrad's 4 temporaries of the largest gradient,
    # 4 x 16 x 3 x 16 = 3072.
    assert res == HbmReserve(margin=50000, dense=4000, activations=6400, table_steps=1536 + 2560 + 3072)
    assert res.total == 67568
    sgd = hbm_reserve(1_000_000, 1000, 100, 16, 16, 4, [1, 3], "sgd", 1)
    # One rank: no DDP buckets, no optimizer state; SGD's one temporary (the coalesced gradient).
    assert (sgd.dense, sgd.activations, sgd.table_steps) == (2000, 12800, 1536 + 2560 + 768)


@pytest.mark.parametrize("argv", [["--config", "tiny"], ["--config", "tiny", "--optimizer", "adagrad"],
                                  ["--config", "dcnv2", "--max-rows", "1000", "--batch-size", "64"]])
def test_the_reserve_covers_what_a_step_holds_beside_the_tables(argv):
    """The rule is an estimate: measured, a step's HBM past the tables and
    their optimizer state stays within the reserve less its 5% margin."""
    run_ = dlrm.setup(dlrm.parse_args([*argv, "--device", "zion", "--no-progress"]))
    a = run_.args
    torch.zion.synchronize(run_.device)
    torch.zion.reset_peak_memory_stats(run_.device)
    before = torch.zion.memory_allocated(run_.device)
    for i in range(2):
        run_.step(run_.data.batch(i).to(run_.device))
    torch.zion.synchronize(run_.device)
    peak = torch.zion.max_memory_allocated(run_.device) - before
    res = hbm_reserve(torch.zion.get_device_properties(run_.device).total_memory,
                      sum(p.numel() * 4 for p in run_.dense.parameters()), run_.dense.activation_floats_per_sample(),
                      a.mini_batch_size, a.mini_batch_size, a.arch_sparse_feature_size, a.table_lookups, a.optimizer,
                      1)
    held_before_step = sum(p.numel() * 4 for p in run_.dense.parameters()) * (1 + (a.optimizer == "adagrad"))
    assert 0 < peak <= res.total - res.margin - held_before_step


# --- building the tables -------------------------------------------------------------

class _Created(TorchDispatchMode):
    """Every tensor an op makes, as (op, device, elements)."""

    def __init__(self) -> None:
        super().__init__()
        self.made: list[tuple[str, torch.device, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor):
                self.made.append((str(func), t.device, t.numel()))
        return out


def test_hbm_tables_are_made_on_the_device_and_never_on_the_host():
    device = torch.device("zion", 0)
    with _Created() as log:
        arch = EmbeddingArch([500, 300], 8, [[0, 1]], 0, seed=3, device=device)
    assert [b.weight.device for b in arch.bags] == [device] * 2
    assert not [m for m in log.made if m[1].type == "cpu"], log.made
    # Drawn in place on zion: the CPU's numbers for the same seed.
    cpu = EmbeddingArch([500, 300], 8, [[0, 1]], 0, seed=3, device=torch.device("cpu"))
    assert all(torch.equal(z.weight.cpu(), c.weight) for z, c in zip(arch.bags, cpu.bags))


def test_ddr_tables_are_made_in_the_sockets_pool():
    from zion_emu import sockets

    device = torch.device("zion", 0)
    arch = EmbeddingArch([500, 300], 8, [[0, 1]], 0, seed=3, device=device, placement=["ddr", "hbm"], socket=1)
    assert arch.bags[0].weight.device.type == "cpu" and sockets.socket_of(arch.bags[0].weight) == 1
    assert arch.bags[1].weight.device == device


# --- whole runs -----------------------------------------------------------------------

def _platform_with_hbm(tmp_path: Path, hbm_bytes: int) -> str:
    path = tmp_path / f"hbm{hbm_bytes}.json"
    path.write_text(json.dumps({"base": "zion", "name": f"zion-hbm-{hbm_bytes}", "oam": {"hbm_bytes": hbm_bytes}}))
    return str(path)


@pytest.mark.slow
def test_auto_placement_keeps_in_hbm_what_fits_the_capacity_less_the_reserve(tmp_path, capsys):
    # The tiny config on one rank (SGD, batch 32, 2 lookups, dim 4), worked by hand:
    # dense parameters: 13*8+8 + 8*4+4 (bottom) + 49*8+8 + 8+1 (top; 49 = 4 + 45 dots)
    #   = 557 floats, 2228 bytes, x2 (weights and gradients) = 4456;
    # activations per sample: bottom 8+8+4+4, top 8+8+1, pooled rows and features
    #   2*10*4, dots 10*10, pairs and top input 2*49: 319 floats; 2 x 32 x 319 x 4 = 81664;
    # each table: 32*2*(8+16+8) + 4*32*16 = 4096, x9, + SGD's temporary 32*2*16: 37888.
    # A capacity of 135272 bytes: margin ceil(6763.6) = 6764, reserve 130772, budget 4500.
    hbm = 135272
    r = run([PYTHON, str(EXAMPLE), *TINY, "--platform", _platform_with_hbm(tmp_path, hbm), "--table-placement",
             "auto"], timeout_s=240, check=True)
    assert (f"# rank 0 hbm_budget 4500 capacity {hbm} reserve 130772 (margin 6764 dense 4456 activations 81664 "
            f"table_steps 37888)") in r.stdout
    # Hottest first (equal lookups: smallest first): 30, 40, 50, 60, 70 rows take
    # 16 * 250 = 4000 bytes; the next, 80 rows, would make 5280 > 4500.
    ddr = sorted(int(line.split()[4]) for line in r.stdout.splitlines()
                 if line.startswith("# rank 0 table ") and line.endswith("place ddr socket 0"))
    assert ddr == [1, 2, 4, 7]
    assert "# rank 0 tables 0,1,2,3,4,5,6,7,8 table_bytes 10240 in_hbm 4000 in_ddr 6240" in r.stdout
    # Placement never changes the numbers.
    assert dlrm.main([*TINY[:2], "--device", "cpu", "--num-batches", "3", "--no-progress"]) == 0
    assert _losses(r.stdout) == _losses(capsys.readouterr().out)


@pytest.mark.slow
def test_tables_past_the_capacity_fail_with_the_allocators_message(tmp_path):
    # 8192 bytes of HBM: the dense part (2228 bytes) and the dots' index buffers
    # (2 x 45 int64, 720) come first, then tables 0-3 (800 + 1280 + 1920 + 960):
    # 7908 in use; table 4 (1440 bytes) does not fit.
    r = run([PYTHON, str(EXAMPLE), *TINY, "--platform", _platform_with_hbm(tmp_path, 8192)], timeout_s=240)
    assert r.returncode == 1, r.stderr
    assert "dlrm.py: error: out of memory while building the model: zion: out of HBM on zion:0" in r.stderr
    assert "(1440 bytes)" in r.stderr and "--table-placement auto" in r.stderr


@pytest.mark.slow
def test_ddr_and_hbm_tables_train_the_same_and_the_report_says_where_time_went(tmp_path):
    hbm_losses, hbm, _ = _train(tmp_path, "hbm")
    ddr_losses, ddr, out = _train(tmp_path, "ddr")
    assert hbm_losses == ddr_losses and len(hbm_losses) == 3  # placement never changes numerics
    assert "place ddr socket 0" in out
    assert ddr["iteration_s"] != hbm["iteration_s"]
    # DDR tables: the CPU of socket 0 did the lookups and updates; HBM tables: no socket work.
    assert [k["socket"] for k in ddr["sockets"]] == [0] and ddr["sockets"][0]["busy_s"] > 0
    assert not any(k["ops"] for k in hbm.get("sockets", []))
    # The pooled rows cross PCIe to the device (and their gradients back); with tables in HBM only the batch does.
    pcie = {name: sum(link["bytes"] for link in r["links"] if link["name"].startswith("pcie"))
            for name, r in (("hbm", hbm), ("ddr", ddr))}
    assert pcie["ddr"] > pcie["hbm"]
    assert ddr["devices"][0]["peak_hbm_bytes"] < hbm["devices"][0]["peak_hbm_bytes"]


def test_adagrad_state_of_a_ddr_table_lives_in_its_socket():
    from zion_emu import sockets

    run_ = dlrm.setup(dlrm.parse_args([*TINY, "--optimizer", "adagrad", "--table-placement", "ddr"]))
    states = [run_.optimizer.state[b.weight]["sum"] for b in run_.embeddings.bags]
    assert all(s.device.type == "cpu" and sockets.socket_of(s) == run_.embeddings.socket for s in states)


# --- bad input ------------------------------------------------------------------------

def test_table_placement_needs_zion():
    r = run([PYTHON, str(EXAMPLE), "--config", "tiny", "--device", "cpu", "--table-placement", "ddr"])
    assert r.returncode == 2 and "--table-placement ddr" in r.stderr and "needs --device zion" in r.stderr


def test_an_unknown_platform_is_a_usage_error():
    r = run([PYTHON, str(EXAMPLE), "--config", "tiny", "--device", "zion", "--platform", "nope"])
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip() == ("dlrm.py: error: --platform nope: unknown platform 'nope'; presets: hgx-a100, hgx-h100, "
                                "zion, zionex (or give the path of a .json file)")


@pytest.mark.parametrize("budget", ["lots", "-1G"])
def test_a_bad_hbm_budget_is_a_clear_error(budget):
    r = run([PYTHON, str(EXAMPLE), "--config", "tiny", "--device", "zion", "--table-placement", "auto",
             "--hbm-budget", budget])
    assert r.returncode == 2 and "--hbm-budget" in r.stderr


def test_an_hbm_budget_without_auto_is_refused(capsys):
    with pytest.raises(SystemExit):
        dlrm.parse_args(["--config", "tiny", "--device", "zion", "--hbm-budget", "1G"])
    assert "--hbm-budget 1G is the HBM for tables under --table-placement auto" in capsys.readouterr().err
