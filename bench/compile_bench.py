"""Modeled time of eager vs torch.compile (inductor) on zion.

    python bench/compile_bench.py [--elements 4194304] [--batch 2048]

- pointwise block: ``y = x*sigmoid(x); z = y*0.5 + x; out = relu(z)`` on
  --elements fp32 values: five eager kernels against one fused kernel;
- a slice: ``x[:, :8] * 2 + 1`` on a 4096 x 4096 fp32 tensor (a fused
  kernel is charged the 8 columns it reads, not the whole tensor);
- a gather: a 256-row ``nn.Embedding`` lookup of a 2^20 x 64 table, times 2
  (one fused kernel reading the 256 rows);
- a DLRM-like training step (3 EmbeddingBags, bottom and top MLPs, dot
  interaction, a pointwise tail; forward, BCE loss, backward) at --batch.
Each figure is modeled time from an idle device to the end of one call,
after a warm-up call (which compiles); it does not depend on this machine.
"""

from __future__ import annotations

import argparse
import time
from typing import Any, Callable

import torch
from torch import nn

import zion_emu


def pointwise_block(x: torch.Tensor) -> torch.Tensor:
    y = x * torch.sigmoid(x)
    z = y * 0.5 + x
    return z.relu()


def slice_block(x: torch.Tensor) -> torch.Tensor:
    return x[:, :8] * 2 + 1


def lookup_block(table: nn.Embedding, rows: torch.Tensor) -> torch.Tensor:
    return table(rows) * 2


class DLRMLike(nn.Module):
    def __init__(self, tables: int = 3, rows: int = 100_000, dim: int = 64, dense_in: int = 13) -> None:
        super().__init__()
        self.emb = nn.ModuleList(nn.EmbeddingBag(rows, dim, mode="sum") for _ in range(tables))
        self.bottom = nn.Sequential(nn.Linear(dense_in, 512), nn.ReLU(), nn.Linear(512, dim), nn.ReLU())
        n = tables + 1
        self.top = nn.Sequential(nn.Linear(dim + n * (n - 1) // 2, 512), nn.ReLU(), nn.Linear(512, 1))

    def forward(self, dense: torch.Tensor, indices: list[torch.Tensor], offsets: list[torch.Tensor]) -> torch.Tensor:
        x = self.bottom(dense)
        z = torch.stack([x] + [e(i, o) for e, i, o in zip(self.emb, indices, offsets)], dim=1)
        inter = torch.bmm(z, z.transpose(1, 2))
        li, lj = torch.tril_indices(z.shape[1], z.shape[1], offset=-1)
        h = torch.cat([x, inter[:, li, lj]], dim=1)
        y = h
        for _ in range(3):
            y = y * torch.sigmoid(y) + h * 0.5
        return torch.sigmoid(self.top(y)).squeeze(1)


def modeled_s(fn: Callable[[], Any]) -> tuple[float, int]:
    """Modeled seconds of one call from an idle device, and the compiled kernels it ran."""
    torch.zion.synchronize()
    start, kernels = zion_emu.clock(), zion_emu.counters().compiled_kernels
    fn()
    torch.zion.synchronize()
    return zion_emu.clock() - start, zion_emu.counters().compiled_kernels - kernels


def compare(name: str, eager: Callable[[], Any], compiled: Callable[[], Any]) -> None:
    eager()
    wall = time.perf_counter()
    compiled()
    compile_s = time.perf_counter() - wall
    eager_s, _ = modeled_s(eager)
    compiled_s, kernels = modeled_s(compiled)
    print(f"{name:34s} eager {eager_s * 1e3:9.3f} ms   compiled {compiled_s * 1e3:9.3f} ms   "
          f"x{eager_s / compiled_s:5.2f}   ({kernels} compiled kernels; first call {compile_s:.1f} s here)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--elements", type=int, default=1 << 22)
    parser.add_argument("--batch", type=int, default=2048)
    args = parser.parse_args()
    print(f"platform {zion_emu.current_platform().name}; modeled time per call on zion:0")

    x = torch.randn(args.elements, device="zion")
    compiled_block = torch.compile(pointwise_block)
    compare(f"pointwise block, {args.elements} fp32", lambda: pointwise_block(x), lambda: compiled_block(x))

    wide = torch.randn(4096, 4096, device="zion")
    compiled_slice = torch.compile(slice_block)
    compare("slice x[:, :8]*2+1 of 4096x4096", lambda: slice_block(wide), lambda: compiled_slice(wide))

    table = nn.Embedding(1 << 20, 64).to("zion")
    rows = torch.randint(0, 1 << 20, (256,), device="zion")
    compiled_lookup = torch.compile(lookup_block)
    with torch.no_grad():
        compare("256-row lookup of 2^20 x 64, *2", lambda: lookup_block(table, rows),
                lambda: compiled_lookup(table, rows))

    torch.manual_seed(0)
    model = DLRMLike().to("zion")
    compiled_model = torch.compile(model)
    b = args.batch
    dense = torch.randn(b, 13, device="zion")
    indices = [torch.randint(0, 100_000, (b * 8,), device="zion") for _ in range(3)]
    offsets = [torch.arange(0, b * 8, 8, device="zion") for _ in range(3)]
    target = torch.rand(b, device="zion")

    def step(m: nn.Module) -> None:
        nn.functional.binary_cross_entropy(m(dense, indices, offsets), target).backward()

    compare(f"DLRM-like step, batch {b}", lambda: step(model), lambda: step(compiled_model))
    if zion_emu.inductor.fallbacks():
        print("ran op by op:", zion_emu.inductor.fallbacks())


if __name__ == "__main__":
    main()
