"""``zion_emu.cuda_compat``: code written for CUDA runs on zion unmodified.

The layer patches torch for a whole process, so the checks run in one helper
interpreter that enabled it (the ``compat`` fixture): each test sends a piece
of code, which asserts there, and a failure comes back with its traceback.
The example script written for CUDA, run unmodified on 1 and 2 ranks, is
test_launcher.py's (through ``zion-emu run --cuda-compat``).
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import textwrap
import time
from typing import Iterator

import pytest

import zion_emu
from zion_emu.cuda_compat import translate_backend
from processes import PYTHON, child_env, run, run_python, started, zion_emu_cli

MARK = "@@cuda-compat-check@@"
CHECK_TIMEOUT_S = 60
RUN_TIMEOUT_S = 240

_SERVER = f"""
import json, sys, traceback
import zion_emu.cuda_compat as compat
report = compat.enable()
for line in sys.stdin:
    namespace = {{"report": report, "compat": compat, "__name__": "__check__"}}
    try:
        exec(compile(json.loads(line), "<check>", "exec"), namespace)
        reply = {{"ok": True}}
    except BaseException:
        reply = {{"ok": False, "error": traceback.format_exc()}}
    print("{MARK}" + json.dumps(reply), flush=True)
"""


class CompatProcess:
    """An interpreter with cuda_compat enabled that runs checks sent to it."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc = proc

    def check(self, code: str) -> None:
        assert self.proc.stdin and self.proc.stdout
        self.proc.stdin.write(json.dumps(textwrap.dedent(code)) + "\n")
        self.proc.stdin.flush()
        deadline = time.monotonic() + CHECK_TIMEOUT_S
        fd = self.proc.stdout.fileno()
        output = b""
        while MARK.encode() not in output or not output.endswith(b"\n"):
            # Raw reads: a buffered readline could hold the reply while select waits.
            ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                pytest.fail(f"cuda-compat check did not answer in {CHECK_TIMEOUT_S} s; output: {output.decode()}")
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                pytest.fail(f"the cuda-compat process ended; output: {output.decode()}")
            output += chunk
        text, _, reply_line = output.decode().rpartition(MARK)
        reply = json.loads(reply_line)
        if not reply["ok"]:
            pytest.fail(reply["error"] + text, pytrace=False)

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(timeout=10)


@pytest.fixture(scope="module")
def compat() -> Iterator[CompatProcess]:
    with started([PYTHON, "-u", "-c", _SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                 stderr=subprocess.STDOUT, text=True, env=child_env(OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES=None),
                 bufsize=1) as proc:
        p = CompatProcess(proc)
        yield p
        p.close()


# Devices.
def test_torch_cuda_reports_the_zion_devices(compat):
    oams = zion_emu.load_platform("zion").get("oam.count")
    compat.check(f"""
        import torch
        assert torch.cuda.is_available() and torch.cuda.is_initialized() in (True, False)
        assert torch.cuda.device_count() == torch.zion.device_count() == {oams}
        torch.cuda.set_device(torch.device("cuda", 3))
        assert torch.cuda.current_device() == torch.zion.current_device() == 3
        assert torch.zeros(1, device="cuda").device == torch.device("zion", 3)
        with torch.cuda.device("cuda:5"):
            assert torch.cuda.current_device() == 5
        assert torch.cuda.current_device() == 3
        for nothing in (-1, None):
            with torch.cuda.device(nothing):
                assert torch.cuda.current_device() == 3
        with torch.cuda.device_of(torch.zeros(1, device="cuda:6")):
            assert torch.cuda.current_device() == 6
        assert torch.cuda.current_device() == 3
        assert isinstance(torch.cuda.device(1), torch.zion.device)
        try:
            torch.cuda.device({oams})
            raise AssertionError("an index past the devices was taken")
        except IndexError as e:
            assert "device index {oams} is out of range" in str(e)
        torch.cuda.set_device(0)
        assert torch.cuda.get_device_name("cuda:1") == "zion OAM"
        props = torch.cuda.get_device_properties(torch.device("cuda", 2))
        assert props.index == 2 and props.total_memory == {zion_emu.load_platform("zion").get("oam.hbm_bytes")}
        assert torch.cuda.is_bf16_supported()
    """)


def test_cuda_device_strings_and_torch_device_become_zion(compat):
    compat.check("""
        import pickle, torch
        d = torch.device("cuda", 1)
        assert d == torch.device("zion:1") and d.type == "zion" and d.index == 1
        assert torch.device("cuda") == torch.device("zion") and torch.device("cuda:2").index == 2
        assert torch.device(type="cuda", index=4) == torch.device("zion", 4)
        assert torch.device("cpu").type == "cpu" and torch.device("meta").type == "meta"
        # torch.device is a stand-in for the C type: checks and pickling still work.
        assert isinstance(d, torch.device) and type(d) is torch._C.device
        assert issubclass(torch._C.device, torch.device) and not isinstance("cuda", torch.device)
        assert pickle.loads(pickle.dumps(d)) == d
        with torch.device("cuda:1"):
            assert torch.empty(2).device == d
    """)


def test_factories_and_tensor_methods_take_cuda_devices(compat):
    compat.check("""
        import torch
        for make in (lambda dev: torch.zeros(2, 3, device=dev), lambda dev: torch.arange(6, device=dev),
                     lambda dev: torch.full((2,), 7.0, device=dev), lambda dev: torch.tensor([1, 2], device=dev),
                     lambda dev: torch.eye(3, device=dev), lambda dev: torch.empty(4, device=dev)):
            for dev, want in (("cuda", "zion:0"), ("cuda:2", "zion:2"), (torch.device("cuda", 1), "zion:1")):
                assert str(make(dev).device) == want, (make(dev).device, dev)
        assert torch.equal(torch.arange(6, device="cuda").cpu(), torch.arange(6))
        x = torch.randn(3, 4)
        assert str(x.cuda().device) == "zion:0" and str(x.cuda(2).device) == "zion:2"
        assert str(x.cuda("cuda:3").device) == "zion:3" and torch.equal(x.cuda(1).cpu(), x)
        assert str(x.to("cuda:1").device) == "zion:1" and str(x.to(device="cuda").device) == "zion:0"
        y = x.to("cuda", torch.float64)
        assert y.dtype == torch.float64 and str(y.device) == "zion:0"
        assert str(x.new_zeros(2, device="cuda:4").device) == "zion:4"
        assert str(x.new_tensor([1.0], device="cuda").device) == "zion:0"
        assert x.to(torch.float16).dtype == torch.float16 and x.to(y).device == y.device
        made_before_enable = torch._C.device("cuda", 1)  # a CUDA torch.device that escaped translation
        assert made_before_enable.type == "cuda" and str(x.to(made_before_enable).device) == "zion:1"
        assert str(torch.ones(1, device=made_before_enable).device) == "zion:1"
    """)


def test_is_cuda_is_true_for_zion_tensors_but_not_inside_torch(compat):
    # torch's own code reads is_cuda to pick CUDA-only kernels (e.g. a
    # broadcast asks for the compute capability when is_cuda), so it sees False.
    compat.check("""
        import torch
        z, c = torch.ones(2, device="cuda"), torch.ones(2)
        assert z.is_cuda and not c.is_cuda
        inside_torch = {"__name__": "torch.nn.functional"}
        exec("result = z.is_cuda", inside_torch, env := {"z": z})
        assert env["result"] is False
    """)


def test_modules_move_with_cuda_and_to(compat):
    compat.check("""
        import torch
        torch.manual_seed(0)
        m = torch.nn.Linear(4, 3)
        ref = m.weight.detach().clone()
        assert m.cuda() is m and str(m.weight.device) == "zion:0"
        assert str(m.to("cuda:2").weight.device) == "zion:2"
        assert str(m.cuda(torch.device("cuda", 1)).bias.device) == "zion:1"
        assert str(m.to(device=torch.device("cuda"), dtype=torch.float64).weight.device) == "zion:0"
        assert torch.equal(m.weight.cpu().float(), ref)
        e = torch.nn.Linear(2, 2, device="meta").to_empty(device="cuda:3")
        assert str(e.weight.device) == "zion:3"
        l = torch.nn.Linear(2, 2, device="cuda:1")
        assert str(l.weight.device) == "zion:1"
    """)


def test_torch_load_maps_cuda_locations(compat, tmp_path):
    compat.check(f"""
        import io, torch
        t = torch.arange(4.0, device="cuda:1")
        path = r"{tmp_path}/t.pt"
        torch.save({{"t": t}}, path)
        for where, want in (("cuda:0", "zion:0"), (torch.device("cuda", 2), "zion:2"),
                            ({{"zion:1": "cuda:3"}}, "zion:3"), ("cpu", "cpu"), (None, "zion:1")):
            loaded = torch.load(path, map_location=where)["t"]
            assert str(loaded.device) == want and torch.equal(loaded.cpu(), torch.arange(4.0)), (where, loaded.device)
        # A checkpoint written on a CUDA machine: its storages are tagged cuda:N
        # (same length as zion:N, so the pickle stays valid when retagged).
        import zipfile
        src = zipfile.ZipFile(path)
        cuda_path = r"{tmp_path}/cuda.pt"
        with zipfile.ZipFile(cuda_path, "w") as dst:
            for info in src.infolist():
                data = src.read(info)
                if info.filename.endswith("data.pkl"):
                    assert b"zion:1" in data
                    data = data.replace(b"zion:1", b"cuda:1")
                dst.writestr(info, data)
        before = report.remapped().get("torch.load(cuda storage)", 0)
        loaded = torch.load(cuda_path)["t"]
        assert str(loaded.device) == "zion:1" and torch.equal(loaded.cpu(), torch.arange(4.0))
        assert report.remapped()["torch.load(cuda storage)"] == before + 1
        assert str(torch.load(cuda_path, map_location="cuda:2")["t"].device) == "zion:2"
    """)


def test_a_distributed_checkpoint_of_cuda_tensors_saves_and_loads(compat, tmp_path):
    # The checkpoint writer copies to the host the tensors on the available accelerator type, "cuda" here while
    # the tensors are zion's: it copied none and stopped on "Tensor must be on CPU".
    compat.check(f"""
        import warnings, torch, torch.distributed.checkpoint as dcp
        saved = {{"w": torch.randn(3, 4, device="cuda"), "b": torch.arange(3.0, device="cuda:1")}}
        loaded = {{"w": torch.zeros(3, 4, device="cuda"), "b": torch.zeros(3, device="cuda:1")}}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "torch.distributed is ... uninitialized, assuming ... a single process"
            dcp.save(saved, checkpoint_id=r"{tmp_path}/ck")
            dcp.load(loaded, checkpoint_id=r"{tmp_path}/ck")
        assert str(loaded["w"].device) == "zion:0" and str(loaded["b"].device) == "zion:1"
        assert all(torch.equal(loaded[k].cpu(), saved[k].cpu()) for k in saved)
    """)


def test_torch_load_dict_map_location_leaves_unnamed_cuda_storages_on_their_zion_device(compat, tmp_path):
    # On CUDA a storage whose saved location the dict does not name stays there; here the unnamed
    # cuda:1 storage failed (ValueError: Expected a cuda device, but got: zion:1).
    compat.check(f"""
        import torch, zipfile
        path, cuda_path = r"{tmp_path}/two.pt", r"{tmp_path}/two_cuda.pt"
        torch.save({{"a": torch.arange(3.0, device="cuda:0"), "b": torch.arange(4.0, device="cuda:1")}}, path)
        with zipfile.ZipFile(path) as src, zipfile.ZipFile(cuda_path, "w") as dst:  # as saved on a CUDA machine
            for info in src.infolist():
                data = src.read(info)
                if info.filename.endswith("data.pkl"):
                    data = data.replace(b"zion:0", b"cuda:0").replace(b"zion:1", b"cuda:1")
                dst.writestr(info, data)
        for where, a, b in (({{"cuda:0": "cuda:0"}}, "zion:0", "zion:1"), ({{"cuda:0": "zion:0"}}, "zion:0", "zion:1"),
                            ({{"cuda:0": "cpu"}}, "cpu", "zion:1"), ({{"cuda:1": "cuda:2"}}, "zion:0", "zion:2"),
                            ({{}}, "zion:0", "zion:1")):
            for f in (cuda_path, path):  # a key cuda:i also names zion:i, the tag saved under cuda-compat
                loaded = torch.load(f, map_location=where)
                assert (str(loaded["a"].device), str(loaded["b"].device)) == (a, b), (f, where, loaded)
                assert torch.equal(loaded["b"].cpu(), torch.arange(4.0))
        assert str(torch.load(path, map_location={{"zion:1": "cpu"}})["b"].device) == "cpu"
    """)


def test_torch_compile_traces_cuda_devices(compat):
    # aot_eager: the graph runs op by op on zion (inductor is refused on zion).
    compat.check("""
        import torch
        def f(x):
            return x.to(torch.device("cuda", 1)) + torch.ones(4, device="cuda:1")
        out = torch.compile(f, backend="aot_eager")(torch.arange(4.0))
        assert str(out.device) == "zion:1" and out.cpu().tolist() == [1.0, 2.0, 3.0, 4.0]
    """)


# Random numbers.
def test_generators_and_seeds(compat):
    # A zion generator holds a CPU generator's state: a seed draws the CPU's numbers.
    compat.check("""
        import torch
        g = torch.Generator(device="cuda")
        assert g.device == torch.device("zion", 0) and isinstance(g, torch.Generator)
        g.manual_seed(5)
        assert torch.equal(torch.randn(4, device="cuda", generator=g).cpu(),
                           torch.randn(4, generator=torch.Generator().manual_seed(5)))
        assert str(torch.Generator(device="cuda:2").device) == "zion:2"
        assert str(torch.Generator().device) == "cpu"
        torch.cuda.manual_seed(7)
        a = torch.rand(3, device="cuda")
        torch.cuda.manual_seed_all(7)
        assert torch.equal(torch.rand(3, device="cuda").cpu(), a.cpu()) and torch.cuda.initial_seed() == 7
        state = torch.cuda.get_rng_state()
        b = torch.rand(3, device="cuda")
        torch.cuda.set_rng_state(state)
        assert torch.equal(torch.rand(3, device="cuda").cpu(), b.cpu())
        assert len(torch.cuda.default_generators) == torch.cuda.device_count()
        assert torch.cuda.default_generators[1] is torch.zion.default_generators[1]
        assert len(torch.cuda.get_rng_state_all()) == torch.cuda.device_count()
    """)


# Streams, events, time.
def test_events_time_a_matmul_in_modeled_milliseconds(compat):
    zion = zion_emu.load_platform("zion")
    peak, efficiency = zion.get("oam.peak_flops")["fp32"], zion.get("oam.efficiency")["matmul"]
    launch_s = zion.get("oam.launch_overhead_ns") * 1e-9
    # 2 * 512^3 / (15e12 * 0.6) + 5 us = 29.83 us + 5 us
    expected_ms = (2 * 512**3 / (peak * efficiency) + launch_s) * 1e3
    assert expected_ms == pytest.approx(0.034827, abs=1e-6)
    compat.check(f"""
        import torch
        a = torch.randn(512, 512, device="cuda")
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record(); a @ a; end.record(); end.synchronize()
        assert abs(start.elapsed_time(end) - {expected_ms!r}) < 1e-9 * {expected_ms!r}, start.elapsed_time(end)
    """)


def test_streams(compat):
    compat.check("""
        import torch
        s = torch.cuda.Stream()
        assert isinstance(s, torch.cuda.Stream) and isinstance(torch.cuda.Event(), torch.cuda.Event)
        assert isinstance(s, torch.Stream) and torch.cuda.Stream.wait_stream is torch.Stream.wait_stream
        assert s.device == torch.device("zion", 0) and s != torch.cuda.default_stream()
        assert torch.cuda.current_stream() == torch.cuda.default_stream()
        assert torch.cuda.default_stream("cuda:1").device_index == 1
        with torch.cuda.stream(s):
            assert torch.cuda.current_stream() == s
            x = torch.randn(64, 64, device="cuda") @ torch.randn(64, 64, device="cuda")
        assert torch.cuda.current_stream() == torch.cuda.default_stream()
        torch.cuda.current_stream().wait_stream(s)
        s.synchronize(); torch.cuda.synchronize("cuda:0"); torch.cuda.synchronize(torch.device("cuda", 1))
        assert not torch.cuda.is_current_stream_capturing()
    """)


def test_nvtx_cuda_profiler_and_sync_debug_mode(compat):
    # They failed with the CPU build's errors ("NVTX functions not installed", cudart None, no _cuda_* in torch._C).
    compat.check("""
        import torch, torch.cuda.nvtx as nvtx, torch.cuda.profiler
        from torch.profiler import ProfilerActivity, profile
        a = torch.randn(8, 8, device="cuda")
        with profile(activities=[ProfilerActivity.CPU]) as p:  # NVTX ranges are record_function ranges
            assert nvtx.range_push("outer") == 0 and nvtx.range_push("inner") == 1
            a @ a
            assert nvtx.range_pop() == 1 and nvtx.range_pop() == 0 and nvtx.range_pop() == -1
            with nvtx.range("step {}", 3):
                a @ a
            handle = nvtx.range_start("across")
            nvtx.range_end(handle)
            nvtx.mark("here")
        names = {e.key for e in p.key_averages()}
        assert {"outer", "inner", "step 3", "across"} <= names, names
        @nvtx.range("decorated")
        def f():
            return 1
        assert f() == 1
        torch.cuda.profiler.start(); torch.cuda.profiler.stop()
        with torch.cuda.profiler.profile():
            a @ a
        with torch.autograd.profiler.emit_nvtx(record_shapes=True):
            a @ a
        assert torch.cuda.get_sync_debug_mode() == 0
        torch.cuda.set_sync_debug_mode("warn")
        assert torch.cuda.get_sync_debug_mode() == 1
        torch.cuda.set_sync_debug_mode(2)
        assert torch.cuda.get_sync_debug_mode() == 2
        for bad in ("loud", 3):
            try:
                torch.cuda.set_sync_debug_mode(bad)
            except RuntimeError as e:
                assert "invalid value of debug_mode" in str(e)
            else:
                raise AssertionError(bad)
        torch.cuda.set_sync_debug_mode("default")
    """)


def test_a_cuda_streams_handle_is_a_cuda_only_error(compat):
    compat.check("""
        import torch
        for s in (torch.cuda.current_stream(), torch.cuda.default_stream(1), torch.cuda.Stream()):
            assert isinstance(s, torch.cuda.Stream) and s.device.type == "zion"
            try:
                s.cuda_stream
            except compat.CudaOnlyError as e:
                assert "torch.cuda.Stream.cuda_stream" in str(e) and "has no zion equivalent" in str(e)
            else:
                raise AssertionError("no error")
            assert not hasattr(s, "cuda_stream")  # also an AttributeError
        assert torch.cuda.current_stream() == torch.zion.current_stream() == torch.cuda.default_stream()
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            assert torch.cuda.current_stream() == s
    """)


def test_memory_statistics(compat):
    hbm = zion_emu.load_platform("zion").get("oam.hbm_bytes")
    compat.check(f"""
        import torch
        torch.cuda.reset_peak_memory_stats("cuda:6")
        base = torch.cuda.memory_allocated(6)
        x = torch.empty(1 << 18, dtype=torch.float32, device="cuda:6")  # 1 MiB
        assert torch.cuda.memory_allocated(torch.device("cuda", 6)) == base + (1 << 20)
        assert torch.cuda.max_memory_allocated("cuda:6") == base + (1 << 20)
        assert torch.cuda.memory_reserved(6) == torch.cuda.memory_allocated(6)  # no caching allocator
        free, total = torch.cuda.mem_get_info(6)
        assert total == {hbm} and free == total - base - (1 << 20)
        assert torch.cuda.memory_stats(6)["allocated_bytes.all.current"] == base + (1 << 20)
        del x
        torch.cuda.empty_cache()
        assert torch.cuda.memory_allocated(6) == base and torch.cuda.max_memory_allocated(6) == base + (1 << 20)
        torch.cuda.reset_peak_memory_stats(6)
        assert torch.cuda.max_memory_allocated(6) == base
        # torch.cuda's table and keys, zion's figures.
        summary = torch.cuda.memory_summary("cuda:6")
        assert summary == torch.zion.memory_summary(6) and "PyTorch zion memory summary, device ID 6" in summary
        assert torch.cuda.memory_summary(6, abbreviated=True) == torch.zion.memory_summary(6, abbreviated=True)
        import torch.cuda.memory
        assert torch.cuda.memory.memory_summary(6) == summary
        assert "| Allocated memory      |" in summary and "from small pool" in summary
        stats = torch.cuda.memory_stats("cuda:6")
        assert stats == torch.zion.memory_stats(6) and stats["capacity_bytes"] == {hbm}
        assert stats["allocated_bytes.all.peak"] == stats["allocated_bytes.all.current"] == base  # peak reset
        # The rest of torch.cuda's memory calls (they reached torch._C._cuda_* and failed).
        nested = torch.cuda.memory_stats_as_nested_dict(6)
        assert nested["allocated_bytes"]["all"]["current"] == base and nested["capacity_bytes"] == {hbm}
        torch.cuda.reset_accumulated_memory_stats(6)
        assert torch.cuda.memory_stats(6)["allocation.all.allocated"] == 0
        pinned = torch.empty(1 << 10).pin_memory()
        assert torch.cuda.host_memory_stats()["allocated_bytes.current"] == 4096
        del pinned
        torch.cuda.reset_peak_host_memory_stats()
        torch.cuda.reset_accumulated_host_memory_stats()
        assert all(v == 0 for k, v in torch.cuda.host_memory_stats().items() if k.endswith("peak_bytes"))
        torch.cuda.memory._record_memory_history(True, trace_alloc_max_entries=100)  # the older signature
        y = torch.empty(256, device="cuda:6")
        assert [s["total_size"] for s in torch.cuda.memory_snapshot()] == [1024]
        torch.cuda.memory._record_memory_history(False)
    """)


def test_legacy_typed_constructors(compat):
    compat.check("""
        import torch
        x = torch.cuda.FloatTensor(2, 3)
        assert x.shape == (2, 3) and x.dtype == torch.float32 and str(x.device) == "zion:0"
        y = torch.cuda.LongTensor([1, 2, 3])
        assert y.dtype == torch.int64 and y.cpu().tolist() == [1, 2, 3]
        assert torch.cuda.HalfTensor(torch.Size([4])).dtype == torch.float16
        assert torch.cuda.DoubleTensor(torch.ones(2)).dtype == torch.float64
        assert isinstance(x, torch.cuda.FloatTensor) and not isinstance(x, torch.cuda.LongTensor)
        assert not isinstance(torch.ones(2), torch.cuda.FloatTensor)
        z = torch.ones(2).type("torch.cuda.BFloat16Tensor")
        assert z.dtype == torch.bfloat16 and str(z.device) == "zion:0"
        assert torch.ones(2).type(torch.cuda.IntTensor).dtype == torch.int32
        assert torch.ones(2).type() == "torch.FloatTensor"
        try:
            torch.ones(2).type("torch.cuda.QuadTensor")
        except ValueError as e:
            assert "unknown tensor type 'torch.cuda.QuadTensor'" in str(e) and "torch.cuda.FloatTensor" in str(e)
        else:
            raise AssertionError("no error")
    """)


# Mixed precision.
def test_autocast_and_grad_scaler_for_cuda(compat):
    compat.check("""
        import torch
        a = torch.randn(8, 8, device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            assert (a @ a).dtype == torch.bfloat16 and torch.is_autocast_enabled("zion")
        with torch.amp.autocast(device_type="cuda", dtype=torch.bfloat16):
            assert (a @ a).dtype == torch.bfloat16
        with torch.cuda.amp.autocast(dtype=torch.bfloat16):
            assert (a @ a).dtype == torch.bfloat16
        assert (a @ a).dtype == torch.float32
        assert isinstance(torch.autocast("cuda"), torch.amp.autocast_mode.autocast)
        for scaler in (torch.amp.GradScaler("cuda"), torch.amp.GradScaler(), torch.cuda.amp.GradScaler()):
            assert scaler._device == "zion"
            w = torch.nn.Parameter(torch.ones(4, device="cuda"))
            opt = torch.optim.SGD([w], lr=0.5)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = (w * 2).sum()
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            assert torch.equal(w.detach().cpu(), torch.zeros(4))  # 1 - 0.5 * 2
    """)



def test_the_autocast_state_reads_and_sets_zions_where_cuda_or_no_device_is_named(compat):
    # Inside torch.autocast("cuda") (a zion region), torch.is_autocast_enabled() read False and
    # torch.get_autocast_gpu_dtype() float16: code branching on them took the path without autocast.
    compat.check("""
        import torch
        assert not torch.is_autocast_enabled() and not torch.is_autocast_enabled("cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            assert torch.is_autocast_enabled() and torch.is_autocast_enabled("cuda")
            assert torch.is_autocast_enabled(device_type="cuda") and torch.is_autocast_enabled("zion")
            assert torch.get_autocast_gpu_dtype() == torch.get_autocast_dtype("cuda") == torch.bfloat16
            assert not torch.is_autocast_enabled("cpu")
        assert not torch.is_autocast_enabled()
        torch.set_autocast_gpu_dtype(torch.float16)
        assert torch.get_autocast_dtype("zion") == torch.float16
        torch.set_autocast_dtype("cuda", torch.bfloat16)
        torch.set_autocast_enabled(True)  # the older form, without a device: CUDA's, here zion's
        try:
            a = torch.randn(8, 8, device="cuda")
            assert torch.is_autocast_enabled("zion") and (a @ a).dtype == torch.bfloat16
        finally:
            torch.set_autocast_enabled("cuda", False)
        assert not torch.is_autocast_enabled("zion")
    """)

# torch.distributed.
def test_backend_names_map_nccl_to_zion():
    assert translate_backend("nccl") == "zion"
    assert translate_backend("NCCL") == "zion"
    assert translate_backend(None) == "zion"
    assert translate_backend("gloo") == "gloo"
    assert translate_backend("cpu:gloo,cuda:nccl") == "cpu:gloo,zion:zion"
    assert translate_backend("zion") == "zion"


def test_nccl_process_group_is_the_zion_backend(compat, tmp_path):
    compat.check(f"""
        import datetime, torch, torch.distributed as dist
        assert dist.is_nccl_available()
        dist.init_process_group("nccl", init_method="file://{tmp_path}/store", rank=0, world_size=1,
                                timeout=datetime.timedelta(seconds=30))
        assert dist.get_backend() == "zion"
        g = dist.new_group(backend="nccl")
        assert dist.get_backend(g) == "zion"
        x = torch.arange(4.0, device="cuda")
        dist.all_reduce(x, group=g)
        assert torch.equal(x.cpu(), torch.arange(4.0))
        assert dist.distributed_c10d._get_default_group()._get_backend(torch.device("cuda")) is not None
        dist.destroy_process_group()
        assert report.remapped()["init_process_group(backend='nccl')"] == 1
        assert report.remapped()["new_group(backend='nccl')"] == 1
    """)


def test_profiler_use_cuda_gives_zion_device_events(compat):
    compat.check("""
        import torch, warnings
        from torch.profiler import ProfilerActivity, profile
        a = torch.randn(16, 16, device="cuda")
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no "CUDA is not available" warning
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
                a @ a
        kineto = {e.key: e.self_device_time_total for e in p.key_averages()}
        with torch.autograd.profiler.profile(use_cuda=True) as p:
            a @ a
        legacy = {e.key: e.self_device_time_total for e in p.key_averages()}
        # Both forms give the matmul its modeled device time (test_profiler.py checks its value), up to
        # the rounding of the profiler's timestamps (a run's modeled clock is offset to the profile's start).
        import math
        assert kineto["aten::mm"] > 0 and math.isclose(kineto["aten::mm"], legacy["aten::mm"], rel_tol=1e-9), \
            (kineto, legacy)
        assert report.remapped()["profiler(use_cuda) -> zion device events"] >= 1
        assert report.remapped()["profiler(ProfilerActivity.CUDA) -> zion device events"] >= 1
    """)


# What has no zion equivalent.
@pytest.mark.parametrize("call, name", [
    ("torch.cuda.get_device_capability()", "torch.cuda.get_device_capability"),
    ("torch.cuda.CUDAGraph()", "torch.cuda.CUDAGraph"),
    ("torch.cuda.graphs.CUDAGraph()", "torch.cuda.CUDAGraph"),
    ("torch.cuda.graph(None)", "torch.cuda.graph"),
    ("torch.cuda.make_graphed_callables(torch.nn.Linear(2, 2), (torch.ones(2),))", "torch.cuda.make_graphed_callables"),
    ("torch.cuda.nccl.all_reduce([torch.ones(2, device='cuda')])", "torch.cuda.nccl.all_reduce"),
    ("torch._C._scatter(torch.ones(2, device='cuda'), [0, 1], None, 0, None)", "torch._C._scatter"),
    ("torch.cuda.utilization()", "torch.cuda.utilization"),
    ("torch.cuda.ExternalStream(0)", "torch.cuda.ExternalStream"),
    ("torch.cuda.memory.set_per_process_memory_fraction(0.5)", "torch.cuda.set_per_process_memory_fraction"),
    ("torch.cuda.memory.get_per_process_memory_fraction()", "torch.cuda.get_per_process_memory_fraction"),
    ("torch.cuda.tunable.enable(True)", "torch.cuda.tunable.enable"),
])
def test_cuda_only_calls_raise_naming_the_call(compat, call, name):
    compat.check(f"""
        import torch, torch.cuda.comm, torch.cuda.graphs, torch.cuda.memory, torch.cuda.nccl, torch.cuda.tunable
        try:
            {call}
        except compat.CudaOnlyError as e:
            assert {name!r} in str(e) and "has no zion equivalent" in str(e), str(e)
        else:
            raise AssertionError("no error")
    """)


def test_torch_cuda_comm_and_data_parallel_run_on_zion(compat):
    compat.check("""
        import torch, torch.cuda.comm
        x = torch.arange(6.0, device="cuda").reshape(3, 2)
        copies = torch.cuda.comm.broadcast(x, [0, 1, 2])
        assert copies[0] is x and [c.device.index for c in copies] == [0, 1, 2]
        assert all(torch.equal(c.cpu(), x.cpu()) for c in copies)
        coalesced = torch._C._broadcast_coalesced([x], [0, 3], 1024)
        assert str(coalesced[1][0].device) == "zion:3" and torch.equal(coalesced[1][0].cpu(), x.cpu())
        m = torch.nn.Linear(2, 2).cuda()
        out = torch.nn.DataParallel(m, device_ids=[0, 1])(torch.ones(4, 2, device="cuda"))
        assert str(out.device) == "zion:0" and torch.allclose(out.cpu(), m.cpu()(torch.ones(4, 2)))
        assert report.remapped()["torch.cuda.comm.broadcast"] == 1
        assert report.remapped()["torch._C._broadcast_coalesced"] == 1
    """)


def test_report_counts_remapped_calls_and_enable_is_idempotent(compat):
    compat.check("""
        import torch
        assert compat.enable() is report and compat.enabled()
        before = report.remapped()
        torch.ones(1, device="cuda"); torch.ones(1, device="cuda"); torch.ones(1, device="cpu")
        torch.cuda.synchronize()
        after = report.remapped()
        assert after["torch.ones(device=cuda)"] == before.get("torch.ones(device=cuda)", 0) + 2
        assert after["torch.cuda.synchronize"] == before.get("torch.cuda.synchronize", 0) + 1
        assert "torch.ones(device=cuda)" in str(report)
        assert "torch.device" in report.patched and "torch.cuda.is_available" in report.patched
    """)


def test_nothing_changes_until_enabled():
    run_python("""
        import torch, zion_emu, zion_emu.cuda_compat as compat
        assert not compat.enabled() and not torch.cuda.is_available()
        assert torch.device("cuda").type == "cuda" and torch.device is torch._C.device
        try:
            torch.zeros(1, device="cuda")
        except (AssertionError, RuntimeError):
            pass
        else:
            raise AssertionError("CUDA tensor made without cuda-compat")
    """, timeout_s=RUN_TIMEOUT_S)


# Processes a cuda-compat process starts.
_SPAWNED_RANKS = """
import sys, torch, torch.distributed as dist, torch.multiprocessing as mp

def worker(gpu, n, store):  # pytorch/examples' ImageNet pattern
    torch.cuda.set_device(gpu)
    dist.init_process_group("nccl", init_method="file://" + store, world_size=n, rank=gpu)
    t = torch.ones(2, device="cuda") * (gpu + 1)
    dist.all_reduce(t)
    sys.stdout.write(f"rank {gpu} {t.tolist()} {t.device} {dist.get_backend()}\\n")  # one write: the ranks share stdout
    sys.stdout.flush()
    dist.destroy_process_group()

if __name__ == "__main__":
    mp.spawn(worker, args=(2, sys.argv[1]), nprocs=2)
"""


def test_mp_spawn_ranks_of_a_cuda_compat_run_are_in_cuda_compat(tmp_path):
    # The children died in torch.cuda.set_device (no torch._C._cuda_setDevice).
    script = tmp_path / "spawn_ranks.py"
    script.write_text(_SPAWNED_RANKS)
    out = zion_emu_cli("run", "--cuda-compat", str(script), str(tmp_path / "store"), timeout_s=RUN_TIMEOUT_S,
                       env=child_env(CUDA_VISIBLE_DEVICES=None)).stdout
    for rank in (0, 1):
        assert f"rank {rank} [3.0, 3.0] zion:{rank} zion" in out, out


_SPAWNED_WORKERS = """
import torch, zion_emu.cuda_compat
from torch.utils.data import DataLoader, Dataset

class Seen(Dataset):
    def __len__(self):
        return 2

    def __getitem__(self, i):
        return torch.cuda.is_available(), torch.cuda.device_count(), torch.zeros(1, device="cuda").device.type

if __name__ == "__main__":
    zion_emu.cuda_compat.enable()
    loader = DataLoader(Seen(), batch_size=None, num_workers=1, multiprocessing_context="spawn")
    print("workers saw", sorted({tuple(seen) for seen in loader}))
"""


def test_spawned_dataloader_workers_are_in_cuda_compat(tmp_path):
    script = tmp_path / "workers.py"
    script.write_text(_SPAWNED_WORKERS)
    n = zion_emu.load_platform("zion").get("oam.count")
    out = run([PYTHON, str(script)], timeout_s=RUN_TIMEOUT_S, check=True,
              env=child_env(CUDA_VISIBLE_DEVICES=None)).stdout
    assert f"workers saw [(True, {n}, 'zion')]" in out, out


# CUDA_VISIBLE_DEVICES.
def test_cuda_visible_devices_is_read_as_cuda_reads_it():
    from zion_emu.cuda_compat import _parse_visible

    for value, count in (("0", 1), ("0,1,2", 3), ("", 0), ("-1", 0), ("0,0", 0), ("0,1,-1,2", 2),
                         ("0,1,8,2", 2), (" 0, 1gpu", 2), ("0,x,1", 1)):
        assert _parse_visible(value, 8) == count, value
    for value in ("1,2", "3", "1,0", "GPU-8e4c2a1f"):
        with pytest.raises(ValueError, match=f"CUDA_VISIBLE_DEVICES='{value}'"):
            _parse_visible(value, 8)


def test_cuda_visible_devices_limits_the_devices():
    # It was ignored: device_count() 8 and nn.DataParallel 8 replicas whatever it said.
    code = """
        import torch, zion_emu.cuda_compat as compat
        compat.enable()
        print("seen", torch.cuda.is_available(), torch.cuda.device_count(), len(torch.cuda.default_generators))
        try:
            torch.zeros(1, device="cuda:2")
        except RuntimeError as e:
            print("refused", e)
        if torch.cuda.is_available():
            m = torch.nn.DataParallel(torch.nn.Linear(2, 2).cuda())
            print("replicas", m.device_ids)
    """
    two = run_python(code, env=child_env(CUDA_VISIBLE_DEVICES="0,1"), timeout_s=RUN_TIMEOUT_S).stdout
    assert "seen True 2 2" in two and "replicas [0, 1]" in two, two
    assert "refused CUDA error: invalid device ordinal: cuda:2" in two and "CUDA_VISIBLE_DEVICES='0,1'" in two, two
    none = run_python(code, env=child_env(CUDA_VISIBLE_DEVICES=""), timeout_s=RUN_TIMEOUT_S).stdout
    assert "seen False 0 0" in none and "refused No CUDA GPUs are available" in none, none
    renumbered = run_python(code, env=child_env(CUDA_VISIBLE_DEVICES="1,2"), timeout_s=RUN_TIMEOUT_S, check=False)
    assert renumbered.returncode != 0 and "CUDA_VISIBLE_DEVICES='1,2'" in renumbered.stderr, renumbered.stderr
    assert "cannot renumber" in renumbered.stderr
