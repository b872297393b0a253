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
# one index per lookup). 187,767,399 rows, about 89.5 GiB in fp32, so real
# mode caps rows.
MLPERF_TABLE_ROWS = (
    39884406, 39043, 17289, 7420, 20263, 3, 7120, 1543, 63, 38532951, 2953546, 403346, 10, 2208, 11938, 155, 4, 976,
    14, 39979771, 25641295, 39664984, 585935, 12972, 108, 36,
)

# MLPerf DLRMv2 (DCN-v2 on the Criteo 1TB multi-hot data set), from the
# reference mlcommons/training recommendation_v2/torchrec_dlrm (README.MD,
# "Running the MLPerf DLRM v2 benchmark"): --num_embeddings_per_feature (rows
# capped at 40M; 204,184,588 rows, about 97.4 GiB in fp32), --multi_hot_sizes
# (indices pooled per table per sample), --embedding_dim 128,
# --dense_arch_layer_sizes 512,256,128, --over_arch_layer_sizes
# 1024,1024,512,256,1, --interaction_type=dcn --dcn_num_layers=3
# --dcn_low_rank_dim=512, --adagrad --learning_rate 0.005, and
# GLOBAL_BATCH_SIZE=65536 (8 GPUs x --batch_size 8192).
DCNV2_TABLE_ROWS = (
    40000000, 39060, 17295, 7424, 20265, 3, 7122, 1543, 63, 40000000, 3067956, 405282, 10, 2209, 11938, 155, 4, 976,
    14, 40000000, 40000000, 40000000, 590152, 12973, 108, 36,
)
DCNV2_MULTI_HOT_SIZES = (3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1)

# The row cap of the two MLPerf shapes by default: about 3.4 GiB of tables
# in real mode, where every modeled byte is a host byte. --max-rows 0 lifts
# it. The cap changes the memory held, not the rows gathered per step.
MLPERF_DEFAULT_MAX_ROWS = 1000000

# What a config leaves out.
DEFAULTS: dict[str, Any] = {
    "arch_interaction_op": "dot",
    "dcn_num_layers": 3,  # torchrec_dlrm's defaults for --dcn_num_layers and --dcn_low_rank_dim
    "dcn_low_rank_dim": 512,
    "optimizer": "sgd",
    "max_rows": 0,
}


def _dashes(values: tuple[int, ...] | list[int]) -> str:
    return "-".join(str(v) for v in values)


CONFIGS: dict[str, dict[str, Any]] = {
    # For tests: seconds on one core. Nine tables, so two ranks own 4 and 5
    # and eight ranks 1, ..., 1, 2: uneven either way.
    "tiny": {
        "arch_sparse_feature_size": 4,
        "arch_embedding_size": "50-80-120-60-90-40-70-100-30",
        "arch_mlp_bot": "13-8-4",
        "arch_mlp_top": "8-1",
        "mini_batch_size": 32,
        "num_batches": 4,
        "num_indices_per_lookup": "2",
        "learning_rate": 0.1,
        "data": "criteo-synthetic",
    },
    # A few iterations in about a minute on 8 ranks sharing 2 cores.
    "small": {
        "arch_sparse_feature_size": 64,
        "arch_embedding_size": _dashes([100000] * 8),
        "arch_mlp_bot": "13-512-256-64",
        "arch_mlp_top": "512-256-1",
        "mini_batch_size": 2048,
        "num_batches": 10,
        "num_indices_per_lookup": "10",
        "learning_rate": 0.1,
        "data": "criteo-synthetic",
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
        "num_indices_per_lookup": "100",
        "learning_rate": 0.01,
        "data": "random",
    },
    # MLPerf DLRM (Criteo Terabyte shape), rows capped (MLPERF_DEFAULT_MAX_ROWS).
    "mlperf": {
        "arch_sparse_feature_size": 128,
        "arch_embedding_size": _dashes(MLPERF_TABLE_ROWS),
        "arch_mlp_bot": "13-512-256-128",
        "arch_mlp_top": "1024-1024-512-256-1",
        "mini_batch_size": 2048,
        "num_batches": 10,
        "num_indices_per_lookup": "1",
        "learning_rate": 1.0,
        "data": "criteo-synthetic",
        "max_rows": MLPERF_DEFAULT_MAX_ROWS,
    },
    # MLPerf DLRMv2: DCN-v2 interaction, multi-hot lookups, Adagrad (see
    # DCNV2_TABLE_ROWS), rows capped (MLPERF_DEFAULT_MAX_ROWS). At the
    # reference's global batch of 65536 one step holds several GiB of
    # activations per rank: real mode on a small machine wants --batch-size.
    "dcnv2": {
        "arch_sparse_feature_size": 128,
        "arch_embedding_size": _dashes(DCNV2_TABLE_ROWS),
        "arch_mlp_bot": "13-512-256-128",
        "arch_mlp_top": "1024-1024-512-256-1",
        "arch_interaction_op": "dcn",
        "dcn_num_layers": 3,
        "dcn_low_rank_dim": 512,
        "mini_batch_size": 65536,
        "num_batches": 10,
        "num_indices_per_lookup": _dashes(DCNV2_MULTI_HOT_SIZES),
        "learning_rate": 0.005,
        "optimizer": "adagrad",
        "data": "criteo-synthetic",
        "max_rows": MLPERF_DEFAULT_MAX_ROWS,
    },
}
