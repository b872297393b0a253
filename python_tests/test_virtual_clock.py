"""``zion_emu.virtual_clock``: a script's own clock (time.perf_counter,
time.time, time.monotonic and their _ns forms) reads modeled time once enabled.

The clock is patched for a whole process, so each test runs its script in a
fresh interpreter; the script asserts, and its traceback fails the test.
"""

from __future__ import annotations

import pytest

import zion_emu
import zion_emu.virtual_clock as vc
from processes import run_python

TIMEOUT_S = 120


def _run(script: str) -> str:
    return run_python(script, timeout_s=TIMEOUT_S).stdout


def test_a_matmul_timed_with_perf_counter_takes_its_modeled_time():
    # The zion preset: fp32 peak, matmul efficiency, launch overhead.
    zion = zion_emu.load_platform("zion")
    peak, efficiency = zion.get("oam.peak_flops")["fp32"], zion.get("oam.efficiency")["matmul"]
    launch_s = zion.get("oam.launch_overhead_ns") * 1e-9
    m, n, k = 1024, 512, 2048
    # 2mnk / (15e12 * 0.6) + 5 us = 2*1024*512*2048 / 9e12 + 5e-6 = 243.609 us
    expected_s = 2 * m * n * k / (peak * efficiency) + launch_s
    assert abs(expected_s - 243.609e-6) < 1e-9
    out = _run(f"""
        import time, torch, zion_emu
        import zion_emu.virtual_clock as vc
        vc.enable()
        a = torch.randn({m}, {k}, device="zion")
        b = torch.randn({k}, {n}, device="zion")
        torch.zion.synchronize()  # idle stream: the launch overhead is not hidden behind earlier work
        t0, t0_ns, w0, m0 = time.perf_counter(), time.perf_counter_ns(), time.time(), time.monotonic()
        a @ b
        torch.zion.synchronize()
        t1, t1_ns, w1, m1 = time.perf_counter(), time.perf_counter_ns(), time.time(), time.monotonic()
        assert t1 == zion_emu.clock(), (t1, zion_emu.clock())
        print(repr(t1 - t0), t1_ns - t0_ns, repr(w1 - w0), repr(m1 - m0))
    """)
    perf, perf_ns, wall, mono = out.split()
    assert abs(float(perf) - expected_s) <= 1e-12 * expected_s + 1e-15
    assert abs(int(perf_ns) - expected_s * 1e9) <= 1  # nanoseconds, rounded
    assert abs(float(wall) - expected_s) < 1e-6  # wall time ~1.8e9 s: doubles resolve ~0.2 us there
    assert abs(float(mono) - expected_s) <= 1e-12 * expected_s + 1e-15


def test_off_until_enabled_then_idempotent_and_time_starts_at_the_wall_clock():
    _run("""
        import time
        import zion_emu.virtual_clock as vc
        real = time.perf_counter
        assert not vc.enabled() and time.perf_counter is real
        t = time.perf_counter(); x = sum(range(200000)); assert time.perf_counter() > t  # real time passes
        before = vc.real_time("time")
        vc.enable(); patched = time.perf_counter; vc.enable()
        assert vc.enabled() and time.perf_counter is patched
        # No zion work yet: modeled time stands still while real time passes.
        assert time.perf_counter() == 0.0 and time.monotonic_ns() == 0
        w = time.time(); x = sum(range(200000)); assert time.time() == w
        assert before <= w <= vc.real_time("time")
    """)


def test_the_clocks_never_go_back_when_the_host_clock_is_reset():
    _run("""
        import time, torch, zion_emu
        import zion_emu.virtual_clock as vc
        vc.enable()
        x = torch.randn(256, 256, device="zion"); x @ x; torch.zion.synchronize()
        before = time.perf_counter()
        assert before == zion_emu.clock() > 0
        zion_emu.reset_clock()
        assert zion_emu.clock() == 0 and time.perf_counter() == before
        x @ x; torch.zion.synchronize()
        assert time.perf_counter() == before + zion_emu.clock()
    """)


def test_waits_with_deadlines_keep_real_time():
    # No modeled time passes while the process waits on a pipe: a deadline
    # measured in modeled time would never expire.
    _run("""
        import multiprocessing, multiprocessing.connection, queue
        import zion_emu.virtual_clock as vc
        vc.enable()
        r, w = multiprocessing.Pipe(duplex=False)
        t = vc.real_time()
        assert multiprocessing.connection.wait([r], timeout=0.2) == []
        q = multiprocessing.Queue()
        try:
            q.get(timeout=0.2)
        except queue.Empty:
            pass
        elapsed = vc.real_time() - t
        assert 0.35 < elapsed < 30, elapsed
    """)


def test_real_time_rejects_unknown_clocks():
    with pytest.raises(ValueError, match="no real clock 'clock'; the clocks are"):
        vc.real_time("clock")
