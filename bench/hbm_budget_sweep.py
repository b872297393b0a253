"""What-if: how much HBM do the embedding tables need?

Runs the DLRM example with ``--table-placement auto`` under a series of
per-rank HBM budgets (the hottest tables in HBM up to the budget, the rest in
the rank's socket DDR, looked up by the CPU) through ``zion-emu run``, and
prints, per budget, the modeled time per iteration, the tables in HBM, peak
HBM per device and peak DDR per socket; ``--plot`` draws iteration time
against the budget.

    python bench/hbm_budget_sweep.py --config paper --nproc 1 --budgets 0,512M,1G,1536M,2G --plot sweep.png
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "dlrm" / "dlrm.py"


def run_one(budget: str, args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        cmd = [sys.executable, "-m", "zion_emu", "run", "--quiet-report", "--report", str(report),
               "--nproc", str(args.nproc), "--platform", args.platform, str(EXAMPLE), "--config", args.config,
               "--device", "zion", "--table-placement", "auto", "--hbm-budget", budget,
               "--num-batches", str(args.num_batches), "--no-progress"]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
        if out.returncode != 0:
            raise SystemExit(f"budget {budget} failed:\n{out.stderr[-3000:]}")
        r = json.loads(report.read_text())
    in_hbm = sum(1 for line in out.stdout.splitlines() if line.startswith("# rank") and " place hbm" in line)
    in_ddr = sum(1 for line in out.stdout.splitlines() if line.startswith("# rank") and " place ddr" in line)
    return {
        "budget": budget,
        "iteration_s": r["iteration_s"],
        "samples_per_s": r["samples_per_s"],
        "tables_hbm": in_hbm,
        "tables_ddr": in_ddr,
        "peak_hbm_bytes": max((d["peak_hbm_bytes"] for d in r["devices"]), default=0),
        "peak_ddr_bytes": max((k["peak_ddr_bytes"] for k in r.get("sockets", [])), default=0),
        "socket_busy_s": sum(k["busy_s"] for k in r.get("sockets", [])),
        "pcie_bytes": sum(link["bytes"] for link in r["links"] if link["name"].startswith("pcie")),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="paper")
    p.add_argument("--platform", default="zion")
    p.add_argument("--nproc", type=int, default=1)
    p.add_argument("--num-batches", type=int, default=2)
    p.add_argument("--budgets", default="0,512M,1G,1536M,2G", help="per-rank HBM budgets for the tables")
    p.add_argument("--plot", default=None, help="PNG of iteration time against the budget")
    p.add_argument("--json", default=None, help="write the rows as JSON")
    p.add_argument("--timeout", type=int, default=1800)
    args = p.parse_args()
    rows = [run_one(b, args) for b in args.budgets.split(",")]
    print(f"DLRM --config {args.config}, {args.nproc} rank(s), platform {args.platform}, --table-placement auto")
    print("| HBM budget per rank | tables in HBM / DDR | modeled ms/iter | modeled samples/s | peak HBM per device (MiB) "
          "| peak DDR per socket (MiB) | socket busy (ms, whole run) | PCIe MiB (whole run) |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        sps = f"{r['samples_per_s']:,.0f}" if r["samples_per_s"] else "-"
        print(f"| {r['budget']} | {r['tables_hbm']} / {r['tables_ddr']} | {r['iteration_s'] * 1e3:.3f} | {sps} | "
              f"{r['peak_hbm_bytes'] / 2**20:.1f} | {r['peak_ddr_bytes'] / 2**20:.1f} | {r['socket_busy_s'] * 1e3:.3f} | "
              f"{r['pcie_bytes'] / 2**20:.1f} |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 3.5))
        ax.plot([r["peak_hbm_bytes"] / 2**30 for r in rows], [r["iteration_s"] * 1e3 for r in rows], marker="o")
        ax.set_xlabel("peak HBM per device (GiB)")
        ax.set_ylabel("modeled ms per iteration")
        ax.set_title(f"DLRM {args.config}: tables in HBM vs DDR ({args.platform})")
        fig.tight_layout()
        fig.savefig(args.plot, dpi=100)
    return 0


if __name__ == "__main__":
    sys.exit(main())
