"""Timing-only mode against real mode on the DLRM example (examples/dlrm).

    python bench/timing_mode_bench.py [--configs small,mlperf] [--num-batches 4]

For each config, one process per mode (ZION_MODE=real, then timing) runs the
example's training loop on one zion device and reports, measured over the
loop after its first iteration (warm-up: Meta kernels' first calls):

- priced ops per second of wall time (the mode's speed; target in timing-only
  mode: >= 100,000 per process), with real mode's rate beside it, over the
  whole loop, over the loop without making batches ("the step alone"), and
  over the training step itself (the example's Run.step: forward, backward
  and the optimizer, without the batch's copy to the device and the loss
  read each iteration prints), and over the training step once more after
  the loop, on as many batches made before it, as a data loader's workers
  hand them over (in the loop, the example makes each batch on the training
  thread between two steps, and the step then starts with the core's caches
  full of the generator's data);
- wall ms per step, the process's peak RSS, and
- the modeled ms/iteration and peak HBM, which must be equal in both modes
  (the bench says so, or prints MISMATCH).

Both modes see the same batches and the same weights' shapes; only real mode
computes values. Each row also gives the rate over the step alone: the
example makes each batch's synthetic indices on the training thread
(SyntheticData.batch), which a real input pipeline does in data-loader
workers, so that time is measured and set apart. A third row runs the same
script in plain CPU eager PyTorch (`--device cpu`, no emulator): the same ops,
counted as the zion runs count them, at the rate eager PyTorch itself issues
them on this machine. A second table gives the wall time of one call of
single ops in each mode.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "dlrm"

# One process: the loop of dlrm.train, timed from its second iteration.
_CHILD = r"""
import json, resource, sys, time
sys.path.insert(0, sys.argv[1])
import torch, zion_emu
import dlrm
from zion_emu import _C
args = dlrm.parse_args(json.loads(sys.argv[2]) + ["--no-progress"])
run = dlrm.setup(args)
marks = []
data_s = [0.0]
make_batch = run.data.batch
def timed_batch(i):
    t = time.perf_counter()
    try:
        return make_batch(i)
    finally:
        data_s[0] += time.perf_counter() - t
run.data.batch = timed_batch
train_step = run.step
step_s, step_ops = [0.0], [0]
def timed_step(batch):
    t, ops = time.perf_counter(), _C.device.priced_ops()
    try:
        return train_step(batch)
    finally:
        step_s[0] += time.perf_counter() - t
        step_ops[0] += _C.device.priced_ops() - ops
run.step = timed_step
def emit(line):
    if line.startswith("iter "):
        marks.append((time.perf_counter(), _C.device.priced_ops(), data_s[0], step_s[0], step_ops[0]))
summary = dlrm.train(run, emit)
(t0, ops0, d0, s0, so0), (t1, ops1, d1, s1, so1) = marks[0], marks[-1]
steps = len(marks) - 1
# The training step again, over as many batches made before the loop, as a
# data loader's workers hand them over: each batch is new to the step, and no
# batch is made on this thread between two steps (the example's generator
# fills the core's caches with its own data). Each batch's copy to the device
# is not timed.
ahead = [make_batch(args.num_batches + i) for i in range(steps)]
ahead_s, ahead_ops = 0.0, 0
for b in ahead:
    b = b.to(run.device, run.embeddings.host_tables)
    t, ops = time.perf_counter(), _C.device.priced_ops()
    train_step(b)
    ahead_s += time.perf_counter() - t
    ahead_ops += _C.device.priced_ops() - ops
zion = args.device == "zion"
print(json.dumps({
    "mode": zion_emu.mode() if zion else "cpu eager", "ops_per_s": (ops1 - ops0) / (t1 - t0),
    "ops_per_step": (ops1 - ops0) / steps, "wall_ms_per_step": 1e3 * (t1 - t0) / steps,
    "data_ms_per_step": 1e3 * (d1 - d0) / steps,
    "train_step_ms": 1e3 * (s1 - s0) / steps, "train_step_ops": (so1 - so0) / steps,
    "ahead_step_ms": 1e3 * ahead_s / steps, "ahead_step_ops": ahead_ops / steps,
    "modeled_ms_per_iter": summary.get("modeled_ms_per_iter"),
    "peak_hbm": torch.zion.max_memory_allocated(0) if zion else None,
    "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


# One process: the wall time per call of single ops on zion:0.
_OPS_CHILD = r"""
import json, time, torch, zion_emu
x = torch.empty(64, 128, device="zion").uniform_(); w = torch.empty(128, 128, device="zion").uniform_()
table = torch.empty(1000, 128, device="zion").uniform_()
idx = torch.randint(0, 1000, (256,)).to("zion"); off = (torch.arange(64) * 4).to("zion")
ops = {"x + 1": lambda: x + 1, "mm 64x128x128": lambda: torch.mm(x, w), "relu": lambda: torch.relu(x),
       "cat": lambda: torch.cat([x, x], 1),
       "embedding_bag 256 lookups": lambda: torch.nn.functional.embedding_bag(idx, table, off, mode="sum")}
out = {}
for name, fn in ops.items():
    for _ in range(200):
        fn()
    n = 3000
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    out[name] = (time.perf_counter() - t0) / n * 1e6
print(json.dumps(out))
"""


def op_costs(mode: str) -> dict:
    env = dict(os.environ, ZION_MODE=mode, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-W", "ignore", "-c", _OPS_CHILD], capture_output=True, text=True, env=env,
                          timeout=600)
    if done.returncode != 0:
        raise SystemExit(f"op costs in {mode} mode failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(config: str, mode: str, extra: list[str], num_batches: int) -> dict:
    """mode: "real" or "timing" (zion), or "cpu" (the same script in CPU eager PyTorch)."""
    device = "cpu" if mode == "cpu" else "zion"
    argv = ["--config", config, "--device", device, "--num-batches", str(num_batches), "--print-freq", "1", *extra]
    env = dict(os.environ, ZION_MODE="real" if mode == "cpu" else mode,
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-W", "ignore", "-c", _CHILD, str(EXAMPLE), json.dumps(argv)],
                          capture_output=True, text=True, env=env, timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"{config} in {mode} mode failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def median_run(found: list[dict]) -> dict:
    """One run's figures: each number the median over the runs (the lower middle one of an even count), the rest as the first run has them."""
    out = dict(found[0])
    for key, value in out.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[key] = statistics.median_low(r[key] for r in found)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--configs", default="tiny,small,mlperf", help="comma-separated example configs (mlperf at its 1M-row cap)")
    p.add_argument("--num-batches", type=int, default=4, help="iterations per run (the first is warm-up)")
    p.add_argument("--repeat", type=int, default=1,
                   help="runs of each mode, in rounds (real, timing, cpu eager, then again); each figure is the median")
    p.add_argument("--example-args", default="", help="more arguments for the example, e.g. '--max-rows 200000'")
    a = p.parse_args()
    extra = a.example_args.split()
    if a.repeat < 1:
        p.error(f"--repeat must be at least 1, got {a.repeat}")
    print(f"# DLRM example, one zion device, {a.num_batches} iterations (the first not timed), "
          f"median of {a.repeat} run(s) per mode; nproc {os.cpu_count()}, load average {os.getloadavg()[0]:.2f}")
    print("| config | mode | priced ops/s | ops/s of the step alone | ops/s of the training step "
          "| ops/s of the training step, batches made ahead | ops/step "
          "| wall ms/step | of it, making the batch | of it, the training step | peak RSS MiB | modeled ms/iter "
          "| peak HBM bytes |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for config in a.configs.split(","):
        runs: dict[str, list[dict]] = {"real": [], "timing": [], "cpu": []}
        for _ in range(a.repeat):
            for mode, found in runs.items():
                found.append(measure(config, mode, extra, a.num_batches))
        rows = {mode: median_run(found) for mode, found in runs.items()}
        ops = rows["timing"]["ops_per_step"]  # CPU eager runs the same ops; nothing prices them there
        train_ops = rows["timing"]["train_step_ops"]
        ahead_ops = rows["timing"]["ahead_step_ops"]
        for mode, r in rows.items():
            wall, data = r["wall_ms_per_step"], r["data_ms_per_step"]
            modeled = "-" if r["modeled_ms_per_iter"] is None else f"{r['modeled_ms_per_iter']:.6f}"
            peak = "-" if r["peak_hbm"] is None else f"{r['peak_hbm']:,}"
            train = r["train_step_ms"]
            print(f"| {config} | {r['mode']} | {ops / wall * 1e3:,.0f} | {ops / (wall - data) * 1e3:,.0f} "
                  f"| {train_ops / train * 1e3:,.0f} | {ahead_ops / r['ahead_step_ms'] * 1e3:,.0f} "
                  f"| {ops:,.0f} | {wall:.2f} | {data:.2f} | {train:.2f} "
                  f"| {r['rss_mib']:,.0f} | {modeled} | {peak} |")
        real, timing = rows["real"], rows["timing"]
        same = (real["modeled_ms_per_iter"] == timing["modeled_ms_per_iter"] and real["peak_hbm"] == timing["peak_hbm"])
        alone = {mode: r["wall_ms_per_step"] - r["data_ms_per_step"] for mode, r in rows.items()}
        for name, key in (("real", "real"), ("cpu eager", "cpu")):
            other = rows[key]
            print(f"| {config} | timing / {name} | {other['wall_ms_per_step'] / timing['wall_ms_per_step']:.2f}x "
                  f"| {alone[key] / alone['timing']:.2f}x | {other['train_step_ms'] / timing['train_step_ms']:.2f}x "
                  f"| {other['ahead_step_ms'] / timing['ahead_step_ms']:.2f}x | "
                  f"| {timing['wall_ms_per_step'] / other['wall_ms_per_step']:.2f}x | | "
                  f"| {timing['rss_mib'] / other['rss_mib']:.2f}x | {('equal' if same else 'MISMATCH') if key == 'real' else ''} | |")
        if a.repeat > 1:
            each = ", ".join(f"{r['train_step_ops'] / r['train_step_ms'] * 1e3:,.0f}" for r in runs["timing"])
            ahead_each = ", ".join(f"{r['ahead_step_ops'] / r['ahead_step_ms'] * 1e3:,.0f}" for r in runs["timing"])
            print(f"| {config} | timing, each run's training-step ops/s | | | {each} | {ahead_each} | | | | | | | |")
    print()
    print("| op (one call, from Python) | real us | timing-only us | timing / real |")
    print("|---|---:|---:|---:|")
    real, timing = op_costs("real"), op_costs("timing")
    for name in real:
        print(f"| {name} | {real[name]:.1f} | {timing[name]:.1f} | {timing[name] / real[name]:.2f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
