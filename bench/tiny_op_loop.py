"""The tiny op `y = x + 1` on one element, looped, for callgrind.

    PYTHONHASHSEED=0 OMP_NUM_THREADS=1 valgrind --tool=callgrind --toggle-collect=builtin_eval \\
        python bench/tiny_op_loop.py --device zion --calls 20000

The loop runs inside one eval() of a compiled loop, so `--toggle-collect=builtin_eval` counts every instruction of
its iterations: the call of `x + 1` and the free of the previous iteration's `y` when the name is rebound (the
last `y` is freed inside the eval too), with the loop's own bytecode, which is the same on every device. Run it
with `--calls 0` as well and subtract: the difference divided by the calls is the cost of one iteration.
"""

from __future__ import annotations

import argparse

import torch

import zion_emu  # noqa: F401  (registers the device)

LOOP = compile("y = None\nfor _ in range(calls):\n    y = x + 1\ndel y\n", "<tiny op loop>", "exec")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="zion")
    parser.add_argument("--calls", type=int, default=20000)
    args = parser.parse_args()
    torch.set_num_threads(1)
    x = torch.ones(1, device=args.device)
    for _ in range(100):  # warm up: first-call lookups and caches are not counted
        y = x + 1
    del y
    eval(LOOP, {"calls": args.calls, "x": x})


if __name__ == "__main__":
    main()
