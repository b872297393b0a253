"""Full-size DLRM in timing-only mode: the MLPerf DLRM (``--config mlperf
--max-rows 0``, 187.8 M rows, 89.5 GiB of fp32 tables) and MLPerf DLRMv2
(``--config dcnv2 --max-rows 0``, 204.2 M rows) on 8 ranks of each preset.

    python bench/full_size_dlrm.py [--platforms zion,zionex,hgx-h100] [--configs mlperf,dcnv2]
                                   [--num-batches 3] [--table-placement hbm]

Each run is ``python -m zion_emu run --timing-only --nproc 8`` of the example
(8 processes on this host). Printed per run: the modeled ms/iteration and
samples/s, the peak HBM of the busiest and the least busy device against the
capacity, the largest host RSS of any rank (target <= 1.5 GiB), and the wall
time of one training step after the first (target <= 60 s on 2 cores). A run
whose sharded tables do not fit a preset's HBM ends in the modeled
out-of-memory error, printed with its device and shortfall.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "dlrm" / "dlrm.py"

# Runs the example in this rank and records the rank's peak RSS at exit.
_WRAPPER = """
import os, resource, runpy, sys
sys.argv = [sys.argv[1]] + sys.argv[2:]
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
finally:
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    with open(os.path.join(os.environ["BENCH_RSS_DIR"], os.environ.get("RANK", "0")), "w") as f:
        f.write(str(rss))
"""


def run(platform: str, config: str, num_batches: int, placement: str, nproc: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        wrapper = Path(tmp) / "rss_wrapper.py"
        wrapper.write_text(_WRAPPER)
        rss_dir = Path(tmp) / "rss"
        rss_dir.mkdir()
        report = Path(tmp) / "report.json"
        argv = [sys.executable, "-m", "zion_emu", "run", "--timing-only", "--platform", platform, "--nproc",
                str(nproc), "--quiet-report", "--report", str(report), str(wrapper), str(EXAMPLE), "--config", config,
                "--max-rows", "0", "--device", "zion", "--num-batches", str(num_batches), "--print-freq", "1",
                "--no-progress", "--table-placement", placement]
        env = dict(os.environ, BENCH_RSS_DIR=str(rss_dir), OMP_NUM_THREADS="1",
                   PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
        done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=3600)
        out = {"platform": platform, "config": config, "ok": done.returncode == 0}
        walls = [float(m) for m in re.findall(r"wall_ms_per_iter ([0-9.]+)", done.stdout)]
        rss = [int(p.read_text()) for p in rss_dir.iterdir()]
        out["max_rss_gib"] = max(rss) / 2**30 if rss else None
        out["wall_s_per_step"] = walls[-1] / 1e3 if len(walls) > 1 else None
        if not out["ok"]:
            errors = [line for line in done.stderr.splitlines() + done.stdout.splitlines() if "out of" in line.lower()]
            out["error"] = errors[0] if errors else done.stderr.strip().splitlines()[-1:]
            return out
        r = json.loads(report.read_text())
        peaks = [d["peak_hbm_bytes"] for d in r["devices"]]
        out.update(ms_per_iter=r["iteration_s"] * 1e3, samples_per_s=r["samples_per_s"],
                   peak_hbm_max=max(peaks), peak_hbm_min=min(peaks), capacity=r["devices"][0]["hbm_capacity_bytes"])
        return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--platforms", default="zion,zionex,hgx-h100")
    p.add_argument("--configs", default="mlperf,dcnv2")
    p.add_argument("--num-batches", type=int, default=3, help="iterations per run (the first is not timed)")
    p.add_argument("--table-placement", default="hbm", choices=["hbm", "auto"])
    p.add_argument("--nproc", type=int, default=8)
    a = p.parse_args()
    gib = 2**30
    print(f"# timing-only, --max-rows 0, {a.nproc} ranks, --table-placement {a.table_placement}, "
          f"{os.cpu_count()} host cores")
    print("| config | platform | ms/iter | samples/s | peak HBM max / min / capacity (GiB) | max rank RSS (GiB) "
          "| wall s/step |")
    print("|---|---|---:|---:|---|---:|---:|")
    for config in a.configs.split(","):
        for platform in a.platforms.split(","):
            r = run(platform, config, a.num_batches, a.table_placement, a.nproc)
            rss = f"{r['max_rss_gib']:.2f}" if r["max_rss_gib"] is not None else "-"
            wall = f"{r['wall_s_per_step']:.1f}" if r["wall_s_per_step"] is not None else "-"
            if not r["ok"]:
                print(f"| {config} | {platform} | {r['error']} | | | {rss} | {wall} |")
                continue
            print(f"| {config} | {platform} | {r['ms_per_iter']:.3f} | {r['samples_per_s']:,.0f} | "
                  f"{r['peak_hbm_max'] / gib:.2f} / {r['peak_hbm_min'] / gib:.2f} / {r['capacity'] / gib:.2f} "
                  f"| {rss} | {wall} |")
            sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
