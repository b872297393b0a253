"""Where a device's modeled wall time went, from the recorded spans of its streams.

Breakdown of a device's modeled wall time T (from 0 to the host clock at
exit):

- compute: time when some compute span runs;
- communication, exposed: collective time when no compute runs;
  overlapped: collective time hidden under compute;
- copies, exposed: copy time when neither compute nor a collective runs;
- host: the rest of T, when the device does nothing (launch overhead,
  host-side work, waiting for data).

compute + exposed communication + exposed copies + host = T, exactly.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Mapping, Sequence

import numpy as np

# The activity of a recorded span, as the native timeline numbers them.
COMPUTE, COPY, COMMUNICATION = 0, 1, 2

# Recorded spans: numpy columns start, end (s), activity, device, stream,
# label, link_classes (a bit per link class the span moved bytes over).
Spans = Mapping[str, np.ndarray]


@dataclass
class Breakdown:
    """One device's wall time split as the module docstring says (seconds)."""

    compute_s: float
    communication_exposed_s: float
    communication_overlapped_s: float
    copies_exposed_s: float
    host_s: float

    def to_json(self) -> dict[str, float]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Breakdown:
        return cls(**d)

    @classmethod
    def mean(cls, parts: Sequence[Breakdown]) -> Breakdown:
        """The mean of each part: still sums to the wall time when every
        breakdown is taken over the same wall time."""
        return cls(*(sum(getattr(b, k) for b in parts) / len(parts) for k in cls.__dataclass_fields__))


def union_length(starts: np.ndarray, ends: np.ndarray) -> float:
    """Total length covered by the intervals [starts[i], ends[i])."""
    if len(starts) == 0:
        return 0.0
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    reach = np.maximum.accumulate(e)
    # A new block starts where an interval begins after everything before it ended.
    new_block = np.empty(len(s), dtype=bool)
    new_block[0] = True
    new_block[1:] = s[1:] > reach[:-1]
    block_ids = np.cumsum(new_block) - 1
    block_start = s[new_block]
    block_end = np.zeros(len(block_start))
    np.maximum.at(block_end, block_ids, e)
    return float(np.sum(block_end - block_start))


def breakdown(spans: Spans, device: int, wall: float) -> Breakdown:
    """The breakdown of one device's wall time (see the module docstring)."""
    mine = spans["device"] == device
    start, end, kind = spans["start"][mine], np.minimum(spans["end"][mine], wall), spans["activity"][mine]
    keep = end > start
    start, end, kind = start[keep], end[keep], kind[keep]

    def covered(*kinds: int) -> float:
        m = np.isin(kind, kinds)
        return union_length(start[m], end[m])

    compute = covered(COMPUTE)
    comm = covered(COMMUNICATION)
    compute_or_comm = covered(COMPUTE, COMMUNICATION)
    anything = covered(COMPUTE, COMMUNICATION, COPY)
    # Differences of unions: each is >= 0 exactly, and clamped where rounding
    # leaves a last-bit negative (a report printed "overlapped -0.0 us").
    exposed_comm = max(compute_or_comm - compute, 0.0)
    return Breakdown(
        compute_s=compute,
        communication_exposed_s=exposed_comm,
        communication_overlapped_s=max(comm - exposed_comm, 0.0),
        copies_exposed_s=max(anything - compute_or_comm, 0.0),
        host_s=max(wall - anything, 0.0),
    )
