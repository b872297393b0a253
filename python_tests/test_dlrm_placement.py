"""Embedding tables in HBM or in socket DDR (examples/dlrm --table-placement)."""

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "dlrm" / "dlrm.py"
sys.path.insert(0, str(EXAMPLE.parent))

from model import place_tables  # noqa: E402
from processes import PYTHON, run, zion_emu_cli  # noqa: E402

TINY = ["--config", "tiny", "--device", "zion", "--num-batches", "3", "--no-progress"]


def _train(tmp_path, placement, *extra):
    report = tmp_path / f"{placement}.json"
    r = zion_emu_cli("run", "--quiet-report", "--report", str(report), str(EXAMPLE), *TINY, "--table-placement",
                     placement, *extra, timeout_s=240)
    losses = [line.split()[3] for line in r.stdout.splitlines() if line.startswith("iter ")]
    return losses, json.loads(report.read_text()), r.stdout


def test_auto_placement_fills_the_budget_with_the_hottest_tables():
    rows = [100, 10, 1000, 50]  # dim 4: 1600, 160, 16000, 800 bytes
    # Equal lookups per table: the smaller table has more lookups per byte.
    assert place_tables(rows, 4, 2, [0, 1, 2, 3], "auto", 160 + 800) == ["ddr", "hbm", "ddr", "hbm"]
    assert place_tables(rows, 4, 2, [0, 1, 2, 3], "auto", 0) == ["ddr"] * 4
    assert place_tables(rows, 4, 2, [2, 3], "hbm", 0) == ["hbm", "hbm"]


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


def test_table_placement_needs_zion():
    r = run([PYTHON, str(EXAMPLE), "--config", "tiny", "--device", "cpu", "--table-placement", "ddr"])
    assert r.returncode == 2 and "--table-placement ddr" in r.stderr and "needs --device zion" in r.stderr


@pytest.mark.parametrize("budget", ["lots", "-1G"])
def test_a_bad_hbm_budget_is_a_clear_error(budget):
    r = run([PYTHON, str(EXAMPLE), "--config", "tiny", "--device", "zion", "--table-placement", "auto",
             "--hbm-budget", budget])
    assert r.returncode == 2 and "--hbm-budget" in r.stderr
