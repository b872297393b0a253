"""The named DLRM shapes of examples/dlrm (configs.py) at full size, planned
without allocating a table, and MLPerf DLRMv2's DCN-v2 model (model.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import zion_emu

REPO = Path(zion_emu.__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "examples" / "dlrm"))

import dlrm  # noqa: E402
from configs import DCNV2_MULTI_HOT_SIZES, DCNV2_TABLE_ROWS, MLPERF_TABLE_ROWS  # noqa: E402
from model import DenseArch, LowRankCrossNet  # noqa: E402

CPU = torch.device("cpu")
ZION_HBM = zion_emu.load_platform("zion").get("oam.hbm_bytes")  # 32 GiB per OAM


def _args(*argv: str) -> "dlrm.argparse.Namespace":
    return dlrm.parse_args(["--no-progress", *argv])


def _dense(a) -> DenseArch:
    return DenseArch(a.bottom, a.top, len(a.table_rows), a.seed, CPU, a.arch_interaction_op, a.dcn_num_layers,
                     a.dcn_low_rank_dim)


def _losses(out: str) -> list[str]:
    return [line.split()[3] for line in out.splitlines() if line.startswith("iter ")]


# --- row counts ------------------------------------------------------------------------

def test_max_rows_zero_gives_the_full_mlperf_tables():
    a = _args("--config", "mlperf", "--max-rows", "0")
    # MLPerf DLRM (Criteo Terabyte, --max-ind-range=40000000): 187,767,399 rows, 89.5 GiB at dim 128 in fp32.
    assert a.table_rows == list(MLPERF_TABLE_ROWS) and sum(a.table_rows) == 187_767_399
    assert sum(a.table_rows) * 128 * 4 == pytest.approx(89.53 * (1 << 30), rel=1e-3)
    # By default rows are capped at 1M: six tables are larger, 7,110,446 rows in all.
    assert sum(_args("--config", "mlperf").table_rows) == 7_110_446


def test_max_rows_zero_gives_the_full_dcnv2_tables():
    a = _args("--config", "dcnv2", "--max-rows", "0")
    # The reference's --num_embeddings_per_feature: five tables at the 40M cap; 204,184,588 rows.
    assert a.table_rows == list(DCNV2_TABLE_ROWS) and sum(a.table_rows) == 204_184_588
    assert sorted(t for t, rows in enumerate(a.table_rows) if rows == 40_000_000) == [0, 9, 19, 20, 21]
    assert sum(_args("--config", "dcnv2").table_rows) == 7_116_632
    assert min(_args("--config", "dcnv2", "--max-rows", "1000").table_rows) == 3


# --- the dcnv2 shape ---------------------------------------------------------------------

def test_the_dcnv2_config_is_mlperf_dlrmv2():
    a = _args("--config", "dcnv2", "--max-rows", "1000")
    assert (a.arch_sparse_feature_size, a.bottom, a.top) == (128, [13, 512, 256, 128], [1024, 1024, 512, 256, 1])
    assert (a.arch_interaction_op, a.dcn_num_layers, a.dcn_low_rank_dim) == ("dcn", 3, 512)
    assert (a.optimizer, a.learning_rate, a.mini_batch_size) == ("adagrad", 0.005, 65536)
    assert a.table_lookups == list(DCNV2_MULTI_HOT_SIZES) and len(a.table_lookups) == 26
    assert sum(a.table_lookups) == 214  # indices per sample over the 26 tables
    assert _args("--config", "dcnv2", "--batch-size", "512").mini_batch_size == 512

    dense = _dense(a)
    # The cross layers see the bottom output and the 26 pooled vectors side by
    # side, (26 + 1) * 128 = 3456 wide, and keep that width for the top MLP.
    assert dense.top[0].in_features == 3456
    assert [tuple(v.shape) for v in dense.cross.v] == [(512, 3456)] * 3
    assert [tuple(w.shape) for w in dense.cross.w] == [(3456, 512)] * 3
    # Parameters: bottom 13*512+512 + 512*256+256 + 256*128+128 = 171,392; cross
    # 3 x (2 x 3456 x 512 + 3456) = 10,627,200; top 3456*1024+1024 + 1024*1024+1024
    # + 1024*512+512 + 512*256+256 + 256+1 = 5,245,953.
    assert sum(p.numel() for p in dense.parameters()) == 171_392 + 10_627_200 + 5_245_953


def test_a_low_rank_cross_layer_is_x0_times_w_v_x_plus_b_plus_x():
    torch.manual_seed(0)
    net = LowRankCrossNet(6, layers=2, rank=2, seed=1, stream=3, device=CPU)
    with torch.no_grad():
        for b in net.b:
            b.normal_()
    x0 = torch.randn(5, 6, dtype=torch.float64)
    net = net.double()
    x = x0
    for v, w, b in zip(net.v, net.w, net.b):
        x = x0 * (torch.einsum("ij,jk,bk->bi", w, v, x) + b) + x
    assert torch.allclose(net(x0), x, rtol=1e-12, atol=1e-12)
    # Biases start at zero (the draw above replaced them).
    assert LowRankCrossNet(6, 1, 2, 1, 3, CPU).b[0].abs().sum() == 0


def test_the_activation_count_of_the_dense_part_worked_by_hand():
    # DCN: bottom 13-4 with its ReLU (4 + 4), top 12-8-1 (8 + 8 + 1), the pooled
    # rows and the features they join (2 x 3 vectors x 4), and per cross layer
    # the rank-3 projection and four 12-wide results: 2 x (3 + 48).
    dcn = DenseArch([13, 4], [8, 1], 2, 0, CPU, "dcn", dcn_layers=2, dcn_rank=3)
    assert dcn.activation_floats_per_sample() == 8 + 17 + 24 + 102
    # Dots: bottom 13-8-4 (8 + 8 + 4 + 4), top 49-8-1 (8 + 8 + 1), 2 x 10 x 4, the
    # 10 x 10 dots, the 45 pairs and the 49-wide top input (2 x 49).
    dot = DenseArch([13, 8, 4], [8, 1], 9, 0, CPU)
    assert dot.activation_floats_per_sample() == 24 + 17 + 80 + 100 + 98


@pytest.mark.slow
def test_dcnv2_trains_the_same_on_zion_and_on_the_cpu(capsys):
    small = ["--config", "dcnv2", "--max-rows", "1000", "--batch-size", "16", "--num-batches", "2", "--no-progress"]
    assert dlrm.main([*small, "--device", "cpu"]) == 0
    cpu = capsys.readouterr().out
    assert dlrm.main([*small, "--device", "zion"]) == 0
    zion = capsys.readouterr().out
    assert len(_losses(cpu)) == 2 and _losses(zion) == _losses(cpu)
    assert " interaction dcn layers 3 rank 512 " in zion and " optimizer adagrad lr 0.005 " in zion


# --- full-size plans (nothing allocated) -------------------------------------------------

def test_mlperf_at_full_size_on_one_oam_keeps_the_four_largest_tables_in_ddr():
    a = _args("--config", "mlperf", "--max-rows", "0", "--device", "zion", "--table-placement", "auto")
    plan = dlrm.table_plan(a, 1, _dense(a), ZION_HBM)
    # Reserve, one rank, SGD, batch 2048: margin ceil(0.05 x 32 GiB) = 1,717,986,919;
    # dense 2,368,897 parameters x 4 bytes x 2 = 18,951,176; activations
    # 2 x 2048 x 16,024 floats x 4 = 262,537,216; tables 26 x (2048 x 528 + 4 x 2048 x 512)
    # + 2048 x 512 = 138,215,424.
    assert plan.reserves[0].total == 1_717_986_919 + 18_951_176 + 262_537_216 + 138_215_424
    assert plan.budgets == [ZION_HBM - 2_137_690_735]  # 32,222,047,633
    # Hottest first: the 22 tables below 26M rows take 29,705,287 rows (15.2 GB);
    # the next, 38,532,951 rows (19.7 GB), would pass the budget, as would the
    # three larger ones.
    ddr = [t for t, w in zip(plan.owners[0], plan.where[0]) if w == "ddr"]
    assert ddr == [0, 9, 19, 21]
    assert "in_hbm 15209106944 in_ddr 80927801344" in plan.lines(a.table_rows, a.arch_sparse_feature_size)[0]


def test_mlperf_at_full_size_on_eight_oams_fits_in_hbm():
    a = _args("--config", "mlperf", "--max-rows", "0", "--device", "zion", "--table-placement", "auto")
    plan = dlrm.table_plan(a, 8, _dense(a), ZION_HBM)
    # One large table per rank; the largest, 39,979,771 rows, is 20.5 GB of 32 GiB.
    assert all(w == "hbm" for where in plan.where for w in where)
    first = plan.lines(a.table_rows, a.arch_sparse_feature_size)[0]
    assert first == "# rank 0 tables 19 table_bytes 20469642752 in_hbm 20469642752 in_ddr 0"


def test_dcnv2_at_full_size_on_eight_oams_keeps_the_40m_row_tables_in_ddr():
    a = _args("--config", "dcnv2", "--max-rows", "0", "--device", "zion", "--table-placement", "auto")
    plan = dlrm.table_plan(a, 8, _dense(a), ZION_HBM)
    # A 40M-row table with its Adagrad state is 2 x 20.48 GB, more than an OAM's
    # 34.36 GB: in HBM it could not even be built.
    assert plan.footprints[0] == 2 * 40_000_000 * 128 * 4 > ZION_HBM
    ddr = sorted(t for tables, where in zip(plan.owners, plan.where) for t, w in zip(tables, where) if w == "ddr")
    assert ddr == [0, 9, 19, 20, 21]
    # Ranks 0-4 own one each; rank 5 the 3,067,956-row table, in HBM.
    assert [tables for tables in plan.owners[:6]] == [[0], [9], [19], [20], [21], [10]]
    assert plan.where[5] == ["hbm"]


# --- bad input ---------------------------------------------------------------------------

def test_lookup_counts_must_match_the_tables(capsys):
    with pytest.raises(SystemExit):
        dlrm.parse_args(["--config", "tiny", "--num-indices-per-lookup", "1-2"])
    err = capsys.readouterr().err
    assert "--num-indices-per-lookup 1-2 gives 2 counts for 9 tables" in err and "one per table" in err
    with pytest.raises(SystemExit):
        dlrm.parse_args(["--config", "tiny", "--dcn-low-rank-dim", "0"])
    assert "--dcn-low-rank-dim is 0" in capsys.readouterr().err
