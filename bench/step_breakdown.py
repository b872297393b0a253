"""Where a DLRM step's emulator overhead goes, op by op.

Runs the same `examples/dlrm/dlrm.py` step on the CPU and on one zion device
in one process (one intra-op thread) under torch.profiler, and prints each
operator's calls and self CPU time per step on both, largest difference first.
The profiler adds its own cost per op to both sides, so the totals are above
`dlrm_bench.py --only overhead`'s wall times; the differences say which ops
carry zion's extra work.

    python bench/step_breakdown.py --config tiny --steps 30
"""

import argparse
import collections
import pathlib
import sys

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "examples" / "dlrm"))

import dlrm  # noqa: E402


def per_step(run, batches, steps: int) -> tuple[collections.Counter, collections.Counter]:
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for i in range(steps):
            run.step(batches[i % len(batches)].to(run.device)).item()
    self_us, calls = collections.Counter(), collections.Counter()
    for event in prof.key_averages():
        self_us[event.key] = event.self_cpu_time_total / steps
        calls[event.key] = event.count / steps
    return self_us, calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="tiny", help="a config of examples/dlrm/dlrm.py (default tiny)")
    parser.add_argument("--steps", type=int, default=30, help="profiled steps per device (default 30)")
    parser.add_argument("--top", type=int, default=25, help="rows printed (default 25)")
    args = parser.parse_args()
    if args.steps < 1:
        parser.error(f"--steps must be at least 1, got {args.steps}")
    torch.set_num_threads(1)
    runs = {d: dlrm.setup(dlrm.parse_args(["--config", args.config, "--device", d, "--no-progress"])) for d in ("cpu", "zion")}
    batches = [runs["cpu"].data.batch(i) for i in range(3)]
    for run in runs.values():  # untimed: first-call costs
        for batch in batches:
            run.step(batch.to(run.device)).item()
    result = {d: per_step(run, batches, args.steps) for d, run in runs.items()}
    (cpu_us, cpu_calls), (zion_us, zion_calls) = result["cpu"], result["zion"]
    keys = sorted(set(cpu_us) | set(zion_us), key=lambda k: cpu_us[k] - zion_us[k])
    print(f"## one {args.config} step, per step over {args.steps} profiled steps, self CPU time\n")
    print("| operator | calls cpu | calls zion | cpu µs | zion µs | zion − cpu µs |")
    print("|---|---:|---:|---:|---:|---:|")
    for k in keys[: args.top]:
        print(f"| {k} | {cpu_calls[k]:.0f} | {zion_calls[k]:.0f} | {cpu_us[k]:.1f} | {zion_us[k]:.1f} | {zion_us[k] - cpu_us[k]:+.1f} |")
    total_cpu, total_zion = sum(cpu_us.values()), sum(zion_us.values())
    print(f"| all operators | {sum(cpu_calls.values()):.0f} | {sum(zion_calls.values()):.0f} | {total_cpu:.1f} | "
          f"{total_zion:.1f} | {total_zion - total_cpu:+.1f} |")


if __name__ == "__main__":
    main()
