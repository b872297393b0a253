"""torchrun's launcher for ``zion-emu run --nproc N``, ending quietly on a
signal: Ctrl-C reaches the ranks too, they write their partial reports, and
the launcher exits with 128 + the signal number instead of a traceback."""

from __future__ import annotations

import sys

from torch.distributed import run
from torch.distributed.elastic.multiprocessing.api import SignalException


def main(argv: list[str]) -> int:
    try:
        run.main(argv)
    except SignalException as e:
        return 128 + int(e.sigval)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
