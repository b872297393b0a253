"""NCCL's own tuning model (NCCL v2.21.5, src/graph/tuning.cc and the channel
search of src/graph/search.cc) for 8 GPUs on one NVSwitch, worked by hand.

Channels (search.cc, no NICs on one node):
- A100 (sm_80), 12 NVLinks x 20.0 GB/s = 240 GB/s per GPU. Ring: 6 channels of
  40 GB/s fill 240, then ncclTopoDupChannels doubles them to 12 x 20 GB/s.
  Tree: the ring's 12 channels at the highest speed that fits: 20 GB/s.
- H100 (sm_90), 18 x 20.6 = 370.8 GB/s. Ring: 6 x 60 = 360 is the best
  product (7 x 50, 9 x 40, 12 x 30 do not beat it), doubled to 12 x 30.
  Tree: 12 x 30. NVLS: 8 channels (one per GPU), each taking (8 + 1) x speed
  of a GPU's link: 40 GB/s (9 x 50 = 450 > 370.8).
Both match the channel graphs NCCL prints on these machines
("nChannels 12, bw 20.000000/20.000000" on A100; "nChannels 12, bw 30" for ring
and tree, "nChannels 8, bw 40" for NVLS on H100 in NVIDIA/nccl#1197).

all_reduce over 8 ranks, one node: ring steps 2(n-1) = 14, ring algorithm
bandwidth = bus x 8/14, tree x 1/2, NVLS x 5/6. Latencies (us): ring
LL 6.6 + 14 x 0.6 = 15.0, LL128 14.0 + 14 x 1.9 = 40.6, Simple 8.4 + 14 x 3.4 =
56.0; tree LL 6.8 + 2 x 7 x 0.6 = 15.2, LL128 14.0 + 14 x 1.25 = 31.5, Simple
0 + 14 x 28 = 392; NVLS 25.
"""

from __future__ import annotations

import pytest
from pytest import approx

import zion_emu
from zion_emu import ConfigError, sim

KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30

# Algorithm bandwidths in GB/s (before the tree correction factor).
A100_BW = {
    ("Ring", "LL"): min(87.7, 240 * 0.5) * 8 / 14,  # llMaxBw Ampere 87.7 -> 50.114
    ("Ring", "LL128"): min(240 * 0.92, 12 * 20.0) * 8 / 14,  # 126.171
    ("Ring", "Simple"): 240 * 8 / 14,  # 137.143
    ("Tree", "LL"): min(min(240 * 0.92, 12 * 24.0) / 3.8, 87.7) * 0.5,  # 29.053
    ("Tree", "LL128"): min(220.8 * 7 / 9, 12 * 20.0) * 0.5,  # 85.867
    ("Tree", "Simple"): 220.8 * 0.5,  # 110.4
}
H100_BW = {
    ("Ring", "LL"): min(141.0, 360 * 0.5) * 8 / 14,  # llMaxBw Hopper 141 -> 80.571
    ("Ring", "LL128"): min(360 * 0.92, 12 * 36.7) * 8 / 14,  # 189.257
    ("Ring", "Simple"): 360 * 8 / 14,  # 205.714
    ("Tree", "LL"): min(min(360 * 0.92, 12 * 38.7) / 3.8, 141.0) * 0.5,  # 43.579
    ("Tree", "LL128"): min(331.2 * 7 / 9, 12 * 36.7) * 0.5,  # 128.8
    ("Tree", "Simple"): 331.2 * 0.5,  # 165.6
    ("NVLS", "Simple"): 8 * 40.0 * 5 / 6,  # 266.667
}
LAT_US = {("Ring", "LL"): 15.0, ("Ring", "LL128"): 40.6, ("Ring", "Simple"): 56.0,
          ("Tree", "LL"): 15.2, ("Tree", "LL128"): 31.5, ("Tree", "Simple"): 392.0, ("NVLS", "Simple"): 25.0}


def us(lat_us: float, nbytes: int, gbps: float) -> float:
    return lat_us + nbytes / (1000 * gbps)


# (size, chosen algorithm/protocol, hand-worked time in us, runner-up time in us)
A100_CASES = [
    # 8 B: ring LL 15.0 + 8/50114 vs tree LL 15.2 + ...
    (8, "Ring", "LL", us(15.0, 8, A100_BW["Ring", "LL"]), us(15.2, 8, A100_BW["Tree", "LL"])),
    # 64 KiB: log2(65536/64) = 10, tree LL factor 0.6: 15.2 + 65536/(29.05e3 x 0.6) = 18.96.
    (64 * KIB, "Ring", "LL", us(15.0, 64 * KIB, A100_BW["Ring", "LL"]), us(15.2, 64 * KIB, A100_BW["Tree", "LL"] * 0.6)),
    # 1 MiB: 15.0 + 20.92 = 35.92 vs ring LL128 40.6 + 8.31 = 48.91.
    (MIB, "Ring", "LL", us(15.0, MIB, A100_BW["Ring", "LL"]), us(40.6, MIB, A100_BW["Ring", "LL128"])),
    # 16 MiB: ring LL128 40.6 + 132.97 = 173.57 vs ring Simple 56.0 + 122.33 = 178.33.
    (16 * MIB, "Ring", "LL128", us(40.6, 16 * MIB, A100_BW["Ring", "LL128"]), us(56.0, 16 * MIB, A100_BW["Ring", "Simple"])),
    # 1 GiB: ring Simple 56 + 7829.37 = 7885.37 vs ring LL128 8550.78 (no tree factor past 256 MiB).
    (GIB, "Ring", "Simple", us(56.0, GIB, A100_BW["Ring", "Simple"]), us(40.6, GIB, A100_BW["Ring", "LL128"])),
]
H100_CASES = [
    (8, "Ring", "LL", us(15.0, 8, H100_BW["Ring", "LL"]), us(15.2, 8, H100_BW["Tree", "LL"])),
    (64 * KIB, "Ring", "LL", us(15.0, 64 * KIB, H100_BW["Ring", "LL"]), us(15.2, 64 * KIB, H100_BW["Tree", "LL"] * 0.6)),
    # 1 MiB: ring LL 15.0 + 13.01 = 28.01 vs NVLS 25 + 3.93 = 28.93.
    (MIB, "Ring", "LL", us(15.0, MIB, H100_BW["Ring", "LL"]), us(25.0, MIB, H100_BW["NVLS", "Simple"])),
    # 16 MiB: NVLS 25 + 62.91 = 87.91 vs ring LL128 40.6 + 88.65 = 129.25.
    (16 * MIB, "NVLS", "Simple", us(25.0, 16 * MIB, H100_BW["NVLS", "Simple"]), us(40.6, 16 * MIB, H100_BW["Ring", "LL128"])),
    # 1 GiB: NVLS 25 + 4026.53 = 4051.53 vs ring Simple 56 + 5219.58 = 5275.58.
    (GIB, "NVLS", "Simple", us(25.0, GIB, H100_BW["NVLS", "Simple"]), us(56.0, GIB, H100_BW["Ring", "Simple"])),
]
# NVLSTree (more than one node only) is reported under the model's two-level algorithm.
MODEL_NAME = {"Ring": "ring", "Tree": "double_binary_tree", "NVLS": "in_switch", "NVLSTree": "hierarchical"}


@pytest.mark.parametrize("cc,nvlink,nvls,ring,tree,nvls_graph", [
    (80, 12 * 20.0, False, (12, 20.0), (12, 20.0), (0, 0.0)),
    (90, 18 * 20.6, True, (12, 30.0), (12, 30.0), (8, 40.0)),
])
def test_channel_search(cc, nvlink, nvls, ring, tree, nvls_graph):
    t = sim.NcclTuning(cc, 8, nvlink, nvls)
    assert t.graph("Ring") == ring and t.graph("Tree") == tree and t.graph("NVLS") == nvls_graph
    # NVLSTree shares the NVLS graph (src/init.cc) but is off on one node: not in the table.
    assert t.graph("NVLSTree") == nvls_graph


def test_two_gpus_on_one_node_get_no_nvls():
    # src/transport/nvls.cc ncclNvlsInit returns with nvlsSupport 0 for 2 GPUs or fewer: a pair of H100s on
    # one NVSwitch node chooses among ring and tree only, as 3 GPUs choose NVLS again.
    def offered(ranks):
        return {c["algorithm"] for c in sim.NcclTuning(90, ranks, H100_N, True).candidates("all_reduce", MIB)}
    assert sim.NcclTuning(90, 2, H100_N, True).graph("NVLS") == (0, 0.0)
    assert offered(2) == {"Ring", "Tree"}
    assert sim.NcclTuning(90, 3, H100_N, True).graph("NVLS")[0] > 0
    assert offered(3) == {"Ring", "Tree", "NVLS"}


@pytest.mark.parametrize("cc,nvlink,nvls,table", [(80, 240.0, False, A100_BW), (90, 370.8, True, H100_BW)])
def test_latency_and_bandwidth_table(cc, nvlink, nvls, table):
    t = sim.NcclTuning(cc, 8, nvlink, nvls)
    # 16 MiB: log2(16 MiB / 64) = 18; tree factors LL .9, LL128 .9, Simple .7 there.
    got = {(c["algorithm"], c["protocol"]): c for c in t.candidates("all_reduce", 16 * MIB)}
    assert set(got) == set(table)
    factor = {"LL": 0.9, "LL128": 0.9, "Simple": 0.7}
    for key, gbps in table.items():
        expected = gbps * (factor[key[1]] if key[0] == "Tree" else 1.0)
        assert got[key]["bandwidth"] == approx(expected * 1e9, rel=1e-12), key
        assert got[key]["latency"] == approx(LAT_US[key] * 1e-6, rel=1e-12), key


@pytest.mark.parametrize("name,cases", [("hgx-a100", A100_CASES), ("hgx-h100", H100_CASES)])
def test_protocol_chosen_per_size_on_the_presets(name, cases):
    p = zion_emu.load_platform(name)
    for size, algo, proto, time_us, runner_up_us in cases:
        assert time_us < runner_up_us
        r = sim.collective(p, "all_reduce", size, 8)
        assert (r.algorithm, r.protocol) == (MODEL_NAME[algo], proto), size
        assert r.time * 1e6 == approx(time_us, rel=1e-9), size
        assert r.closed_form


def test_h100_choices_are_those_nccls_log_reported_on_one_8_gpu_node():
    # NVIDIA/nccl-tests#309 (qoofyk, 2025-05-23): NCCL's log on one node of
    # 8 H100 80GB HBM3 (VMs with a topology file, NCCL version not given),
    # all_reduce from 8 B to 16 GB: "8B~1MB: uses Algo RING proto LL",
    # "2MB~16GB uses Algo NVLS proto SIMPLE". The model's choice comes from
    # NCCL v2.21.5's tables alone (test_protocol_chosen_per_size_on_the_presets
    # works the times); at every power of two it is the logged one.
    p = zion_emu.load_platform("hgx-h100")
    for k in range(3, 35):
        r = sim.collective(p, "all_reduce", float(1 << k), 8)
        logged = ("ring", "LL") if (1 << k) <= MIB else ("in_switch", "Simple")
        assert (r.algorithm, r.protocol) == logged, 1 << k


def test_other_collectives_use_their_own_steps():
    # all_gather of 64 MiB on H100: ring steps n-1 = 7, ratio 8/7. Ring Simple
    # 8.4 + 7 x 3.4 = 32.2 us at 360 x 8/7 = 411.4 GB/s: 195.3 us; ring LL128
    # 14.0 + 7 x 1.9 = 27.3 us at 331.2 x 8/7 GB/s: 204.6 us; NVLS 25 us at
    # 266.7 GB/s: 276.7 us. The ring's 8/7 beats NVLS's 5/6 here.
    p = zion_emu.load_platform("hgx-h100")
    S = 64 * MIB
    ring_simple = us(8.4 + 7 * 3.4, S, 360 * 8 / 7)
    assert ring_simple < us(27.3, S, 331.2 * 8 / 7) < us(25.0, S, 266.6666666666667)
    r = sim.collective(p, "all_gather", S, 8)
    assert (r.algorithm, r.protocol) == ("ring", "Simple")
    assert r.time * 1e6 == approx(ring_simple, rel=1e-9)
    # broadcast: ring only, one hop of latency on channels that are the same
    # ring each: LL 6.6 + 0.6 = 7.2 us at min(141, 180) x 8/8 GB/s.
    b = sim.collective(p, "broadcast", 8, 8)
    assert (b.algorithm, b.protocol) == ("ring", "LL")
    assert b.time * 1e6 == approx(us(7.2, 8, 141.0), rel=1e-9)


def test_all_to_all_and_forced_algorithms_keep_the_topology_model():
    p = zion_emu.load_platform("hgx-a100")
    assert sim.collective(p, "all_to_all", MIB, 8).protocol == ""
    assert sim.collective(p, "all_reduce", MIB, 8, algo="ring").protocol == ""
    off = zion_emu.load_platform("hgx-a100", overrides={"collectives.nccl_tuner.enabled": False})
    assert sim.collective(off, "all_reduce", MIB, 8).protocol == ""


def test_subsets_of_ranks_get_their_own_tuning():
    # 4 of the A100s: ring steps 6, ratio 4/6; ring LL latency 6.6 + 6 x 0.6 = 10.2 us.
    p = zion_emu.load_platform("hgx-a100")
    r = sim.collective(p, "all_reduce", 8, [0, 1, 2, 3])
    assert (r.algorithm, r.protocol) == ("ring", "LL")
    assert r.time * 1e6 == approx(us(10.2, 8, min(87.7, 120.0) * 4 / 6), rel=1e-9)


def test_bad_tuning_inputs_are_refused():
    with pytest.raises(ValueError, match="compute capability 75 has no figures; allowed: 70, 80, 90"):
        sim.NcclTuning(75, 8, 240.0)
    with pytest.raises(ValueError, match="compute_capability"):
        zion_emu.load_platform("hgx-a100", overrides={"collectives.nccl_tuner.compute_capability": 86})



def test_the_tuner_can_be_added_by_override_to_a_platform_without_it():
    # `--set collectives.nccl_tuner.enabled=true` on zion was refused as an unknown field: an override could
    # only change fields the document had, and nccl_tuner is optional. The values are hgx-h100's.
    assignments = ["collectives.nccl_tuner.enabled=true", "collectives.nccl_tuner.compute_capability=90"]
    base = zion_emu.load_platform("zion", assignments=["fabric.topology=switch", *assignments])
    assert base.get("collectives.nccl_tuner.compute_capability") == 90
    r = sim.collective(base, "all_reduce", 8, 8)
    assert r.protocol == "LL"  # priced by the tuner: a protocol is named
    # Left incomplete, it names the missing field (and no advice about platform files' "base").
    with pytest.raises(ConfigError) as e:
        zion_emu.load_platform("zion", assignments=["collectives.nccl_tuner.enabled=true"])
    assert "field 'collectives.nccl_tuner.compute_capability' is missing" in str(e.value)
    assert "base" not in str(e.value)
    # A misspelt field is still refused, and the optional one is among those allowed.
    with pytest.raises(ConfigError, match=r"unknown field 'collectives.nccl_tunr.enabled' \(at 'collectives'\); "
                                          r"allowed: .*astra, base_latency_ns, nccl_tuner, pipeline_chunks"):
        zion_emu.load_platform("zion", assignments=["collectives.nccl_tunr.enabled=true"])

def test_other_fabrics_keep_the_topology_model():
    # The tuner's channel search is the NVSwitch one: a fully connected
    # variant of the preset prices auto by the topology model.
    p = zion_emu.load_platform("hgx-a100", overrides={"fabric.topology": "fully_connected"})
    assert sim.collective(p, "all_reduce", MIB, 8).protocol == ""


def test_the_nccl_tests_table_names_algorithm_and_protocol(capsys: pytest.CaptureFixture[str]):
    import json as _json

    from zion_emu.__main__ import main

    assert main(["collectives", "--platform", "hgx-h100", "--min-bytes", "1M", "--max-bytes", "16M",
                 "--step-factor", "16"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if line[:1].isspace() or line[:1].isdigit()]
    rows = [r for r in rows if r and r[0].isdigit()]
    assert [(int(r[0]), r[-1]) for r in rows] == [(MIB, "ring/LL"), (16 * MIB, "in_switch/Simple")]
    assert main(["collectives", "--platform", "hgx-h100", "--min-bytes", "16M", "--max-bytes", "16M", "--json"]) == 0
    (row,) = _json.loads(capsys.readouterr().out)
    assert (row["algorithm"], row["protocol"]) == ("in_switch", "Simple")
    assert row["time_us"] == approx(H100_CASES[3][3], rel=1e-6)


# --- the protocol in the backend's records -------------------------------------


def _world_of_eight_worker(rank: int, nprocs: int, store: str, name: str, cases: list) -> None:
    """Ranks 0 and 4 of a world of 8 (the rest modeled, as `zion-emu run
    --world-size 8 --ranks 0,4 --timing-only` runs it): each all_reduce is
    priced for all 8 GPUs of the node, so the record names NCCL's choice for
    8 ranks."""
    import os
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    import zion_emu.distributed as zd

    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    me = (0, 4)[rank]
    dist.init_process_group("zion", init_method=f"file://{store}", rank=me, world_size=8,
                            timeout=timedelta(seconds=60))
    torch.zion.set_device(me)
    assert zion_emu.current_platform().name == name
    for size, algo, proto, time_us, _ in cases:
        dist.all_reduce(torch.empty(size // 4, device="zion"))
        r = zd.last_collective()
        assert (r["op"], r["bytes"], r["devices"]) == ("all_reduce", size, list(range(8))), r
        assert (r["algorithm"], r["protocol"]) == (MODEL_NAME[algo], proto), (size, r)
        assert r["time"] * 1e6 == approx(time_us, rel=1e-9), (size, r)
    # A forced algorithm is the topology model's: no protocol.
    ring = dist.new_group(backend="zion", pg_options=zd.Options(algorithm="ring"))
    dist.all_reduce(torch.empty(256, device="zion"), group=ring)
    r = zd.last_collective(ring)
    assert (r["algorithm"], r["protocol"]) == ("ring", None), r
    dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.multiproc
@pytest.mark.parametrize("name,cases", [("hgx-a100", A100_CASES), ("hgx-h100", H100_CASES)])
def test_last_collective_names_the_protocol_nccl_chose(name, cases, tmp_path, monkeypatch):
    from processes import spawn

    # Timing-only: floating-point tensors hold no bytes, so 1 GiB costs no memory.
    monkeypatch.setenv("ZION_MODE", "timing")
    monkeypatch.setenv("ZION_PRESENT_RANKS", "0,4")
    monkeypatch.setenv("ZION_PLATFORM", name)
    spawn(_world_of_eight_worker, 2, tmp_path, name, cases, timeout_s=120)


# Two ranks of one node (n = 2): the channel graphs are the 8-rank ones (the
# ring search does not depend on n; the tree's budget 2 x capacity allows
# more, but its channels x speed must fit the capacity); ring steps 2(n-1) = 2,
# ratio 2/2 = 1. Ring latencies: LL 6.6 + 2 x 0.6 = 7.8 us, LL128 14.0 + 2 x
# 1.9 = 17.8, Simple 8.4 + 2 x 3.4 = 15.2.
# A100: LL min(87.7, 120) = 87.7 GB/s, LL128 min(220.8, 240) = 220.8, Simple 240.
#   64 KiB: LL 7.8 + 0.747 = 8.547 vs Simple 15.2 + 0.273 = 15.473.
#   1 MiB: Simple 15.2 + 4.369 = 19.569 vs LL 7.8 + 11.956 = 19.756 vs LL128
#   17.8 + 4.749 = 22.549; trees (factors LL .5, LL128 .6, Simple .5 at
#   log2(16384) = 14) from 8.0 + 72.2, 16.5 + 20.4 and 56 + 19.0.
# H100: LL min(141, 180) = 141, LL128 min(331.2, 440.4) = 331.2, Simple 360;
#   NVLS 2 channels (one per GPU) of 60 GB/s (3 x 60 = 180 <= 370.8) x 5/6 = 100 GB/s.
#   1 MiB: LL 7.8 + 7.437 = 15.237 vs Simple 15.2 + 2.913 = 18.113.
#   4 MiB: Simple 15.2 + 11.651 = 26.851 vs LL128 17.8 + 12.664 = 30.464 vs
#   LL 7.8 + 29.747 = 37.547 vs NVLS 25 + 41.943.
TWO_RANK_CASES = {
    "hgx-a100": [(64 * KIB, "ring/LL", us(7.8, 64 * KIB, 87.7)), (MIB, "ring/Simple", us(15.2, MIB, 240.0))],
    "hgx-h100": [(MIB, "ring/LL", us(7.8, MIB, 141.0)), (4 * MIB, "ring/Simple", us(15.2, 4 * MIB, 360.0))],
}


@pytest.mark.slow
@pytest.mark.multiproc
@pytest.mark.parametrize("name", ["hgx-a100", "hgx-h100"])
def test_bench_collectives_table_shows_the_protocol(name):
    import json as _json

    from processes import zion_emu_cli

    (small, small_shown, small_us), (large, large_shown, large_us) = TWO_RANK_CASES[name]
    args = ["bench-collectives", "--platform", name, "--nproc", "2", "--min-bytes", str(small), "--max-bytes",
            str(large), "--step-factor", str(large // small), "--iters", "1", "--warmup", "0"]
    table = zion_emu_cli(*args, timeout_s=180).stdout
    rows = [line.split() for line in table.splitlines() if line.strip() and not line.startswith("#")]
    # size, count, type, redop, root, time, algbw, busbw, algorithm, host, iters
    assert [(int(r[0]), float(r[5]), r[8]) for r in rows] == [
        (small, approx(small_us, abs=0.006), small_shown), (large, approx(large_us, abs=0.006), large_shown)]
    js = _json.loads(zion_emu_cli(*args, "--json", timeout_s=180).stdout)
    assert [(r["bytes"], f"{r['algorithm']}/{r['protocol']}") for r in js] == [(small, small_shown), (large, large_shown)]
    assert [r["time_ns"] for r in js] == [approx(small_us * 1e3, abs=1e-3), approx(large_us * 1e3, abs=1e-3)]


# ---------------------------------------------------------------------------
# The pipeline time model (collectives.nccl_tuner.time_model = "pipeline"):
# NCCL v2.21.5's ring kernels, worked by hand. Figures: src/init.cc buffers
# (LL 8 lines x 512 threads x 8 steps x 16 B = 512 KiB, 64 KiB a step, 32 KiB of
# data; Simple 4 MiB, 512 KiB a step, all_reduce / all_gather chunks of
# NCCL_STEPS / 2 = 4 steps = 2 MiB in 2 slices; broadcast chunks of 1 step),
# src/enqueue.cc (channels launched, threads, aligned split over channels, last
# chunk), src/graph/tuning.cc (baseLat, hwLat[NVLINK][Ring]: LL 6.6 / 0.6 us,
# Simple 8.4 / 3.4 us). A100: 24 collective channels (12 search channels
# doubled); with all 24 launched a channel's bandwidth is the ring's bus
# bandwidth / 24: LL 87.7 GB/s / 24, Simple 240 / 24 = 10 GB/s.

def _a100_tuning():
    return sim.NcclTuning(80, 8, 240.0, False)


def test_pipeline_one_mib_all_reduce_ring_ll_on_8_ranks_by_hand():
    t = _a100_tuning()
    assert t.collective_channels == 24
    lau = t.launch("all_reduce", MIB, "Ring", "LL")
    # Channels: 1 MiB >= 24 x 512 threads x (8 x 8 ranks) = 786,432, so all 24; threads stay 512.
    # Split: ceil(1,048,576 / 24) = 43,691 rounded up to LL's alignment 8 B x 512 = 4,096 -> 45,056
    # (11 x 4,096); 1 MiB / 45,056 -> 24 channels. A loop covers 8 ranks x 32 KiB = 256 KiB > 45,056:
    # one loop, whose chunk is ceil(45,056 / 8) = 5,632 rounded up to 4,096 -> 8,192 B.
    # 14 sends of 8,192 B, each h = 8,192 / (87.7e9 / 24) s = 2.2418 us. LL passes data on line by line
    # (prims_ll.h), so a send follows the previous one max(h, 0.6 us hop) later: 13 x h + h, and the last line
    # lands a hop after it left.
    assert (lau["modeled"], lau["channels"], lau["threads"], lau["channel_bytes"]) == (True, 24, 512, 45056)
    assert (lau["chunk_bytes"], lau["loops"], lau["last_chunk_bytes"], lau["sends"], lau["slices"]) == \
        (32768, 1, 8192, 14, 1)
    assert lau["channel_bandwidth"] == approx(87.7e9 / 24)
    h = 8192 / (87.7e3 / 24)
    assert lau["time"] * 1e6 == approx(6.6 + 14 * h + 0.6, rel=1e-12)  # 38.59 us
    # The tuner's own price of the same pair: 15.0 + 1 MiB / 50.114 GB/s = 35.92 us.
    assert t.choose("all_reduce", MIB)[:2] == ("Ring", "LL")
    assert t.choose("all_reduce", MIB)[2] * 1e6 == approx(us(15.0, MIB, A100_BW[("Ring", "LL")]))


def test_pipeline_32_mib_all_reduce_ring_simple_hides_the_hop_behind_the_second_slice():
    lau = _a100_tuning().launch("all_reduce", 32 * MIB, "Ring", "Simple")
    # 32 MiB / 24 = 1,398,101.3 -> 1,398,102 rounded up to 4,096 -> 1,400,832 (342 x 4,096); 24 channels.
    # Threads 512 + a sync warp. One loop (8 x 2 MiB > 1,400,832): chunk ceil(1,400,832 / 8) = 175,104 ->
    # 176,128 (43 x 4,096), cut in 2 slices of 88,064 B (above 512 KiB x 2 / 32 = 32 KiB).
    assert (lau["channels"], lau["threads"], lau["channel_bytes"], lau["loops"], lau["last_chunk_bytes"],
            lau["slices"]) == (24, 544, 1400832, 1, 176128, 2)
    # A slice takes h = 88,064 / 10e9 s = 8.8064 us > the 3.4 us hop: slice 0 of send j arrives (h + 3.4 after
    # it started) before the rank has sent slice 1 of send j - 1, so the channel never waits:
    # 14 sends x 2 slices x h, then the last hop; plus the base latency.
    h = 88064 / 10e3
    assert lau["time"] * 1e6 == approx(8.4 + 28 * h + 3.4, rel=1e-12)  # 258.38 us


def test_pipeline_all_gather_latency_bound_slices_fill_and_drain():
    # 12 MiB gathered: each rank's 1.5 MiB piece / 24 channels = 65,536 B per channel (aligned), one loop of
    # one chunk of 65,536 in 2 slices of 32,768 (= 512 KiB x 2 / 32). h = 3.2768 us < the 3.4 us hop, so the
    # slices wait on the ring: slice 0 of send j starts j (h + 3.4) in, and the last of 7 sends ends at
    # (7 + 2 - 1) h + 6 x 3.4, the receive a hop later: (sends + slices - 1) h + sends x hop.
    lau = _a100_tuning().launch("all_gather", 12 * MIB, "Ring", "Simple")
    assert (lau["channels"], lau["channel_bytes"], lau["loops"], lau["last_chunk_bytes"], lau["sends"],
            lau["slices"]) == (24, 65536, 1, 65536, 7, 2)
    h = 32768 / 10e3
    assert lau["time"] * 1e6 == approx(8.4 + 8 * h + 7 * 3.4, rel=1e-12)  # 58.41 us


def test_pipeline_all_reduce_loops_run_one_after_another():
    # 768 MiB: 32 MiB per channel = 2 loops of 8 x 2 MiB, chunks of 2 MiB in 2 slices of 1 MiB
    # (h = 104.8576 us, bandwidth-bound): each loop 28 h + 3.4, the loops in sequence.
    lau = _a100_tuning().launch("all_reduce", 768 * MIB, "Ring", "Simple")
    assert (lau["channel_bytes"], lau["loops"], lau["last_chunk_bytes"]) == (32 * MIB, 2, 2 * MIB)
    h = MIB / 10e3
    assert lau["time"] * 1e6 == approx(8.4 + 2 * (28 * h + 3.4), rel=1e-12)


def test_pipeline_broadcast_is_a_chain_of_chunks():
    # 48 MiB: 2 MiB per channel = 4 chunks of one 512 KiB step (BROADCAST_CHUNKSTEPS 1) down 7 hops. The last
    # rank has the last chunk after (4 chunks + 7 hops - 1) x h + 6 hops' latency, and a hop later it arrives:
    # (k + n - 2) h + (n - 1) x 3.4, h = 524,288 / 10e9 s.
    lau = _a100_tuning().launch("broadcast", 48 * MIB, "Ring", "Simple")
    assert (lau["channels"], lau["channel_bytes"], lau["chunk_bytes"], lau["loops"], lau["sends"], lau["slices"]) \
        == (24, 2 * MIB, 512 * KIB, 4, 7, 1)
    h = 512 * KIB / 10e3
    assert lau["time"] * 1e6 == approx(8.4 + 10 * h + 7 * 3.4, rel=1e-12)
    # 4,096 B more a channel: a fifth, smaller chunk (h' = 0.4096 us) trails the four. Rank m has sent chunk 4
    # at (m + 4) h + m x 3.4; the small one follows at once (it arrived earlier), so the last rank is done at
    # 10 h + 6 x 3.4 + h' and the chunk arrives a hop later.
    more = _a100_tuning().launch("broadcast", 24 * (2 * MIB + 4096), "Ring", "Simple")
    assert (more["channel_bytes"], more["loops"], more["last_chunk_bytes"]) == (2 * MIB + 4096, 5, 4096)
    assert more["time"] * 1e6 == approx(8.4 + 10 * h + 7 * 3.4 + 0.4096, rel=1e-12)
    # A petabyte is counted, not walked chunk by chunk.
    huge = _a100_tuning().launch("broadcast", 1e15, "Ring", "Simple")
    assert huge["loops"] == approx(1e15 / 24 / (512 * KIB), rel=1e-6)


def test_pipeline_ll128_passes_lines_on():
    # 4 MiB ring LL128 on A100: 20 warps, so pieces of 480 x 20 = 9,600 B: ceil(4 MiB / 24) = 174,763 -> 182,400
    # (19 x 9,600), ceil(4,194,304 / 182,400) = 23 channels. One loop (8 x 576,000 > 182,400): chunk
    # ceil(182,400 / 8) = 22,800 -> 28,800. Bandwidth for 23 of 24 channels: min(240 x 23/24 x 0.92, 12 x 23/24 x
    # 20) = 211.6 GB/s over 23 = 9.2 GB/s. h = 28,800 / 9.2e3 = 3.1304 us > the 1.9 us hop: 14.0 + 14 h + 1.9.
    lau = _a100_tuning().launch("all_reduce", 4 * MIB, "Ring", "LL128")
    assert (lau["channels"], lau["threads"], lau["channel_bytes"], lau["loops"], lau["last_chunk_bytes"]) == \
        (23, 640, 182400, 1, 28800)
    assert lau["channel_bandwidth"] == approx(9.2e9)
    assert lau["time"] * 1e6 == approx(14.0 + 14 * 28800 / 9.2e3 + 1.9, rel=1e-12)  # 59.73 us


def test_pipeline_ll_broadcast_chain_passes_lines_on():
    # 1 MiB broadcast ring LL on A100: 24 channels of 45,056 B, chunks of one LL step, 32,768 B: a full one and
    # 12,288 B. Line by line, rank m starts chunk i at i h + m x 0.6 us, so the last line lands at
    # h + h' + 7 hops. h = 32,768 / (87.7e9 / 24) s = 8.967 us, h' = 3.363 us.
    lau = _a100_tuning().launch("broadcast", MIB, "Ring", "LL")
    assert (lau["channels"], lau["channel_bytes"], lau["chunk_bytes"], lau["loops"], lau["last_chunk_bytes"],
            lau["sends"]) == (24, 45056, 32768, 2, 12288, 7)
    bw = 87.7e3 / 24
    assert lau["time"] * 1e6 == approx(6.6 + 32768 / bw + 12288 / bw + 7 * 0.6, rel=1e-12)  # 23.13 us


def test_pipeline_small_calls_launch_fewer_channels_and_threads():
    # 64 KiB ring LL: 65,536 < c x 512 x 64 down to c = 2; threads stay 512 (65,536 = 2 x 512 x 64).
    # Split 32,768 per channel (aligned to 4,096); chunk ceil(32,768 / 8) = 4,096.
    lau = _a100_tuning().launch("all_reduce", 64 * KIB, "Ring", "LL")
    assert (lau["channels"], lau["threads"], lau["channel_bytes"], lau["last_chunk_bytes"]) == (2, 512, 32768, 4096)
    # Bandwidth: the tuner's ring LL formula for 2 of the 24 channels: 240 GB/s x 2/24 = 20, LL min(87.7, 20 x
    # 0.5) = 10 GB/s, 5 GB/s a channel (llMaxBw caps all the channels together, and 2 do not reach it).
    assert lau["channel_bandwidth"] == approx(5e9)
    assert lau["time"] * 1e6 == approx(6.6 + 14 * (4096 / 5e3) + 0.6, rel=1e-12)  # h = 0.8192 us > the hop
    # 8 B: one channel; threads 512 -> 256 -> 128 -> 64 (8 < 1 x 64 x 64), then the 3-warp floor: 96.
    # The step moves what is there: 8 B.
    tiny = _a100_tuning().launch("all_reduce", 8, "Ring", "LL")
    assert (tiny["channels"], tiny["threads"], tiny["channel_bytes"], tiny["last_chunk_bytes"]) == (1, 96, 8, 8)
    assert tiny["channel_bandwidth"] == approx(5e9)  # min(87.7, 240 / 24 x 0.5)
    # h = 0.0016 us < the 0.6 us hop: each send waits on the previous rank's first line, 13 hops, then the
    # last send's h and the hop its last line takes: the tuner's 14 hops plus one h.
    assert tiny["time"] * 1e6 == approx(6.6 + 13 * 0.6 + 8 / 5e3 + 0.6, rel=1e-12)


def test_pipeline_keeps_tree_at_the_tuners_price():
    t = sim.NcclTuning(90, 8, 370.8, True)
    lau = t.launch("all_reduce", 8 * MIB, "Tree", "LL128")
    tuner = next(c for c in t.candidates("all_reduce", 8 * MIB) if (c["algorithm"], c["protocol"]) == ("Tree", "LL128"))
    assert lau["modeled"] is False and lau["time"] == tuner["time"]


# NVLS all_reduce on one node (NCCL v2.21.5 src/device/all_reduce.h, the oneNode branch of the NVLS kernel):
# 16 channels (src/transport/nvls.cc NCCL_NVLS_NCHANNELS), 640 threads (NCCL_MAX_NTHREADS), the count split in
# 4,096-byte pieces (NCCL_SIMPLE_ALIGNMENT), chunks from computeCollChunkInfo's NVLS branch: a Simple step of
# 512 KiB capped at nvlsChunkSize 128 KiB, to 64 KiB below 64 x ops x chunk, 32 KiB below 8 x ops x chunk,
# 16 KiB below 2 x ops x chunk (ops = channels x 8 heads). A channel's loop is 8 heads x chunk; the scatter,
# reduce and gather warp groups pass each loop on like a 3-stage pipeline, each stage moving the loop at a
# channel's share of the tuner's NVLS bandwidth, 266.667 GB/s / 16 = 16.667 GB/s: sum of the loops + 2 x the
# longest, after NVLS's 25 us.
H100_NVLS_CHANNEL = H100_BW["NVLS", "Simple"] / 16 * 1e9  # bytes/s


def _h100_tuning():
    return sim.NcclTuning(90, 8, 370.8, True)


@pytest.mark.parametrize("size,chunk,loops,last,loop_bytes", [
    # 2 MiB: 131,072 B a channel (32 x 4,096), 16 channels, ops 128: 2 MiB < 1 GiB -> 64 KiB, < 64 MiB -> 32 KiB,
    # < 8 MiB -> 16 KiB. A loop of 8 x 16 KiB = 131,072: one loop, 25 + 3 x 7.864 = 48.59 us.
    (2 * MIB, 16384, 1, 16384, [131072]),
    # 32 MiB: 2 MiB a channel; 32 MiB < 64 MiB -> 32 KiB, not < 8 MiB: loops of 262,144, 8 of them,
    # 25 + (8 + 2) x 15.729 = 182.29 us.
    (32 * MIB, 32768, 8, 32768, [262144] * 8),
    # 33 MiB: 2,162,688 B a channel = 8 loops + 65,536 B; the last loop's chunk is ceil(65,536 / 8) = 8,192
    # (two 4,096 pieces) and the stage moves the 65,536 left: 25 + 8 x 15.729 + 3.932 + 2 x 15.729.
    (33 * MIB, 32768, 9, 8192, [262144] * 8 + [65536]),
    # 1 GiB: not < 64 x 128 x 128 KiB = 1 GiB, so 128 KiB chunks; 64 MiB a channel = 64 loops of 1 MiB.
    (GIB, 131072, 64, 131072, [MIB] * 64),
])
def test_pipeline_nvls_all_reduce_by_hand(size, chunk, loops, last, loop_bytes):
    lau = _h100_tuning().launch("all_reduce", size, "NVLS", "Simple")
    assert (lau["modeled"], lau["channels"], lau["threads"], lau["channel_bytes"]) == (True, 16, 640, size / 16)
    assert (lau["chunk_bytes"], lau["loops"], lau["last_chunk_bytes"], lau["sends"]) == (chunk, loops, last, 3)
    assert lau["channel_bandwidth"] == approx(H100_NVLS_CHANNEL)
    assert sum(loop_bytes) == size / 16
    stage = [b / H100_NVLS_CHANNEL for b in loop_bytes]
    assert lau["time"] == approx(25e-6 + sum(stage) + 2 * max(stage), rel=1e-12)


@pytest.mark.parametrize("op", ["all_gather", "reduce_scatter"])
def test_pipeline_nvls_all_gather_and_reduce_scatter_by_hand(op):
    # all_gather.h / reduce_scatter.h (not registered): two warp groups (broadcast through NVLS and gather;
    # scatter and NVLS reduce), each stepping through the rank's piece one chunk a loop. The chunk comes from the
    # call's nBytes (info.h: all_gather / reduce_scatter nBytes = the per-rank count x nRanks), so 32 MiB gets
    # all_reduce's 32 KiB. The piece, 4 MiB, over 16 channels: 262,144 B a channel = 8 loops. A loop's stage
    # moves 8 heads x 32 KiB of the call's bytes: h = 262,144 / 16.667 GB/s = 15.729 us; 25 + 8 h + 1 x h.
    lau = _h100_tuning().launch(op, 32 * MIB, "NVLS", "Simple")
    assert (lau["modeled"], lau["channels"], lau["channel_bytes"], lau["chunk_bytes"], lau["loops"],
            lau["last_chunk_bytes"], lau["sends"]) == (True, 16, 262144, 32768, 8, 32768, 2)
    h = 8 * 32768 / H100_NVLS_CHANNEL
    assert lau["time"] == approx(25e-6 + 9 * h, rel=1e-12)  # 166.56 us
    # 33 MiB: 270,336 B a channel = 8 chunks + 8,192 B; the last loop moves 8 x 8,192 of the call's bytes.
    more = _h100_tuning().launch(op, 33 * MIB, "NVLS", "Simple")
    assert (more["channel_bytes"], more["loops"], more["last_chunk_bytes"]) == (270336, 9, 8192)
    assert more["time"] == approx(25e-6 + 9 * h + 8 * 8192 / H100_NVLS_CHANNEL, rel=1e-12)


def test_pipeline_nvls_small_call_runs_fewer_channels():
    # 48 KiB: ceil(49,152 / 16) = 3,072 -> 4,096 a channel, so ceil(49,152 / 4,096) = 12 channels. One loop of
    # what is there (4,096 < 8 x 16 KiB); its chunk ceil(4,096 / 8) = 512 -> 4,096. 25 + 3 x 4,096 / 16.667 GB/s.
    lau = _h100_tuning().launch("all_reduce", 48 * KIB, "NVLS", "Simple")
    assert (lau["channels"], lau["channel_bytes"], lau["chunk_bytes"], lau["loops"], lau["last_chunk_bytes"]) == \
        (12, 4096, 16384, 1, 4096)
    assert lau["time"] * 1e6 == approx(25 + 3 * 4096 / (H100_NVLS_CHANNEL / 1e6), rel=1e-12)  # 25.74 us
    empty = _h100_tuning().launch("all_reduce", 0, "NVLS", "Simple")
    assert (empty["loops"], empty["time"]) == (0, approx(25e-6))


def test_pipeline_launch_rejects_what_nccl_does_not_offer():
    t = _a100_tuning()
    with pytest.raises(ValueError, match="allowed: LL, LL128, Simple"):
        t.launch("all_reduce", MIB, "Ring", "LL64")
    with pytest.raises(ValueError, match="allowed: Tree, Ring, NVLS, NVLSTree"):
        t.launch("all_reduce", MIB, "Star", "LL")
    with pytest.raises(ValueError, match="NVLS"):
        t.launch("all_reduce", MIB, "NVLS", "Simple")  # no NVLS on this A100 node
    with pytest.raises(ValueError, match="all_to_all"):
        t.launch("all_to_all", MIB, "Ring", "Simple")


@pytest.mark.parametrize("name", ["hgx-a100", "hgx-h100"])
def test_time_model_option_prices_the_tuners_choice(name):
    tuner = zion_emu.load_platform(name)
    assert tuner.get("collectives.nccl_tuner.time_model") == "tuner"
    pipe = zion_emu.load_platform(name, overrides={"collectives.nccl_tuner.time_model": "pipeline"})
    p = tuner
    t = sim.NcclTuning(p.get("collectives.nccl_tuner.compute_capability"), 8,
                       p.get("fabric.links_per_pair") * p.get("fabric.link_bandwidth_gb_per_s"),
                       p.get("fabric.in_switch_reduction"))
    for size in (8, 64 * KIB, MIB, 32 * MIB, GIB):
        algo, proto, tuner_s = t.choose("all_reduce", size)
        a = sim.collective(tuner, "all_reduce", size, 8)
        b = sim.collective(pipe, "all_reduce", size, 8)
        # The same choice; the time is the tuner's or the launch's.
        assert (a.algorithm, a.protocol) == (b.algorithm, b.protocol) and a.protocol == proto
        assert a.time == approx(tuner_s, rel=1e-12)
        assert b.time == approx(t.launch("all_reduce", size, algo, proto)["time"], rel=1e-12)


def test_time_model_must_be_tuner_or_pipeline():
    with pytest.raises(Exception, match=r"time_model.*allowed.*tuner.*pipeline|tuner, pipeline"):
        zion_emu.load_platform("hgx-a100", overrides={"collectives.nccl_tuner.time_model": "fast"})


# --- more than one node ---------------------------------------------------------
#
# NCCL v2.21.5 across nodes (src/graph/search.cc ncclTopoCompute with NICs,
# src/graph/tuning.cc ncclTopoTuneModel and ncclTopoGetAlgoTime), worked by
# hand for nodes of 8 GPUs of the presets.
#
# GPU-to-NIC path (system->maxBw): min(NIC speed / 8, PCIe x16 links).
#   hgx-h100: min(400 / 8 = 50, 16 x 3.0 = 48) = 48 GB/s; 8 NICs, two per PCIe
#   switch with two GPUs each (each NIC at PIX from two GPUs).
#   hgx-a100: min(200 / 8 = 25, 16 x 1.5 = 24) = 24 GB/s; 8 NICs likewise.
# Ring search (speedArrayInter / sm90SpeedArrayInter; one channel per NIC at
# a speed above half the path): H100 48 GB/s, 8 channels x 48 = 384 >= the
# GPU's 18 x 20.6 = 370.8 GB/s: done; ncclTopoDupChannels keeps them (Hopper,
# < 50 GB/s, > 4 channels). A100 24 GB/s, 8 x 24 = 192; 12 GB/s gives 16 x 12
# = 192, not more, and 10 / 24 < 0.49 ends pass 1; 24 < 25 is not duplicated;
# pass 2: 28, 30, 48 exceed the NIC. Ring graphs: bwIntra = bwInter.
# Balanced tree: the ring's 8 channels at the first speed that fits: 48 (H100),
# 24 (A100); pass 2 raises bwIntra alone while below 2 x bwInter and the
# NVLink chains fit: H100 is already at the top speed; A100 28 then 30
# (8 x 30 = 240 = the GPU's 12 x 20 GB/s), 48 does not fit.
# The communicator's channels: 2 x min(8, 8) = 16 (ncclTopoPostset).
# NVLS graph with NICs (hgx-h100 only: NVLink SHARP, sm_90, more than 2 GPUs
# per node; NVLS and NVLSTree share it). One channel per NIC, headed by the
# GPU local to that NIC, taking bwInter of its GPU-to-NIC path and bwIntra of
# every GPU's NVLink, twice of its head's: c channels fit while (c + 1) x
# bwIntra <= 370.8. Pass 1 from 48: 48 gives 6 (7 x 48 = 336; 8 x 48 = 384 >
# 370.8), 45 gives 7 (8 x 45 = 360), kept; 42 gives 7, not more; 40 gives 8
# (9 x 40 = 360) = ngpus: done. No duplication for NVLS. Pass 2 raises
# bwInter alone while below 2 x bwIntra: 42, 45, 48 (the path's 48 holds each
# way): 8 channels, bwIntra 40, bwInter 48.
#
# ncclTopoTuneModel: bw per channel = bwIntra up to 2 nodes, bwInter beyond;
# the N2 column (index2 = 1) at 2 nodes, N4 (index2 = 2) at 16; llMaxBw by
# CPU vendor (H100 preset Intel: llMaxBws[0] = {39.0, 39.0, 20.4}; A100 preset
# AMD: llMaxBws[1] = {87.7, 22.5, 19.0}); perChMaxRingLL128Bws Ampere 20.0,
# Hopper 36.7; perChMaxTreeBws Ampere {24.0, 23.6, 17.8}, Hopper {38.7, 41.4,
# 36.0}; perChMaxTreeLL128Bws Ampere 20.0, Hopper {36.7, 36.7, 29.0}; tree
# LL128 x 120/128 across nodes. NVLS is off across nodes (no CollNet).
# NVLSTree (all_reduce, Simple only, nNodes > 1): per channel min(bwIntra,
# bwInter up to 2 nodes, bwInter / 2 beyond), x 5/6; latency baseLat 0 +
# hwLat[NVLINK][NVLSTree] 25 + 2 x log2(nNodes) x hwLat[NET][NVLSTree] 14.
# Latency: ring all_reduce nsteps = 2(N - 1), nInterSteps = 2 x nNodes:
# baseLat + (nsteps - nInterSteps) x max(hwLat[NVLINK], netOverhead) +
# nInterSteps x hwLat[NET]; netOverhead Intel 1 us, AMD 2 us, x 3 for Simple.
# hwLat[NET] Ring {2.7, 4.0, 14.0}, Tree {5.0, 8.5, 28}. Tree: baseLat +
# 2 x ((N / nNodes - 1) x hwLat[NVLINK] + log2(nNodes) x hwLat[NET]).
# ncclTopoGetAlgoTime: ring Simple all_reduce latency x 1.4 (Ampere and
# later) once nBytes / (16 channels x N) >= 64.

H100_N = 18 * 20.6  # the GPU's NVLink (system->totalBw)
NET_RING = {"LL": 2.7, "LL128": 4.0, "Simple": 14.0}   # hwLat[NET][Ring]
NET_TREE = {"LL": 5.0, "LL128": 8.5, "Simple": 28.0}   # hwLat[NET][Tree]
NET_NVLS_TREE, NVL_NVLS_TREE = 14.0, 25.0               # hwLat[NET] / hwLat[NVLINK][NVLSTree][Simple]
NVL_RING = {"LL": 0.6, "LL128": 1.9, "Simple": 3.4}    # hwLat[NVLINK][Ring]
NVL_TREE = {"LL": 0.6, "LL128": 1.25, "Simple": 28.0}  # hwLat[NVLINK][Tree]
BASE_RING = {"LL": 6.6, "LL128": 14.0, "Simple": 8.4}
BASE_TREE = {"LL": 6.8, "LL128": 14.0, "Simple": 0.0}


def _ring_lat(nranks, nnodes, overhead):
    nsteps, inter = 2 * (nranks - 1), 2 * nnodes
    return {p: BASE_RING[p] + (nsteps - inter) * max(NVL_RING[p], overhead * (3 if p == "Simple" else 1))
            + inter * NET_RING[p] for p in BASE_RING}


def _tree_lat(ppn, log2_nodes):
    return {p: BASE_TREE[p] + 2 * ((ppn - 1) * NVL_TREE[p] + log2_nodes * NET_TREE[p]) for p in BASE_TREE}


def _nvls_tree_lat(log2_nodes):
    return 0.0 + NVL_NVLS_TREE + 2 * log2_nodes * NET_NVLS_TREE


# (preset, nodes): ring and tree (channels, bwIntra, bwInter), the all_reduce
# table (GB/s of algorithm bandwidth before the tree factor, us before the plateau).
ACROSS = {
    ("hgx-h100", 2): dict(
        ring=(8, 48.0, 48.0), tree=(8, 48.0, 48.0), nvls=(8, 40.0, 48.0),
        bw={("Ring", "LL"): min(39.0, 8 * 48 * 0.5) * 16 / 30,             # 20.8
            ("Ring", "LL128"): min(8 * 48 * 0.92, 8 * 36.7) * 16 / 30,     # 293.6 x 16/30 = 156.587
            ("Ring", "Simple"): 8 * 48 * 16 / 30,                          # 204.8
            ("Tree", "LL"): min(min(8 * 48 * 0.92, 8 * 41.4) / 3.8, 39.0) * 0.5,  # 331.2 -> 39 x 0.5 = 19.5
            ("Tree", "LL128"): min(331.2 * 120 / 128, 8 * 36.7) * 0.5,     # 146.8
            ("Tree", "Simple"): 331.2 * 0.5,                               # 165.6
            ("NVLSTree", "Simple"): 8 * min(40.0, 48.0) * 5 / 6},          # 266.667
        # ring 43.4 / 79.4 / 152.8; tree 25.2 / 48.5 / 448; NVLSTree 25 + 2 x 1 x 14 = 53
        lat={**{("Ring", p): v for p, v in _ring_lat(16, 2, 1.0).items()},
             **{("Tree", p): v for p, v in _tree_lat(8, 1).items()}, ("NVLSTree", "Simple"): _nvls_tree_lat(1)}),
    ("hgx-h100", 16): dict(
        ring=(8, 48.0, 48.0), tree=(8, 48.0, 48.0), nvls=(8, 40.0, 48.0),
        bw={("Ring", "LL"): min(20.4, 8 * 48 * 0.5) * 128 / 254,           # 10.280
            ("Ring", "LL128"): min(8 * 48 * 0.92, 8 * 36.7) * 128 / 254,   # 147.956
            ("Ring", "Simple"): 8 * 48 * 128 / 254,                        # 193.512
            ("Tree", "LL"): min(min(8 * 48 * 0.92, 8 * 36.0) / 3.8, 20.4) * 0.5,  # 288 -> 20.4 x 0.5 = 10.2
            ("Tree", "LL128"): min(288 * 120 / 128, 8 * 29.0) * 0.5,       # 232 x 0.5 = 116
            ("Tree", "Simple"): 288 * 0.5,                                 # 144
            ("NVLSTree", "Simple"): 8 * min(40.0, 48.0 / 2) * 5 / 6},      # 160
        # ring 315.0 / 563.8 / 1211.2; tree 55.2 / 99.5 / 616; NVLSTree 25 + 2 x 4 x 14 = 137
        lat={**{("Ring", p): v for p, v in _ring_lat(128, 16, 1.0).items()},
             **{("Tree", p): v for p, v in _tree_lat(8, 4).items()}, ("NVLSTree", "Simple"): _nvls_tree_lat(4)}),
    ("hgx-a100", 2): dict(
        ring=(8, 24.0, 24.0), tree=(8, 30.0, 24.0), nvls=(0, 0.0, 0.0),
        bw={("Ring", "LL"): min(22.5, 8 * 24 * 0.5) * 16 / 30,             # 12.0
            ("Ring", "LL128"): min(8 * 24 * 0.92, 8 * 20.0) * 16 / 30,     # 160 x 16/30 = 85.333
            ("Ring", "Simple"): 8 * 24 * 16 / 30,                          # 102.4
            # tree at 2 nodes: bwIntra 30
            ("Tree", "LL"): min(min(8 * 30 * 0.92, 8 * 23.6) / 3.8, 22.5) * 0.5,  # 188.8 -> 22.5 x 0.5 = 11.25
            ("Tree", "LL128"): min(188.8 * 120 / 128, 8 * 20.0) * 0.5,     # 80
            ("Tree", "Simple"): 188.8 * 0.5},                              # 94.4
        # ring 69.4 / 82.0 / 220.4 (AMD: netOverhead 2 us); tree 25.2 / 48.5 / 448
        lat={**{("Ring", p): v for p, v in _ring_lat(16, 2, 2.0).items()},
             **{("Tree", p): v for p, v in _tree_lat(8, 1).items()}}),
    ("hgx-a100", 16): dict(
        ring=(8, 24.0, 24.0), tree=(8, 30.0, 24.0), nvls=(0, 0.0, 0.0),
        bw={("Ring", "LL"): min(19.0, 8 * 24 * 0.5) * 128 / 254,           # 9.575
            ("Ring", "LL128"): min(8 * 24 * 0.92, 8 * 20.0) * 128 / 254,   # 80.630
            ("Ring", "Simple"): 8 * 24 * 128 / 254,                        # 96.756
            # tree beyond 2 nodes: bwInter 24
            ("Tree", "LL"): min(min(8 * 24 * 0.92, 8 * 17.8) / 3.8, 19.0) * 0.5,  # 142.4 -> 19 x 0.5 = 9.5
            ("Tree", "LL128"): min(142.4 * 120 / 128, 8 * 20.0) * 0.5,     # 133.5 x 0.5 = 66.75
            ("Tree", "Simple"): 142.4 * 0.5},                              # 71.2
        # ring 537.0 / 586.0 / 1788.4; tree 55.2 / 99.5 / 616
        lat={**{("Ring", p): v for p, v in _ring_lat(128, 16, 2.0).items()},
             **{("Tree", p): v for p, v in _tree_lat(8, 4).items()}}),
}
# treeCorrectionFactor at log2(nBytes / 64): 8 B -> 0, 64 KiB -> 10, 1 MiB -> 14, 16 MiB -> 18, 1 GiB -> 24 (none).
TREE_FACTOR = {8: {"LL": 1.0, "LL128": 1.0, "Simple": 0.9}, 64 * KIB: {"LL": 0.6, "LL128": 0.6, "Simple": 0.6},
               MIB: {"LL": 0.5, "LL128": 0.6, "Simple": 0.5}, 16 * MIB: {"LL": 0.9, "LL128": 0.9, "Simple": 0.7},
               GIB: {"LL": 1.0, "LL128": 1.0, "Simple": 1.0}}
# The pair of least hand-worked time, per size (see _hand_times).
ACROSS_CHOICE = {
    # 8 B: tree LL 25.2 us vs ring LL 43.4 and NVLSTree 53.0; 64 KiB: tree LL 25.2 + 65536 / (19.5e3 x 0.6)
    # = 30.80 vs NVLSTree 53 + 0.25. From 1 MiB NVLSTree (53 us, 266.667 GB/s) wins: 1 MiB 53 + 3.93 = 56.93
    # vs tree LL128 48.5 + 1 MiB / (146.8 x 0.6) = 60.40; 16 MiB 53 + 62.91 = 115.91 vs tree LL128 48.5 +
    # 126.98 = 175.48; 1 GiB 53 + 4026.53 = 4079.53 vs ring Simple 152.8 x 1.4 + 5242.88 = 5456.80.
    ("hgx-h100", 2): ["Tree/LL", "Tree/LL", "NVLSTree/Simple", "NVLSTree/Simple", "NVLSTree/Simple"],
    # 16 nodes, NVLSTree 137 us at 160 GB/s: 1 MiB 137 + 6.55 = 143.55 loses to tree LL128 99.5 + 1 MiB /
    # (116 x 0.6) = 114.57; 16 MiB 137 + 104.86 = 241.86 beats tree LL128 99.5 + 16 MiB / (116 x 0.9) =
    # 260.20; 1 GiB 137 + 6710.89 = 6847.89 beats ring Simple 1211.2 x 1.4 + 1 GiB / 193.512 = 7244.39.
    ("hgx-h100", 16): ["Tree/LL", "Tree/LL", "Tree/LL128", "NVLSTree/Simple", "NVLSTree/Simple"],
    # 16 MiB at 2 nodes: ring LL128 82.0 + 16 MiB / 85.333 = 278.61 vs tree LL128 48.5 + 16 MiB / 72 = 281.52.
    ("hgx-a100", 2): ["Tree/LL", "Tree/LL", "Tree/LL128", "Ring/LL128", "Ring/Simple"],
    ("hgx-a100", 16): ["Tree/LL", "Tree/LL", "Tree/LL128", "Tree/LL128", "Ring/Simple"],
}
SIZES = [8, 64 * KIB, MIB, 16 * MIB, GIB]


def _hand_times(key, size):
    t = ACROSS[key]
    nranks = 8 * key[1]
    out = {}
    for (algo, proto), gbps in t["bw"].items():
        lat = t["lat"][algo, proto]
        if algo == "Ring" and proto == "Simple" and size // (16 * nranks) >= 64:
            lat *= 1.4  # the ring plateau
        if algo == "Tree":
            gbps *= TREE_FACTOR[size][proto]
        out[algo, proto] = us(lat, size, gbps)
    return out


@pytest.mark.parametrize("key", list(ACROSS))
def test_channel_search_across_nodes(key):
    name, nodes = key
    cc, nic = (90, 48.0) if name == "hgx-h100" else (80, 24.0)
    nvlink = H100_N if name == "hgx-h100" else 12 * 20.0
    t = sim.NcclTuning(cc, 8 * nodes, nvlink, cc >= 90, nodes=nodes, nics=8, nic_gb_per_s=nic,
                       amd_cpu=name == "hgx-a100")
    assert t.graph_across_nodes("Ring") == ACROSS[key]["ring"]
    assert t.graph_across_nodes("Tree") == ACROSS[key]["tree"]
    # One NVLS graph for NVLS and NVLSTree (none on A100); NVLS itself is not offered across nodes.
    assert t.graph_across_nodes("NVLS") == t.graph_across_nodes("NVLSTree") == ACROSS[key]["nvls"]
    assert t.collective_channels == 16


@pytest.mark.parametrize("key", list(ACROSS))
def test_latency_and_bandwidth_across_nodes(key):
    name, nodes = key
    t = sim.NcclTuning(*((90, 8 * nodes, H100_N, True) if name == "hgx-h100" else (80, 8 * nodes, 240.0, False)),
                       nodes=nodes, nics=8, nic_gb_per_s=48.0 if name == "hgx-h100" else 24.0,
                       amd_cpu=name == "hgx-a100")
    nranks = 8 * nodes
    for size in SIZES:
        got = {(c["algorithm"], c["protocol"]): c for c in t.candidates("all_reduce", size)}
        assert set(got) == set(ACROSS[key]["bw"]), size  # no NVLS across nodes; NVLSTree on H100 only
        for (algo, proto), gbps in ACROSS[key]["bw"].items():
            factor = TREE_FACTOR[size][proto] if algo == "Tree" else 1.0
            lat = ACROSS[key]["lat"][algo, proto]
            if algo == "Ring" and proto == "Simple" and size // (16 * nranks) >= 64:
                lat *= 1.4
            assert got[algo, proto]["bandwidth"] == approx(gbps * factor * 1e9, rel=1e-12), (size, algo, proto)
            assert got[algo, proto]["latency"] == approx(lat * 1e-6, rel=1e-12), (size, algo, proto)


@pytest.mark.parametrize("key", list(ACROSS))
def test_pair_chosen_per_size_across_nodes_on_the_presets(key):
    name, nodes = key
    p = zion_emu.load_platform(name, overrides={"nodes": nodes})
    for size, expected in zip(SIZES, ACROSS_CHOICE[key]):
        times = _hand_times(key, size)
        best = min(times, key=times.get)
        assert "/".join(best) == expected, size
        r = sim.collective(p, "all_reduce", size, 8 * nodes)
        algo, proto = expected.split("/")
        assert (r.algorithm, r.protocol) == (MODEL_NAME[algo], proto), size
        assert r.time * 1e6 == approx(times[best], rel=1e-9), size
        assert r.closed_form


def test_other_collectives_across_nodes():
    # hgx-h100, 2 nodes (16 ranks), ring only (NVLS is off across nodes, NVLSTree and Tree are all_reduce's).
    # all_gather: nsteps 15, nInterSteps nNodes - 1 = 1, ratio 16/15:
    # LL 6.6 + 14 x max(0.6, 1.0) + 1 x 2.7 = 23.3 us at min(39, 192) x 16/15 = 41.6 GB/s.
    # broadcast: the channels are not the same ring each (sameChannels 0):
    # nsteps = 16 x hwLat[NET][Ring][LL] 2.7: 6.6 + 43.2 = 49.8 us at 39 GB/s.
    t = sim.NcclTuning(90, 16, H100_N, True, nodes=2, nics=8, nic_gb_per_s=48.0)
    for op in ("all_gather", "reduce_scatter", "broadcast", "reduce"):
        assert {c["algorithm"] for c in t.candidates(op, GIB)} == {"Ring"}, op
    p = zion_emu.load_platform("hgx-h100", overrides={"nodes": 2})
    g = sim.collective(p, "all_gather", 8, 16)
    assert (g.algorithm, g.protocol) == ("ring", "LL")
    assert g.time * 1e6 == approx(us(23.3, 8, 39.0 * 16 / 15), rel=1e-9)
    b = sim.collective(p, "broadcast", 8, 16)
    assert (b.algorithm, b.protocol) == ("ring", "LL")
    assert b.time * 1e6 == approx(us(6.6 + 16 * 2.7, 8, 39.0), rel=1e-9)
    # Large all_gather: Simple 8.4 + 14 x 3.4 + 14.0 = 70.0 us at 384 x 16/15 = 409.6 GB/s (no plateau
    # outside all_reduce) vs LL128 14.0 + 14 x 1.9 + 4.0 = 44.6 us at 293.6 x 16/15.
    big = sim.collective(p, "all_gather", GIB, 16)
    assert (big.algorithm, big.protocol) == ("ring", "Simple")
    assert big.time * 1e6 == approx(us(70.0, GIB, 409.6), rel=1e-9)


def test_one_node_communicators_on_a_multi_node_platform_are_unchanged():
    # hgx-h100 with 2 nodes: the 16-rank communicator is priced by the tuner
    # (tree LL at 8 B, above); 8 ranks inside node 0 or inside node 1 give
    # exactly the one-node figures of H100_CASES.
    p = zion_emu.load_platform("hgx-h100", overrides={"nodes": 2})
    assert sim.collective(p, "all_reduce", 8, 16).protocol == "LL"
    for devices in (list(range(8)), list(range(8, 16))):
        for size, algo, proto, time_us, _ in H100_CASES:
            r = sim.collective(p, "all_reduce", size, devices)
            assert (r.algorithm, r.protocol) == (MODEL_NAME[algo], proto), size
            assert r.time * 1e6 == approx(time_us, rel=1e-12), size


def test_communicators_the_model_does_not_cover_across_nodes_keep_the_topology_model():
    # Two GPUs on each node on one PCIe switch (GPUs 0, 1 with NICs 0, 1) are
    # priced by the tuner: ring search 2 NICs x 48 GB/s (2 x 48 = 96; 45 ... 24
    # give no more; 22 / 48 < 0.49 ends pass 1), duplicated (2 channels, not
    # > 4) to 4 x 24; pass 2 finds no higher speed with 4 channels (the 2 NICs
    # carry one each above 24 GB/s). Tree: 4 channels fit first at 24 GB/s;
    # bwIntra raised to 48.
    p = zion_emu.load_platform("hgx-h100", overrides={"nodes": 2})
    t = sim.NcclTuning(90, 4, H100_N, True, nodes=2, nics=2, nic_gb_per_s=48.0)
    assert t.graph_across_nodes("Ring") == (4, 24.0, 24.0)
    assert t.graph_across_nodes("Tree") == (4, 48.0, 24.0)
    # Two GPUs per node: no NVLS (src/transport/nvls.cc ncclNvlsInit needs more than 2), so no NVLSTree.
    assert t.graph_across_nodes("NVLSTree") == (0, 0.0, 0.0)
    assert "NVLSTree" not in {c["algorithm"] for c in t.candidates("all_reduce", GIB)}
    assert sim.collective(p, "all_reduce", MIB, [0, 1, 8, 9]).protocol != ""
    # One GPU per node, different GPUs per node, and NICs without GPUDirect: the topology model.
    assert sim.collective(p, "all_reduce", MIB, [0, 8]).protocol == ""
    assert sim.collective(p, "all_reduce", MIB, [0, 1, 8, 10]).protocol == ""
    no_gdr = zion_emu.load_platform("hgx-h100", overrides={"nodes": 2, "nic.gpudirect": False})
    assert sim.collective(no_gdr, "all_reduce", MIB, 16).protocol == ""
    with pytest.raises(ValueError, match="same number of GPUs on each node"):
        sim.NcclTuning(90, 15, H100_N, True, nodes=2, nics=8, nic_gb_per_s=48.0)


def test_pipeline_time_model_keeps_the_tuners_time_across_nodes():
    # time_model "pipeline" times rings within a node; across nodes it keeps
    # the tuner's time (1 GiB on 2 H100 nodes: NVLSTree Simple 4079.53 us;
    # 1 GiB on 2 A100 nodes: ring Simple).
    p = zion_emu.load_platform("hgx-h100", overrides={"nodes": 2, "collectives.nccl_tuner.time_model": "pipeline"})
    r = sim.collective(p, "all_reduce", GIB, 16)
    assert (r.algorithm, r.protocol) == ("hierarchical", "Simple")
    assert r.time * 1e6 == approx(_hand_times(("hgx-h100", 2), GIB)["NVLSTree", "Simple"], rel=1e-9)
    a100 = zion_emu.load_platform("hgx-a100", overrides={"nodes": 2, "collectives.nccl_tuner.time_model": "pipeline"})
    r = sim.collective(a100, "all_reduce", GIB, 16)
    assert (r.algorithm, r.protocol) == ("ring", "Simple")
    assert r.time * 1e6 == approx(_hand_times(("hgx-a100", 2), GIB)["Ring", "Simple"], rel=1e-9)
    t = sim.NcclTuning(90, 16, H100_N, True, nodes=2, nics=8, nic_gb_per_s=48.0)
    assert t.launch("all_reduce", GIB, "Ring", "Simple")["modeled"] is False
    assert t.launch("all_reduce", GIB, "NVLSTree", "Simple")["modeled"] is False


def test_nvls_tree_all_reduce_on_h100_nodes_by_hand():
    # NCCL v2.21.5's NVLSTree for all_reduce on nodes of 8 H100s (graph worked
    # in the comment above ACROSS: 8 channels, bwIntra 40, bwInter 48 GB/s).
    # 2 nodes: bw = 8 x min(40, 48) x 5/6 = 320 x 5/6 = 266.667 GB/s;
    #          latency = 0 + 25 + 2 x log2(2) x 14 = 53 us.
    # 16 nodes: bw = 8 x min(40, 48 / 2) x 5/6 = 192 x 5/6 = 160 GB/s;
    #          latency = 0 + 25 + 2 x log2(16) x 14 = 137 us.
    # No tree correction factor and no ring plateau: 1 GiB takes 53 + 2^30 / 266.667e3 = 4079.53 us on 2
    # nodes and 137 + 2^30 / 160e3 = 6847.89 us on 16.
    for nodes, lat_us, gbps, gib_us in [(2, 25 + 2 * 1 * 14.0, 8 * min(40.0, 48.0) * 5 / 6, 4079.53184),
                                        (16, 25 + 2 * 4 * 14.0, 8 * min(40.0, 48.0 / 2) * 5 / 6, 6847.8864)]:
        t = sim.NcclTuning(90, 8 * nodes, H100_N, True, nodes=nodes, nics=8, nic_gb_per_s=48.0)
        nt = [c for c in t.candidates("all_reduce", GIB) if c["algorithm"] == "NVLSTree"]
        assert [c["protocol"] for c in nt] == ["Simple"], nodes  # Simple only
        assert nt[0]["latency"] == approx(lat_us * 1e-6, rel=1e-12), nodes
        assert nt[0]["bandwidth"] == approx(gbps * 1e9, rel=1e-12), nodes
        assert nt[0]["time"] * 1e6 == approx(gib_us, rel=1e-9), nodes
        assert t.choose("all_reduce", GIB)[:2] == ("NVLSTree", "Simple")
    # Before NVLSTree was modeled these were Tree/LL128 (1 MiB and 16 MiB at 2 nodes, 16 MiB at 16) and
    # Ring/Simple (1 GiB); small sizes stay on Tree/LL, and 1 MiB at 16 nodes on Tree/LL128 (ACROSS_CHOICE).
    p2 = zion_emu.load_platform("hgx-h100", overrides={"nodes": 2})
    p16 = zion_emu.load_platform("hgx-h100", overrides={"nodes": 16})
    chosen = {(nodes, size): (r.algorithm, r.protocol)
              for nodes, p in ((2, p2), (16, p16)) for size in SIZES
              for r in [sim.collective(p, "all_reduce", size, 8 * nodes)]}
    assert chosen == {
        (2, 8): ("double_binary_tree", "LL"), (2, 64 * KIB): ("double_binary_tree", "LL"),
        (2, MIB): ("hierarchical", "Simple"), (2, 16 * MIB): ("hierarchical", "Simple"),
        (2, GIB): ("hierarchical", "Simple"),
        (16, 8): ("double_binary_tree", "LL"), (16, 64 * KIB): ("double_binary_tree", "LL"),
        (16, MIB): ("double_binary_tree", "LL128"), (16, 16 * MIB): ("hierarchical", "Simple"),
        (16, GIB): ("hierarchical", "Simple"),
    }
    # hgx-a100 has no NVLink SHARP: no NVLS graph, no NVLSTree, the choices as before.
    for nodes in (2, 16):
        a = sim.NcclTuning(80, 8 * nodes, 240.0, False, nodes=nodes, nics=8, nic_gb_per_s=24.0, amd_cpu=True)
        assert a.graph_across_nodes("NVLSTree") == (0, 0.0, 0.0)
        assert {c["algorithm"] for c in a.candidates("all_reduce", GIB)} == {"Ring", "Tree"}
        pa = zion_emu.load_platform("hgx-a100", overrides={"nodes": nodes})
        got = ["/".join((r.algorithm, r.protocol)) for size in SIZES
               for r in [sim.collective(pa, "all_reduce", size, 8 * nodes)]]
        assert got == [{"Tree": "double_binary_tree", "Ring": "ring"}[c.split("/")[0]] + "/" + c.split("/")[1]
                       for c in ACROSS_CHOICE["hgx-a100", nodes]]


@pytest.mark.parametrize("nics,nic,graph", [
    # 45 GB/s paths: pass 1 45 -> 7 channels (8 x 45 = 360), 42 -> 7, 40 -> 8 = ngpus; pass 2 raises
    # bwInter to 42 and 45; 48 is above the path.
    (8, 45.0, (8, 40.0, 45.0)),
    # 24 GB/s paths: 8 channels at 24 at once (9 x 24 = 216); 30 does not fit the path: 24 / 24.
    (8, 24.0, (8, 24.0, 24.0)),
    # 4 NICs: one channel each, 4 at 48 (5 x 48 = 240); no lower speed gives more channels (the
    # product only falls) and 22 / 48 < 0.49 ends pass 1; bwInter is already at the top.
    (4, 48.0, (4, 48.0, 48.0)),
])
def test_nvls_graph_with_nics(nics, nic, graph):
    t = sim.NcclTuning(90, 16, H100_N, True, nodes=2, nics=nics, nic_gb_per_s=nic)
    assert t.graph_across_nodes("NVLSTree") == graph
    ch, intra, inter = graph
    lat, bw = [(c["latency"], c["bandwidth"]) for c in t.candidates("all_reduce", MIB) if c["algorithm"] == "NVLSTree"][0]
    assert lat == approx(53e-6, rel=1e-12)
    assert bw == approx(ch * min(intra, inter) * 5 / 6 * 1e9, rel=1e-12)
