"""Reference machines against published nccl-tests all_reduce bus bandwidth.

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
