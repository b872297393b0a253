"""Reference machines against published nccl-tests all_reduce results, size by size.

    python bench/calibration.py          # prints a markdown table per machine

Published rows: bench/reference/nccl_tests_published.json (each with its source).
"""

from __future__ import annotations

import json
from pathlib import Path

import zion_emu
from zion_emu import sim

REFERENCE = Path(__file__).resolve().parent / "reference" / "nccl_tests_published.json"


def main() -> None:
    published = json.loads(REFERENCE.read_text())
    for name, ref in published.items():
        platform = zion_emu.load_platform(name)
        print(f"\n### {name} all_reduce, 8 ranks — published: {ref['source']}\n")
        print("| size (B) | published time (us) | modeled time (us) | published busbw (GB/s) | modeled busbw (GB/s) | modeled / published busbw | algorithm |")
        print("|---:|---:|---:|---:|---:|---:|---|")
        for row in ref["rows"]:
            r = sim.collective(platform, "all_reduce", row["bytes"], 8)
            ratio = r.busbw / 1e9 / row["busbw_gbps"] if row["busbw_gbps"] else float("nan")
            print(f"| {row['bytes']} | {row['time_us']:.2f} | {r.time * 1e6:.2f} | {row['busbw_gbps']:.2f} | "
                  f"{r.busbw / 1e9:.2f} | {ratio:.2f} | {r.algorithm} |")


if __name__ == "__main__":
    main()
