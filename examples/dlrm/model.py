"""DLRM (Naumov et al., 2019) split the way it trains at scale.

- Embedding tables are model parallel, table-wise: each rank owns a
  contiguous block of tables and pools them for the whole global batch.
  :class:`PooledExchange` sends each rank the pooled rows of its own samples
  (``all_to_all_single``) and sends the gradients back the same way.
- The bottom MLP, the dot interaction and the top MLP (:class:`DenseArch`)
  are data parallel: each rank runs its slice of the batch, under DDP.

Weights are drawn on the CPU from seeded generators, per table and per layer
(the reference's initialization), then moved to the device, so every device
and every world size starts from the same numbers.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch import nn


def table_owners(tables: int, world_size: int) -> list[list[int]]:
    """Tables of each rank: contiguous blocks whose sizes differ by at most one
    (the first ``tables % world_size`` ranks take one more). Ranks past the
    table count own none."""
    base, extra = divmod(tables, world_size)
    owned, start = [], 0
    for r in range(world_size):
        count = base + (1 if r < extra else 0)
        owned.append(list(range(start, start + count)))
        start += count
    return owned


def _generator(seed: int, stream: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed * 1000003 + stream)


def make_embedding(rows: int, dim: int, seed: int, table: int) -> nn.EmbeddingBag:
    """A sum-pooled bag with sparse gradients, uniform(-1/sqrt(rows), 1/sqrt(rows)) as the reference."""
    bag = nn.EmbeddingBag(rows, dim, mode="sum", sparse=True, _weight=torch.empty(rows, dim))
    bound = math.sqrt(1.0 / rows)
    with torch.no_grad():
        bag.weight.uniform_(-bound, bound, generator=_generator(seed, 1000 + table))
    return bag


def make_mlp(widths: list[int], seed: int, stream: int, last_relu: bool) -> nn.Sequential:
    """Linear layers with ReLU between (and after the last if ``last_relu``);
    weights normal(0, sqrt(2 / (fan_in + fan_out))), biases normal(0, sqrt(1 / fan_out)) as the reference."""
    layers: list[nn.Module] = []
    g = _generator(seed, stream)
    for k, (n_in, n_out) in enumerate(zip(widths[:-1], widths[1:])):
        linear = nn.Linear(n_in, n_out)
        with torch.no_grad():
            linear.weight.normal_(0.0, math.sqrt(2.0 / (n_in + n_out)), generator=g)
            linear.bias.normal_(0.0, math.sqrt(1.0 / n_out), generator=g)
        layers.append(linear)
        if k < len(widths) - 2 or last_relu:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def interaction_width(dim: int, tables: int) -> int:
    """Width of the dot interaction's output: the dense vector and one dot per pair of the tables + 1 vectors."""
    return dim + (tables + 1) * tables // 2


class DenseArch(nn.Module):
    """Bottom MLP, dot interaction, top MLP: the data-parallel part of DLRM."""

    def __init__(self, bottom: list[int], top: list[int], tables: int, seed: int) -> None:
        super().__init__()
        self.bottom = make_mlp(bottom, seed, 1, last_relu=True)
        self.top = make_mlp([interaction_width(bottom[-1], tables)] + top, seed, 2, last_relu=False)
        upper = torch.triu_indices(tables + 1, tables + 1, offset=1)
        self.register_buffer("rows", upper[0].clone(), persistent=False)
        self.register_buffer("cols", upper[1].clone(), persistent=False)

    def forward(self, dense: torch.Tensor, pooled: torch.Tensor) -> torch.Tensor:
        """``dense`` [b, dense features], ``pooled`` [b, tables, dim] -> logits [b]."""
        x = self.bottom(dense)
        # Pairwise dots of the bottom output and the pooled embeddings; each
        # pair once (the strict upper triangle), next to the dense vector.
        features = torch.cat([x.unsqueeze(1), pooled], dim=1)
        dots = torch.bmm(features, features.transpose(1, 2))
        z = torch.cat([x, dots[:, self.rows, self.cols]], dim=1)
        return self.top(z).squeeze(1)


class PooledExchange(torch.autograd.Function):
    """The model-parallel to data-parallel switch.

    Forward: ``send`` holds, for each destination rank in order, this rank's
    tables pooled over that rank's samples; each rank receives every table
    pooled over its own samples (all_to_all_single with the given splits).
    Backward: the gradients travel the reverse way, scaled by ``grad_scale``:
    each rank's loss is the mean over its own samples, 1/world_size of the
    global loss, and DDP averages the dense gradients to match.
    """

    @staticmethod
    def forward(ctx, send: torch.Tensor, send_splits: list[int], recv_splits: list[int], grad_scale: float,
                group: "dist.ProcessGroup | None") -> torch.Tensor:
        received = send.new_empty(sum(recv_splits))
        dist.all_to_all_single(received, send, output_split_sizes=recv_splits, input_split_sizes=send_splits,
                               group=group)
        ctx.splits, ctx.grad_scale, ctx.group = (send_splits, recv_splits), grad_scale, group
        return received

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        send_splits, recv_splits = ctx.splits
        grad_send = grad.new_empty(sum(send_splits))
        dist.all_to_all_single(grad_send, grad.contiguous(), output_split_sizes=send_splits,
                               input_split_sizes=recv_splits, group=ctx.group)
        if ctx.grad_scale != 1.0:
            grad_send.mul_(ctx.grad_scale)
        return grad_send, None, None, None, None


class EmbeddingArch(nn.Module):
    """This rank's tables, and the exchange that hands every rank its samples' pooled rows of every table."""

    def __init__(self, table_rows: list[int], dim: int, owners: list[list[int]], rank: int, seed: int,
                 device: torch.device) -> None:
        super().__init__()
        self.dim, self.tables, self.owners, self.rank = dim, len(table_rows), owners, rank
        # One table at a time to the device, so the host holds at most one extra copy.
        self.bags = nn.ModuleList(make_embedding(table_rows[t], dim, seed, t).to(device) for t in owners[rank])

    def forward(self, indices: list[torch.Tensor], offsets: torch.Tensor, local_batch: int) -> torch.Tensor:
        """-> [local batch, tables, dim]: every table pooled over this rank's samples."""
        world = len(self.owners)
        own = len(self.bags)
        if world == 1:
            return torch.stack([bag(idx, offsets) for bag, idx in zip(self.bags, indices)], dim=1)
        if own:
            pooled = torch.stack([bag(idx, offsets) for bag, idx in zip(self.bags, indices)])  # [own, B, dim]
            # -> [world, own, b, dim]: destination-major, the all_to_all's input order.
            send = pooled.view(own, world, local_batch, self.dim).transpose(0, 1).reshape(-1)
        else:
            # A rank without tables still takes part in both exchanges: an
            # input that requires grad makes autograd run the backward one.
            send = torch.empty(0, device=offsets.device, requires_grad=True)
        chunk = local_batch * self.dim
        send_splits = [own * chunk] * world
        recv_splits = [len(tables) * chunk for tables in self.owners]
        received = PooledExchange.apply(send, send_splits, recv_splits, 1.0 / world, None)
        # Sources in rank order hold contiguous blocks of tables: [tables, b, dim].
        return received.view(self.tables, local_batch, self.dim).transpose(0, 1)
