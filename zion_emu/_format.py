"""Text for people: byte counts, modeled times and column-aligned tables, written
once for every command and report that prints them."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

# Binary units, as nccl-tests' K/M/G and torch.cuda.memory_summary count.
_BYTE_UNITS = (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10))


def format_bytes(n: float, decimals: int | None = None) -> str:
    """A byte count in the largest binary unit it fills: with ``decimals``
    None, up to four significant digits (8 -> '8 B', 2**20 -> '1 MiB',
    3 * 2**29 -> '1.5 GiB'); with ``decimals`` d, d decimals after a unit
    (2**20 -> '1.00 MiB') and whole bytes below one (10 -> '10 B'), as a
    table column wants."""
    for unit, scale in _BYTE_UNITS:
        if n >= scale:
            value = n / scale
            return f"{value:.4g} {unit}" if decimals is None else f"{value:.{decimals}f} {unit}"
    return f"{n:.4g} B" if decimals is None else f"{n:.0f} B"


def format_time(seconds: float | None) -> str:
    """Seconds in s, ms or us with a few decimals: 1.5 -> '1.500 s',
    2.5e-3 -> '2.500 ms', 7.8e-6 -> '7.8 us'; '-' for None or not finite."""
    if seconds is None or not math.isfinite(seconds):
        return "-"
    if seconds >= 1:
        return f"{seconds:.3f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3f} ms"
    return f"{seconds * 1e6:.1f} us"


@dataclass(frozen=True)
class Column:
    """One column of a :class:`Table`: its title, the width its cells are
    padded to (0: as wide as the text), ``">"`` (numbers) or ``"<"`` (names),
    the format spec of a value (``".2f"``) and an optional second header line
    such as ``"(us)"``."""

    title: str
    width: int = 0
    align: str = ">"
    spec: str = ""
    unit: str = ""


class Table:
    """A column-aligned text table. Rows are indented by ``indent`` and their
    cells joined by ``gap``; the header starts at the margin (its first title
    spans the indent) and may begin with ``header_prefix`` over the first
    column, as nccl-tests' '#'. A cell given as a str is taken as written; any
    other value is formatted with its column's spec."""

    def __init__(self, *columns: Column, indent: str = "", gap: str = " ", header_prefix: str = "") -> None:
        if not columns:
            raise ValueError("a table needs at least one column")
        self.columns = columns
        self.indent = indent
        self.gap = gap
        self.header_prefix = header_prefix

    @staticmethod
    def _pad(text: str, width: int, align: str) -> str:
        return f"{text:{align}{width}}" if width else text

    def _cell(self, column: Column, value: Any) -> str:
        text = value if isinstance(value, str) else format(value, column.spec)
        return self._pad(text, column.width, column.align)

    def row(self, *values: Any) -> str:
        """One row: a value per column."""
        if len(values) != len(self.columns):
            raise ValueError(f"a row of this table has {len(self.columns)} cells, got {len(values)}")
        return self.indent + self.gap.join(self._cell(c, v) for c, v in zip(self.columns, values))

    def _header_line(self, titles: Sequence[str]) -> str:
        first, *rest = self.columns
        cells = [self._pad(titles[0], first.width + len(self.indent), first.align)]
        cells += [self._pad(t, c.width, c.align) for c, t in zip(rest, titles[1:])]
        line = self.gap.join(cells).rstrip()
        if self.header_prefix:
            line = self.header_prefix + line[len(self.header_prefix):]
        return line

    def header(self) -> list[str]:
        """The titles, then the units if any column has one."""
        lines = [self._header_line([c.title for c in self.columns])]
        if any(c.unit for c in self.columns):
            lines.append(self._header_line([c.unit for c in self.columns]))
        return lines

    def render(self, rows: Sequence[Sequence[Any]]) -> list[str]:
        """The header, then one line per row."""
        return self.header() + [self.row(*values) for values in rows]
