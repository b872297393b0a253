"""Synthetic DLRM batches, generated on the CPU as a data loader would.

Every batch is a pure function of (seed, batch index): each table's indices
and the dense features and labels come from their own seeded generators, drawn
for the whole global batch. A rank keeps the indices of the tables it owns
(all samples: table-wise model parallel) and the dense rows and labels of its
own slice of samples (data parallel). So one process, or any number of ranks,
on any device, sees the same numbers.

Two kinds:
- ``random`` (as the reference's random generator): dense features uniform in
  [0, 1), indices uniform over the table, soft targets uniform in [0, 1).
- ``criteo-synthetic``: Criteo-shaped. 13 dense features are log(1 + count)
  of heavy-tailed counts; indices follow a power law (Zipf-like, a few hot
  rows take most lookups), scattered over the table by a fixed bijection;
  labels are clicks drawn from a fixed hidden logistic model of the dense
  features and the looked-up rows, so the model has something to learn.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

CRITEO_DENSE_FEATURES = 13
ZIPF_EXPONENT = 1.05  # power-law exponent of row popularity
SCATTER_MULTIPLIER = 1000003  # a prime: x -> x * p mod rows is a bijection unless p divides rows
CLICK_BIAS = -1.2  # hidden model's bias: about one click in four, as in Criteo's logs

KINDS = ("random", "criteo-synthetic")


def _mix(*words: int) -> int:
    """A 63-bit seed from integers (splitmix64 steps), so streams do not overlap."""
    h = 0x9E3779B97F4A7C15
    for w in words:
        h = (h ^ (w & 0xFFFFFFFFFFFFFFFF)) * 0xBF58476D1CE4E5B9 & 0xFFFFFFFFFFFFFFFF
        h = (h ^ (h >> 27)) * 0x94D049BB133111EB & 0xFFFFFFFFFFFFFFFF
        h ^= h >> 31
    return h & 0x7FFFFFFFFFFFFFFF


def _generator(*words: int) -> torch.Generator:
    return torch.Generator().manual_seed(_mix(*words))


@dataclass
class Batch:
    dense: torch.Tensor  # [local batch, dense features] float32
    indices: list[torch.Tensor]  # per owned table: [global batch * its lookups] int64
    # Per owned table: [global batch] int64, the bag starts. Tables with as
    # many lookups per sample share one tensor.
    offsets: list[torch.Tensor]
    labels: torch.Tensor  # [local batch] float32

    def to(self, device: torch.device, host_tables: frozenset[int] = frozenset()) -> "Batch":
        """The batch on ``device``; the indices of the owned tables numbered in
        ``host_tables`` (positions in ``indices``: tables in host DDR, looked up
        by the CPU) stay where they are, as do the offsets when any do. A
        shared offsets tensor is copied once."""
        if host_tables:
            offsets = list(self.offsets)
        else:
            moved: dict[int, torch.Tensor] = {}
            for o in self.offsets:
                if id(o) not in moved:
                    moved[id(o)] = o.to(device)
            offsets = [moved[id(o)] for o in self.offsets]
        return Batch(self.dense.to(device),
                     [i if k in host_tables else i.to(device) for k, i in enumerate(self.indices)],
                     offsets, self.labels.to(device))

    def packed(self) -> tuple[torch.Tensor, ...]:
        """The batch as four tensors, for a data-loader worker to hand over (each tensor crosses
        processes through its own shared-memory segment, so a batch of many small tensors is slow to
        pass): dense, labels, every table's indices in one, and the offsets' lengths, indices' lengths
        and which offsets tensor each table shares."""
        unique = list({id(o): o for o in self.offsets}.values())
        position = {id(o): k for k, o in enumerate(unique)}
        which = [position[id(o)] for o in self.offsets]
        integers = torch.cat([*self.indices, *unique]) if self.indices else torch.empty(0, dtype=torch.int64)
        layout = torch.tensor([len(self.indices), len(unique), *(i.numel() for i in self.indices),
                               *(o.numel() for o in unique), *which], dtype=torch.int64)
        return self.dense, self.labels, integers, layout

    @staticmethod
    def unpacked(dense: torch.Tensor, labels: torch.Tensor, integers: torch.Tensor, layout: torch.Tensor) -> "Batch":
        """The batch that ``packed`` gave: its indices and offsets are views of one tensor."""
        sizes = layout.tolist()
        tables, shared = sizes[0], sizes[1]
        pieces = list(torch.split(integers, sizes[2:2 + tables + shared]))
        indices, unique = pieces[:tables], pieces[tables:]
        which = sizes[2 + tables + shared:]
        return Batch(dense, indices, [unique[k] for k in which], labels)


class SyntheticData:
    """Batches for one rank: ``batch(i)`` is the i-th batch, as this rank sees it."""

    DENSE, LABELS, HIDDEN = -1, -2, -3  # generator streams besides the tables' (0 ..)

    def __init__(self, kind: str, table_rows: list[int], dense_features: int, lookups: int | list[int],
                 global_batch: int, rank: int, world_size: int, owned_tables: list[int], seed: int) -> None:
        """``lookups``: indices per sample, one count for every table or one per table."""
        lookups = [lookups] * len(table_rows) if isinstance(lookups, int) else list(lookups)
        if len(lookups) != len(table_rows):
            raise ValueError(f"{len(lookups)} lookup counts for {len(table_rows)} tables; give one, or one per table")
        if kind not in KINDS:
            raise ValueError(f"--data {kind!r} is not a data kind; allowed: {', '.join(KINDS)}")
        if kind == "criteo-synthetic" and dense_features != CRITEO_DENSE_FEATURES:
            raise ValueError(f"--data criteo-synthetic has {CRITEO_DENSE_FEATURES} dense features, but "
                             f"--arch-mlp-bot starts with {dense_features}; start it with {CRITEO_DENSE_FEATURES} "
                             f"or use --data random")
        self.kind, self.rows, self.dense_features = kind, list(table_rows), dense_features
        self.lookups, self.global_batch, self.seed = lookups, global_batch, seed
        self.local_batch = global_batch // world_size
        self.first = rank * self.local_batch
        self.owned = list(owned_tables)
        counts = {lookups[t] for t in self.owned}
        by_count = {n: torch.arange(0, global_batch * n, n, dtype=torch.int64) for n in counts}
        self.offsets = [by_count[lookups[t]] for t in self.owned]
        if kind == "criteo-synthetic":
            g = _generator(seed, self.HIDDEN)
            self.dense_weights = torch.randn(dense_features, generator=g) / math.sqrt(dense_features)
            self.dense_scales = torch.rand(dense_features, generator=g) * 4.0  # log-scale of each count
            self.row_salts = torch.randint(0, 1 << 30, (len(self.rows),), generator=g).tolist()

    def _indices(self, i: int, table: int) -> torch.Tensor:
        n, count = self.rows[table], self.global_batch * self.lookups[table]
        g = _generator(self.seed, i, table)
        if self.kind == "random":
            return torch.randint(0, n, (count,), generator=g, dtype=torch.int64)
        # Inverse CDF of a continuous power law on [1, n + 1), floored: row k
        # (0-based, before scattering) is drawn with probability ~ (k + 1)^-a.
        u = torch.rand(count, generator=g, dtype=torch.float64)
        a = 1.0 - ZIPF_EXPONENT
        ranks = ((((n + 1.0) ** a - 1.0) * u + 1.0) ** (1.0 / a)).floor().to(torch.int64) - 1
        ranks.clamp_(0, n - 1)
        multiplier = SCATTER_MULTIPLIER if n % SCATTER_MULTIPLIER else 1
        return (ranks * multiplier + table) % n

    def _row_effect(self, table: int, indices: torch.Tensor) -> torch.Tensor:
        """The hidden model's effect of each looked-up row: a fixed hash of the row in [-1, 1)."""
        h = (indices * 2654435761 + self.row_salts[table]) % (1 << 16)
        return h.to(torch.float32) / (1 << 15) - 1.0

    def batch(self, i: int) -> Batch:
        local = slice(self.first, self.first + self.local_batch)
        g = _generator(self.seed, i, self.DENSE)
        tables = range(len(self.rows)) if self.kind == "criteo-synthetic" else self.owned
        indices = {t: self._indices(i, t) for t in tables}
        if self.kind == "random":
            dense = torch.rand(self.global_batch, self.dense_features, generator=g)[local]
            labels = torch.rand(self.global_batch, generator=_generator(self.seed, i, self.LABELS))[local]
            return Batch(dense.contiguous(), [indices[t] for t in self.owned], self.offsets, labels.contiguous())
        counts = torch.exp(torch.randn(self.global_batch, self.dense_features, generator=g) + self.dense_scales)
        dense = torch.log1p(counts.floor())
        logit = (dense - self.dense_scales) @ self.dense_weights + CLICK_BIAS
        for t, idx in indices.items():
            logit += self._row_effect(t, idx).view(self.global_batch, self.lookups[t]).mean(dim=1)
        draws = torch.rand(self.global_batch, generator=_generator(self.seed, i, self.LABELS))
        labels = (draws < torch.sigmoid(logit)).to(torch.float32)
        return Batch(dense[local].contiguous(), [indices[t] for t in self.owned], self.offsets,
                     labels[local].contiguous())
