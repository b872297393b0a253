"""The emulator's own cost, measured side by side with CPU eager in one run.

    python bench/overhead.py [--repeat 5]

- tiny op: ``x + 1`` on one element, zion vs CPU, µs per op (target <= 1.20x);
- a small DLRM-like training step (EmbeddingBags + MLPs, SGD), zion vs CPU
  eager, ms per step (target <= 1.10x);
- page faults per DLRM step, zion vs CPU (no target: where host time went
  before the CPU kernels of zion ops kept their freed blocks);
- host memory: resident-set growth while holding zion tensors vs the bytes
  of those tensors (target <= 1.1x).
Each figure is the median of --repeat runs.
"""

from __future__ import annotations

import argparse
import gc
import resource
import statistics
import time

import torch

import zion_emu  # noqa: F401  (registers the device)


def per_call_us(fn, calls: int) -> float:
    fn()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e6


def tiny_op(device: str, calls: int) -> float:
    x = torch.ones(1, device=device)
    return per_call_us(lambda: x + 1, calls)


class SmallDLRM(torch.nn.Module):
    def __init__(self, tables: int = 8, rows: int = 10000, dim: int = 16) -> None:
        super().__init__()
        self.bags = torch.nn.ModuleList(torch.nn.EmbeddingBag(rows, dim, mode="sum") for _ in range(tables))
        self.bottom = torch.nn.Sequential(torch.nn.Linear(13, 64), torch.nn.ReLU(), torch.nn.Linear(64, dim), torch.nn.ReLU())
        self.top = torch.nn.Sequential(torch.nn.Linear(dim * (tables + 1), 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))

    def forward(self, dense: torch.Tensor, indices: list[torch.Tensor], offsets: torch.Tensor) -> torch.Tensor:
        features = [self.bottom(dense)] + [bag(idx, offsets) for bag, idx in zip(self.bags, indices)]
        return self.top(torch.cat(features, dim=1))


def dlrm_step_ms(device: str, steps: int, batch: int = 256, lookups: int = 4) -> tuple[float, float]:
    """Milliseconds and minor page faults per step."""
    torch.manual_seed(0)
    model = SmallDLRM().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    dense = torch.randn(batch, 13).to(device)
    indices = [torch.randint(0, 10000, (batch * lookups,)).to(device) for _ in range(8)]
    offsets = torch.arange(0, batch * lookups, lookups).to(device)
    target = torch.rand(batch, 1).to(device)

    def step() -> None:
        loss = torch.nn.functional.binary_cross_entropy_with_logits(model(dense, indices, offsets), target)
        opt.zero_grad()
        loss.backward()
        opt.step()

    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    ms = per_call_us(step, steps) / 1e3
    return ms, (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) / (steps + 1)


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def rss_ratio() -> float:
    gc.collect()
    before = rss_bytes()
    held = [torch.ones(1 << 20, device="zion") for _ in range(64)]  # 256 MiB
    after = rss_bytes()
    tensor_bytes = sum(t.numel() * t.element_size() for t in held)
    return (after - before) / tensor_bytes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--only", choices=("tiny", "dlrm"), help="measure only the tiny op or only the DLRM step")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = []
    tiny_pair_ratio = None
    cpu_runs, zion_runs = [], []
    for _ in range(args.repeat if args.only != "dlrm" else 0):  # interleaved, as the DLRM runs below
        cpu_runs.append(tiny_op("cpu", 20000))
        zion_runs.append(tiny_op("zion", 20000))
    if cpu_runs:
        rows.append(("tiny op x + 1 (1 element)", "us/op", statistics.median(cpu_runs), statistics.median(zion_runs), 1.20))
        tiny_pair_ratio = statistics.median(z / c for c, z in zip(cpu_runs, zion_runs))
    cpu_runs, zion_runs = [], []
    for _ in range(args.repeat if args.only != "tiny" else 0):  # interleaved, so a change in machine load hits both alike
        cpu_runs.append(dlrm_step_ms("cpu", 20))
        zion_runs.append(dlrm_step_ms("zion", 20))
    if cpu_runs:
        cpu, zion = (statistics.median(ms for ms, _ in runs) for runs in (cpu_runs, zion_runs))
        rows.append(("small DLRM training step", "ms/step", cpu, zion, 1.10))
        cpu, zion = (statistics.median(f for _, f in runs) for runs in (cpu_runs, zion_runs))
        rows.append(("page faults per DLRM step", "faults", cpu, zion, None))
    print(f"{'measure':32s} {'unit':8s} {'cpu':>10s} {'zion':>10s} {'ratio':>7s} {'target':>7s}")
    for name, unit, c, z, target in rows:
        ratio = f"{z / c:7.2f}" if c else f"{'':>7s}"
        print(f"{name:32s} {unit:8s} {c:10.2f} {z:10.2f} {ratio} {'' if target is None else f'{target:7.2f}':>7s}")
    if tiny_pair_ratio is not None:
        print(f"{'tiny op, median of paired ratios':32s} {'ratio':8s} {'':>10s} {'':>10s} {tiny_pair_ratio:7.2f} {1.20:7.2f}")
    print(f"{'host RSS growth / tensor bytes':32s} {'ratio':8s} {'':>10s} {'':>10s} {rss_ratio():7.2f} {1.1:7.2f}")


if __name__ == "__main__":
    main()
