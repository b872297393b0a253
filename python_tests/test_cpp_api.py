"""The C++ API: a libtorch program built against libzion_emu with CMake
(find_package(Torch), find_package(zion_emu) from the build tree), run with no
Python interpreter. Two small programs: examples/cpp/gemm_timing and
bench/cpp/copy_bench (Google Benchmark, modeled time as its manual time).

Closed forms, read from the platform files:
- GEMM m x n x k fp32: 2*m*n*k / (oam.peak_flops.fp32 * oam.efficiency.matmul)
  + launch overhead (the start event is recorded on an idle stream, so it
  sees the launch). On zion, 2048 x 1024 x 1024: 4.295e9 / 9e12 = 477.2 us + 5 us.
- Pinned H2D of b bytes to zion:0: launch + 2 PCIe latencies (socket -> switch
  -> OAM) + b / min(uplink, OAM link) bandwidth; zion: 5 us + 300 ns + b / 12 GB/s.
  Pageable adds the host's staging copy, b / DDR bandwidth. Each PCIe link
  class on the way carries b bytes, busy b / its bandwidth."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch.utils

import zion_emu
from processes import run

ROOT = Path(__file__).resolve().parent.parent
BUILD_DIR = Path(os.environ.get("ZION_BUILD_DIR", ROOT / "build" / "cmake")).resolve()
# Stable build directories beside the library's (build/test-cpp for the
# regular build, build/asan/test-cpp for make sanitize's): a second run
# rebuilds nothing, and ccache serves a fresh checkout.
TEST_BUILD = BUILD_DIR.parent / "test-cpp"
BUILD_TIMEOUT_S = 900
# A test that builds a program (one torch TU, 30-120 s) may run past the suite's 300 s.
builds = pytest.mark.timeout(BUILD_TIMEOUT_S + 120)
# Each builds a program against the library first (or finds it built).
pytestmark = pytest.mark.slow


def _run(cmd: list[str], what: str, timeout: float = BUILD_TIMEOUT_S, **kwargs) -> subprocess.CompletedProcess:
    proc = run(cmd, timeout_s=timeout, **kwargs)
    if proc.returncode != 0:
        output = (proc.stdout + proc.stderr)[-6000:]
        pytest.fail(f"{what} failed (exit {proc.returncode}): {' '.join(cmd)}\n{output}", pytrace=False)
    return proc


def _build(source: Path, name: str, target: str) -> Path:
    config = BUILD_DIR / "zion_emuConfig.cmake"
    if not config.exists():
        pytest.fail(f"{config} is missing: build zion-emu first (pip install --no-build-isolation -e ., "
                    "or python setup.py build_ext --inplace with ZION_BUILD_DIR set)", pytrace=False)
    out = TEST_BUILD / name
    args = ["cmake", "-S", str(source), "-B", str(out), "-DCMAKE_BUILD_TYPE=Release",
            f"-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path}", f"-Dzion_emu_DIR={BUILD_DIR}"]
    if not (out / "CMakeCache.txt").exists() and shutil.which("ninja"):
        args += ["-G", "Ninja"]
    if shutil.which("ccache"):
        args.append("-DCMAKE_CXX_COMPILER_LAUNCHER=ccache")
    _run(args, f"configuring {source.relative_to(ROOT)}")
    _run(["cmake", "--build", str(out), "--target", target], f"building {target}")
    return out / target


@pytest.fixture(scope="module")
def gemm_timing() -> Path:
    return _build(ROOT / "examples" / "cpp", "example", "gemm_timing")


@pytest.fixture(scope="module")
def copy_bench() -> Path:
    return _build(ROOT / "bench" / "cpp", "bench", "copy_bench")


@builds
@pytest.mark.parametrize("platform", ["zion", "hgx-h100"])
def test_gemm_time_from_events_is_the_roofline_closed_form(gemm_timing: Path, platform: str):
    m, n, k = 2048, 1024, 1024
    p = zion_emu.load_platform(platform)
    peak, efficiency = p.get("oam.peak_flops.fp32"), p.get("oam.efficiency.matmul")
    compute_s = 2 * m * n * k / (peak * efficiency)
    memory_s = 4 * (m * k + k * n + m * n) / (p.get("oam.hbm_bandwidth_gb_per_s") * 1e9 * efficiency)
    assert compute_s > memory_s  # compute-bound, so the closed form is the FLOP term
    expected_ns = (compute_s + p.get("oam.launch_overhead_ns") * 1e-9) * 1e9

    out = _run([str(gemm_timing), platform, str(m), str(n), str(k)], "gemm_timing", timeout=120).stdout
    match = re.search(rf"^{re.escape(p.name)} zion:0 matmul {m}x{n}x{k} fp32: ([0-9.]+) ns modeled", out, re.M)
    assert match, out
    assert float(match.group(1)) == pytest.approx(expected_ns, rel=1e-9, abs=1e-3)
    # The output tensors are still alive when memory is read: a, b and c.
    assert f"zion:0 memory: {4 * (m * k + k * n + m * n)} bytes allocated" in out


def _pcie_links(p) -> list[tuple[str, float]]:
    """The links from the home socket of OAM 0 to OAM 0, socket -> PCIe
    switch (uplink) -> OAM: (link class, bandwidth) each."""
    lane = p.get("pcie.lane_bandwidth_gb_per_s")
    switch = next(s for s in p.get("pcie.switches") if 0 in s["oams"])
    return [(f"pcie_{gen}_x{lanes}", lane[gen] * lanes * 1e9)
            for gen, lanes in ((switch["uplink_generation"], switch["uplink_lanes"]),
                               (switch["generation"], switch["oam_lanes"]))]


@builds
def test_h2d_copy_bench_reports_the_pcie_closed_form(copy_bench: Path):
    size = 1 << 20
    p = zion_emu.load_platform("zion")
    links = _pcie_links(p)
    bandwidth, latency = min(bw for _, bw in links), len(links) * p.get("pcie.latency_ns") * 1e-9
    launch = p.get("oam.launch_overhead_ns") * 1e-9
    pinned_s = launch + latency + size / bandwidth
    pageable_s = size / (p.get("socket.ddr_bandwidth_gb_per_s") * 1e9) + pinned_s

    proc = _run([str(copy_bench), "--platform=zion", f"--benchmark_filter=^H2D/(pinned|pageable)/bytes:{size}/",
                 "--benchmark_format=json"], "copy_bench", timeout=120)
    report = json.loads(proc.stdout)
    assert report["context"]["zion_platform"] == "zion"
    rows = {b["name"]: b for b in report["benchmarks"]}
    pinned, pageable = rows[f"H2D/pinned/bytes:{size}/iterations:4/manual_time"], \
        rows[f"H2D/pageable/bytes:{size}/iterations:4/manual_time"]
    assert pinned["time_unit"] == "us"
    assert pinned["real_time"] == pytest.approx(pinned_s * 1e6, rel=1e-9)
    assert pageable["real_time"] == pytest.approx(pageable_s * 1e6, rel=1e-9)
    assert pinned["bytes"] == size  # the model's copy counter on zion:0, per iteration
    # Link counters, per iteration: each link class carries the bytes once per
    # link of it crossed, busy bytes / its bandwidth per link (zion: 1 MiB over
    # pcie_gen3_x16 busy 87.4 us and over pcie_gen4_x16 busy 43.7 us).
    for name, bw in links:
        crossings = sum(n == name for n, _ in links)
        assert pinned[f"{name}_bytes"] == crossings * size
        assert pinned[f"{name}_busy_us"] == pytest.approx(crossings * size / bw * 1e6, rel=1e-9)
    assert pinned["host_us"] > 0


@builds
def test_copy_bench_names_a_platform_it_cannot_load(copy_bench: Path):
    proc = run([str(copy_bench), "--platform=no-such-preset"], timeout_s=60)
    assert proc.returncode == 2
    assert "no-such-preset" in proc.stderr and "zion" in proc.stderr
