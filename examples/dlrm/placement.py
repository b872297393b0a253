"""Which rank owns each embedding table, and whether it lives in the rank's
HBM or in the DDR of the rank's CPU socket.

**Ownership** (:func:`table_owners`) balances bytes: tables are taken largest
first (ties: lower table number first), each to the rank that holds the
fewest bytes so far (ties: lower rank). So no rank's HBM carries much more
than another's, whatever the order of the tables.

**Placement** (:func:`place_tables`) on one rank: ``hbm`` or ``ddr`` puts
every table there; ``auto`` fills a budget of HBM bytes with the hottest
tables (most lookups per sample per byte of table) and leaves the rest in
DDR, looked up by the CPU: hot tables on the accelerator, large cold ones in
host memory, as Zion was designed to run them. A table's HBM bytes count its
optimizer state: Adagrad keeps a sum of squared gradients the size of the
table (:data:`OPTIMIZER_STATE_SLOTS`).

**The budget** under ``auto`` is the device's HBM capacity less a reserve for
what a training step holds besides the tables (:func:`hbm_reserve`):

- a margin of 5% of the capacity, for what the rule does not count (the
  MLPerf DLRMv2 reference reserves the same 5% in torchrec's planner,
  ``HeuristicalStorageReservation(percentage=0.05)``);
- the dense part: its parameters, their gradients, the optimizer's state and,
  with several ranks, DDP's gradient buckets;
- the dense part's activations: every float its forward makes per sample
  (:meth:`model.DenseArch.activation_floats_per_sample`) times the local batch,
  doubled for their gradients in backward;
- per owned table, for the global batch: the batch's indices, the sparse
  gradient (its values and row indices, held from backward to the optimizer
  step), the pooled rows and the all-to-all's send buffer with their
  gradients; and the optimizer's temporaries for the largest sparse gradient
  (its coalesced copy, and for Adagrad the squared, root and scaled values).

Every owned table's step memory is counted, even for a table that ends up in
DDR, so the reserve does not depend on the placement it decides.

:func:`plan_tables` puts it together for every rank (a :class:`TablePlan`);
each rank works out the same plan, so rank 0 can print everyone's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

FLOAT_BYTES = 4  # fp32 tables, activations and gradients
INDEX_BYTES = 8  # int64 indices and offsets
PLACEMENTS = ("hbm", "ddr", "auto")
# Tensors of a parameter's shape the optimizer keeps: torch.optim.Adagrad its
# state_sum; SGD (no momentum) none.
OPTIMIZER_STATE_SLOTS = {"sgd": 0, "adagrad": 1}
# Temporaries of a sparse update, in copies of the gradient's values: the
# coalesced gradient, and for Adagrad also the squared values, the root of
# the state at the gradient's rows and the scaled step (torch.optim.Adagrad's
# sparse path).
UPDATE_TEMPORARIES = {"sgd": 1, "adagrad": 4}
HBM_MARGIN_FRACTION = 0.05


def table_bytes(rows: int, dim: int) -> int:
    """Bytes of one fp32 table."""
    return rows * dim * FLOAT_BYTES


def table_owners(sizes: Sequence[int], world_size: int) -> list[list[int]]:
    """Tables of each rank (ascending), balanced by ``sizes`` (bytes): largest
    first, each to the least-loaded rank; ties go to the lower table number
    and the lower rank. Ranks past the table count own none."""
    if world_size < 1:
        raise ValueError(f"world size {world_size}: it must be at least 1")
    load = [0] * world_size
    owned: list[list[int]] = [[] for _ in range(world_size)]
    for t in sorted(range(len(sizes)), key=lambda t: (-sizes[t], t)):
        r = min(range(world_size), key=lambda r: (load[r], r))
        owned[r].append(t)
        load[r] += sizes[t]
    return [sorted(tables) for tables in owned]


def place_tables(footprints: Sequence[int], lookups: Sequence[int], owned: Sequence[int], placement: str,
                 hbm_budget: int) -> list[str]:
    """Where each owned table lives: "hbm" or "ddr", in the order of ``owned``.

    ``footprints[t]``: table t's HBM bytes (with its optimizer state);
    ``lookups[t]``: its indices per sample. Under ``auto``, tables in order of
    lookups per byte (ties: lower table number) go to HBM while they fit
    ``hbm_budget``; a table that does not fit goes to DDR, and a later, colder
    one that does still goes to HBM."""
    if placement not in PLACEMENTS:
        raise ValueError(f"table placement {placement!r}; allowed: {', '.join(PLACEMENTS)}")
    if placement != "auto":
        return [placement] * len(owned)
    heat = sorted(owned, key=lambda t: (-lookups[t] / footprints[t], t))
    where, used = {}, 0
    for t in heat:
        if used + footprints[t] <= hbm_budget:
            where[t], used = "hbm", used + footprints[t]
        else:
            where[t] = "ddr"
    return [where[t] for t in owned]


@dataclass(frozen=True)
class HbmReserve:
    """The HBM one rank keeps free of tables under ``auto``, by part (bytes)."""

    margin: int
    dense: int
    activations: int
    table_steps: int

    @property
    def total(self) -> int:
        return self.margin + self.dense + self.activations + self.table_steps


def hbm_reserve(capacity: int, dense_param_bytes: int, activation_floats_per_sample: int, local_batch: int,
                global_batch: int, dim: int, owned_lookups: Sequence[int], optimizer: str,
                world_size: int) -> HbmReserve:
    """The reserve of the module docstring for one rank; ``owned_lookups``:
    the indices per sample of each table the rank owns."""
    slots = OPTIMIZER_STATE_SLOTS[optimizer]
    dense = dense_param_bytes * (2 + slots + (1 if world_size > 1 else 0))
    activations = 2 * local_batch * activation_floats_per_sample * FLOAT_BYTES
    row_bytes = dim * FLOAT_BYTES
    steps = sum(global_batch * lookups * (INDEX_BYTES + row_bytes + INDEX_BYTES) + 4 * global_batch * row_bytes
                for lookups in owned_lookups)
    if owned_lookups:
        steps += UPDATE_TEMPORARIES[optimizer] * global_batch * max(owned_lookups) * row_bytes
    return HbmReserve(math.ceil(HBM_MARGIN_FRACTION * capacity), dense, activations, steps)


@dataclass(frozen=True)
class TablePlan:
    """Every rank's tables and where they live; each rank works out the same plan."""

    owners: list[list[int]]  # per rank, ascending
    where: list[list[str]]  # per rank, per owned table: "hbm" or "ddr"
    footprints: list[int]  # per table: HBM bytes with its optimizer state
    capacity: int | None = None  # the device's HBM, when auto worked out the budgets
    reserves: list[HbmReserve] | None = None  # per rank, likewise
    budgets: list[int] | None = None  # per rank: HBM for tables under auto

    def lines(self, table_rows: Sequence[int], dim: int, memories: bool = True) -> list[str]:
        """A line per rank: its tables and their bytes (with ``memories``, in
        HBM and in DDR); under auto, its budget and how the reserve adds up."""
        out = []
        for r, (tables, where) in enumerate(zip(self.owners, self.where)):
            sizes = [table_bytes(table_rows[t], dim) for t in tables]
            line = f"# rank {r} tables {','.join(map(str, tables)) or '-'} table_bytes {sum(sizes)}"
            if memories:
                hbm = sum(b for b, w in zip(sizes, where) if w == "hbm")
                line += f" in_hbm {hbm} in_ddr {sum(sizes) - hbm}"
            out.append(line)
            if self.budgets is not None:
                line = f"# rank {r} hbm_budget {self.budgets[r]}"
                if self.reserves is not None:
                    res = self.reserves[r]
                    line += (f" capacity {self.capacity} reserve {res.total} (margin {res.margin} dense {res.dense} "
                             f"activations {res.activations} table_steps {res.table_steps})")
                out.append(line)
        return out


def plan_tables(table_rows: Sequence[int], dim: int, lookups: Sequence[int], optimizer: str, placement: str,
                world_size: int, global_batch: int, hbm_budget: int | None, capacity: int | None,
                dense_param_bytes: int, activation_floats_per_sample: int) -> TablePlan:
    """Owners balanced by bytes, then each rank's placement. Under auto the
    budget is ``hbm_budget`` when given, else ``capacity`` less each rank's
    :func:`hbm_reserve`."""
    sizes = [table_bytes(rows, dim) for rows in table_rows]
    footprints = [size * (1 + OPTIMIZER_STATE_SLOTS[optimizer]) for size in sizes]
    owners = table_owners(sizes, world_size)
    reserves = budgets = None
    if placement == "auto":
        if hbm_budget is not None:
            budgets = [hbm_budget] * world_size
        elif capacity is None:
            raise ValueError("table placement auto needs the device's HBM capacity or an HBM budget")
        else:
            reserves = [hbm_reserve(capacity, dense_param_bytes, activation_floats_per_sample,
                                    global_batch // world_size, global_batch, dim, [lookups[t] for t in tables],
                                    optimizer, world_size)
                        for tables in owners]
            budgets = [max(0, capacity - res.total) for res in reserves]
    where = [place_tables(footprints, lookups, tables, placement, budgets[r] if budgets else 0)
             for r, tables in enumerate(owners)]
    return TablePlan(owners, where, footprints, capacity if reserves else None, reserves, budgets)
