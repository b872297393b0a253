"""torchrec on zion (zion_emu/torchrec): DistributedModelParallel DLRM trains
on zion natively and under --cuda-compat with rank 0's losses those of the
CPU/gloo run with the same plan, bit for bit; a step prices every op with a
formula; the fbgemm lookups and the pooled-embedding all-to-all take the
time worked out by hand from the platform's numbers.

Single-process checks run in a fresh interpreter (importing fbgemm_gpu
installs zion's kernels into the process that does it); multi-rank runs go
through torchrun (CPU) and zion-emu run, each bounded by a timeout.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import zion_emu
from processes import REPO, child_env, run, run_python, torchrun, zion_emu_cli

EXAMPLE = str(REPO / "examples" / "torchrec_dlrm.py")
RUN_TIMEOUT_S = 150

pytest.importorskip("torchrec", reason="make install installs torchrec (requirements-torchrec.txt)")


def _lines(output: str, prefix: str) -> list[list[str]]:
    return [line.split() for line in output.splitlines() if line.startswith(prefix)]


def _losses(output: str) -> list[str]:
    return [fields[2] for fields in _lines(output, "loss ")]


# --- one process ---------------------------------------------------------------

def test_importing_zion_emu_imports_neither_torchrec_nor_fbgemm():
    done = run_python("""
        import sys, zion_emu
        print(sorted(m for m in ("torchrec", "fbgemm_gpu") if m in sys.modules), zion_emu.torchrec.installed())
    """)
    assert done.stdout.split("\n")[0] == "[] []"


def test_the_planner_sees_the_platform_and_places_shards_on_zion():
    done = run_python("""
        import json, zion_emu
        from torchrec.distributed.planner import Topology
        from torchrec.distributed import sharding_plan
        from torchrec.distributed.planner import planners
        t = Topology(world_size=4, compute_device="zion")
        given = Topology(world_size=4, compute_device="zion", hbm_cap=123)
        print(json.dumps({"device": t.compute_device, "hbm": [d.storage.hbm for d in t.devices],
                          "ddr": t.devices[0].storage.ddr, "intra": t.intra_host_bw, "inter": t.inter_host_bw,
                          "hbm_bw": t.hbm_mem_bw, "given_hbm": given.devices[0].storage.hbm,
                          "placement": sharding_plan.placement("zion", 3, 2),
                          "planners_placement": planners.placement("zion", 5, 4),
                          "cpu_placement": sharding_plan.placement("cpu", 1, 2)}))
    """)
    got = json.loads(done.stdout)
    p = zion_emu.load_platform("zion")
    # Zion: 8 OAMs of 32 GiB HBM at 1000 GB/s; 8 sockets of 384 GiB DDR
    # shared by the 8 OAMs; 4 NICs of 100 Gbit/s shared by 8 OAMs: 6.25 GB/s
    # each; torchrec's bandwidths are bytes per millisecond.
    assert got["device"] == "cuda"  # torchrec's accelerator model
    assert got["hbm"] == [p.get("oam.hbm_bytes")] * 4 == [32 * 2**30] * 4
    assert got["ddr"] == p.get("socket.ddr_bytes") * 8 // 8 == 384 * 2**30
    assert got["hbm_bw"] == pytest.approx(1000e9 / 1e3)
    assert got["inter"] == pytest.approx(4 * 100e9 / 8 / 8 / 1e3)
    # Intra-node: the modeled all-to-all bus bandwidth of the 8 fully
    # connected OAMs at 256 MiB: (n-1)/n * S / (alpha + S/n / 25 GB/s).
    S, n, link, alpha = 256 * 2**20, 8, 25e9, 600e-9 + 6600e-9
    assert got["intra"] == pytest.approx((n - 1) / n * S / (alpha + S / n / link) / 1e3, rel=1e-6)
    assert got["given_hbm"] == 123  # what the caller gives wins
    assert got["placement"] == "rank:3/zion:1" and got["planners_placement"] == "rank:5/zion:1"
    assert got["cpu_placement"] == "rank:1/cpu"


def test_the_planner_offers_zion_no_uvm_kernels():
    # The planner chose fused_uvm_caching for a table bigger than HBM, as on CUDA, and zion allocated the
    # whole table in HBM: an out-of-memory error for the planner's own plan, or, with room, an HBM table
    # priced at HBM speed where the plan said UVM.
    done = run_python("""
        import json, torch, zion_emu
        from fbgemm_gpu.split_embedding_configs import EmbOptimType
        from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
        from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
        from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
        from torchrec.distributed.planner.types import PlannerError

        def ebc(rows):
            return EmbeddingBagCollection(tables=[EmbeddingBagConfig(name="t", embedding_dim=16, num_embeddings=rows,
                                                                     feature_names=["f"])], device=torch.device("meta"))
        sharder = EmbeddingBagCollectionSharder(fused_params={"optimizer": EmbOptimType.EXACT_SGD, "learning_rate": 0.1})
        out = {}
        plan = EmbeddingShardingPlanner(topology=Topology(world_size=2, compute_device="zion")).plan(ebc(1000), [sharder])
        out["fits"] = plan.plan[""]["t"].compute_kernel
        small = Topology(world_size=2, compute_device="zion", hbm_cap=4_000_000)
        try:
            EmbeddingShardingPlanner(topology=small).plan(ebc(200_000), [sharder])
        except PlannerError as e:
            out["too_big"] = "insufficient storage" in str(e)
        uvm_only = {"t": ParameterConstraints(compute_kernels=["fused_uvm_caching"])}
        try:
            EmbeddingShardingPlanner(topology=Topology(world_size=2, compute_device="zion"),
                                     constraints=uvm_only).plan(ebc(1000), [sharder])
        except ValueError as e:
            out["uvm_only"] = str(e)
        cpu = Topology(world_size=2, compute_device="cuda", hbm_cap=4_000_000)
        out["cuda"] = EmbeddingShardingPlanner(topology=cpu).plan(ebc(200_000), [sharder]).plan[""]["t"].compute_kernel
        print(json.dumps(out))
    """)
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["fits"] == "fused" and got["too_big"] is True
    assert "table 't' may only use the compute kernels ['fused_uvm_caching']" in got["uvm_only"]
    assert "zion models no UVM" in got["uvm_only"]
    assert got["cuda"] in ("fused_uvm", "fused_uvm_caching")  # a CUDA topology plans as before


WEIGHTED_SNIPPET = """
    import json, torch, zion_emu, fbgemm_gpu
    from zion_emu import _C
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import (ComputeDevice,
        SplitTableBatchedEmbeddingBagsCodegen)
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation
    from fbgemm_gpu.split_embedding_configs import EmbOptimType

    d = torch.device("zion", 0)
    # KeyedJaggedTensor.permute with per-sample weights: lengths and indices move with the weights.
    lengths = torch.tensor([[1, 2], [2, 1]]).to(d)
    indices = torch.tensor([1, 2, 3, 4, 5, 6]).to(d)
    weights = torch.rand(6).to(d)
    permuted = torch.ops.fbgemm.permute_2D_sparse_data(torch.tensor([1, 0], dtype=torch.int32).to(d), lengths,
                                                       indices, weights, 6)
    # A weighted lookup whose per-sample weights take a gradient.
    specs = [(1000, 16, EmbeddingLocation.HOST, ComputeDevice.CPU)] * 2
    tbe = SplitTableBatchedEmbeddingBagsCodegen(specs, optimizer=EmbOptimType.EXACT_SGD, learning_rate=0.1, device=d)
    lookups = (torch.arange(192) * 7 % 1000).to(d)
    per_sample = torch.rand(192).to(d).requires_grad_()
    tbe(lookups, torch.arange(0, 193, 3).to(d), per_sample_weights=per_sample).sum().backward()
    # A sequence (no-bag) lookup with Adagrad fused, as torchrec's EmbeddingCollection runs it.
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import PoolingMode
    nobag = SplitTableBatchedEmbeddingBagsCodegen([(1000, 16, EmbeddingLocation.HOST, ComputeDevice.CPU)],
                                                  optimizer=EmbOptimType.EXACT_ADAGRAD, learning_rate=0.1,
                                                  pooling_mode=PoolingMode.NONE, device=d)
    rows = nobag(lookups[:96], torch.arange(0, 97, 3).to(d))
    rows.sum().backward()
    torch.zion.synchronize()
    print(json.dumps({"mode": zion_emu.mode(), "real": [not _C.device.is_storage_less(t) for t in permuted[:2]],
                      "lengths": permuted[0].tolist(), "indices": permuted[1].tolist(),
                      "weights_grad": list(per_sample.grad.shape), "rows": list(rows.shape),
                      "guessed": zion_emu.cost.guessed_ops(0), "clock": zion_emu.clock(),
                      "peak": torch.zion.max_memory_allocated(0), "priced": _C.device.priced_ops()}))
"""


def test_weighted_features_and_sequence_lookups_run_in_timing_only_mode_as_in_real_mode():
    # Sequence (no-bag) lookups had no shape rule in timing-only mode. fbgemm's permute of a KeyedJaggedTensor with storage-less weights made its lengths and indices storage-less
    # (read as zeros, and the run stopped in bounds_check_indices), and the per-sample weights' gradient had no
    # shape rule.
    real, timing = (json.loads(run_python(WEIGHTED_SNIPPET, timeout_s=RUN_TIMEOUT_S, env=child_env(ZION_MODE=mode))
                               .stdout.strip().splitlines()[-1]) for mode in ("real", "timing"))
    assert (real.pop("mode"), timing.pop("mode")) == ("real", "timing")
    assert timing["real"] == [True, True] and timing["lengths"] == [[2, 1], [1, 2]]
    assert timing["indices"] == [4, 5, 6, 1, 2, 3] and timing["weights_grad"] == [192]
    assert timing["rows"] == [96, 16] and timing["guessed"] == {}
    assert timing == real


TBE_SNIPPET = """
    import json, torch, zion_emu
    from zion_emu import _C
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import (ComputeDevice,
        SplitTableBatchedEmbeddingBagsCodegen)
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation
    from fbgemm_gpu.split_embedding_configs import EmbOptimType

    T, ROWS, D, B = 2, 1000, 16, 32
    indices = torch.arange(B * T * 3) * 7 % ROWS   # 3 lookups per sample and feature
    offsets = torch.arange(0, B * T * 3 + 1, 3)

    def step(device):
        torch.manual_seed(0)
        specs = [(ROWS, D, EmbeddingLocation.HOST, ComputeDevice.CPU)] * T
        tbe = SplitTableBatchedEmbeddingBagsCodegen(specs, optimizer=EmbOptimType.EXACT_ROWWISE_ADAGRAD,
                                                    learning_rate=0.1, device=device)
        with torch.no_grad():
            tbe.weights_host.copy_(torch.randn(tbe.weights_host.shape).to(device))
        out = tbe(indices.to(device), offsets.to(device))
        (out * torch.arange(out.numel(), dtype=torch.float).reshape(out.shape).to(device)).sum().backward()
        return out.detach().cpu(), tbe.weights_host.detach().cpu()

    cpu_out, cpu_weights = step("cpu")
    zion_emu.reset_clock()
    out, weights = step(torch.device("zion", 0))
    totals = _C.timeline.label_totals()
    print(json.dumps({"same_out": torch.equal(out, cpu_out), "same_weights": torch.equal(weights, cpu_weights),
                      "trained": not torch.equal(weights, torch.randn(0)),
                      "guessed": zion_emu.cost.guessed_ops(0),
                      "forward": totals["fbgemm::split_embedding_codegen_forward_unweighted_pt2_wrapper"],
                      "backward": totals[
                          "fbgemm::split_embedding_backward_codegen_rowwise_adagrad_unweighted_pt2_wrapper"]}))
"""


def test_a_tbe_lookup_trains_as_on_the_cpu_and_takes_its_closed_form_time():
    got = json.loads(run_python(TBE_SNIPPET, timeout_s=RUN_TIMEOUT_S).stdout.strip().splitlines()[-1])
    assert got["same_out"] and got["same_weights"] and got["guessed"] == {}

    p = zion_emu.load_platform("zion")
    hbm = p.get("oam.hbm_bandwidth_gb_per_s") * 1e9                 # 1000 GB/s
    stream = hbm * p.get("oam.efficiency.elementwise")                # 0.8 of it
    gather = hbm * p.get("oam.efficiency.embedding_random_access")    # 0.4 of it
    T, D, B = 2, 16, 32
    L = B * T * 3                                                     # 192 lookups
    index_bytes = 8 * L + 8 * (B * T + 1)                             # int64 indices and offsets
    pooled_bytes = 4 * B * T * D                                      # fp32 [B, T*D]
    # Forward: L rows of D fp32 gathered; indices, offsets stream in and the
    # pooled output streams out.
    forward = (index_bytes + pooled_bytes) / stream + 4 * L * D / gather
    # Backward, row-wise Adagrad fused: the pooled gradient and the indices
    # stream in; each lookup's row (D fp32) and its one fp32 momentum are
    # read and written back.
    backward = (pooled_bytes + index_bytes) / stream + 2 * L * (4 * D + 4) / gather
    assert got["forward"] == [pytest.approx(forward, rel=1e-9), 1]
    assert got["backward"] == [pytest.approx(backward, rel=1e-9), 1]


@pytest.mark.parametrize("optimizer,state_bytes_per_row", [("sgd", 0), ("adagrad", 4 * 16), ("rowwise_adagrad", 4)])
def test_a_fused_backward_reads_and_writes_each_row_with_its_optimizer_state(optimizer, state_bytes_per_row):
    from zion_emu import sim

    p = zion_emu.load_platform("zion")
    model = sim.OpCostModel.for_oam(p)
    B, T, D, L, ROWS = 32, 2, 16, 100, 1000
    f32, i64, i32 = (lambda n: sim.TensorDesc([n], "fp32")), (lambda n: sim.TensorDesc([n], "int64")), \
        (lambda n: sim.TensorDesc([n], "int32"))
    # Schema order: grad_output, host/dev/uvm/lxu weights, placements,
    # weights_offsets, D_offsets, hash_size_cumsum, indices, offsets,
    # indice_weights, lxu_cache_locations, then the optimizer's state.
    inputs = [sim.TensorDesc([B, T * D], "fp32"), f32(T * ROWS * D), f32(0), f32(0), f32(0), i32(T), i64(T),
              i32(T + 1), i64(T + 1), i64(L), i64(B * T + 1), f32(0), i32(0)]
    if optimizer != "sgd":
        momentum = T * ROWS * (D if optimizer == "adagrad" else 1)
        inputs += [f32(momentum), f32(0), f32(0), i32(T), i64(T)]
    inputs.append(sim.TensorDesc([], "fp32"))  # learning_rate_tensor
    cost = model.cost(sim.OpCall(f"fbgemm::split_embedding_backward_codegen_{optimizer}_unweighted_pt2_wrapper",
                                 inputs, []))
    hbm = 1000e9
    streamed = 4 * B * T * D + 8 * L + 8 * (B * T + 1)
    touched = 2 * L * (4 * D + state_bytes_per_row)
    assert cost.work.gathered_bytes == touched and cost.work.bytes == streamed
    assert cost.device_time == pytest.approx(streamed / (hbm * 0.8) + touched / (hbm * 0.4), rel=1e-12)
    assert not cost.guessed


def test_the_per_sample_weights_gradient_gathers_each_looked_up_row_once():
    # It was priced by the default guess: a read of the whole table every step.
    from zion_emu import sim

    p = zion_emu.load_platform("zion")
    model = sim.OpCostModel.for_oam(p)
    B, T, D, L, ROWS = 32, 2, 16, 100, 1_000_000
    f32, i64, i32 = (lambda n: sim.TensorDesc([n], "fp32")), (lambda n: sim.TensorDesc([n], "int64")), \
        (lambda n: sim.TensorDesc([n], "int32"))
    # Schema order (max_D is not a tensor): grad_output, host/dev/uvm/lxu weights, placements, weights_offsets,
    # D_offsets, indices, offsets, lxu_cache_locations, feature_requires_grad; one value per lookup out.
    inputs = [sim.TensorDesc([B, T * D], "fp32"), f32(T * ROWS * D), f32(0), f32(0), f32(0), i32(T), i64(T),
              i32(T + 1), i64(L), i64(B * T + 1), i32(0), i32(0)]
    cost = model.cost(sim.OpCall("fbgemm::split_embedding_codegen_grad_indice_weights_pt2_wrapper", inputs, [f32(L)]))
    hbm = 1000e9
    streamed = 4 * B * T * D + 8 * L + 8 * (B * T + 1) + 4 * L
    gathered = 4 * L * D
    assert cost.work.gathered_bytes == gathered and cost.work.bytes == streamed and cost.work.flops == 2 * L * D
    assert cost.device_time == pytest.approx(streamed / (hbm * 0.8) + gathered / (hbm * 0.4), rel=1e-12)
    assert not cost.guessed


def test_a_sequence_lookup_gathers_and_updates_each_looked_up_row():
    # torchrec's EmbeddingCollection runs fbgemm's no-bag lookup, which was priced by the default guess: a read
    # of the whole table (and its optimizer state) every step.
    from zion_emu import sim

    model = sim.OpCostModel.for_oam(zion_emu.load_platform("zion"))
    D, L, ROWS = 64, 96, 1_000_000
    f32, i64, i32 = (lambda n: sim.TensorDesc([n], "fp32")), (lambda n: sim.TensorDesc([n], "int64")), \
        (lambda n: sim.TensorDesc([n], "int32"))
    # Forward, schema order (D is an int): host/dev/uvm/lxu weights, placements, weights_offsets,
    # hash_size_cumsum, indices, offsets, lxu_cache_locations, uvm_cache_stats; out [L, D].
    lookup = [f32(ROWS * D), f32(0), f32(0), f32(0), i32(1), i64(1), i64(2), i64(L), i64(L + 1), i32(0), i32(0)]
    forward = model.cost(sim.OpCall("fbgemm::split_embedding_nobag_codegen_forward_unweighted_pt2_wrapper", lookup,
                                    [sim.TensorDesc([L, D], "fp32")]))
    hbm = 1000e9
    index_bytes = 8 * L + 8 * (L + 1)
    assert forward.work.gathered_bytes == 4 * L * D and forward.work.bytes == index_bytes + 4 * L * D
    assert forward.device_time == pytest.approx((index_bytes + 4 * L * D) / (hbm * 0.8) + 4 * L * D / (hbm * 0.4),
                                                rel=1e-12)
    # Backward with Adagrad fused: grad_output [L, D], the weights, placements, weights_offsets,
    # hash_size_cumsum, indices, offsets, lxu_cache_locations, then momentum1 host, dev, uvm, placements,
    # offsets and the learning rate. Each lookup's row and its momentum row are read and written back.
    state = [f32(ROWS * D), f32(0), f32(0), i32(1), i64(1), sim.TensorDesc([], "fp32")]
    backward = model.cost(sim.OpCall("fbgemm::split_embedding_nobag_backward_codegen_adagrad_unweighted_pt2_wrapper",
                                     [sim.TensorDesc([L, D], "fp32"), *lookup[:10], *state], [f32(0)]))
    touched = 2 * L * (4 * D + 4 * D)
    assert backward.work.gathered_bytes == touched and backward.work.bytes == 4 * L * D + index_bytes
    assert not forward.guessed and not backward.guessed


VBE_SNIPPET = """
    import json, torch, zion_emu
    from zion_emu import _C
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import (ComputeDevice,
        SplitTableBatchedEmbeddingBagsCodegen)
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation
    from fbgemm_gpu.split_embedding_configs import EmbOptimType

    # Variable batch per feature: feature 0 has 3 bags, feature 1 has 5.
    lengths = torch.tensor([2, 0, 4, 1, 3, 3, 2, 5])
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
    indices = torch.arange(int(lengths.sum())) * 37 % 1000

    def step(device, optimizer):
        torch.manual_seed(0)
        specs = [(1000, 16, EmbeddingLocation.HOST, ComputeDevice.CPU)] * 2
        tbe = SplitTableBatchedEmbeddingBagsCodegen(specs, optimizer=optimizer, learning_rate=0.1, device=device)
        with torch.no_grad():
            tbe.weights_host.copy_(torch.randn(tbe.weights_host.shape).to(device))
        out = tbe(indices.to(device), offsets.to(device), batch_size_per_feature_per_rank=[[3], [5]])
        (out * torch.arange(out.numel(), dtype=torch.float).to(device)).sum().backward()
        return out.detach().cpu(), tbe.weights_host.detach().cpu()

    got = {"mode": zion_emu.mode()}
    zion_emu.reset_clock()
    for name, optimizer in (("sgd", EmbOptimType.EXACT_SGD), ("rowwise_adagrad", EmbOptimType.EXACT_ROWWISE_ADAGRAD)):
        cpu = step("cpu", optimizer)
        zion = step(torch.device("zion", 0), optimizer)
        got[name] = [list(zion[0].shape), torch.equal(zion[0], cpu[0]), torch.equal(zion[1], cpu[1])]

    # torchrec expands a variable batch's pooled rows to the full batch with batch_index_select_dim0.
    def expand(device):
        torch.manual_seed(0)
        flat = torch.randn(5 * 16 + 3 * 8).to(device).requires_grad_()   # 5 rows of 16 and 3 rows of 8
        rows = torch.tensor([4, 0, 4, 1, 2, 0]).to(device)                # 4 rows of the first, 2 of the second
        out = torch.ops.fbgemm.batch_index_select_dim0(flat, rows, [4, 2], [5, 3], [16, 8], False)
        (out * torch.arange(out.numel(), dtype=torch.float).to(device)).sum().backward()
        return out.detach().cpu(), flat.grad.cpu()

    cpu, zion = expand("cpu"), expand(torch.device("zion", 0))
    got["expand"] = [list(zion[0].shape), list(zion[1].shape), torch.equal(zion[0], cpu[0]),
                     torch.equal(zion[1], cpu[1])]
    torch.zion.synchronize()
    totals = _C.timeline.label_totals()
    got.update({"forward": totals["fbgemm::split_embedding_codegen_forward_unweighted_vbe_pt2_wrapper"],
                "sgd_backward": totals["fbgemm::split_embedding_backward_codegen_sgd_unweighted_vbe_pt2_wrapper"],
                "rowwise_backward": totals[
                    "fbgemm::split_embedding_backward_codegen_rowwise_adagrad_unweighted_vbe_pt2_wrapper"],
                "guessed": zion_emu.cost.guessed_ops(0), "clock": zion_emu.clock(),
                "peak": torch.zion.max_memory_allocated(0), "priced": _C.device.priced_ops()})
    print(json.dumps(got))
"""


def test_a_variable_batch_lookup_takes_its_closed_form_time_and_runs_in_timing_only_mode():
    # Variable-batch (VBE) lookups were priced by the default guess, a read of the whole table, and had no shape
    # rule in timing-only mode; the expansion to the full batch failed in timing-only mode (its backward's size
    # is data-dependent) and was priced from no outputs in real mode (it returns a list).
    real, timing = (json.loads(run_python(VBE_SNIPPET, timeout_s=RUN_TIMEOUT_S, env=child_env(ZION_MODE=mode))
                               .stdout.strip().splitlines()[-1]) for mode in ("real", "timing"))
    assert (real.pop("mode"), timing.pop("mode")) == ("real", "timing")
    # Real mode: the CPU's pooled rows and updated weights; 8 bags of 16 in one flat output.
    assert real["sgd"] == [[128], True, True] and real["rowwise_adagrad"] == [[128], True, True]
    assert real["guessed"] == {}
    hbm = 1000e9
    stream, gather = hbm * 0.8, hbm * 0.4          # zion's elementwise and embedding random-access efficiencies
    L, D, bags = 20, 16, 8
    index_bytes = 8 * L + 8 * (bags + 1)           # int64 indices and offsets
    flat_bytes = 4 * bags * D                      # the flat pooled output, or its gradient
    forward = (index_bytes + flat_bytes) / stream + 4 * L * D / gather
    assert real["forward"] == [pytest.approx(2 * forward, rel=1e-9), 2]  # once per optimizer
    assert real["sgd_backward"] == [pytest.approx((flat_bytes + index_bytes) / stream + 2 * L * 4 * D / gather,
                                                  rel=1e-9), 1]
    assert real["rowwise_backward"] == [pytest.approx((flat_bytes + index_bytes) / stream
                                                      + 2 * L * (4 * D + 4) / gather, rel=1e-9), 1]
    assert real["expand"] == [[80], [104], True, True]
    # Timing-only mode: the same shapes, times, memory and priced ops (the expansion runs its CPU kernels on
    # zeros for the rows, so the sizes its backward reads are real).
    assert timing.pop("sgd")[0] == [128] and timing.pop("rowwise_adagrad")[0] == [128]
    assert timing.pop("expand")[:2] == [[80], [104]]
    real.pop("sgd"), real.pop("rowwise_adagrad"), real.pop("expand")
    assert timing == real


def test_expanding_a_variable_batch_to_the_full_batch_gathers_each_selected_row():
    # batch_index_select_dim0, with which torchrec expands a variable-batch lookup's rows, was priced by the
    # default guess: a read of its whole input.
    from zion_emu import sim

    model = sim.OpCostModel.for_oam(zion_emu.load_platform("zion"))
    ROWS, COLS, N = 100_000, 64, 512           # 512 rows selected from 100k rows of 64 fp32
    f32, i64 = (lambda n: sim.TensorDesc([n], "fp32")), (lambda n: sim.TensorDesc([n], "int64"))
    small = [i64(1)] * 5                      # the forward's integer outputs (sizes, numels, saved)
    forward = model.cost(sim.OpCall("fbgemm::batch_index_select_dim0_forward_cpu_impl",
                                    [f32(ROWS * COLS), i64(N)], [f32(N * COLS), *small]))
    hbm = 1000e9
    assert forward.work.gathered_bytes == 4 * N * COLS and forward.work.bytes == 8 * N + 4 * N * COLS + 40
    assert forward.device_time == pytest.approx((8 * N + 4 * N * COLS + 40) / (hbm * 0.8) + 4 * N * COLS / (hbm * 0.4),
                                                rel=1e-12)
    # Backward: grad_output, indices, indices_numels, num_indices, rows, columns, saved; the input-sized
    # gradient is zeroed, and each gradient element added into a row of it.
    backward = model.cost(sim.OpCall("fbgemm::batch_index_select_dim0_backward_cpu_impl",
                                     [f32(N * COLS), i64(N), *small], [f32(ROWS * COLS)]))
    streamed = 4 * N * COLS + 8 * N + 40 + 4 * ROWS * COLS
    assert backward.work.gathered_bytes == 2 * 4 * N * COLS and backward.work.bytes == streamed
    assert backward.work.flops == N * COLS
    assert not forward.guessed and not backward.guessed


def test_fbgemm_ops_with_cpu_only_autograd_give_zion_the_cpu_gradients():
    # permute_pooled_embs_auto_grad_split (column-wise sharding's permute of
    # pooled embeddings) has an AutogradCPU kernel only: on zion it ran below
    # autograd and its input's gradient was None. Every such fbgemm op now
    # has a zion autograd kernel, fbgemm's own glue on CPU aliases.
    done = run_python("""
        import torch, zion_emu, fbgemm_gpu
        has = torch._C._dispatch_has_kernel_for_dispatch_key
        names = [n for n in torch._C._dispatch_get_all_op_names() if n.startswith("fbgemm::")]
        cpu_only = [n for n in names if has(n, "AutogradCPU") and not has(n, "Autograd")]
        assert "fbgemm::permute_pooled_embs_auto_grad_split" in cpu_only
        assert [n for n in cpu_only if not has(n, "AutogradPrivateUse1")] == [], cpu_only

        def run(device):
            x = torch.randn(3, 16, generator=torch.Generator().manual_seed(0)).to(device).requires_grad_()
            offsets = torch.tensor([0, 4, 8, 12, 16], device=device)
            order = torch.tensor([0, 2, 1, 3], device=device)
            y = torch.ops.fbgemm.permute_pooled_embs_auto_grad_split(x, offsets, order, offsets, order)
            (y * torch.arange(48.0, device=device).reshape(3, 16)).sum().backward()
            return y.detach().cpu(), x.grad.cpu()

        (y_cpu, g_cpu), (y_zion, g_zion) = run("cpu"), run("zion")
        assert torch.equal(y_cpu, y_zion) and torch.equal(g_cpu, g_zion)
        from zion_emu import cost
        assert not [op for op in cost.guessed_ops(0) if op.startswith("fbgemm::")], cost.guessed_ops(0)
    """)
    assert done.returncode == 0, done.stderr


def test_a_cpu_kernel_that_records_its_own_autograd_graph_is_refused():
    # Like fbgemm's DENSE lookup, this op keeps its autograd inside its CPU
    # kernel and has no autograd kernel. Through zion's fallback the graph
    # would stay on the CPU aliases and the gradient be lost silently; the
    # fallback refuses instead.
    done = run_python("""
        import torch, zion_emu

        class Double(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return x * 2

            @staticmethod
            def backward(ctx, g):
                return g * 2

        lib = torch.library.Library("zion_test", "DEF")
        lib.define("double(Tensor x) -> Tensor")
        lib.impl("double", Double.apply, "CPU")
        x = torch.ones(3).to("zion").requires_grad_()
        with torch.no_grad():
            print("no grad", torch.ops.zion_test.double(x).sum().item())
        torch.ops.zion_test.double(x)
    """, check=False)
    assert "no grad 6.0" in done.stdout  # nothing to lose without autograd
    assert done.returncode != 0
    assert "zion: the CPU kernel of zion_test::double recorded an autograd graph on its result" in done.stderr


# --- ranks ---------------------------------------------------------------------

CONFIGS = [("table_wise", "sgd"), ("row_wise", "rowwise_adagrad")]


def _cpu_run(sharding: str, optimizer: str) -> str:
    done = run(torchrun(2, EXAMPLE, "--device", "cpu", "--sharding", sharding, "--optimizer", optimizer),
               timeout_s=RUN_TIMEOUT_S, check=True, env=child_env(OMP_NUM_THREADS="1"))
    return done.stdout


@pytest.mark.slow
@pytest.mark.multiproc
@pytest.mark.parametrize("sharding,optimizer", CONFIGS)
def test_two_ranks_on_zion_give_the_cpu_losses_bit_for_bit(sharding, optimizer):
    # Every plan has t0 table-wise, t1 as named, t2 column-wise and t3
    # data-parallel (the DENSE kernel).
    cpu = _losses(_cpu_run(sharding, optimizer))
    assert len(cpu) == 3 and len(set(cpu)) > 1
    args = ("--sharding", sharding, "--optimizer", optimizer)
    native = zion_emu_cli("run", "--nproc", "2", EXAMPLE, "--device", "zion", *args, timeout_s=RUN_TIMEOUT_S,
                          env=child_env(OMP_NUM_THREADS="1")).stdout
    assert _losses(native) == cpu
    compat = zion_emu_cli("run", "--nproc", "2", "--cuda-compat", EXAMPLE, *args, timeout_s=RUN_TIMEOUT_S,
                          env=child_env(OMP_NUM_THREADS="1")).stdout
    assert _losses(compat) == cpu

    for out in (native, compat):
        # The last step priced every op with a formula.
        assert _lines(out, "guessed_ops ") == [["guessed_ops", "{}"]]
        # Pooled embeddings cross the one 25 GB/s link between OAMs 0 and 1:
        # base latency + link latency + the largest block / link bandwidth.
        p = zion_emu.load_platform("zion")
        latency = (p.get("collectives.base_latency_ns") + p.get("fabric.latency_ns")) * 1e-9  # 6.6 + 0.6 us
        link = p.get("fabric.link_bandwidth_gb_per_s") * 1e9
        exchanges = _lines(out, "pooled_all_to_all ")
        assert exchanges
        for fields in exchanges:
            largest, modeled = int(fields[2]), float(fields[4])
            assert largest > 0
            assert modeled == pytest.approx(latency + largest / link, rel=1e-9)
