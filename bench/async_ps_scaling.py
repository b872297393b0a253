"""Asynchronous (parameter servers) against synchronous (DDP + all-to-all)
DLRM training: modeled throughput against the number of trainers.

For each trainer count T it runs, through ``zion-emu run`` on one platform:

- **async**: ``examples/async_ps/train.py`` with T trainers (OAMs, node-major)
  and S parameter servers (sockets of node 0) for each S of ``--servers``,
  all T + S ranks as processes, in real mode (RPC moves real bytes);
  throughput is every trainer's samples over the modeled time from the first
  trainer's start to the last one's end; the limit is the busiest resource,
  a server's socket or a link the servers' messages crossed (they share
  each link's clock: every server's messages count), with its utilization;
- **sync**: ``examples/dlrm/dlrm.py`` on T ranks, the same model shapes and
  the same samples per rank per step (global batch = T x per-trainer batch),
  in timing-only mode with two ranks running when T > 8 (``--world-size T
  --ranks 0,8``, priced as T processes); throughput is the global batch over
  the modeled time per iteration.

    python bench/async_ps_scaling.py --trainers 1,2,4,8,16 --servers 1,4 --json async_ps.json
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
ASYNC = ROOT / "examples" / "async_ps" / "train.py"
SYNC = ROOT / "examples" / "dlrm" / "dlrm.py"


def _run(cmd: list[str], timeout_s: float) -> str:
    """Runs ``cmd`` in a session of its own; kills the whole group past the timeout."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            cwd=ROOT)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise SystemExit(f"timed out after {timeout_s:.0f} s: {' '.join(cmd)}")
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if proc.returncode != 0:
        raise SystemExit(f"failed (exit {proc.returncode}): {' '.join(cmd)}\n{err[-3000:]}")
    return out


def run_async(trainers: int, servers: int, args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        _run([sys.executable, "-m", "zion_emu", "run", "--quiet-report", "--platform", args.platform,
              "--world-size", str(trainers + servers), str(ASYNC), "--servers", str(servers), "--shape", args.shape,
              "--steps", str(args.steps), "--out", tmp], args.timeout)
        s = json.loads((Path(tmp) / "summary.json").read_text())
    return {"samples_per_s": s["samples_per_s"], "step_s": s["step_s"], "limit": s["limit"],
            "limit_utilization": s["limit_utilization"],
            "server_utilization": max(st["utilization"] for st in s["server_stats"]),
            "pull_wait_share": s["pull_wait_share"]}


def run_sync(trainers: int, per_trainer: int, args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        ranks = ["--ranks", "0,8"] if trainers > 8 else []
        _run([sys.executable, "-m", "zion_emu", "run", "--quiet-report", "--report", str(report), "--timing-only",
              "--platform", args.platform, "--world-size", str(trainers), *ranks, str(SYNC), "--config", args.shape,
              "--mini-batch-size", str(per_trainer * trainers), "--num-batches", str(args.steps + 1),
              "--no-progress"], args.timeout)
        r = json.loads(report.read_text())
    # The report's link utilization is per class, over all its links.
    busiest = max(r["links"], key=lambda link: link["busy_s"], default=None)
    return {"samples_per_s": per_trainer * trainers / r["iteration_s"], "iteration_s": r["iteration_s"],
            "busiest_link_class": busiest["name"] if busiest else ""}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trainers", default="1,2,4,8,16", help="trainer counts (default 1,2,4,8,16)")
    p.add_argument("--servers", default="1,4", help="parameter-server counts of the async runs (default 1,4)")
    p.add_argument("--platform", default="zionex", help="default zionex (16 nodes of 8 OAMs, 4 sockets each)")
    p.add_argument("--shape", default="small", choices=("small",), help="the shapes both examples share")
    p.add_argument("--steps", type=int, default=3, help="steps of each async trainer (sync: one more, the first "
                   "is not timed)")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per run")
    p.add_argument("--json", default=None, help="write the rows as JSON")
    args = p.parse_args()
    sys.path.insert(0, str(ASYNC.parent))
    from ps_model import SHAPES

    per_trainer = SHAPES[args.shape].batch
    trainer_counts = [int(t) for t in args.trainers.split(",")]
    server_counts = [int(s) for s in args.servers.split(",")]
    rows = []
    for t in trainer_counts:
        row: dict[str, Any] = {"trainers": t, "sync": run_sync(t, per_trainer, args)}
        for s in server_counts:
            row[f"async_{s}"] = run_async(t, s, args)
        rows.append(row)
        print(f"# trainers {t} done", file=sys.stderr, flush=True)

    head = f"{'trainers':>8} {'sync samples/s':>15} {'sync ms/it':>10} {'sync busiest':>13}"
    for s in server_counts:
        head += f" {f'async S={s} samples/s':>22} {'ms/step':>8} {'pull wait':>9} {'busiest (utilization)':<46}"
    print(f"platform {args.platform}, shape {args.shape}, {per_trainer} samples per trainer per step")
    print(head)
    for row in rows:
        sync = row["sync"]
        line = (f"{row['trainers']:>8} {sync['samples_per_s']:>15,.0f} {sync['iteration_s'] * 1e3:>10.3f} "
                f"{sync['busiest_link_class']:>13}")
        for s in server_counts:
            a = row[f"async_{s}"]
            limit = f"{a['limit']} ({a['limit_utilization'] * 100:.0f}%)"
            line += (f" {a['samples_per_s']:>22,.0f} {a['step_s'] * 1e3:>8.3f} {a['pull_wait_share'] * 100:>8.0f}% "
                     f"{limit:<46}")
        print(line)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
