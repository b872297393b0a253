"""Named DLRM shapes for ``dlrm.py --config NAME``.

Each config sets the architecture and run flags; a flag given on the command
line overrides the config's value. Sizes are written the way the public
facebookresearch/dlrm reference takes them: dash-separated lists.
"""

from __future__ import annotations

from typing import Any

# MLPerf DLRM on Criteo Terabyte: the 26 table sizes of the day-0..23 data set
# with --max-ind-range=40000000, dim 128 (the reference's run_and_time.sh for
# MLPerf training: --arch-sparse-feature-size=128 --arch-mlp-bot=13-512-256-128
# --arch-mlp-top=1024-1024-512-256-1 --learning-rate=1.0 --mini-batch-size=2048,
# one index per lookup). About 89.5 GiB in fp32, so real mode caps rows.
MLPERF_TABLE_ROWS = (
    39884406, 39043, 17289, 7420, 20263, 3, 7120, 1543, 63, 38532951, 2953546, 403346, 10, 2208, 11938, 155, 4, 976,
    14, 39979771, 25641295, 39664984, 585935, 12972, 108, 36,
)


def _dashes(values: tuple[int, ...] | list[int]) -> str:
    return "-".join(str(v) for v in values)


CONFIGS: dict[str, dict[str, Any]] = {
    # For tests: seconds on one core. Nine tables, so two ranks own 5 and 4
    # and eight ranks 2, 1, ..., 1: uneven either way.
    "tiny": {
        "arch_sparse_feature_size": 4,
        "arch_embedding_size": "50-80-120-60-90-40-70-100-30",
        "arch_mlp_bot": "13-8-4",
        "arch_mlp_top": "8-1",
        "mini_batch_size": 32,
        "num_batches": 4,
        "num_indices_per_lookup": 2,
        "learning_rate": 0.1,
        "data": "criteo-synthetic",
        "max_rows": 0,
    },
    # A few iterations in about a minute on 8 ranks sharing 2 cores.
    "small": {
        "arch_sparse_feature_size": 64,
        "arch_embedding_size": _dashes([100000] * 8),
        "arch_mlp_bot": "13-512-256-64",
        "arch_mlp_top": "512-256-1",
        "mini_batch_size": 2048,
        "num_batches": 10,
        "num_indices_per_lookup": 10,
        "learning_rate": 0.1,
        "data": "criteo-synthetic",
        "max_rows": 0,
    },
    # The DLRM paper's benchmark (Naumov et al., 2019, and the reference's
    # bench/dlrm_s_benchmark.sh): 8 tables x 1M rows, dim 64, 100 lookups per
    # table, bottom MLP 512-512-64 on 512 dense features, top 1024-1024-1024-1,
    # batch 2048, random data.
    "paper": {
        "arch_sparse_feature_size": 64,
        "arch_embedding_size": _dashes([1000000] * 8),
        "arch_mlp_bot": "512-512-64",
        "arch_mlp_top": "1024-1024-1024-1",
        "mini_batch_size": 2048,
        "num_batches": 10,
        "num_indices_per_lookup": 100,
        "learning_rate": 0.01,
        "data": "random",
        "max_rows": 0,
    },
    # MLPerf DLRM (Criteo Terabyte shape). Tables are capped at 1M rows by
    # default so real mode needs ~3.5 GiB; --max-rows 0 lifts the cap. The cap
    # changes the memory held, not the rows gathered per step.
    "mlperf": {
        "arch_sparse_feature_size": 128,
        "arch_embedding_size": _dashes(MLPERF_TABLE_ROWS),
        "arch_mlp_bot": "13-512-256-128",
        "arch_mlp_top": "1024-1024-512-256-1",
        "mini_batch_size": 2048,
        "num_batches": 10,
        "num_indices_per_lookup": 1,
        "learning_rate": 1.0,
        "data": "criteo-synthetic",
        "max_rows": 1000000,
    },
}
