"""Reference machines against published nccl-tests all_reduce results, size by size.

    python bench/calibration.py          # prints a markdown table per machine

Published rows: bench/reference/nccl_tests_published.json (each with its source).
Two models side by side: "before" is the topology model (collectives.nccl_tuner
off: the sim's algorithms on the preset's links, no protocols), "after" is
NCCL's own tuning model (the presets' default). Errors are modeled / published
- 1 on time; the geomeans are of modeled / published and of max(r, 1/r).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import zion_emu
from zion_emu import sim

REFERENCE = Path(__file__).resolve().parent / "reference" / "nccl_tests_published.json"
MIB = 1 << 20


def _geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def _summary(label: str, ratios: dict[int, float]) -> str:
    def band(lo: int, hi: float) -> list[float]:
        return [r for b, r in ratios.items() if lo <= b <= hi]

    mid, big = band(MIB, 32 * MIB), band(128 * MIB, math.inf)
    worst = lambda rs: max(abs(r - 1) for r in rs) * 100 if rs else float("nan")  # noqa: E731
    every = list(ratios.values())
    return (f"{label}: geomean modeled/published {_geomean(every):.3f}, geomean max(r,1/r) "
            f"{_geomean([max(r, 1 / r) for r in every]):.3f}; worst |error| 1-32 MiB {worst(mid):.1f}%, "
            f">= 128 MiB {worst(big):.1f}%")


def main() -> None:
    published = json.loads(REFERENCE.read_text())
    for name, ref in published.items():
        after = zion_emu.load_platform(name)
        before = zion_emu.load_platform(name, overrides={"collectives.nccl_tuner.enabled": False})
        print(f"\n### {name} all_reduce, 8 ranks — published: {ref['source']}\n")
        print("| size (B) | published (us) | before (us) | error before | after (us) | error after | "
              "after: algorithm/protocol |")
        print("|---:|---:|---:|---:|---:|---:|---|")
        ratios_before: dict[int, float] = {}
        ratios_after: dict[int, float] = {}
        for row in ref["rows"]:
            b = sim.collective(before, "all_reduce", row["bytes"], 8)
            a = sim.collective(after, "all_reduce", row["bytes"], 8)
            rb = b.time * 1e6 / row["time_us"]
            ra = a.time * 1e6 / row["time_us"]
            ratios_before[row["bytes"]] = rb
            ratios_after[row["bytes"]] = ra
            shown = f"{a.algorithm}/{a.protocol}" if a.protocol else a.algorithm
            print(f"| {row['bytes']} | {row['time_us']:.2f} | {b.time * 1e6:.2f} | {(rb - 1) * 100:+.1f}% | "
                  f"{a.time * 1e6:.2f} | {(ra - 1) * 100:+.1f}% | {shown} |")
        print()
        print(_summary("before", ratios_before))
        print(_summary("after", ratios_after))


if __name__ == "__main__":
    main()
