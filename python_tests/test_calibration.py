"""Reference machines against published nccl-tests all_reduce bus bandwidth.

Figures (out-of-place busbw, GB/s): 8x A100-SXM4 228.1 at 1 GiB, 231.6 at
8 GiB; 8x H100 with NVLS 466.4 and 478.9 (the runs and their sources are in
bench/reference/nccl_tests_published.json). The model must land within 10%; bench/README.md has the table at
every size."""

import pytest

import zion_emu
from zion_emu import sim

GIB = 1 << 30


@pytest.mark.parametrize("name,size,published_gbps", [
    ("hgx-a100", 1 * GIB, 228.1),
    ("hgx-a100", 8 * GIB, 231.6),
    ("hgx-h100", 1 * GIB, 466.4),
    ("hgx-h100", 8 * GIB, 478.9),
])
def test_all_reduce_busbw_within_10_percent_of_nccl_tests(name, size, published_gbps):
    r = sim.collective(zion_emu.load_platform(name), "all_reduce", size, 8)
    assert r.busbw / 1e9 == pytest.approx(published_gbps, rel=0.10)


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
