"""torch.zion.memory: the HBM history and snapshots in torch.cuda.memory's
format, read back by torch's own memory_viz."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import pytest
import torch

from processes import run_python


def test_a_training_step_snapshot_renders_and_peaks_at_max_memory_allocated(tmp_path: Path):
    # A fresh interpreter: the pools hold nothing before recording starts.
    run_python(f"""
        import pickle, torch, zion_emu
        from torch import nn
        from torch.cuda import _memory_viz
        torch.zion.memory._record_memory_history(max_entries=100000)
        model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 10)).to("zion")
        opt = torch.optim.Adam(model.parameters())
        x, y = torch.randn(64, 256, device="zion"), torch.randint(0, 10, (64,), device="zion")
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad()
        torch.zion.memory._dump_snapshot({str(tmp_path / "snap.pickle")!r})
        snap = torch.zion.memory._snapshot()
        trace = snap["device_traces"][0]
        assert zion_emu.memory.peak_from_trace(snap, 0) == torch.zion.max_memory_allocated() > 0
        # Allocations carry the Python line that made them and modeled times.
        allocs = [e for e in trace if e["action"] == "alloc"]
        assert any(f["name"] == "<module>" and f["filename"].endswith("<string>") for e in allocs for f in e["frames"])
        times = [e["time_us"] for e in trace]
        assert times == sorted(times) and times[-1] > times[0]
        # Segments are the live allocations: the parameters, Adam's state, x and y.
        assert sum(s["allocated_size"] for s in snap["segments"]) == torch.zion.memory_allocated()
        # torch's own readers take it.
        assert "Active Memory Timeline" in _memory_viz.trace_plot(snap)
        assert _memory_viz.segment_plot(snap)
        assert "alloc" in _memory_viz.trace(snap)
        assert "Summary of segments" in _memory_viz.segsum(snap)
    """)
    snap = pickle.loads((tmp_path / "snap.pickle").read_bytes())
    assert snap["segments"] and snap["device_traces"][0]


def test_an_out_of_memory_error_is_in_the_trace():
    run_python("""
        import torch, zion_emu
        zion_emu.set_platform("zion", overrides={"oam.hbm_bytes": 1 << 20})
        torch.zion.memory._record_memory_history()
        a = torch.empty(1 << 18, device="zion")  # 1 MiB: all of it
        try:
            torch.empty(16, device="zion")
        except torch.OutOfMemoryError:
            pass
        else:
            raise AssertionError("expected an OOM")
        oom = [e for e in torch.zion.memory._snapshot()["device_traces"][0] if e["action"] == "oom"]
        assert len(oom) == 1 and oom[0]["size"] == 64 and oom[0]["device_free"] == 0
    """)


def test_stopping_keeps_what_was_recorded_and_records_nothing_more():
    run_python("""
        import torch, zion_emu
        torch.zion.memory._record_memory_history()
        a = torch.empty(1000, device="zion")
        torch.zion.memory._record_memory_history(enabled=None)
        b = torch.empty(2000, device="zion")
        sizes = [e["size"] for e in torch.zion.memory._snapshot()["device_traces"][0] if e["action"] == "alloc"]
        assert sizes == [4000]
        del a  # allocated while recording: its free is still recorded, so the trace stays balanced
        frees = [e["size"] for e in torch.zion.memory._snapshot()["device_traces"][0] if e["action"] == "free_completed"]
        assert frees == [4000]
    """)


def test_recording_the_state_keeps_the_segments_and_no_trace():
    # enabled="state", as torch.cuda's: what is alive, without the trace of events (it recorded the trace).
    run_python("""
        import torch, zion_emu
        torch.zion.memory._record_memory_history(enabled="state")
        a, b = torch.empty(1000, device="zion"), torch.empty(2000, device="zion:1")
        del b
        snap = torch.zion.memory._snapshot()
        assert all(trace == [] for trace in snap["device_traces"])
        assert [(s["device"], s["total_size"]) for s in snap["segments"]] == [(0, 4000)]
    """)


def test_cuda_compat_forms_are_zions():
    run_python("""
        import torch, zion_emu.cuda_compat
        zion_emu.cuda_compat.enable()
        torch.cuda.memory._record_memory_history()
        a = torch.empty(256, device="cuda")
        snap = torch.cuda.memory._snapshot()
        assert [e["size"] for e in snap["device_traces"][0] if e["action"] == "alloc"] == [1024]
    """)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="enabled='yes'"):
        torch.zion.memory._record_memory_history(enabled="yes")
    with pytest.raises(ValueError, match="max_entries=0"):
        torch.zion.memory._record_memory_history(max_entries=0)


def test_timing_only_snapshot_of_a_model_bigger_than_the_host(tmp_path: Path):
    # A 25M x 64 fp32 table (6.4 GB; with its dense gradient, Adagrad's state
    # and the step's temporaries the peak passes this host's 24 GiB) holds no
    # host bytes in timing-only mode; its memory picture is all there.
    out = run_python("""
        import resource, torch, zion_emu
        from torch import nn
        from torch.cuda import _memory_viz
        assert zion_emu.mode() == "timing"
        torch.ones(1, device="zion")  # the runtime is up: what the process holds before the model
        rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        torch.zion.memory._record_memory_history(max_entries=100000)
        rows, dim = 25_000_000, 64
        table = nn.EmbeddingBag(rows, dim, mode="sum", device="zion")
        top = nn.Linear(dim, 1, device="zion")
        opt = torch.optim.Adagrad([*table.parameters(), *top.parameters()])
        idx = torch.randint(0, rows, (4096,), device="zion")
        offsets = torch.arange(0, 4096, 2, device="zion")
        top(table(idx, offsets)).sum().backward()
        opt.step()
        snap = torch.zion.memory._snapshot()
        trace = snap["device_traces"][0]
        table_bytes = rows * dim * 4
        assert any(e["action"] == "alloc" and e["size"] == table_bytes for e in trace)
        peak = zion_emu.memory.peak_from_trace(snap, 0)
        assert peak == torch.zion.max_memory_allocated() >= 3 * table_bytes
        assert sum(s["allocated_size"] for s in snap["segments"]) == torch.zion.memory_allocated()
        assert "Active Memory Timeline" in _memory_viz.trace_plot(snap)
        print("peak", peak)
        # The host never held the table: the process's peak resident memory
        # grew by less than a quarter of it. Holding it would add all 6.4 GB;
        # the growth is the dense backward's CPU kernel on its narrow stand-in
        # (a 25M-row result and its integer temporaries, about 0.7 GB), plus,
        # in an ASan build, shadow memory and quarantine.
        grew = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - rss_before
        assert grew < table_bytes / 4, (grew, rss_before)
    """, env={**os.environ, "ZION_MODE": "timing"}).stdout
    peak = int(out.split("peak")[1].split()[0])
    assert peak > 24 << 30, peak
