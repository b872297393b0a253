"""A small DLRM training script written for CUDA, in the style of the
public DLRM reference (dlrm_s_pytorch.py): flags for the architecture, random
data, sparse EmbeddingBags trained with SGD, and DistributedDataParallel for
the MLPs when launched with WORLD_SIZE > 1 (the embedding tables are
replicated; their gradients are summed across ranks). It knows nothing of
zion: run it with the CUDA compatibility layer to put it on zion.

    python examples/cuda_dlrm_reference_style.py --use-gpu --num-batches 5
    torchrun --nproc-per-node 2 examples/cuda_dlrm_reference_style.py --use-gpu

Without --use-gpu it trains on the CPU (gloo when distributed). Each
iteration prints one line::

    iter=<i> loss=<global mean loss, full precision> time_ms=<iteration time>
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.distributed.nn  # noqa: F401  (before the group exists; see the end of main)
import torch.nn as nn


def sizes(text: str) -> list[int]:
    return [int(v) for v in text.split("-")]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="DLRM-style training (random data)")
    p.add_argument("--arch-sparse-feature-size", type=int, default=16)
    p.add_argument("--arch-embedding-size", type=sizes, default=sizes("40-30-20"))
    p.add_argument("--arch-mlp-bot", type=sizes, default=sizes("8-32-16"))
    p.add_argument("--arch-mlp-top", type=sizes, default=sizes("22-32-1"))
    p.add_argument("--mini-batch-size", type=int, default=32)
    p.add_argument("--num-batches", type=int, default=5)
    p.add_argument("--num-indices-per-lookup", type=int, default=4)
    p.add_argument("--learning-rate", type=float, default=0.1)
    p.add_argument("--numpy-rand-seed", type=int, default=123)
    p.add_argument("--use-gpu", action="store_true")
    p.add_argument("--dist-backend", default="", help="default: nccl with --use-gpu, else gloo")
    return p.parse_args(argv)


def mlp(layer_sizes: list[int], sigmoid_last: bool) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (n_in, n_out) in enumerate(zip(layer_sizes[:-1], layer_sizes[1:])):
        layers.append(nn.Linear(n_in, n_out))
        last = i == len(layer_sizes) - 2
        layers.append(nn.Sigmoid() if last and sigmoid_last else nn.ReLU())
    return nn.Sequential(*layers)


class DLRM(nn.Module):
    def __init__(self, dim: int, table_rows: list[int], bot: list[int], top: list[int]) -> None:
        super().__init__()
        features = len(table_rows) + 1
        interactions = dim + features * (features - 1) // 2
        if bot[-1] != dim:
            raise SystemExit(f"--arch-mlp-bot must end in the sparse feature size {dim}, got {bot}")
        if top[0] != interactions:
            raise SystemExit(f"--arch-mlp-top must start with {interactions} (dense + pairwise dots), got {top}")
        self.emb_l = nn.ModuleList()
        for rows in table_rows:
            bag = nn.EmbeddingBag(rows, dim, mode="sum", sparse=True)
            bound = (1.0 / rows) ** 0.5
            with torch.no_grad():
                bag.weight.uniform_(-bound, bound)
            self.emb_l.append(bag)
        self.bot_l = mlp(bot, sigmoid_last=False)
        self.top_l = mlp(top, sigmoid_last=True)
        rows, cols = torch.tril_indices(features, features, offset=-1)
        self.register_buffer("tri_rows", rows, persistent=False)
        self.register_buffer("tri_cols", cols, persistent=False)

    def interact(self, x: torch.Tensor, ly: list[torch.Tensor]) -> torch.Tensor:
        t = torch.stack([x] + ly, dim=1)  # (batch, features, dim)
        z = torch.bmm(t, t.transpose(1, 2))
        return torch.cat([x, z[:, self.tri_rows, self.tri_cols]], dim=1)

    def forward(self, dense: torch.Tensor, offsets: list[torch.Tensor], indices: list[torch.Tensor]) -> torch.Tensor:
        x = self.bot_l(dense)
        ly = [bag(i, o) for bag, i, o in zip(self.emb_l, indices, offsets)]
        return self.top_l(self.interact(x, ly))


def random_batch(g: torch.Generator, args: argparse.Namespace, rows: list[int]) -> tuple:
    """One global mini-batch on the CPU: dense features, per-table offsets and
    indices (the reference's lS_o, lS_i), and 0/1 targets."""
    n, k = args.mini_batch_size, args.num_indices_per_lookup
    dense = torch.rand(n, args.arch_mlp_bot[0], generator=g)
    offsets = [torch.arange(0, n * k, k, dtype=torch.int64) for _ in rows]
    indices = [torch.randint(0, r, (n * k,), generator=g, dtype=torch.int64) for r in rows]
    target = torch.randint(0, 2, (n, 1), generator=g).float()
    return dense, offsets, indices, target


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    use_gpu = args.use_gpu
    if use_gpu and not torch.cuda.is_available():
        raise SystemExit("--use-gpu: CUDA is not available")
    if args.mini_batch_size % world:
        raise SystemExit(f"--mini-batch-size {args.mini_batch_size} must split evenly over {world} ranks")
    torch.manual_seed(args.numpy_rand_seed)
    if use_gpu:
        torch.cuda.manual_seed_all(args.numpy_rand_seed)
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        print(f"rank {rank}: using {torch.cuda.device_count()} GPU(s), {torch.cuda.get_device_name(device)}",
              file=sys.stderr)
    else:
        device = torch.device("cpu")
    if world > 1:
        dist.init_process_group(args.dist_backend or ("nccl" if use_gpu else "gloo"))

    rows = args.arch_embedding_size
    model = DLRM(args.arch_sparse_feature_size, rows, args.arch_mlp_bot, args.arch_mlp_top)
    if use_gpu:
        model = model.cuda()
    if world > 1:
        ids = [local_rank] if use_gpu else None
        model.bot_l = nn.parallel.DistributedDataParallel(model.bot_l, device_ids=ids)
        model.top_l = nn.parallel.DistributedDataParallel(model.top_l, device_ids=ids)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.learning_rate)
    loss_fn = nn.BCELoss()

    data = torch.Generator().manual_seed(args.numpy_rand_seed)
    share = args.mini_batch_size // world
    k = args.num_indices_per_lookup
    lo, hi = rank * share, (rank + 1) * share
    for it in range(args.num_batches):
        dense, offsets, indices, target = random_batch(data, args, rows)
        # This rank's slice of the global batch; offsets restart at zero.
        dense, target = dense[lo:hi], target[lo:hi]
        offsets = [o[:share] for o in offsets]
        indices = [i[lo * k:hi * k] for i in indices]
        t0 = time.perf_counter()
        if use_gpu:
            dense, target = dense.to(device), target.to(device)
            offsets = [o.to(device) for o in offsets]
            indices = [i.to(device) for i in indices]
        optimizer.zero_grad()
        loss = loss_fn(model(dense, offsets, indices), target)
        loss.backward()
        if world > 1:
            # Replicated tables: average their (sparse) gradients over the ranks.
            for bag in model.emb_l:
                grad = bag.weight.grad.to_dense()
                dist.all_reduce(grad)
                bag.weight.grad = grad / world
        optimizer.step()
        reported = loss.detach().clone()
        if world > 1:
            dist.all_reduce(reported)
            reported /= world
        value = reported.item()
        if use_gpu:
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - t0
        if rank == 0:
            print(f"iter={it} loss={value!r} time_ms={elapsed * 1e3:.4f}", flush=True)
    if world > 1:
        # The group's backend is freed, and gloo's worker threads joined, only
        # once nothing holds it: the DDP modules do (hence their deletion) and
        # torch.distributed.nn's default arguments would, had it been imported
        # after the group was made (hence the import above). A gloo worker left
        # at interpreter teardown can abort the process as it drops a tensor.
        del model, optimizer
        gc.collect()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
