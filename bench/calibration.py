"""Reference machines against published nccl-tests results, size by size.

    python bench/calibration.py             # prints a markdown table per machine
    python bench/calibration.py --channels  # also: the channels NCCL launches per size

Published rows: bench/reference/nccl_tests_published.json (each with its source;
a run's "platform" names the preset that models its machine, else its key does;
its "collective" names the operation, all_reduce when absent; sizes mean what
nccl-tests' size column means, the gathered output of an all_gather and the
input of a reduce_scatter).
Three models side by side: "before" is the topology model (collectives.nccl_tuner
off: the sim's algorithms on the preset's links, no protocols); "tuner" is
NCCL's own tuning model (the presets' default, collectives.nccl_tuner.time_model
= "tuner"); "pipeline" keeps the tuner's choice and times it by NCCL's ring
kernels' chunks, loops and steps, and NVLS by its kernels' loops through
their warp groups (time_model = "pipeline"; Tree keeps the tuner's time). Errors are modeled / published - 1 on time; the geomeans are
of modeled / published and of max(r, 1/r).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import zion_emu
from zion_emu import sim

REFERENCE = Path(__file__).resolve().parent / "reference" / "nccl_tests_published.json"
MIB = 1 << 20


# What NCCL v2.21.5 launches once its tuner has chosen (src/enqueue.cc,
# getChannnelThreadInfo): a ring or tree call starts from the communicator's
# collective channels and drops one while nBytes < channels x threads x
# threshold, down to 1; NVLS takes the communicator's NVLS channels.
MAX_THREADS = {"LL": 512, "LL128": 640, "Simple": 512}  # device.h: NCCL_LL/LL128/SIMPLE_MAX_NTHREADS
THREAD_THRESHOLD = {"LL": 8, "LL128": 8, "Simple": 64}  # comm.h: NCCL_*_THREAD_THRESHOLD; ring LL x nRanks (tuning.cc)
MAX_CHANNELS = 32  # MAXCHANNELS
NVLS_CHANNELS = 16  # src/transport/nvls.cc: NCCL_NVLS_NCHANNELS' default


def coll_channels(graph_channels: int) -> int:
    """The communicator's collective channels: ncclTopoPostset (src/graph/connect.cc)
    doubles the search's min(ring, tree) channels, up to MAXCHANNELS."""
    return min(MAX_CHANNELS, 2 * graph_channels)


def launched_channels(algorithm: str, protocol: str, nbytes: int, ranks: int, channels: int) -> int:
    """Channels NCCL launches for one call of (algorithm, protocol), from ``channels``
    collective channels (ring Simple runs 512 threads: NVLink's bwIntra x channels is above PCI_BW)."""
    if algorithm == "NVLS":
        return NVLS_CHANNELS
    per_channel = MAX_THREADS[protocol] * THREAD_THRESHOLD[protocol] * (ranks if (algorithm, protocol) == ("Ring", "LL")
                                                                          else 1)
    nc = channels
    while nbytes < nc * per_channel and nc >= 2:
        nc -= 1
    return nc


def _channels(name: str, ref: dict) -> None:
    """Per size: NCCL's choice, the channels it launches and, for what it is worth,
    ncclTopoGetAlgoTime's time at that many channels (bandwidth x launched /
    collective channels, the scaling NCCL applies when a tuner plugin sets the
    channels; NVLS is priced on its own graph, unscaled)."""
    p = zion_emu.load_platform(name)
    tuning = sim.NcclTuning(p.get("collectives.nccl_tuner.compute_capability"), 8,
                            p.get("fabric.links_per_pair") * p.get("fabric.link_bandwidth_gb_per_s"),
                            p.get("fabric.in_switch_reduction"))
    channels = coll_channels(min(tuning.graph("Ring")[0], tuning.graph("Tree")[0]))
    print(f"\n### {name}: channels NCCL launches ({channels} collective channels)\n")
    print("| size (B) | published (us) | chosen | channels launched | NCCL's time at those channels (us) | error |")
    print("|---:|---:|---|---:|---:|---:|")
    for row in ref["rows"]:
        algo, proto, _ = tuning.choose("all_reduce", row["bytes"])
        c = next(c for c in tuning.candidates("all_reduce", row["bytes"])
                 if (c["algorithm"], c["protocol"]) == (algo, proto))
        nc = launched_channels(algo, proto, row["bytes"], 8, channels)
        scale = 1.0 if algo == "NVLS" else nc / channels
        t = (c["latency"] + row["bytes"] / (c["bandwidth"] * scale)) * 1e6
        print(f"| {row['bytes']} | {row['time_us']:.2f} | {algo}/{proto} | {nc} | {t:.2f} | "
              f"{(t / row['time_us'] - 1) * 100:+.1f}% |")


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
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--channels", action="store_true",
                        help="also print, per size, the channels NCCL v2.21.5 launches for its choice")
    args = parser.parse_args()
    published = json.loads(REFERENCE.read_text())
    for name, ref in published.items():
        preset = ref.get("platform", name)  # a run named otherwise says which preset models its machine
        models = {
            "before": zion_emu.load_platform(preset, overrides={"collectives.nccl_tuner.enabled": False}),
            "tuner": zion_emu.load_platform(preset, overrides={"collectives.nccl_tuner.time_model": "tuner"}),
            "pipeline": zion_emu.load_platform(preset, overrides={"collectives.nccl_tuner.time_model": "pipeline"}),
        }
        op = ref.get("collective", "all_reduce")
        print(f"\n### {name}: {op}, 8 ranks — published: {ref['source']}\n")
        print("| size (B) | published (us) | before (us) | error | tuner (us) | error | pipeline (us) | error | "
              "chosen |")
        print("|---:|---:|---:|---:|---:|---:|---:|---:|---|")
        ratios: dict[str, dict[int, float]] = {m: {} for m in models}
        for row in ref["rows"]:
            cells = []
            shown = ""
            for m, platform in models.items():
                r = sim.collective(platform, op, row["bytes"], 8)
                ratio = r.time * 1e6 / row["time_us"]
                ratios[m][row["bytes"]] = ratio
                cells.append(f"{r.time * 1e6:.2f} | {(ratio - 1) * 100:+.1f}%")
                if m == "tuner":
                    shown = f"{r.algorithm}/{r.protocol}" if r.protocol else r.algorithm
            print(f"| {row['bytes']} | {row['time_us']:.2f} | {' | '.join(cells)} | {shown} |")
        print()
        for m in models:
            print(_summary(m, ratios[m]))
        if args.channels and op == "all_reduce":
            _channels(preset, ref)


if __name__ == "__main__":
    main()
