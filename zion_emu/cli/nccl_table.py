"""The nccl-tests table: one collective timed over a range of sizes, one row each.

nccl-tests reports algbw = size / time and busbw = algbw x factor (all_reduce
2(n-1)/n; reduce_scatter, all_gather, all_to_all (n-1)/n; broadcast 1), with
GB/s = 1e9 bytes/s. The model returns both; this module only formats them.
The algorithm column names the model's algorithm and, where NCCL's tuning
model priced the call, NCCL's protocol after a slash: ``ring/LL128``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from zion_emu._format import Column, Table
from zion_emu.cli.sizes import ELEMENT_BYTES

_REDUCING = {"all_reduce", "reduce_scatter", "reduce"}
_ROOTED = {"broadcast", "reduce"}

# (op, nbytes) -> the model's CollectiveResult (time, algbw, busbw, algorithm, protocol).
RunCollective = Callable[[str, int], Any]

# nccl-tests' columns; its header lines start with '#'.
TABLE = Table(
    Column("size", 12, unit="(B)"), Column("count", 12, unit="(elements)"), Column("type", 8), Column("redop", 6),
    Column("root", 6), Column("time", 10, spec=".2f", unit="(us)"), Column("algbw", 8, spec=".2f", unit="(GB/s)"),
    Column("busbw", 8, spec=".2f", unit="(GB/s)"), Column("algorithm", align="<"),
    gap="  ", header_prefix="# ",
)


@dataclass
class Row:
    op: str
    ranks: int
    link_model: str
    nbytes: int
    dtype: str
    root: int
    time_s: float
    algbw_bytes_per_s: float
    busbw_bytes_per_s: float
    algorithm: str
    protocol: str = ""  # NCCL's protocol (LL, LL128, Simple) where its tuning model priced the call

    @property
    def shown_algorithm(self) -> str:
        return f"{self.algorithm}/{self.protocol}" if self.protocol else self.algorithm

    @property
    def count(self) -> int:
        return self.nbytes // ELEMENT_BYTES[self.dtype]

    @property
    def redop(self) -> str:
        return "sum" if self.op in _REDUCING else "none"

    @property
    def shown_root(self) -> int:
        return self.root if self.op in _ROOTED else -1  # nccl-tests prints -1 for unrooted ops

    @property
    def busbw_gbps(self) -> float:
        return self.busbw_bytes_per_s / 1e9

    def to_json(self) -> dict[str, Any]:
        return {
            "op": self.op, "ranks": self.ranks, "link_model": self.link_model,
            "bytes": self.nbytes, "count": self.count, "type": self.dtype, "redop": self.redop,
            "root": self.shown_root,
            "time_us": round(self.time_s * 1e6, 6), "time_ns": round(self.time_s * 1e9, 3),
            "algbw_gbps": self.algbw_bytes_per_s / 1e9, "busbw_gbps": self.busbw_gbps,
            "algorithm": self.algorithm, "protocol": self.protocol,
        }

    def line(self) -> str:
        return TABLE.row(self.nbytes, self.count, self.dtype, self.redop, self.shown_root, self.time_s * 1e6,
                         self.algbw_bytes_per_s / 1e9, self.busbw_gbps, self.shown_algorithm)


def sweep(run: RunCollective, op: str, ranks: int, link_model: str, sizes: list[int], dtype: str, root: int) -> list[Row]:
    rows = []
    for nbytes in sizes:
        r = run(op, nbytes)
        rows.append(Row(op, ranks, link_model, nbytes, dtype, root, r.time, r.algbw, r.busbw, r.algorithm,
                        getattr(r, "protocol", "")))
    return rows


def table(rows: list[Row], header: list[str]) -> str:
    """nccl-tests' layout: '#' header lines, one row per size, '# Avg bus bandwidth'."""
    lines = [f"# {h}" for h in header] + ["#", *TABLE.header()] + [row.line() for row in rows]
    avg = sum(r.busbw_gbps for r in rows) / len(rows) if rows else 0.0
    lines += [f"# Avg bus bandwidth    : {avg:g}", "#"]
    return "\n".join(lines)
