"""DLRM (Naumov et al., 2019) split the way it trains at scale.

- Embedding tables are model parallel, table-wise: each rank owns whole
  tables (placement.table_owners balances their bytes) and pools them for the
  whole global batch. :class:`PooledExchange` sends each rank the pooled rows
  of its own samples (``all_to_all_single``) and sends the gradients back the
  same way.
- The bottom MLP, the interaction (DLRM's pairwise dots, or DCN-v2's low-rank
  cross layers) and the top MLP (:class:`DenseArch`) are data parallel: each
  rank runs its slice of the batch, under DDP.

Every parameter is made on its device, uninitialized, and drawn there in
place from seeded generators, per table and per layer (the reference's
initialization), so a table never exists twice, nor on the host for an HBM
table. On the CPU and on zion the generators are CPU generators, so every
device and every world size starts from the same numbers; on a device whose
generators differ (CUDA) each tensor is drawn on the CPU and copied over.
"""

from __future__ import annotations

import math
from typing import Callable

import torch
import torch.distributed as dist
from torch import nn

INTERACTIONS = ("dot", "dcn")
# Devices whose torch.Generator draws the CPU's numbers (zion's generators
# hold CPU generator state).
CPU_RNG_DEVICES = ("cpu", "zion")


class _Draw:
    """Seeded draws into parameters that already live on their device: one
    generator stream (``seed``, ``stream``), consumed in call order."""

    def __init__(self, seed: int, stream: int, device: torch.device) -> None:
        self.on = device if device.type in CPU_RNG_DEVICES else torch.device("cpu")
        self.generator = torch.Generator(device=self.on).manual_seed(seed * 1000003 + stream)

    def __call__(self, param: torch.Tensor, fill: Callable[[torch.Tensor, torch.Generator], object]) -> None:
        with torch.no_grad():
            if param.device.type == self.on.type:
                fill(param, self.generator)
            else:
                drawn = torch.empty(param.shape, dtype=param.dtype, device=self.on)
                fill(drawn, self.generator)
                param.copy_(drawn)


def make_embedding(rows: int, dim: int, seed: int, table: int, device: torch.device) -> nn.EmbeddingBag:
    """A sum-pooled bag with sparse gradients on ``device``, uniform(-1/sqrt(rows), 1/sqrt(rows)) as the reference."""
    bag = nn.utils.skip_init(nn.EmbeddingBag, rows, dim, mode="sum", sparse=True, device=device)
    bound = math.sqrt(1.0 / rows)
    _Draw(seed, 1000 + table, device)(bag.weight, lambda w, g: w.uniform_(-bound, bound, generator=g))
    return bag


def make_mlp(widths: list[int], seed: int, stream: int, last_relu: bool, device: torch.device) -> nn.Sequential:
    """Linear layers with ReLU between (and after the last if ``last_relu``);
    weights normal(0, sqrt(2 / (fan_in + fan_out))), biases normal(0, sqrt(1 / fan_out)) as the reference."""
    layers: list[nn.Module] = []
    draw = _Draw(seed, stream, device)
    for k, (n_in, n_out) in enumerate(zip(widths[:-1], widths[1:])):
        linear = nn.utils.skip_init(nn.Linear, n_in, n_out, device=device)
        draw(linear.weight, lambda w, g: w.normal_(0.0, math.sqrt(2.0 / (n_in + n_out)), generator=g))
        draw(linear.bias, lambda b, g: b.normal_(0.0, math.sqrt(1.0 / n_out), generator=g))
        layers.append(linear)
        if k < len(widths) - 2 or last_relu:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def mlp_activation_floats(widths: list[int], last_relu: bool) -> int:
    """Floats per sample that :func:`make_mlp`'s forward makes: each layer's output and its ReLU's."""
    relus = len(widths) - 2 + (1 if last_relu else 0)
    return sum(widths[1:]) + sum(widths[1:1 + relus])


def interaction_width(dim: int, tables: int, interaction: str = "dot") -> int:
    """Width of the interaction's output, the top MLP's input: for ``dot``, the
    dense vector and one dot per pair of the tables + 1 vectors; for ``dcn``,
    the tables + 1 vectors side by side (the cross layers keep the width)."""
    if interaction == "dcn":
        return (tables + 1) * dim
    return dim + (tables + 1) * tables // 2


class LowRankCrossNet(nn.Module):
    """DCN-v2's cross layers with low-rank weights (Wang et al., 2021; torchrec's
    LowRankCrossNet): x_{l+1} = x_0 * (W_l (V_l x_l) + b_l) + x_l, with V_l
    [rank, width] and W_l [width, rank] xavier-normal and b_l zero."""

    def __init__(self, width: int, layers: int, rank: int, seed: int, stream: int, device: torch.device) -> None:
        super().__init__()
        draw = _Draw(seed, stream, device)
        self.v = nn.ParameterList()
        self.w = nn.ParameterList()
        self.b = nn.ParameterList()
        for _ in range(layers):
            v = nn.Parameter(torch.empty(rank, width, device=device))
            w = nn.Parameter(torch.empty(width, rank, device=device))
            draw(v, lambda t, g: nn.init.xavier_normal_(t, generator=g))
            draw(w, lambda t, g: nn.init.xavier_normal_(t, generator=g))
            self.v.append(v)
            self.w.append(w)
            self.b.append(nn.Parameter(torch.zeros(width, device=device)))

    def forward(self, x0: torch.Tensor) -> torch.Tensor:
        x = x0
        for v, w, b in zip(self.v, self.w, self.b):
            x = x0 * (nn.functional.linear(nn.functional.linear(x, v), w) + b) + x
        return x

    def activation_floats_per_sample(self) -> int:
        """Per layer: the low-rank projection, the projection back, the bias added, the product with x_0, the sum."""
        return sum(v.shape[0] + 4 * v.shape[1] for v in self.v)


class DenseArch(nn.Module):
    """Bottom MLP, interaction, top MLP: the data-parallel part of DLRM.

    ``interaction`` is ``dot`` (DLRM's pairwise dots of the bottom output and
    the pooled embeddings) or ``dcn`` (DCN-v2: the same vectors side by side
    through ``dcn_layers`` low-rank cross layers of rank ``dcn_rank``)."""

    def __init__(self, bottom: list[int], top: list[int], tables: int, seed: int, device: torch.device,
                 interaction: str = "dot", dcn_layers: int = 3, dcn_rank: int = 512) -> None:
        super().__init__()
        if interaction not in INTERACTIONS:
            raise ValueError(f"interaction {interaction!r}; allowed: {', '.join(INTERACTIONS)}")
        self.interaction, self.tables = interaction, tables
        self.bottom_widths, self.top_widths = list(bottom), [interaction_width(bottom[-1], tables, interaction)] + top
        self.bottom = make_mlp(bottom, seed, 1, last_relu=True, device=device)
        self.top = make_mlp(self.top_widths, seed, 2, last_relu=False, device=device)
        self.cross: LowRankCrossNet | None = None
        if interaction == "dcn":
            self.cross = LowRankCrossNet(self.top_widths[0], dcn_layers, dcn_rank, seed, 3, device)
        else:
            upper = torch.triu_indices(tables + 1, tables + 1, offset=1)
            self.register_buffer("rows", upper[0].to(device), persistent=False)
            self.register_buffer("cols", upper[1].to(device), persistent=False)

    def forward(self, dense: torch.Tensor, pooled: torch.Tensor) -> torch.Tensor:
        """``dense`` [b, dense features], ``pooled`` [b, tables, dim] -> logits [b]."""
        x = self.bottom(dense)
        features = torch.cat([x.unsqueeze(1), pooled], dim=1)
        if self.cross is not None:
            z = self.cross(features.flatten(1))
        else:
            # Pairwise dots of the bottom output and the pooled embeddings; each
            # pair once (the strict upper triangle), next to the dense vector.
            dots = torch.bmm(features, features.transpose(1, 2))
            z = torch.cat([x, dots[:, self.rows, self.cols]], dim=1)
        return self.top(z).squeeze(1)

    def activation_floats_per_sample(self) -> int:
        """Floats per sample that ``forward`` makes, the pooled rows it is given included."""
        dim, vectors = self.bottom_widths[-1], self.tables + 1
        floats = mlp_activation_floats(self.bottom_widths, last_relu=True) + mlp_activation_floats(
            self.top_widths, last_relu=False)
        floats += 2 * vectors * dim  # the pooled rows given, and the features they join
        if self.cross is not None:
            return floats + self.cross.activation_floats_per_sample()
        return floats + vectors * vectors + 2 * self.top_widths[0]  # all dots, the pairs, the top's input


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
    """This rank's tables, and the exchange that hands every rank its samples' pooled rows of every table.

    A table placed in "ddr" is a CPU tensor in the DDR of ``socket``
    (zion_emu.socket): the CPU looks it up, and the pooled rows cross PCIe
    to the device (their gradient crosses back in backward)."""

    def __init__(self, table_rows: list[int], dim: int, owners: list[list[int]], rank: int, seed: int,
                 device: torch.device, placement: list[str] | None = None, socket: int | None = None) -> None:
        super().__init__()
        self.dim, self.tables, self.owners, self.rank = dim, len(table_rows), owners, rank
        self.placement = placement or ["hbm"] * len(owners[rank])
        self.socket, self.device = socket, device
        bags = []
        for t, where in zip(owners[rank], self.placement):
            if where == "ddr":
                import zion_emu

                with zion_emu.socket(socket):
                    bags.append(make_embedding(table_rows[t], dim, seed, t, torch.device("cpu")))
            else:
                bags.append(make_embedding(table_rows[t], dim, seed, t, device))
        self.bags = nn.ModuleList(bags)
        # The exchange delivers the tables grouped by owner, rank 0's first;
        # ``arrival[t]`` is where table t arrives, to put them back in order.
        arrived = [t for tables in owners for t in tables]
        self.arrival: torch.Tensor | None = None
        if arrived != list(range(self.tables)):
            position = {t: k for k, t in enumerate(arrived)}
            self.arrival = torch.tensor([position[t] for t in range(self.tables)], dtype=torch.int64).to(device)

    @property
    def host_tables(self) -> frozenset[int]:
        """Positions among the owned tables of those in DDR (their indices stay on the host)."""
        return frozenset(k for k, where in enumerate(self.placement) if where == "ddr")

    def _pool(self, indices: list[torch.Tensor], offsets: list[torch.Tensor]) -> list[torch.Tensor]:
        """Each owned table pooled. With a table in DDR every offsets tensor is
        on the host; each one an HBM table needs crosses to the device once."""
        out, on_device = [], {}
        for bag, idx, off, where in zip(self.bags, indices, offsets, self.placement):
            if where == "ddr":
                out.append(bag(idx, off).to(self.device))
                continue
            if off.device != idx.device:
                if id(off) not in on_device:
                    on_device[id(off)] = off.to(idx.device)
                off = on_device[id(off)]
            out.append(bag(idx, off))
        return out

    def forward(self, indices: list[torch.Tensor], offsets: list[torch.Tensor], local_batch: int) -> torch.Tensor:
        """-> [local batch, tables, dim]: every table pooled over this rank's samples."""
        world = len(self.owners)
        own = len(self.bags)
        if world == 1:
            return torch.stack(self._pool(indices, offsets), dim=1)
        if own:
            pooled = torch.stack(self._pool(indices, offsets))  # [own, B, dim]
            # -> [world, own, b, dim]: destination-major, the all_to_all's input order.
            send = pooled.view(own, world, local_batch, self.dim).transpose(0, 1).reshape(-1)
        else:
            # A rank without tables still takes part in both exchanges: an
            # input that requires grad makes autograd run the backward one.
            send = torch.empty(0, device=self.device, requires_grad=True)
        chunk = local_batch * self.dim
        send_splits = [own * chunk] * world
        recv_splits = [len(tables) * chunk for tables in self.owners]
        received = PooledExchange.apply(send, send_splits, recv_splits, 1.0 / world, None)
        # Sources in rank order, each with its tables: [tables, b, dim] in arrival order.
        received = received.view(self.tables, local_batch, self.dim)
        if self.arrival is not None:
            received = received.index_select(0, self.arrival)
        return received.transpose(0, 1)
