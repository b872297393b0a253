"""One process, many devices: torch.nn.parallel (replicate, scatter,
parallel_apply, gather, DataParallel, data_parallel) on zion:0..7, and a
single-process script written for CUDA (examples/dlrm_single_process.py)
under --cuda-compat.

Tolerances: DataParallel sums each weight's gradient over the replicas
(reduce_add of 8 partial sums) where the CPU sums over the whole batch in
one matmul; only the order of those sums differs, so gradients and the
losses after a step agree to float32 rounding (rtol 1e-5), not bit for bit."""

import json

import pytest
import torch
from torch.nn.parallel import DataParallel, data_parallel, gather, parallel_apply, replicate, scatter

import zion_emu
from zion_emu import _C
from processes import PYTHON, REPO, run, zion_emu_cli

DEVICES = list(range(8))
COMPUTE = 0  # span activity


def settle() -> float:
    for d in DEVICES:
        torch.zion.synchronize(d)
    return _C.device.host_time()


def model_and_batch(seed: int = 0) -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    m = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    return m, torch.randn(64, 32, generator=g), torch.randn(64, 1, generator=g)


def spans_since(t0: float) -> dict:
    """The recorded spans that start at or after ``t0``, as columns."""
    s = _C.timeline.spans()
    keep = s["start"] >= t0
    return {k: v[keep] for k, v in s.items()}


@pytest.fixture
def recording():
    _C.timeline.set_recording(1 << 20)
    yield
    _C.timeline.set_recording(0)


def test_data_parallel_on_eight_devices_matches_the_cpu(recording):
    cpu_model, x, y = model_and_batch()
    loss_cpu = torch.nn.functional.mse_loss(cpu_model(x), y)
    loss_cpu.backward()
    model, _, _ = model_and_batch()
    model = model.to("zion:0")
    t0 = settle()
    out = DataParallel(model, device_ids=DEVICES)(x.to("zion:0"))
    loss = torch.nn.functional.mse_loss(out, y.to("zion:0"))
    loss.backward()
    assert out.device == torch.device("zion:0")
    assert loss.item() == pytest.approx(loss_cpu.item(), rel=1e-6)
    for p, q in zip(model.parameters(), cpu_model.parameters()):
        # Reduced to the output device (Broadcast's backward: reduce_add_coalesced).
        assert p.grad.device == torch.device("zion:0")
        torch.testing.assert_close(p.grad.cpu(), q.grad, rtol=1e-5, atol=1e-7)


def test_the_modeled_step_runs_the_replicas_side_by_side(recording):
    # Each replica's matmuls (256 x 1024 x 1024: 60 us on the zion preset's
    # OAM) outlast the 8 launches (5 us each) the shared host clock issues
    # between them, so every device's work overlaps every other's.
    torch.manual_seed(4)
    model = torch.nn.Linear(1024, 1024).to("zion:0")
    x = torch.randn(2048, 1024).to("zion:0")
    t0 = settle()
    DataParallel(model, device_ids=DEVICES)(x).sum().backward()
    s = spans_since(t0)
    compute = {d: [(a, b) for a, b, dev, act in zip(s["start"], s["end"], s["device"], s["activity"])
                   if dev == d and act == COMPUTE] for d in DEVICES}
    overlapping = {(d, e) for d in DEVICES for e in DEVICES
                   if d < e and any(a < f and c < b for a, b in compute[d] for c, f in compute[e])}
    assert len(overlapping) == 28  # every pair of devices


def test_parallel_apply_runs_each_replica_on_its_devices_current_stream(recording):
    model, x, _ = model_and_batch(1)
    model = model.to("zion:0")
    devices = [0, 3, 5]
    streams = {d: torch.zion.Stream(d) for d in devices}
    previous = {d: torch.zion.current_stream(d) for d in devices}
    current_device = torch.zion.current_device()
    for s in streams.values():
        torch.accelerator.set_stream(s)  # also makes its device current
    try:
        t0 = settle()
        replicas = replicate(model, devices)
        inputs = scatter(x.to("zion:0"), devices)
        outputs = parallel_apply(replicas, inputs, devices=devices)
        result = gather(outputs, "zion:3")
    finally:
        for s in previous.values():
            torch.accelerator.set_stream(s)
        torch.zion.set_device(current_device)
    assert result.device == torch.device("zion:3")
    torch.testing.assert_close(result.cpu(), model.cpu()(x), rtol=1e-6, atol=1e-6)
    s = spans_since(t0)
    for d in devices:
        ops = {int(st) for dev, st, act in zip(s["device"], s["stream"], s["activity"]) if dev == d and act == COMPUTE}
        assert ops == {streams[d].stream_id}, (d, ops)


def test_data_parallel_takes_a_host_batch():
    # Scatter copies host chunks on background streams and record_stream()s them.
    model, x, _ = model_and_batch(5)
    want = model(x)
    out = DataParallel(model.to("zion:0"), device_ids=[0, 1, 2])(x)
    assert out.device == torch.device("zion:0")
    torch.testing.assert_close(out.cpu(), want, rtol=1e-6, atol=1e-6)


def test_functional_data_parallel_puts_the_output_where_asked():
    model, x, _ = model_and_batch(2)
    want = model(x)
    model = model.to("zion:2")
    out = data_parallel(model, x.to("zion:2"), device_ids=[2, 4, 6, 7], output_device=5)
    assert out.device == torch.device("zion:5")
    torch.testing.assert_close(out.cpu(), want, rtol=1e-6, atol=1e-6)


def test_the_report_covers_every_device_of_the_process_and_the_trace_each_stream(recording):
    from zion_emu import report, trace

    model, x, y = model_and_batch(3)
    model = model.to("zion:0")
    side = torch.zion.Stream(6)
    with torch.zion.stream(side):
        torch.ones(4, device="zion:6").add_(1)
    torch.nn.functional.mse_loss(DataParallel(model)(x.to("zion:0")), y.to("zion:0")).backward()
    snap = report.snapshot()
    assert {d.device for d in snap.devices} == set(DEVICES)
    names = {e["args"]["name"] for e in trace.events([snap]) if e.get("name") == "thread_name"}
    assert {f"zion:{d} stream 0" for d in DEVICES} <= names and f"zion:6 stream {side.stream_id}" in names


# -- the single-process example under --cuda-compat ------------------------------

EXAMPLE = str(REPO / "examples" / "dlrm_single_process.py")
EXAMPLE_ARGS = ["--num-batches", "3"]


def _losses(text: str) -> list[float]:
    return [float(line.split("loss=")[1].split()[0]) for line in text.splitlines() if line.startswith("iter=")]


def _zion_run(tmp_path, *args: str) -> tuple[list[float], dict]:
    out = tmp_path / f"report{len(list(tmp_path.iterdir()))}.json"
    r = zion_emu_cli("run", "--cuda-compat", "--quiet-report", "--report", str(out), EXAMPLE, *EXAMPLE_ARGS, *args,
                     timeout_s=600)
    return _losses(r.stdout), json.loads(out.read_text())


@pytest.mark.slow
def test_a_single_process_cuda_script_trains_on_eight_devices_as_on_the_cpu_and_faster_than_on_one(tmp_path):
    cpu = _losses(run([PYTHON, EXAMPLE, *EXAMPLE_ARGS, "--device", "cpu"], timeout_s=600, check=True).stdout)
    eight, report8 = _zion_run(tmp_path)
    one, report1 = _zion_run(tmp_path, "--devices", "1")
    assert len(cpu) == len(eight) == len(one) == 3
    # Same model, same data; only the order of the gradient sums differs.
    assert eight == pytest.approx(cpu, rel=1e-5) and one == pytest.approx(cpu, rel=1e-5)
    assert {d["device"] for d in report8["devices"]} == set(DEVICES)
    assert {d["device"] for d in report1["devices"]} == {0}
    assert report8["iteration_s"] < report1["iteration_s"]
