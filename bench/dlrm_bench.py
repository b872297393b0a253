"""The DLRM example (examples/dlrm/dlrm.py) as a benchmark.

    python bench/dlrm_bench.py [--config small] [--repeat 5] [--steps 3]
                               [--nproc 8] [--num-batches 3] [--platforms zion,zionex,hgx-h100]

(a) Emulator overhead: one training step of ``--config`` on one zion device
    (real mode) vs CPU eager, wall time, both in this process, alternating
    step by step (a CPU step, then the same step on zion; ``--repeat`` x
    ``--steps`` pairs). The figure is the median over pairs of zion / cpu,
    which a load that drifts over the run cannot bias. Both start from the
    same weights and see the same batches, so their losses must agree bit
    for bit; the bench checks that too. Batches are generated before timing;
    a step includes the copy to the device and ends with ``loss.item()``.
    Target: zion / cpu <= 1.10. Backward on zion runs on the calling
    thread, as on the CPU. With ``ZION_AUTOGRAD_DEVICE_THREADS=1`` it runs
    on the autograd engine's device thread instead (as on CUDA): each
    backward hands work to it and back, which on a loaded machine can cost
    milliseconds of scheduling delay. ``--no-autograd-threads`` turns the
    engine's threads off for the whole run
    (``torch.autograd.set_multithreading_enabled(False)``).
(b) Modeled training speed: ``torchrun --nproc-per-node --nproc`` of the
    example with ``--platform P`` for each preset, one subprocess each;
    prints a markdown table of the modeled ms/iteration and samples/s.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "dlrm"
sys.path.insert(0, str(EXAMPLE))

import dlrm  # noqa: E402


def backward_thread() -> str:
    from zion_emu import _backward

    on_device_thread = _backward.device_threads_requested() and torch.autograd.is_multithreading_enabled()
    return "autograd's zion device thread" if on_device_thread else "the calling thread"


def overhead(config: str, repeat: int, steps: int) -> None:
    torch.set_num_threads(1)
    runs = {device: dlrm.setup(dlrm.parse_args(["--config", config, "--device", device, "--no-progress"]))
            for device in ("cpu", "zion")}
    batches = [runs["cpu"].data.batch(i) for i in range(steps)]
    per_step: dict[str, list[float]] = {"cpu": [], "zion": []}
    losses: dict[str, list[float]] = {"cpu": [], "zion": []}
    for device, run in runs.items():  # one untimed step each: first-call costs
        losses[device].append(run.step(batches[0].to(run.device)).item())
    # Steps alternate, CPU then zion, so both see the same load on the machine.
    for _ in range(repeat):
        for batch in batches:
            for device, run in runs.items():
                run.synchronize()
                start = time.perf_counter()
                loss = run.step(batch.to(run.device))
                value = loss.item()  # waits for the step, as a training loop's logging does
                per_step[device].append(time.perf_counter() - start)
                losses[device].append(value)
    cpu_ms, zion_ms = (statistics.median(per_step[d]) * 1e3 for d in ("cpu", "zion"))
    paired = statistics.median(z / c for z, c in zip(per_step["zion"], per_step["cpu"]))
    a = runs["cpu"].args
    print(f"## (a) emulator overhead: one {config} step (tables {a.arch_embedding_size}, dim "
          f"{a.arch_sparse_feature_size}, bot {a.arch_mlp_bot}, top {a.arch_mlp_top}, batch {a.mini_batch_size}, "
          f"{a.num_indices_per_lookup} lookups, SGD), 1 thread, {repeat} x {steps} steps each, alternating, "
          f"zion backward on {backward_thread()}\n")
    print("| device | median ms/step | min ms/step | median of paired ratios | target |")
    print("|---|---:|---:|---:|---|")
    print(f"| cpu eager | {cpu_ms:.2f} | {min(per_step['cpu']) * 1e3:.2f} | 1.000 | |")
    print(f"| zion (real mode, one device) | {zion_ms:.2f} | {min(per_step['zion']) * 1e3:.2f} | {paired:.3f} | "
          f"<= 1.10 {'ok' if paired <= 1.10 else 'missed'} |")
    same = losses["cpu"] == losses["zion"]
    print(f"\nlosses equal bit for bit on cpu and zion over {len(losses['cpu'])} steps: {same}\n")
    if not same:
        raise SystemExit(f"zion and cpu losses differ: {losses}")


def modeled(config: str, nproc: int, num_batches: int, platforms: list[str]) -> None:
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    rows = []
    for platform in platforms:
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
                   "--max-restarts", "0", str(EXAMPLE / "dlrm.py"), "--config", config, "--device", "zion",
                   "--platform", platform, "--num-batches", str(num_batches), "--print-freq", str(num_batches),
                   "--no-progress"]
        done = subprocess.run(command, env=env, capture_output=True, text=True)
        if done.returncode:
            raise SystemExit(f"{platform}: the run failed:\n{(done.stdout + done.stderr)[-3000:]}")
        (line,) = [ln for ln in done.stdout.splitlines() if ln.startswith("summary ")]
        fields = line.split()
        summary = dict(zip(fields[1::2], fields[2::2]))
        rows.append((platform, float(summary["modeled_ms_per_iter"]), float(summary["modeled_samples_per_s"]),
                     int(summary["peak_hbm_bytes"]) / 2**20, float(summary["wall_samples_per_s"])))
    print(f"## (b) modeled training speed: --config {config}, {nproc} ranks, {num_batches} iterations\n")
    print("| platform | modeled ms/iter | modeled samples/s | peak HBM per device (MiB) | wall samples/s (emulator) |")
    print("|---|---:|---:|---:|---:|")
    for platform, ms, samples, hbm, wall in rows:
        print(f"| {platform} | {ms:.3f} | {samples:,.0f} | {hbm:.1f} | {wall:.1f} |")
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="small", choices=tuple(dlrm.CONFIGS))
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--steps", type=int, default=3, help="(a) steps per timed run")
    parser.add_argument("--nproc", type=int, default=8, help="(b) ranks")
    parser.add_argument("--num-batches", type=int, default=3, help="(b) iterations per run")
    parser.add_argument("--platforms", default="zion,zionex,hgx-h100", help="(b) comma-separated presets")
    parser.add_argument("--only", choices=("overhead", "modeled"), help="run one part")
    parser.add_argument("--no-autograd-threads", action="store_true",
                        help="(a) torch.autograd.set_multithreading_enabled(False) for the run: backward on the "
                             "calling thread even with ZION_AUTOGRAD_DEVICE_THREADS=1")
    args = parser.parse_args()
    if args.no_autograd_threads:
        torch.autograd.set_multithreading_enabled(False)
    print(f"date {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, torch {torch.__version__}, "
          f"{os.cpu_count()} cpus\n")
    if args.only != "modeled":
        overhead(args.config, args.repeat, args.steps)
    if args.only != "overhead":
        modeled(args.config, args.nproc, args.num_batches, args.platforms.split(","))


if __name__ == "__main__":
    main()
