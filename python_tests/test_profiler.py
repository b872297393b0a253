"""torch.profiler sees zion as its PrivateUse1 device: every priced op, copy
and collective is a device event with its modeled start and duration, on its
OAM and stream, linked to the CPU op that issued it."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import torch
from torch.profiler import ProfilerActivity, profile, record_function, schedule, tensorboard_trace_handler

import zion_emu
from processes import run_python, zion_emu_cli

ZION = ProfilerActivity.PrivateUse1


def matmul_us(m: int, n: int, k: int) -> float:
    """A float32 matmul on the zion preset: 2mnk FLOP at oam.peak_flops.fp32
    x oam.efficiency.matmul (15 TFLOP/s x 0.6 = 9 TFLOP/s), in microseconds.
    The 5 us launch overhead is host time, not the kernel's."""
    platform = zion_emu.load_platform("zion")
    peak = platform.get("oam.peak_flops.fp32") * platform.get("oam.efficiency.matmul")
    assert peak == 9e12
    return 2 * m * n * k / peak * 1e6


def device_events(trace: dict) -> list[dict]:
    return [e for e in trace["traceEvents"] if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy")]


def test_zion_is_a_profiler_activity():
    assert ZION in torch.profiler.supported_activities()


def test_matmul_device_time_is_its_modeled_time(tmp_path: Path):
    a = torch.randn(1024, 1024, device="zion")
    b = torch.randn(1024, 1024, device="zion")
    torch.zion.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ZION]) as prof:
        c = a @ b
        c @ b  # issued while the first runs: it starts on the stream when the first ends
        torch.zion.synchronize()
    expected = matmul_us(1024, 1024, 1024)  # 238.609 us
    assert expected == pytest.approx(238.609, abs=1e-3)
    stats = {e.key: e for e in prof.key_averages()}
    mm = stats["aten::mm"]
    assert mm.count == 2
    # Each event's duration is whole nanoseconds: 1 ns of rounding per event at most.
    assert mm.self_device_time_total == pytest.approx(2 * expected, abs=2e-3)
    assert stats["aten::matmul"].device_time_total == pytest.approx(2 * expected, abs=2e-3)
    assert stats["aten::matmul"].self_device_time_total == 0
    assert mm.self_cpu_time_total > 0  # the host side is the emulation's wall time

    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    trace = json.loads(path.read_text())
    names = {(e["pid"], e["args"]["name"]) for e in trace["traceEvents"]
             if e.get("ph") == "M" and e["name"] == "process_name"}
    assert (0, "zion:0") in names  # a device track beside the host's
    kernels = sorted((e for e in device_events(trace) if e["name"] == "aten::mm"), key=lambda e: e["ts"])
    assert [(e["pid"], e["tid"]) for e in kernels] == [(0, 0), (0, 0)]
    assert [e["dur"] for e in kernels] == [pytest.approx(expected, abs=1e-3)] * 2
    # Modeled start: the second matmul waits for the first on stream 0.
    assert kernels[1]["ts"] - kernels[0]["ts"] == pytest.approx(expected, abs=2e-3)
    assert kernels[0]["args"]["modeled duration (us)"] == pytest.approx(expected, rel=1e-12)
    # Each device event names the CPU op that issued it.
    host_mm = [e for e in trace["traceEvents"] if e.get("cat") == "cpu_op" and e["name"] == "aten::mm"]
    assert sorted(e["args"]["correlation"] for e in kernels) == sorted(e["args"]["External id"] for e in host_mm)


def test_copies_and_streams_are_their_own_events():
    x = torch.randn(1 << 20, device="zion:1")
    torch.zion.synchronize(1)
    side = torch.zion.Stream("zion:1")
    with profile(activities=[ProfilerActivity.CPU, ZION]) as prof:
        with torch.zion.stream(side):
            y = x * 2
        y.cpu()
    events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.PrivateUse1]
    by_name = {e.name: e for e in events}  # ops are named with their overload, as the cost model prices them
    assert by_name["aten::mul.Tensor"].device_index == 1
    assert by_name["aten::mul.Tensor"].device_resource_id == side.stream_id
    assert by_name["copy D2H"].device_index == 1
    # The copy is the modeled transfer: 4 MiB over zion:1's PCIe switch to
    # its socket, whose gen3 x16 uplink (16 lanes x 0.75 GB/s = 12 GB/s) is
    # the narrowest link, plus 2 PCIe hops x 150 ns.
    assert by_name["copy D2H"].time_range.elapsed_us() == pytest.approx((4 << 20) / 12e9 * 1e6 + 0.3, abs=1e-3)
    assert by_name["copy D2H"].device_resource_id == 0  # the current stream again, outside the side stream


def test_record_function_has_device_work_under_it(tmp_path: Path):
    a = torch.randn(512, 512, device="zion")
    with profile(activities=[ProfilerActivity.CPU, ZION]) as prof:
        with record_function("forward"):
            b = a @ a
            b = b @ a
        b.cpu()
    stats = {e.key: e for e in prof.key_averages()}
    # The range's own CPU event holds the device time of the ops inside it.
    assert stats["forward"].device_time_total == pytest.approx(2 * matmul_us(512, 512, 512), abs=2e-3)
    path = tmp_path / "t.json"
    prof.export_chrome_trace(str(path))
    trace = json.loads(path.read_text())
    host = [e for e in trace["traceEvents"] if e.get("cat") == "user_annotation" and e["name"] == "forward"]
    device = [e for e in trace["traceEvents"] if e.get("cat") == "gpu_user_annotation" and e["name"] == "forward"]
    assert len(host) == 1 and len(device) == 1
    assert device[0]["pid"] == 0
    assert device[0]["dur"] == pytest.approx(2 * matmul_us(512, 512, 512), abs=2e-3)


def test_schedule_and_tensorboard_handler(tmp_path: Path):
    a = torch.randn(256, 256, device="zion")
    with profile(activities=[ProfilerActivity.CPU, ZION], schedule=schedule(wait=1, warmup=1, active=2, repeat=1),
                 on_trace_ready=tensorboard_trace_handler(str(tmp_path))) as prof:
        for _ in range(5):
            (a @ a).sum().item()
            prof.step()
    files = list(tmp_path.glob("*.pt.trace.json"))
    assert len(files) == 1
    trace = json.loads(files[0].read_text())
    kernels = [e for e in device_events(trace) if e["name"] == "aten::mm"]
    assert len(kernels) == 2  # the two active steps only
    assert all(e["dur"] == pytest.approx(matmul_us(256, 256, 256), abs=1e-3) for e in kernels)


def test_cpu_only_profiles_record_no_device_events():
    a = torch.randn(64, 64, device="zion")
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        a @ a
    assert not [e for e in prof.events() if e.device_type != torch.autograd.DeviceType.CPU]
    assert any(e.name == "aten::mm" for e in prof.events())


def test_a_profile_of_cpu_work_leaves_the_device_unstarted():
    run_python("""
        import torch, zion_emu
        from torch.profiler import profile
        with profile() as prof:  # the default activities include zion's
            torch.ones(4) + 1
        assert not torch.zion.is_initialized()
        zion_emu.set_platform("hgx-h100")  # still allowed: no zion tensor exists
        with profile() as prof:
            a = torch.ones(64, 64, device="zion")  # starts the device: its allocation is not in the profile
            a @ a
        names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.PrivateUse1]
        assert names[-1] == "aten::mm" and torch.zion.get_device_name() == "hgx-h100 OAM"
    """)


@pytest.fixture
def modeled_host_time():
    zion_emu.profiler.set_host_time("modeled")
    try:
        yield
    finally:
        zion_emu.profiler.set_host_time("wall")


def launch_us() -> float:
    """The host's cost of issuing one op on the zion preset: 5 us."""
    launch = zion_emu.load_platform("zion").get("oam.launch_overhead_ns") / 1e3
    assert launch == 5.0
    return launch


def test_host_track_in_modeled_time(tmp_path: Path, modeled_host_time):
    a = torch.randn(1024, 1024, device="zion")
    torch.zion.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ZION]) as prof:
        with record_function("step"):
            a @ a
            torch.zion.synchronize()
    # Hand-worked: the host spends one launch issuing the matmul, then waits
    # for it; the kernel starts when its launch ends.
    launch, mm = launch_us(), matmul_us(1024, 1024, 1024)
    stats = {e.key: e for e in prof.key_averages()}
    assert stats["aten::mm"].cpu_time_total == pytest.approx(launch, abs=2e-3)
    assert stats["aten::matmul"].cpu_time_total == pytest.approx(launch, abs=2e-3)
    assert stats["aten::matmul"].self_cpu_time_total == pytest.approx(0, abs=2e-3)
    assert stats["step"].cpu_time_total == pytest.approx(launch + mm, abs=2e-3)
    assert stats["step"].self_cpu_time_total == pytest.approx(mm, abs=3e-3)  # the wait in synchronize
    assert stats["aten::mm"].device_time_total == pytest.approx(mm, abs=2e-3)  # device time is unchanged

    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    trace = json.loads(path.read_text())
    assert trace["zionHostTime"] == "modeled"
    events = {(e["cat"], e["name"]): e for e in trace["traceEvents"] if e.get("ph") == "X"}
    host_mm, kernel, step = events["cpu_op", "aten::mm"], events["kernel", "aten::mm"], events["user_annotation", "step"]
    assert host_mm["dur"] == pytest.approx(launch, abs=2e-3)
    assert kernel["ts"] == pytest.approx(host_mm["ts"] + host_mm["dur"], abs=2e-3)  # on the device's axis
    assert step["ts"] == pytest.approx(host_mm["ts"], abs=2e-3)
    assert step["ts"] + step["dur"] == pytest.approx(kernel["ts"] + kernel["dur"], abs=2e-3)


def test_a_range_without_a_synchronize_lasts_the_launch_in_modeled_host_time(modeled_host_time):
    # README's example: the host runs ahead of the device, so the range ends with the launch.
    a = torch.randn(1024, 1024, device="zion")
    torch.zion.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ZION]) as prof:
        with record_function("step"):
            a @ a
    stats = {e.key: e for e in prof.key_averages()}
    assert stats["step"].cpu_time_total == pytest.approx(launch_us(), abs=2e-3)
    assert stats["aten::mm"].device_time_total == pytest.approx(matmul_us(1024, 1024, 1024), abs=2e-3)


def test_profile_memory_records_each_zion_block_on_its_device(tmp_path: Path):
    # It recorded none: the HBM pool did not report to the profiler, and a small result of a zion op's CPU
    # kernel was reported as CPU memory.
    x = torch.ones(64, 64, device="zion:2")
    with profile(activities=[ProfilerActivity.CPU, ZION], profile_memory=True) as prof:
        a = torch.empty(1 << 20, device="zion:2")  # 4 MiB
        del a
        y = torch.mm(x, x)  # 16 KiB, made by the CPU kernel on zion's behalf
        b = torch.empty(1 << 10)  # 4 KiB on the CPU
    stats = {e.key: e for e in prof.key_averages()}
    assert stats["aten::empty"].device_memory_usage == 4 << 20
    assert stats["aten::empty"].cpu_memory_usage == 4 << 10
    assert (stats["aten::mm"].device_memory_usage, stats["aten::mm"].cpu_memory_usage) == (16 << 10, 0)
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    memory = [e["args"] for e in json.loads(path.read_text())["traceEvents"] if e.get("name") == "[memory]"]
    zion = [(m["Device Id"], m["Bytes"], m["Total Allocated"]) for m in memory if m["Device Type"] == 20]
    held = 16 << 10  # x
    assert zion == [(2, 4 << 20, held + (4 << 20)), (2, -(4 << 20), held), (2, 16 << 10, 2 * held)]
    assert torch.equal(y.cpu(), x.cpu() @ x.cpu()) and b.numel() == 1 << 10


def test_host_track_is_wall_time_by_default(tmp_path: Path):
    assert zion_emu.profiler.host_time() == "wall"
    a = torch.randn(1024, 1024, device="zion")
    torch.zion.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ZION]) as prof:
        a @ a
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    trace = json.loads(path.read_text())
    assert "zionHostTime" not in trace
    # The emulator runs the 2 GFLOP matmul on this host's cores: far more
    # wall time than the 5 us the modeled host spends launching it.
    assert {e.key: e for e in prof.key_averages()}["aten::mm"].cpu_time_total > 20 * launch_us()


def test_modeled_host_time_with_a_schedule(tmp_path: Path, modeled_host_time):
    a = torch.randn(256, 256, device="zion")
    with profile(activities=[ProfilerActivity.CPU, ZION], schedule=schedule(wait=1, warmup=1, active=2, repeat=1),
                 on_trace_ready=tensorboard_trace_handler(str(tmp_path))) as prof:
        for _ in range(5):
            a @ a
            prof.step()
    (file,) = tmp_path.glob("*.pt.trace.json")
    trace = json.loads(file.read_text())
    assert trace["zionHostTime"] == "modeled"
    host_mm = [e for e in trace["traceEvents"] if e.get("cat") == "cpu_op" and e["name"] == "aten::mm"]
    assert [e["dur"] for e in host_mm] == [pytest.approx(launch_us(), abs=2e-3)] * 2


def test_host_time_names_the_clocks_it_takes():
    with pytest.raises(ValueError, match=r"one of wall, modeled, got 'cpu'"):
        zion_emu.profiler.set_host_time("cpu")
    assert zion_emu.profiler.host_time() == "wall"


def test_run_sets_the_host_time_of_its_ranks(tmp_path: Path):
    script = tmp_path / "prof.py"
    script.write_text(textwrap.dedent("""
        import json, sys
        import torch
        from torch.profiler import ProfilerActivity, profile
        a = torch.randn(512, 512, device="zion")
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as prof:
            a @ a
        prof.export_chrome_trace(sys.argv[1])
        print("mm_us", {e.key: e for e in prof.key_averages()}["aten::mm"].cpu_time_total)
    """))
    trace = tmp_path / "t.json"
    out = zion_emu_cli("run", "--quiet-report", "--profiler-host-time", "modeled", str(script), str(trace)).stdout
    assert float(out.split("mm_us")[1].split()[0]) == pytest.approx(launch_us(), abs=2e-3)
    assert json.loads(trace.read_text())["zionHostTime"] == "modeled"
    bad = zion_emu_cli("run", "--profiler-host-time", "cpu", str(script), check=False)
    assert bad.returncode != 0 and "invalid choice: 'cpu'" in bad.stderr
