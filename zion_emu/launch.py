"""What runs in each process that ``python -m zion_emu run`` starts.

``python -m zion_emu.launch script.py args...`` (under torchrun for several
ranks) turns on what the run's options ask for (span recording always,
``--cuda-compat``, ``--virtual-clock``), counts optimizer steps as
iterations, runs the script as ``__main__``, and at exit -- normal, by
``sys.exit``, by an exception or by Ctrl-C -- leaves this rank's snapshot in
the run directory (``$ZION_RUN_DIR``) for the launcher to merge.

In a world bigger than its processes (``zion-emu run --world-size N
--ranks LIST``) torchrun numbers the processes 0..P-1; each takes the rank of
the world it plays before the script starts (:func:`take_world_rank`).

A script may say how many samples one of its iterations processes on this
rank with :func:`zion_emu.samples_per_iteration` (here too, as
``zion_emu.launch.samples_per_iteration``); the report then gives samples/s.
"""

from __future__ import annotations

import gc
import json
import math
import os
import runpy
import signal
import sys
import traceback
from pathlib import Path
from typing import Any

from zion_emu.iterations import StepClock, samples_per_iteration
from zion_emu.report import RankStatus

__all__ = ["main", "samples_per_iteration"]

RUN_DIR_ENV = "ZION_RUN_DIR"
OPTIONS_FILE = "options.json"


def _write_snapshot(run_dir: Path, rank: int, steps: StepClock, status: RankStatus) -> None:
    import numpy as np

    from zion_emu import report

    snap = report.snapshot(rank, steps.iterations())
    snap.status = status
    np.savez(run_dir / f"rank{rank}.npz", **(snap.spans or {}))
    tmp = run_dir / f"rank{rank}.json.tmp"
    tmp.write_text(json.dumps(snap.to_json()))
    os.replace(tmp, run_dir / f"rank{rank}.json")


def take_world_rank(world: dict[str, Any]) -> None:
    """Makes this process the rank of ``world`` (``world_size``, ``ranks``,
    ``devices_per_node``) that torchrun's RANK numbers among the listed ones:
    the script sees RANK, WORLD_SIZE, LOCAL_RANK = RANK % devices_per_node and
    GROUP_RANK = RANK // devices_per_node, as under torchrun with a node per
    devices_per_node ranks; the zion backend learns which ranks run."""
    from zion_emu.distributed import PRESENT_RANKS_ENV

    n, ranks, per_node = int(world["world_size"]), [int(r) for r in world["ranks"]], int(world["devices_per_node"])
    rank = ranks[int(os.environ.get("RANK", "0"))]
    os.environ.update({
        "RANK": str(rank), "WORLD_SIZE": str(n),
        "LOCAL_RANK": str(rank % per_node), "LOCAL_WORLD_SIZE": str(min(per_node, n)),
        "GROUP_RANK": str(rank // per_node), "GROUP_WORLD_SIZE": str(math.ceil(n / per_node)),
        "ROLE_RANK": str(rank), "ROLE_WORLD_SIZE": str(n),
    })
    if len(ranks) < n:
        os.environ[PRESENT_RANKS_ENV] = ",".join(map(str, ranks))
    else:
        os.environ.pop(PRESENT_RANKS_ENV, None)


class Terminated(KeyboardInterrupt):
    """SIGTERM (torchrun stopping the ranks, `kill`, a job scheduler's stop),
    raised where the program is, as a Ctrl-C is: see :func:`raise_terminated`."""


def raise_terminated(signum: int, frame: object) -> None:
    """A SIGTERM handler that raises :class:`Terminated`."""
    raise Terminated()


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python -m zion_emu.launch script.py [args...]", file=sys.stderr)
        return 2
    run_dir = Path(os.environ[RUN_DIR_ENV])
    options = json.loads((run_dir / OPTIONS_FILE).read_text())
    if options.get("world"):
        take_world_rank(options["world"])
    rank = int(os.environ.get("RANK", "0"))

    from torch.optim.optimizer import register_optimizer_step_post_hook

    import zion_emu  # noqa: F401  (the device, the platform from $ZION_PLATFORM)
    from zion_emu import report

    report.start_recording(options.get("max_spans", report.DEFAULT_MAX_SPANS))
    compat = None
    if options.get("cuda_compat"):
        from zion_emu import cuda_compat

        compat = cuda_compat.enable()
    if options.get("virtual_clock"):
        from zion_emu import virtual_clock

        virtual_clock.enable()
    steps = StepClock()
    register_optimizer_step_post_hook(steps.hook)
    from zion_emu import inference

    inference.track_forwards()  # forwards with gradients off are queries: the report's inference section

    script = argv[0]
    sys.argv = list(argv)
    sys.path.insert(0, str(Path(script).resolve().parent))
    status = RankStatus("ok", 0)
    code = 0
    # torchrun stops the other ranks with SIGTERM when one fails: each writes
    # its partial report, as on a Ctrl-C, rather than dying without one.
    signal.signal(signal.SIGTERM, raise_terminated)
    # What exists now (torch's and zion's modules, hundreds of thousands of
    # objects) lives as long as the process: out of the cyclic collector's
    # passes, the collection below and the interpreter's exit take about a
    # second less on 2 cores. The script's own objects are collected as ever.
    gc.freeze()
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if e.code is not None and not isinstance(e.code, int):
            print(e.code, file=sys.stderr)
        status = RankStatus("sys.exit", code)
    except Terminated:
        code = 128 + signal.SIGTERM
        status = RankStatus("terminated", code)
        print(f"zion-emu: rank {rank} stopped by SIGTERM (another rank failed, or the launcher was stopped); writing "
              "the partial report", file=sys.stderr)
    except KeyboardInterrupt:
        code = 130
        status = RankStatus("interrupted", code)
        print(f"zion-emu: rank {rank} interrupted; writing the partial report", file=sys.stderr)
    except BaseException as e:  # the script failed: its traceback, then the partial report
        traceback.print_exc()
        code = 1
        status = RankStatus("exception", code, error=f"{type(e).__name__}: {e}")
    if compat is not None:
        status.cuda_compat_remapped = compat.remapped()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # another Ctrl-C must not cut the report short
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    # The script's globals went with runpy's module, some in reference cycles:
    # collected now, the snapshot's memory in use is what live objects hold,
    # not what the collector happened to leave.
    gc.collect()
    try:
        _write_snapshot(run_dir, rank, steps, status)
    except Exception as e:  # the report is lost, the script's result is not
        print(f"zion-emu: rank {rank} could not write its report: {type(e).__name__}: {e}", file=sys.stderr)
        code = code or 1
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
