"""Ranking inference (zion_emu.inference): latency per query and queries/s.

zion preset: OAM fp32 peak 15 TFLOP/s at matmul efficiency 0.6, HBM 1000 GB/s;
launch overhead 5 us; socket 0 -> PCIe switch 0 Gen3 x16 (12 GB/s, 150 ns),
switch -> OAM 0 Gen4 x16 (24 GB/s, 150 ns); DDR 153.6 GB/s per socket, so a
pageable copy first costs the host bytes / 153.6 GB/s of staging. A socket
runs fp32 at 4.1216 TFLOP/s (28 cores).
"""

import dataclasses
import json
import sys

import pytest
import torch
from torch import nn

import zion_emu
from zion_emu import _C, inference, report
from zion_emu.report_text import format_text
from processes import REPO, zion_emu_cli

LAUNCH = 5e-6
PCIE = 12e9
PCIE_LATENCY = 300e-9  # two PCIe hops of 150 ns
DDR = 153.6e9
OAM_MATMUL = 15e12 * 0.6
HBM_MATMUL = 1000e9 * 0.6
SOCKET_FP32 = 4.1216e12

B, K, N = 512, 1024, 1024


def linear_query_s(b: int = B, k: int = K, n: int = N) -> float:
    """One query on zion:0, stream idle at its start: the pageable input's
    staging copy on the host, its H2D copy (launch, latency, bytes over the
    Gen3 x16 link, the host waiting), the addmm's launch and roofline, then
    the D2H of the scores: it starts when the addmm ends (later than its own
    launch, since the addmm takes longer than 5 us) and the host waits for it
    and its staging copy."""
    x_bytes, y_bytes = 4 * b * k, 4 * b * n
    flops = 2 * b * k * n
    mm_bytes = 4 * (n + b * k + k * n + b * n)  # bias, input, weight, output
    mm = max(flops / OAM_MATMUL, mm_bytes / HBM_MATMUL)
    assert mm > LAUNCH  # the case worked out above
    h2d = x_bytes / DDR + LAUNCH + PCIE_LATENCY + x_bytes / PCIE
    d2h = PCIE_LATENCY + y_bytes / PCIE + y_bytes / DDR
    return h2d + LAUNCH + mm + d2h


@pytest.fixture
def fresh():
    """A clean timeline recording spans, and no queries seen; tracking on."""
    torch.zion.synchronize()
    _C.timeline.set_recording(100_000)
    zion_emu.reset_clock()
    inference.reset()
    inference.track_forwards()
    yield
    inference.stop_tracking_forwards()  # the hooks are global: later tests must not see them
    inference.reset()
    _C.timeline.set_recording(0)


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Linear(K, N).to("zion").eval()


def test_the_closed_form_at_a_glance():
    # 2*512*1024^2 / 9e12 = 119.3 us of matmul; 2 MiB over 12 GB/s = 174.8 us each way; two
    # launches show (the D2H is launched while the addmm runs).
    assert linear_query_s() == pytest.approx(
        2 * 2097152 / 153.6e9 + 2 * 5e-6 + 2 * 300e-9 + 2 * 2097152 / 12e9 + 1073741824 / 9e12, rel=1e-12)


def test_an_explicit_query_is_the_input_copy_the_forward_and_the_scores_copy(fresh):
    m = model()
    x = torch.randn(B, K)
    torch.zion.synchronize()
    with torch.inference_mode():
        with inference.query():
            scores = m(x.to("zion")).cpu()
    assert torch.equal(scores, nn.functional.linear(x, m.weight.cpu(), m.bias.cpu()))
    (start, end), = inference.queries()
    assert end - start == pytest.approx(linear_query_s(), rel=1e-9)
    snap = inference.snapshot()
    assert snap.source == "explicit" and snap.queries == 1 and snap.qps == pytest.approx(1 / linear_query_s())


def test_forward_hooks_time_each_query_after_the_warm_up(fresh):
    m = model()
    torch.zion.synchronize()
    with torch.no_grad():
        for i in range(4):
            m(torch.randn(B, K).to("zion")).cpu()
    snap = inference.snapshot()
    # Query k runs from query k-1's scores on the host (the end of its D2H copy,
    # then its staging copy) to the end of its own D2H copy: the same sum.
    assert snap.source == "forwards" and snap.warmup_queries == 1 and snap.queries == 3
    assert snap.latencies_s == pytest.approx([linear_query_s()] * 3, rel=1e-9)
    assert snap.qps == pytest.approx(1 / linear_query_s(), rel=1e-9)


def test_a_model_in_two_top_level_modules_is_one_query_per_score_copy(fresh):
    first, second = nn.Linear(K, N).to("zion"), nn.Linear(N, N).to("zion")
    with torch.no_grad():
        for _ in range(3):
            second(first(torch.randn(B, K).to("zion"))).cpu()
    snap = inference.snapshot()
    assert snap.queries == 2  # 3 queries, not 6 forwards; the first is the warm-up
    assert snap.latencies_s[0] == pytest.approx(snap.latencies_s[1], rel=1e-12)
    # The second layer adds its matmul: it is launched while the first runs,
    # and the D2H waits for it.
    assert snap.latencies_s[0] == pytest.approx(linear_query_s() + 2 * B * N * N / OAM_MATMUL, rel=1e-9)


def test_training_forwards_and_nested_modules_are_not_queries(fresh):
    m = nn.Sequential(nn.Linear(8, 8), nn.ReLU()).to("zion")
    for _ in range(3):
        m(torch.randn(4, 8).to("zion")).sum().backward()  # gradients on: training
    assert inference.snapshot() is None
    with torch.no_grad():
        for _ in range(3):
            m(torch.randn(4, 8).to("zion")).cpu()
    assert inference.snapshot().queries == 2  # the Sequential's forwards, not its layers'


def test_one_implicit_query_says_why_it_has_no_latency(fresh):
    m = model()
    with torch.no_grad():
        m(torch.randn(B, K).to("zion")).cpu()
    snap = inference.snapshot()
    assert snap.queries == 0 and snap.qps is None and "warm-up" in snap.note


def test_cpu_inference_in_a_socket_is_priced_on_the_socket(fresh):
    torch.manual_seed(0)
    with zion_emu.socket(2):
        m = nn.Linear(K, N).eval()
        x = torch.randn(B, K)
        with torch.inference_mode(), inference.query():
            m(x)
    (start, end), = inference.queries()
    # No copies: the host runs the addmm, compute-bound at the socket's peak
    # (its 8.4 MB take 54.6 us at DDR bandwidth).
    assert end - start == pytest.approx(2 * B * K * N / SOCKET_FP32, rel=1e-9)


def test_percentiles_interpolate_between_sorted_latencies():
    # 1..100 ms, shuffled: p50 sits at position 49.5 -> 50.5 ms; p99 at 98.01 -> 99.01 ms.
    values = [((i * 37) % 100 + 1) * 1e-3 for i in range(100)]
    assert sorted(values) == [i * 1e-3 for i in range(1, 101)]
    stats = inference.latency_stats(values)
    assert stats["p50_s"] == pytest.approx(50.5e-3, rel=1e-12)
    assert stats["p99_s"] == pytest.approx(99.01e-3, rel=1e-12)
    assert stats["mean_s"] == pytest.approx(50.5e-3, rel=1e-12)
    assert inference.latency_stats([7.0]) == {"p50_s": 7.0, "p99_s": 7.0, "mean_s": 7.0}
    with pytest.raises(ValueError, match="at least one latency"):
        inference.latency_stats([])


def test_the_report_pools_latencies_over_ranks_and_sums_their_rates(fresh):
    base = report.snapshot(0, keep_spans=False)
    a = dataclasses.replace(base, rank=0, inference=inference.InferenceSnapshot("explicit", 2, [1e-3, 3e-3], 0.0, 4e-3))
    b = dataclasses.replace(base, rank=1, inference=inference.InferenceSnapshot("explicit", 1, [2e-3], 1.0, 1.002))
    merged = report.merge([a, b])
    inf = merged.inference
    assert inf.queries == 3 and inf.ranks == [0, 1]
    # [1, 2, 3] ms: p99 at position 0.99 * 2 = 1.98 -> 2.98 ms.
    assert inf.p50_s == pytest.approx(2e-3) and inf.p99_s == pytest.approx(2.98e-3)
    assert inf.qps == pytest.approx(2 / 4e-3 + 1 / 2e-3)
    again = report.RunReport.from_json(json.loads(json.dumps(merged.to_json())))
    assert again.inference == inf
    snap_again = report.RankSnapshot.from_json(json.loads(json.dumps(a.to_json())))
    assert snap_again.inference == a.inference
    text = format_text(merged)
    assert "3 queries (zion_emu.inference.query())" in text and "queries/s" in text
    assert "inference" not in report.merge([dataclasses.replace(base, inference=None)]).to_json()


SCRIPT = """
import torch
from torch import nn
torch.manual_seed(0)
m = nn.Linear({k}, {n}).to("zion").eval()
with torch.inference_mode():
    for _ in range(5):
        m(torch.randn({b}, {k}).to("zion")).cpu()
"""


@pytest.mark.slow
def test_zion_emu_run_reports_the_queries_of_an_unmodified_script(tmp_path):
    script = tmp_path / "serve.py"
    script.write_text(SCRIPT.format(b=B, k=K, n=N))
    out = tmp_path / "r.json"
    done = zion_emu_cli("run", "--report", str(out), str(script), cwd=REPO)
    inf = json.loads(out.read_text())["inference"]
    assert inf["source"] == "forwards" and inf["queries"] == 4 and inf["warmup_queries"] == 1
    assert inf["p50_s"] == pytest.approx(linear_query_s(), rel=1e-9)
    assert inf["p99_s"] == pytest.approx(linear_query_s(), rel=1e-9)
    assert inf["qps"] == pytest.approx(1 / linear_query_s(), rel=1e-9)
    assert "4 queries (top-level forwards with gradients off, after 1 warm-up)" in done.stdout


def test_the_dlrm_examples_sweep_serves_each_size_on_the_oam_and_the_socket(fresh):
    sys.path.insert(0, str(REPO / "examples" / "dlrm"))
    import dlrm

    lines: list[str] = []
    args = dlrm.parse_args(["--config", "tiny", "--inference", "--batch-sizes", "1,8", "--num-batches", "3"])
    rows = dlrm.serve(args, lines.append)
    assert [r["batch"] for r in rows] == [1, 8]
    for r in rows:
        # Three identical queries: p50 = p99, and queries/s is one over that latency.
        for name in ("oam", "socket"):
            assert r[f"{name}_p50_ms"] == pytest.approx(r[f"{name}_p99_ms"], rel=1e-9)
            assert r[f"{name}_qps"] == pytest.approx(1e3 / r[f"{name}_p50_ms"], rel=1e-9)
        assert r["oam_scores"] == r["socket_scores"]  # the same model, numerics bit for bit
    # An OAM query pays at least its three H2D copies' and one D2H copy's launches.
    assert rows[0]["oam_p50_ms"] > 4 * LAUNCH * 1e3
    assert rows[1]["oam_p50_ms"] > rows[0]["oam_p50_ms"] and rows[1]["socket_p50_ms"] > rows[0]["socket_p50_ms"]
    assert [line.split()[2] for line in lines if line.startswith("inference batch")] == ["1", "8"]
    wins = [r["batch"] for r in rows if r["oam_p50_ms"] < r["socket_p50_ms"]]
    assert lines[-1].startswith("crossover oam_faster_from_batch ")
    assert lines[-1].split()[2] == ("none" if 8 not in wins else str(1 if 1 in wins else 8))
    assert inference.queries() == []  # each size's queries were its own


@pytest.mark.parametrize("argv, message", [
    (["--batch-sizes", "1,8"], "without --inference it would do nothing"),
    (["--inference", "--batch-sizes", "1,x"], "positive integers separated by commas"),
    (["--inference", "--device", "cpu"], "needs --device zion"),
    (["--inference", "--table-placement", "ddr"], "leave --table-placement at hbm"),
])
def test_the_dlrm_examples_inference_flags_refuse_what_they_cannot_do(argv, message, capsys):
    sys.path.insert(0, str(REPO / "examples" / "dlrm"))
    import dlrm

    with pytest.raises(SystemExit) as e:
        dlrm.parse_args(["--config", "tiny", *argv])
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_stopping_the_tracking_of_forwards_removes_its_global_hooks():
    from torch.nn.modules.module import _has_any_global_hook

    inference.stop_tracking_forwards()
    assert not _has_any_global_hook()
    inference.track_forwards()
    inference.track_forwards()  # idempotent: one pair of hooks
    assert _has_any_global_hook()
    inference.stop_tracking_forwards()
    assert not _has_any_global_hook()  # torch.compile of a module would warn otherwise
