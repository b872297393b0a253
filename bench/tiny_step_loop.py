"""Steps of the tiny DLRM config (examples/dlrm/dlrm.py --config tiny), looped, for callgrind.

    PYTHONHASHSEED=0 OMP_NUM_THREADS=1 valgrind --tool=callgrind --toggle-collect=builtin_eval \\
        python bench/tiny_step_loop.py --device zion --steps 60

After 20 warm-up steps, the steps run inside one eval() of a compiled loop, so `--toggle-collect=builtin_eval`
counts every instruction of them (a step: the batch's copy to the device, forward, backward, SGD, `loss.item()`).
Run it with `--steps 10` as well and subtract: the difference over the 50 steps is the cost of one step, free of
the first-call work that the first counted steps still do.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples" / "dlrm"))
import dlrm  # noqa: E402

LOOP = compile("for i in range(steps):\n    run.step(batches[i % 4].to(run.device)).item()\n", "<tiny step loop>", "exec")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="zion", choices=("cpu", "zion"))
    parser.add_argument("--steps", type=int, default=60)
    args = parser.parse_args()
    torch.set_num_threads(1)
    run = dlrm.setup(dlrm.parse_args(["--config", "tiny", "--device", args.device, "--no-progress"]))
    batches = [run.data.batch(i) for i in range(4)]
    for i in range(20):  # warm up: first-call lookups and caches are not counted
        run.step(batches[i % 4].to(run.device)).item()
    eval(LOOP, {"steps": args.steps, "run": run, "batches": batches})  # noqa: S307 (our own compiled loop)


if __name__ == "__main__":
    main()
