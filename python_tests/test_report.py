"""The run report as typed records: merging ranks' snapshots by hand, the JSON
``--report`` writes and reads back, the text ``zion-emu run`` prints, and the
byte, time and table helpers every command prints with."""

import json

import pytest

from zion_emu import report as rep
from zion_emu._format import Column, Table, format_bytes, format_time
from zion_emu.report_text import format_text


def rank(r: int, wall_s: float, busy_s: float, samples: int | None,
         breakdown: rep.Breakdown | None) -> rep.RankSnapshot:
    return rep.RankSnapshot(
        rank=r, platform="zion", wall_s=wall_s, oam_tracks=8,
        devices=[rep.DeviceSnapshot(device=r, busy_s=busy_s, busy_by_activity_s={"compute": busy_s}, flops=1e9,
                                    bytes=1e6, copy_bytes=0.0, ops=10, guessed_ops=1, peak_hbm_bytes=3 << 20,
                                    hbm_capacity_bytes=32 << 30, breakdown=breakdown)],
        sockets=[], labels={"aten::mm": (busy_s, 10), "aten::erfinv": (0.5, 1)},
        links=[rep.LinkCounters("fabric", 25e9, 56, 1e6, 0.4, 2), rep.LinkCounters("upi", 20.8e9, 48, 0.0, 0.0, 0)],
        guessed_ops={"aten::erfinv": 1}, dropped_spans=0, iterations=[1.0, 3.0, 5.0, 7.0],
        samples_per_iteration=samples,
        status=rep.RankStatus("ok", 0),
    )


def two_ranks() -> list[rep.RankSnapshot]:
    # Rank 0 runs 10 s, rank 1 stops at 8 s: its device is idle (host) for the last 2 s of the run.
    return [rank(0, 10.0, 4.0, 16, rep.Breakdown(4.0, 1.0, 0.5, 1.0, 4.0)),
            rank(1, 8.0, 2.0, 16, rep.Breakdown(2.0, 1.0, 0.0, 1.0, 4.0))]


def test_merge_by_hand():
    merged = rep.merge(two_ranks())
    assert merged.ranks == 2 and merged.wall_s == 10.0
    # Steps done at 1, 3, 5, 7 s: three intervals of 2 s after the first; 16 + 16 samples each.
    assert merged.iterations == 4 and merged.iteration_s == 2.0
    assert merged.samples_per_iteration == 32 and merged.samples_per_s == 16.0
    # Busy: the run's 10 s less each device's host (idle) time: 10 - 4 and 10 - (4 + 2).
    assert [d.busy_pct for d in merged.devices] == [60.0, 40.0]
    assert merged.devices[1].breakdown == rep.Breakdown(2.0, 1.0, 0.0, 1.0, 6.0)  # 4 s + the 2 s it was gone
    # The mean over devices: (4+2)/2, (1+1)/2, ..., host (4+6)/2; it adds up to the wall time.
    assert merged.breakdown == rep.Breakdown(3.0, 1.0, 0.25, 1.0, 5.0)
    b = merged.breakdown
    assert b.compute_s + b.communication_exposed_s + b.copies_exposed_s + b.host_s == merged.wall_s
    fabric = merged.links[0]  # most bytes first
    # 2 x 0.4 s busy over 56 links for 10 s.
    assert (fabric.name, fabric.bytes, fabric.transfers) == ("fabric", 2e6, 4)
    assert fabric.utilization_pct == pytest.approx(100 * 0.8 / (56 * 10.0))
    assert [(op.name, op.busy_s, op.count) for op in merged.top_ops] == [("aten::mm", 6.0, 20),
                                                                         ("aten::erfinv", 1.0, 2)]
    assert merged.guessed_ops == {"aten::erfinv": 2}


def test_a_devices_busy_share_counts_overlapped_communication_once():
    # 8 s of compute with 4 s of communication under it, 2 s idle: the streams were busy 12 s of a 10 s run,
    # the device 8 s of it. Without spans, the streams' sum is the only figure, and it is capped at the wall.
    overlapped = rank(0, 10.0, 12.0, None, rep.Breakdown(8.0, 0.0, 4.0, 0.0, 2.0))
    assert [d.busy_pct for d in rep.merge([overlapped]).devices] == [80.0]
    unrecorded = rank(0, 10.0, 12.0, None, None)
    assert [d.busy_pct for d in rep.merge([unrecorded]).devices] == [100.0]
    assert [d.busy_pct for d in rep.merge([rank(0, 10.0, 3.0, None, None)]).devices] == [30.0]


def test_samples_per_iteration_given_for_the_run_wins_and_a_rank_that_declared_none_leaves_it_unknown():
    assert rep.merge(two_ranks(), samples_per_iteration=64).samples_per_s == 32.0
    snaps = two_ranks()
    snaps[1].samples_per_iteration = None
    merged = rep.merge(snaps)
    assert merged.samples_per_iteration is None and merged.samples_per_s is None


def test_a_device_without_a_breakdown_leaves_the_run_without_one_and_says_why():
    snaps = two_ranks()
    snaps[1].devices[0].breakdown = None
    merged = rep.merge(snaps)
    assert merged.breakdown is None and "not recorded for every device" in merged.breakdown_note
    assert "breakdown" not in merged.to_json()["devices"][1]  # absent, not null, as before records had types
    assert "breakdown: spans were not recorded" in format_text(merged)


def test_the_json_round_trips_and_keeps_its_keys(tmp_path):
    merged = rep.merge(two_ranks())
    merged.status = rep.RunStatus(0, False, {0: rep.RankStatus("ok", 0), 1: rep.RankStatus("exception", 1, "E: x")})
    doc = json.loads(json.dumps(merged.to_json()))
    assert list(doc) == ["platform", "ranks", "wall_s", "iterations", "iteration_s", "samples_per_iteration",
                         "samples_per_s", "breakdown", "breakdown_note", "devices", "sockets", "links", "top_ops",
                         "guessed_ops", "status", "mode", "placeholders"]
    assert doc["status"]["ranks"] == {"0": {"exit": "ok", "code": 0},
                                      "1": {"exit": "exception", "code": 1, "error": "E: x"}}
    assert rep.RunReport.from_json(doc) == merged
    # The file's text and its path read back the same; anything else is refused by name.
    text = json.dumps(merged.to_json())
    assert rep.RunReport.from_json(text) == merged and rep.RunReport.from_json(text.encode()) == merged
    path = tmp_path / "report.json"
    path.write_text(text)
    assert rep.RunReport.from_json(path) == merged
    with pytest.raises(ValueError, match="the text given is not JSON .* its path as a pathlib.Path"):
        rep.RunReport.from_json(str(path))
    with pytest.raises(TypeError, match="JSON object .* not list"):
        rep.RunReport.from_json([doc])
    snap = two_ranks()[0]
    assert rep.RankSnapshot.from_json(json.loads(json.dumps(snap.to_json()))) == snap


def test_the_text_names_the_parts_devices_links_and_work():
    merged = rep.merge(two_ranks())
    merged.status = rep.RunStatus(130, True, {})
    text = format_text(merged)
    assert text.startswith("(partial: the run was interrupted)\n== zion-emu report: platform zion, 2 rank(s) ==")
    assert "time per iteration     2.000 s" in text and "throughput             16 samples/s" in text
    lines = text.splitlines()
    header = next(line for line in lines if line.startswith("device"))
    row = next(line for line in lines if line.startswith("  zion:1"))
    assert header.index("capacity") + len("capacity") == row.index("32.00 GiB") + len("32.00 GiB")  # aligned
    assert "  fabric" in text and "upi" not in text  # links that moved nothing are left out
    assert "  aten::erfinv  x2" in text


def test_format_bytes_in_binary_units():
    assert [format_bytes(n) for n in (8, 1 << 20, 3 << 29, 4 << 40)] == ["8 B", "1 MiB", "1.5 GiB", "4 TiB"]
    assert [format_bytes(n, decimals=2) for n in (10, 1536, 32 << 30)] == ["10 B", "1.50 KiB", "32.00 GiB"]


def test_format_time_in_seconds_milliseconds_or_microseconds():
    assert [format_time(t) for t in (1.5, 2.5e-3, 7.8e-6, None, float("inf"))] == \
        ["1.500 s", "2.500 ms", "7.8 us", "-", "-"]


def test_a_table_aligns_its_header_with_its_rows():
    table = Table(Column("name", 6, "<"), Column("time", 8, spec=".2f", unit="(us)"), indent="  ")
    assert table.render([("mm", 1.5), ("relu", 12.25)]) == [
        "name         time",
        "             (us)",
        "  mm         1.50",
        "  relu      12.25",
    ]
    nccl = Table(Column("size", 12), Column("algorithm", align="<"), gap="  ", header_prefix="# ")
    assert nccl.header() == ["#       size  algorithm"] and nccl.row(8, "ring") == "           8  ring"


def test_the_float32_matmul_precision_merges_by_rank_and_is_left_out_when_none_was_priced():
    snaps = two_ranks()
    assert "fp32_matmul_precision" not in rep.merge(snaps).to_json()  # reports from before it read the same
    snaps[0].fp32_matmul_precision = {"op": "aten::mm", "requested": "tf32", "priced": "fp32"}
    snaps[1].fp32_matmul_precision = {"op": "aten::mm", "requested": "tf32", "priced": "fp32"}
    extra = rank(2, 8.0, 2.0, 16, None)
    extra.fp32_matmul_precision = {"op": "aten::addmm", "requested": "bf16", "priced": "bf16"}
    merged = rep.merge([*snaps, extra])
    assert merged.fp32_matmul_precision == [
        {"op": "aten::mm", "requested": "tf32", "priced": "fp32", "fell_back": True, "ranks": [0, 1]},
        {"op": "aten::addmm", "requested": "bf16", "priced": "bf16", "fell_back": False, "ranks": [2]}]
    doc = json.loads(json.dumps(merged.to_json()))
    assert list(doc)[-1] == "fp32_matmul_precision"
    assert rep.RunReport.from_json(doc) == merged
    assert rep.RankSnapshot.from_json(json.loads(json.dumps(extra.to_json()))) == extra
    text = format_text(merged)
    assert ("float32 matmuls        priced at fp32: the settings asked for tf32, which platform zion's OAM has no "
            "peak for (the last one: aten::mm, rank(s) 0-1)") in text
    assert "float32 matmuls        priced at bf16, as the settings asked (the last one: aten::addmm, rank(s) 2)" in text
