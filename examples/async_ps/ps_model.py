"""The model and data of the asynchronous DLRM example, shared by the
trainers (``train.py``) and by a one-process replay of the ordered schedule.

A DLRM-shaped model: a bottom MLP on 13 dense features, sum-pooled lookups
in each embedding table, their concatenation into a top MLP and a logistic
loss. The tables live on the parameter servers; a trainer pulls the rows a
batch touches (each distinct row once) and pushes their gradients.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class Shape:
    tables: int
    rows: int
    dim: int
    bottom: tuple[int, ...]  # hidden widths after the 13 dense features; the last equals dim
    top: tuple[int, ...]  # hidden widths before the single logit
    lookups: int  # indices pooled per table per sample
    batch: int  # samples per trainer per step
    lr: float


SHAPES = {
    # For tests: seconds on one core.
    "tiny": Shape(tables=3, rows=40, dim=4, bottom=(8, 4), top=(8,), lookups=2, batch=8, lr=0.1),
    # The DLRM example's "small" shapes (8 tables x 100k rows, dim 64, bottom
    # 13-512-256-64, top 512-256-1, 10 lookups), 256 samples per trainer.
    "small": Shape(tables=8, rows=100000, dim=64, bottom=(512, 256, 64), top=(512, 256), lookups=10, batch=256,
                   lr=0.1),
}

DENSE_FEATURES = 13


def table_names(shape: Shape) -> list[str]:
    return [f"table{j}" for j in range(shape.tables)]


def init_tables(shape: Shape, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    bound = 1.0 / shape.rows ** 0.5
    return {name: torch.empty(shape.rows, shape.dim).uniform_(-bound, bound, generator=g)
            for name in table_names(shape)}


class Dense(nn.Module):
    """The MLPs: every parameter the embedding tables are not."""

    def __init__(self, shape: Shape) -> None:
        super().__init__()
        if shape.bottom[-1] != shape.dim:
            raise ValueError(f"the bottom MLP must end at the embedding dimension {shape.dim}, got {shape.bottom}")
        widths = (DENSE_FEATURES, *shape.bottom)
        self.bottom = nn.Sequential(*[m for a, b in zip(widths, widths[1:]) for m in (nn.Linear(a, b), nn.ReLU())])
        widths = (shape.dim * (1 + shape.tables), *shape.top, 1)
        layers: list[nn.Module] = []
        for a, b in zip(widths, widths[1:]):
            layers += [nn.Linear(a, b), nn.ReLU()]
        self.top = nn.Sequential(*layers[:-1])

    def forward(self, x: torch.Tensor, pooled: list[torch.Tensor]) -> torch.Tensor:
        return self.top(torch.cat([self.bottom(x), *pooled], dim=1)).squeeze(1)


def init_dense(shape: Shape, seed: int) -> Dense:
    torch.manual_seed(seed)
    return Dense(shape)


@dataclass
class Batch:
    x: torch.Tensor  # batch x 13
    ids: list[torch.Tensor]  # per table: batch x lookups global row ids
    y: torch.Tensor  # batch labels in {0, 1}


def batch(shape: Shape, seed: int, trainer: int, step: int) -> Batch:
    """Trainer ``trainer``'s batch at ``step``: uniform ids, random features
    and labels, the same on every device and in every run."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + trainer * 10_007 + step)
    x = torch.randn(shape.batch, DENSE_FEATURES, generator=g)
    ids = [torch.randint(0, shape.rows, (shape.batch, shape.lookups), generator=g) for _ in range(shape.tables)]
    y = torch.randint(0, 2, (shape.batch,), generator=g).float()
    return Batch(x, ids, y)


def unique_rows(ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(distinct row ids, each lookup's position among them)."""
    uniq, inverse = torch.unique(ids.flatten(), return_inverse=True)
    return uniq, inverse.view_as(ids)


def loss_of(model: Dense, rows: list[torch.Tensor], inverse: list[torch.Tensor], x: torch.Tensor,
            y: torch.Tensor) -> torch.Tensor:
    """The loss of one batch given the pulled rows of each table (leaves
    whose ``.grad`` is what a trainer pushes)."""
    pooled = [F.embedding_bag(inv, r, mode="sum") for r, inv in zip(rows, inverse)]
    return F.binary_cross_entropy_with_logits(model(x, pooled), y)
