"""Runs the benchmark suite and writes one results JSON.

    python bench/run_all.py [--build] [--only gemm_bench,overhead] [--platform zion] [--out build/bench-results.json]

Each entry of BENCHMARKS is one command. Google Benchmark programs (kind
"gbench") write their own JSON (--benchmark_out), which goes into the results
as it is; other commands' stdout goes in as JSON when it parses, else as text.
A command whose program, script or CLI subcommand is not there is skipped
with a message saying what is missing; a command that fails is recorded with
its exit code and output, and the suite goes on.

--build first builds the C++ benchmarks (bench/cpp) against the zion_emu build
tree (build/cmake, which `pip install -e .` or setup.py makes)."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform as host_platform
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CPP_BUILD = ROOT / "build" / "bench-cpp"


@dataclass
class Benchmark:
    name: str
    argv: list[str]  # "{python}" and "{bin}" (the C++ benchmarks' build directory) are filled in
    kind: str = "text"  # "gbench": a Google Benchmark program; "text": anything else
    needs: list[str] = field(default_factory=list)  # paths (repo-relative, {bin}) or "cli:<command>"
    takes_platform: bool = False  # passes --platform=NAME when run_all is given one
    timeout_s: float = 3600


# One line per benchmark; add new ones here.
BENCHMARKS = [
    Benchmark("sim_bench", ["{bin}/sim_bench"], needs=["{bin}/sim_bench"]),
    Benchmark("collective_bench", ["{bin}/collective_bench"], "gbench", ["{bin}/collective_bench"]),
    Benchmark("gemm_bench", ["{bin}/gemm_bench"], "gbench", ["{bin}/gemm_bench"], True),
    Benchmark("embedding_bag_bench", ["{bin}/embedding_bag_bench"], "gbench", ["{bin}/embedding_bag_bench"], True),
    Benchmark("elementwise_bench", ["{bin}/elementwise_bench"], "gbench", ["{bin}/elementwise_bench"], True),
    Benchmark("copy_bench", ["{bin}/copy_bench"], "gbench", ["{bin}/copy_bench"], True),
    Benchmark("overhead", ["{python}", "bench/overhead.py", "--repeat", "3"], needs=["bench/overhead.py"]),
    Benchmark("bench_collectives", ["{python}", "-m", "zion_emu", "bench-collectives"], needs=["cli:bench-collectives"]),
    Benchmark("dlrm", ["{python}", "bench/dlrm_bench.py"], needs=["bench/dlrm_bench.py"]),
    Benchmark("hbm_budget_sweep", ["{python}", "bench/hbm_budget_sweep.py"], needs=["bench/hbm_budget_sweep.py"]),
    Benchmark("compile", ["{python}", "bench/compile_bench.py"], needs=["bench/compile_bench.py"]),
]


def _fill(text: str, bin_dir: Path) -> str:
    return text.replace("{python}", sys.executable).replace("{bin}", str(bin_dir))


def _missing(bench: Benchmark, bin_dir: Path) -> str | None:
    """What a benchmark needs and is not there, in words; None if nothing."""
    for need in bench.needs:
        if need.startswith("cli:"):
            command = need[len("cli:"):]
            probe = subprocess.run([sys.executable, "-m", "zion_emu", command, "--help"], cwd=ROOT,
                                   capture_output=True, text=True, timeout=120)
            if probe.returncode != 0:
                return f"`python -m zion_emu {command}` does not exist in this checkout"
        else:
            path = Path(_fill(need, bin_dir))
            path = path if path.is_absolute() else ROOT / path
            if not path.exists():
                hint = " (run with --build)" if "{bin}" in need else ""
                return f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path} is missing{hint}"
    return None


def build_cpp(bin_dir: Path) -> None:
    """Configures bench/cpp against the zion_emu build tree and builds it."""
    import torch.utils

    package = Path(os.environ.get("ZION_BUILD_DIR", ROOT / "build" / "cmake"))
    if not (package / "zion_emuConfig.cmake").exists():
        sys.exit(f"run_all: {package}/zion_emuConfig.cmake is missing; build zion-emu first "
                 "(pip install --no-build-isolation -e .)")
    configure = ["cmake", "-S", str(ROOT / "bench" / "cpp"), "-B", str(bin_dir), "-DCMAKE_BUILD_TYPE=Release",
                 f"-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path}", f"-Dzion_emu_DIR={package}"]
    if not (bin_dir / "CMakeCache.txt").exists():
        configure += ["-G", "Ninja"]
    subprocess.run(configure, check=True)
    subprocess.run(["cmake", "--build", str(bin_dir)], check=True)


def run(bench: Benchmark, bin_dir: Path, platform: str | None, out_dir: Path) -> dict:
    entry: dict = {"name": bench.name, "kind": bench.kind}
    missing = _missing(bench, bin_dir)
    argv = [_fill(a, bin_dir) for a in bench.argv]
    if platform and bench.takes_platform:
        argv.append(f"--platform={platform}")
    entry["command"] = " ".join(argv)
    if missing:
        print(f"[skip] {bench.name}: {missing}", flush=True)
        return {**entry, "status": "skipped", "reason": missing}
    gbench_json = out_dir / f"{bench.name}.json"
    if bench.kind == "gbench":
        argv += [f"--benchmark_out={gbench_json}", "--benchmark_out_format=json"]
    print(f"[run ] {bench.name}: {' '.join(argv)}", flush=True)
    start = time.monotonic()
    try:
        # Google Benchmark's console table shows as it runs; its JSON goes to the file.
        proc = subprocess.run(argv, cwd=ROOT, stdout=None if bench.kind == "gbench" else subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, timeout=bench.timeout_s)
    except subprocess.TimeoutExpired:
        print(f"[fail] {bench.name}: over {bench.timeout_s} s", flush=True)
        return {**entry, "status": "failed", "reason": f"timed out after {bench.timeout_s} s"}
    entry["wall_s"] = round(time.monotonic() - start, 2)
    if proc.stdout:
        sys.stdout.write(proc.stdout)
    if proc.returncode != 0:
        print(f"[fail] {bench.name}: exit {proc.returncode}\n{proc.stderr[-4000:]}", flush=True)
        return {**entry, "status": "failed", "reason": f"exit {proc.returncode}", "stderr": proc.stderr[-4000:]}
    if bench.kind == "gbench":
        entry["results"] = json.loads(gbench_json.read_text())
    else:
        try:
            entry["results"] = json.loads(proc.stdout or "")
        except json.JSONDecodeError:
            entry["text"] = proc.stdout
    return {**entry, "status": "ok"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build", action="store_true", help="build the C++ benchmarks first")
    parser.add_argument("--bin", type=Path, default=CPP_BUILD, help="the C++ benchmarks' build directory")
    parser.add_argument("--only", default="", help="comma-separated names: " + ", ".join(b.name for b in BENCHMARKS))
    parser.add_argument("--platform", help="platform for the device benchmarks (a preset or JSON file)")
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "bench-results.json")
    args = parser.parse_args(argv)

    chosen = BENCHMARKS
    if args.only:
        names = [n.strip() for n in args.only.split(",") if n.strip()]
        unknown = [n for n in names if n not in {b.name for b in BENCHMARKS}]
        if unknown:
            parser.error(f"unknown benchmark {', '.join(unknown)}; known: {', '.join(b.name for b in BENCHMARKS)}")
        chosen = [b for b in BENCHMARKS if b.name in names]
    bin_dir = args.bin.resolve()
    if args.build:
        build_cpp(bin_dir)
    out_dir = args.out.resolve().parent / (args.out.stem + "_raw")
    out_dir.mkdir(parents=True, exist_ok=True)
    results = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": {"machine": host_platform.machine(), "cpus": os.cpu_count(), "python": sys.version.split()[0]},
        "platform": args.platform,
        "benchmarks": [run(b, bin_dir, args.platform, out_dir) for b in chosen],
    }
    args.out.write_text(json.dumps(results, indent=1))
    counts = {s: sum(r["status"] == s for r in results["benchmarks"]) for s in ("ok", "skipped", "failed")}
    print(f"run_all: {counts['ok']} ran, {counts['skipped']} skipped, {counts['failed']} failed; wrote {args.out}")
    return 1 if counts["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
