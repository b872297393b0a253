"""A DLRM trained by one process on all the GPUs of a node, written for CUDA:
model parallelism for the embedding tables (table k on cuda:k), their
pooled outputs moved to cuda:0, and data parallelism for the MLPs through
``nn.DataParallel`` (replicate, scatter, parallel_apply, gather). It knows
nothing of zion: run it with the CUDA compatibility layer to put it on zion.

    python -m zion_emu run --cuda-compat examples/dlrm_single_process.py
    python -m zion_emu run --cuda-compat examples/dlrm_single_process.py --devices 1
    python examples/dlrm_single_process.py --device cpu

``--devices N`` uses cuda:0..N-1 (tables round-robin, DataParallel over N);
``--device cpu`` keeps everything on the CPU and applies each MLP to the
whole batch. Each iteration prints one line::

    iter=<i> loss=<loss, full precision> time_ms=<iteration time>
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn as nn


def sizes(text: str) -> list[int]:
    return [int(v) for v in text.split("-")]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="single-process DLRM: tables on every GPU, data-parallel MLPs")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--devices", type=int, default=None, help="GPUs to use (default: all)")
    p.add_argument("--tables", type=int, default=8)
    p.add_argument("--table-rows", type=int, default=10000)
    p.add_argument("--sparse-feature-size", type=int, default=64)
    p.add_argument("--mlp-bot", type=sizes, default=sizes("256-1024-1024-64"))
    p.add_argument("--mlp-top", type=sizes, default=sizes("100-1024-1024-1"))
    p.add_argument("--mini-batch-size", type=int, default=2048)
    p.add_argument("--indices-per-lookup", type=int, default=8)
    p.add_argument("--num-batches", type=int, default=5)
    p.add_argument("--learning-rate", type=float, default=0.0001)
    p.add_argument("--seed", type=int, default=123)
    return p.parse_args(argv)


def mlp(layer_sizes: list[int], sigmoid_last: bool) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (n_in, n_out) in enumerate(zip(layer_sizes[:-1], layer_sizes[1:])):
        layers.append(nn.Linear(n_in, n_out))
        last = i == len(layer_sizes) - 2
        layers.append(nn.Sigmoid() if last and sigmoid_last else nn.ReLU())
    return nn.Sequential(*layers)


class DLRM(nn.Module):
    def __init__(self, args: argparse.Namespace, devices: list[torch.device]) -> None:
        super().__init__()
        dim, features = args.sparse_feature_size, args.tables + 1
        if args.mlp_bot[-1] != dim or args.mlp_top[0] != dim + features * (features - 1) // 2:
            raise SystemExit(f"--mlp-bot must end in {dim} and --mlp-top start with "
                             f"{dim + features * (features - 1) // 2}")
        self.devices = devices
        self.emb = nn.ModuleList(nn.EmbeddingBag(args.table_rows, dim, mode="sum", sparse=True)
                                 for _ in range(args.tables))
        self.bot = mlp(args.mlp_bot, sigmoid_last=False)
        self.top = mlp(args.mlp_top, sigmoid_last=True)
        rows, cols = torch.tril_indices(features, features, offset=-1)
        self.register_buffer("tri_rows", rows, persistent=False)
        self.register_buffer("tri_cols", cols, persistent=False)

    def place(self) -> None:
        """Tables round-robin over the devices, the rest on the first; the
        MLPs data-parallel over all of them."""
        main = self.devices[0]
        for k, bag in enumerate(self.emb):
            bag.to(self.table_device(k))
        self.bot.to(main)
        self.top.to(main)
        self.tri_rows, self.tri_cols = self.tri_rows.to(main), self.tri_cols.to(main)
        if main.type != "cpu" and len(self.devices) > 1:
            ids = [d.index for d in self.devices]
            self.bot = nn.DataParallel(self.bot, device_ids=ids)
            self.top = nn.DataParallel(self.top, device_ids=ids)

    def table_device(self, k: int) -> torch.device:
        return self.devices[k % len(self.devices)]

    def forward(self, dense: torch.Tensor, offsets: list[torch.Tensor], indices: list[torch.Tensor]) -> torch.Tensor:
        main = self.devices[0]
        x = self.bot(dense)
        # Model parallel: each table looks up on its device; its pooled rows go to the first device.
        ly = [bag(i, o).to(main) for bag, i, o in zip(self.emb, indices, offsets)]
        t = torch.stack([x] + ly, dim=1)
        z = torch.bmm(t, t.transpose(1, 2))
        return self.top(torch.cat([x, z[:, self.tri_rows, self.tri_cols]], dim=1))


def random_batch(g: torch.Generator, args: argparse.Namespace) -> tuple:
    n, k = args.mini_batch_size, args.indices_per_lookup
    dense = torch.rand(n, args.mlp_bot[0], generator=g)
    offsets = [torch.arange(0, n * k, k, dtype=torch.int64) for _ in range(args.tables)]
    indices = [torch.randint(0, args.table_rows, (n * k,), generator=g, dtype=torch.int64) for _ in range(args.tables)]
    target = torch.randint(0, 2, (n, 1), generator=g).float()
    return dense, offsets, indices, target


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.device == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit("--device cuda: CUDA is not available")
        count = args.devices or torch.cuda.device_count()
        if not 1 <= count <= torch.cuda.device_count():
            raise SystemExit(f"--devices {count}: this node has {torch.cuda.device_count()} GPUs")
        devices = [torch.device("cuda", i) for i in range(count)]
    else:
        devices = [torch.device("cpu")]
    torch.manual_seed(args.seed)
    model = DLRM(args, devices)
    model.place()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.learning_rate)
    loss_fn = nn.BCELoss()
    data = torch.Generator().manual_seed(args.seed)
    main_device = devices[0]
    for it in range(args.num_batches):
        dense, offsets, indices, target = random_batch(data, args)
        t0 = time.perf_counter()
        dense, target = dense.to(main_device), target.to(main_device)
        offsets = [o.to(model.table_device(k)) for k, o in enumerate(offsets)]
        indices = [i.to(model.table_device(k)) for k, i in enumerate(indices)]
        optimizer.zero_grad()
        loss = loss_fn(model(dense, offsets, indices), target)
        loss.backward()
        optimizer.step()
        value = loss.item()
        if main_device.type != "cpu":
            for d in devices:
                torch.cuda.synchronize(d)
        print(f"iter={it} loss={value!r} time_ms={(time.perf_counter() - t0) * 1e3:.4f}", flush=True)


if __name__ == "__main__":
    main()
