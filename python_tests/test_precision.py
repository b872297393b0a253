"""Float32 matmuls and convolutions priced at the precision the script allows
(TF32 or bf16), with CPU numerics.

The hgx-a100 preset's OAM peaks (oam.peak_flops, from NVIDIA's A100 datasheet,
dense): fp32 19.5 TFLOP/s, tf32 156 TFLOP/s, bf16 312 TFLOP/s; matmul efficiency
0.7, convolution 0.6, HBM 2,039 GB/s.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pytest import approx

import zion_emu
from zion_emu import sim
from processes import run_python

# 4096 x 1024 @ 1024 x 1024 in float32.
M, K, N = 4096, 1024, 1024
FLOPS = 2 * M * K * N  # 8,589,934,592
BYTES = (M * K + K * N + M * N) * 4  # 37,748,736: both operands read, the output written
FP32_S = FLOPS / (19.5e12 * 0.7)  # 629.3 us
TF32_S = FLOPS / (156e12 * 0.7)  # 78.66 us
BF16_S = FLOPS / (312e12 * 0.7)  # 39.33 us
MEMORY_S = BYTES / (2039e9 * 0.7)  # 26.45 us: compute-bound at every precision


def mm_call(precision: str) -> sim.OpCall:
    return sim.OpCall("aten::mm", [sim.TensorDesc([M, K]), sim.TensorDesc([K, N])], [sim.TensorDesc([M, N])],
                      fp32_matmul=precision)


def test_the_preset_carries_the_a100_datasheet_peaks():
    peaks = zion_emu.load_platform("hgx-a100").get("oam.peak_flops")
    assert (peaks["fp32"], peaks["tf32"], peaks["bf16"]) == (19.5e12, 156e12, 312e12)


@pytest.mark.parametrize("precision,seconds", [("fp32", FP32_S), ("tf32", TF32_S), ("bf16", BF16_S)])
def test_closed_form_of_a_4096x1024x1024_matmul_on_hgx_a100(precision, seconds):
    model = sim.OpCostModel.for_oam(zion_emu.load_platform("hgx-a100"))
    cost = model.cost(mm_call(precision))
    assert cost.work.flops == FLOPS and cost.work.bytes == BYTES
    assert cost.memory_time == approx(MEMORY_S, rel=1e-12)
    assert cost.device_time == cost.compute_time == approx(seconds, rel=1e-12)
    assert (cost.requested_dtype, cost.priced_dtype) == (precision, precision)
    assert FP32_S / TF32_S == approx(8.0)  # 156 / 19.5


def test_precision_moves_only_fp32_matmul_class_work():
    model = sim.OpCostModel.for_oam(zion_emu.load_platform("hgx-a100"))
    # A bf16 matmul stays bf16; an elementwise fp32 op is not a matmul.
    bf16 = sim.OpCall("aten::mm", [sim.TensorDesc([M, K], "bf16"), sim.TensorDesc([K, N], "bf16")],
                      [sim.TensorDesc([M, N], "bf16")], fp32_matmul="tf32")
    assert model.cost(bf16).priced_dtype == "bf16"
    add = sim.OpCall("aten::add.Tensor", [sim.TensorDesc([M, N]), sim.TensorDesc([M, N])], [sim.TensorDesc([M, N])],
                     fp32_matmul="tf32", fp32_convolution="tf32")
    assert model.cost(add).priced_dtype == "fp32"
    # int64 operands are not floats: no TF32.
    ints = sim.OpCall("aten::mm", [sim.TensorDesc([8, 8], "int64"), sim.TensorDesc([8, 8], "int64")],
                      [sim.TensorDesc([8, 8], "int64")], fp32_matmul="tf32")
    assert model.cost(ints).priced_dtype == "fp32"
    # A convolution follows fp32_convolution, not fp32_matmul.
    conv = sim.OpCall("aten::convolution", [sim.TensorDesc([8, 64, 56, 56]), sim.TensorDesc([64, 64, 3, 3])],
                      [sim.TensorDesc([8, 64, 56, 56])], fp32_matmul="tf32")
    assert model.cost(conv).priced_dtype == "fp32"
    conv.fp32_convolution = "tf32"
    flops = 2 * 8 * 56 * 56 * 64 * 64 * 3 * 3
    assert model.cost(conv).compute_time == approx(flops / (156e12 * 0.6), rel=1e-12)


def test_an_unknown_precision_is_refused():
    with pytest.raises(ValueError, match=r"fp32_matmul: unknown precision 'fp16'; allowed: fp32, tf32, bf16"):
        mm_call("fp16")


def test_a_unit_without_a_tf32_peak_prices_tf32_at_fp32():
    unit = sim.ComputeUnit("oam", {"fp32": 1e12, "bf16": 4e12}, 1e11, {"matmul": 0.5})
    cost = sim.OpCostModel(unit).cost(
        sim.OpCall("aten::mm", [sim.TensorDesc([1024, 1024]), sim.TensorDesc([1024, 1024])],
                   [sim.TensorDesc([1024, 1024])], fp32_matmul="tf32"))
    assert (cost.requested_dtype, cost.priced_dtype) == ("tf32", "fp32")
    assert cost.compute_time == approx(2 * 1024**3 / (1e12 * 0.5), rel=1e-12)


_DEVICE_SCRIPT = """
import json, warnings, torch, zion_emu
zion_emu.set_platform({platform!r})
warnings.simplefilter("always")
a_cpu = torch.randn({m}, {k}, generator=torch.Generator().manual_seed(0))
b_cpu = torch.randn({k}, {n}, generator=torch.Generator().manual_seed(1))
a, b = a_cpu.to("zion"), b_cpu.to("zion")

def busy(f):
    torch.zion.synchronize()
    before = zion_emu._C.device.counters(0)["busy_s"]
    out = f()
    torch.zion.synchronize()
    return zion_emu._C.device.counters(0)["busy_s"] - before, out

out = {{"first": torch.zion.last_matmul_precision()}}
def case(name, setup):
    setup()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        t, y = busy(lambda: torch.mm(a, b))
    out[name] = [t, torch.zion.last_matmul_precision(), torch.equal(y.cpu(), torch.mm(a_cpu, b_cpu)),
                 [str(x.message) for x in w]]

case("highest", lambda: torch.set_float32_matmul_precision("highest"))
case("high", lambda: torch.set_float32_matmul_precision("high"))
case("medium", lambda: torch.set_float32_matmul_precision("medium"))
case("highest_again", lambda: torch.set_float32_matmul_precision("highest"))
def cuda_flag():
    torch.backends.cuda.matmul.allow_tf32 = True
case("cuda_allow_tf32", cuda_flag)
def cuda_flag_off():
    torch.backends.cuda.matmul.allow_tf32 = False
case("cuda_allow_tf32_off", cuda_flag_off)
def zion_flag():
    torch.zion.matmul.allow_tf32 = True
case("zion_allow_tf32", zion_flag)
out["zion_flag_reads"] = [torch.zion.matmul.allow_tf32, torch.backends.cuda.matmul.allow_tf32]
torch.zion.matmul.allow_tf32 = False

# Convolutions: cudnn.allow_tf32 (True by default, as on CUDA).
x_cpu = torch.randn(8, 64, 56, 56, generator=torch.Generator().manual_seed(2))
w_cpu = torch.randn(64, 64, 3, 3, generator=torch.Generator().manual_seed(3))
x, w = x_cpu.to("zion"), w_cpu.to("zion")
conv = lambda: torch.nn.functional.conv2d(x, w, padding=1)
out["conv_default"] = [busy(conv)[0], torch.zion.last_matmul_precision()]
torch.backends.cudnn.allow_tf32 = False
t, y = busy(conv)
out["conv_off"] = [t, torch.zion.last_matmul_precision(),
                   torch.equal(y.cpu(), torch.nn.functional.conv2d(x_cpu, w_cpu, padding=1))]
print(json.dumps(out))
"""


def _run(platform: str) -> dict:
    code = _DEVICE_SCRIPT.format(platform=platform, m=M, k=K, n=N)
    return json.loads(run_python(code).stdout.splitlines()[-1])


def test_torch_settings_price_zion_matmuls_and_keep_cpu_numerics():
    out = _run("hgx-a100")
    assert out["first"] is None
    conv_flops = 2 * 8 * 56 * 56 * 64 * 64 * 3 * 3
    expected = {
        "highest": (FP32_S, "fp32"), "high": (TF32_S, "tf32"), "medium": (BF16_S, "bf16"),
        "highest_again": (FP32_S, "fp32"), "cuda_allow_tf32": (TF32_S, "tf32"),
        "cuda_allow_tf32_off": (FP32_S, "fp32"), "zion_allow_tf32": (TF32_S, "tf32"),
    }
    for name, (seconds, precision) in expected.items():
        t, last, same, warned = out[name]
        assert t == approx(seconds, rel=1e-9), name
        assert last == {"op": "aten::mm", "requested": precision, "priced": precision}, name
        assert same, name  # numerics are the CPU op's, whatever the pricing
        assert warned == [], name
    assert out["zion_flag_reads"] == [True, True]
    t, last = out["conv_default"]
    assert last["requested"] == last["priced"] == "tf32" and last["op"].startswith("aten::")
    assert t == approx(conv_flops / (156e12 * 0.6), rel=1e-6)
    t, last, same = out["conv_off"]
    assert last["priced"] == "fp32" and same
    assert t == approx(conv_flops / (19.5e12 * 0.6), rel=1e-6)


def test_a_platform_without_tf32_warns_once_and_prices_fp32(tmp_path: Path):
    preset = json.loads((Path(zion_emu.__file__).parent / "platforms" / "hgx-a100.json").read_text())
    del preset["oam"]["peak_flops"]["tf32"]
    preset["name"] = "a100-without-tf32"
    path = tmp_path / "no-tf32.json"
    path.write_text(json.dumps(preset))
    out = _run(str(path))
    t, last, same, warned = out["high"]
    assert t == approx(FP32_S, rel=1e-9) and same
    assert last == {"op": "aten::mm", "requested": "tf32", "priced": "fp32"}
    assert len(warned) == 1 and "no tf32 peak" in warned[0] and "a100-without-tf32" in warned[0]
    assert out["cuda_allow_tf32"][3] == []  # once per process
    assert out["cuda_allow_tf32"][1]["priced"] == "fp32"
    assert out["medium"][0] == approx(BF16_S, rel=1e-9)  # bf16 has its peak


def test_torch_zion_matmul_rejects_other_settings():
    import torch

    with pytest.raises(AttributeError, match="allowed: allow_tf32"):
        torch.zion.matmul.allow_fp16 = True
    with pytest.raises(TypeError, match="True or False"):
        torch.zion.matmul.allow_tf32 = 1


# --- the run report -----------------------------------------------------------

_REPORT_SCRIPT = """
import sys, torch
if sys.argv[1] != "default":
    torch.set_float32_matmul_precision(sys.argv[1])
a = torch.ones(64, 64, device="zion")
torch.mm(a, a)
"""


def _report_of(tmp_path: Path, platform: str, precision: str) -> tuple[dict, str]:
    from processes import zion_emu_cli

    script, out = tmp_path / "mm.py", tmp_path / f"report-{precision}.json"
    script.write_text(_REPORT_SCRIPT)
    done = zion_emu_cli("run", "--platform", platform, "--report", str(out), str(script), precision)
    return json.loads(out.read_text()), done.stdout


@pytest.mark.slow
def test_the_run_report_says_which_precision_priced_float32_matmuls(tmp_path: Path):
    doc, text = _report_of(tmp_path, "hgx-a100", "high")
    assert doc["fp32_matmul_precision"] == [
        {"op": "aten::mm", "requested": "tf32", "priced": "tf32", "fell_back": False, "ranks": [0]}]
    assert "float32 matmuls        priced at tf32, as the settings asked (the last one: aten::mm)" in text
    doc, text = _report_of(tmp_path, "hgx-a100", "default")  # "highest": fp32, as on CUDA
    assert doc["fp32_matmul_precision"] == [
        {"op": "aten::mm", "requested": "fp32", "priced": "fp32", "fell_back": False, "ranks": [0]}]
    assert "priced at fp32, as the settings asked" in text
    # The A100 preset without its tf32 peak falls back to fp32, and says so.
    preset = json.loads((Path(zion_emu.__file__).parent / "platforms" / "hgx-a100.json").read_text())
    del preset["oam"]["peak_flops"]["tf32"]
    preset["name"] = "a100-without-tf32"
    path = tmp_path / "no-tf32.json"
    path.write_text(json.dumps(preset))
    doc, text = _report_of(tmp_path, str(path), "high")
    assert doc["fp32_matmul_precision"] == [
        {"op": "aten::mm", "requested": "tf32", "priced": "fp32", "fell_back": True, "ranks": [0]}]
    assert ("priced at fp32: the settings asked for tf32, which platform a100-without-tf32's OAM has no peak for"
            in text)


_MIXED_SCRIPT = """
import torch
a = torch.ones(1024, 1024, device="zion")
torch.set_float32_matmul_precision("high")
torch.mm(a, a)
torch.mm(a, a)
torch.set_float32_matmul_precision("highest")
torch.mm(a, a)
torch.mm(a.bfloat16(), a.bfloat16())  # not a float32 matmul: not counted
"""


@pytest.mark.slow
def test_the_run_report_counts_every_float32_matmul_by_precision(tmp_path: Path):
    from processes import zion_emu_cli

    script, out = tmp_path / "mixed.py", tmp_path / "report.json"
    script.write_text(_MIXED_SCRIPT)
    page = tmp_path / "report.html"
    text = zion_emu_cli("run", "--platform", "hgx-a100", "--report", str(out), "--html", str(page), str(script)).stdout
    doc = json.loads(out.read_text())
    # Hand-worked: 2 x 1024^3 FLOP each, compute-bound at both precisions
    # (12.6 MB at 2,039 GB/s x 0.7 is 8.8 us).
    flops = 2 * 1024**3
    fp32, tf32 = doc["fp32_matmul_counts"]  # most device time first
    assert (fp32["requested"], fp32["priced"], fp32["ops"], fp32["fell_back"]) == ("fp32", "fp32", 1, False)
    assert fp32["flops"] == flops and fp32["device_s"] == approx(flops / (19.5e12 * 0.7), rel=1e-9)
    assert (tf32["requested"], tf32["priced"], tf32["ops"], tf32["ranks"]) == ("tf32", "tf32", 2, [0])
    assert tf32["flops"] == 2 * flops and tf32["device_s"] == approx(2 * flops / (156e12 * 0.7), rel=1e-9)
    assert doc["fp32_matmul_precision"][0]["requested"] == "fp32"  # the last one
    assert "  priced at tf32           2 ops           4.3 GFLOP" in text
    assert "  priced at fp32           1 ops           2.1 GFLOP" in text
    html = page.read_text()
    assert "<h2>Float32 matmuls by precision</h2>" in html
    assert '<td>tf32</td><td class="num">tf32</td><td class="num">2</td><td class="num">4.3</td>' in html
