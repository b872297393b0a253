"""torchrun's launcher for ``zion-emu run --nproc N``, ending quietly on a
signal: Ctrl-C reaches the ranks too, they write their partial reports, and
the launcher exits with 128 + the signal number instead of a traceback.

It dies with ``zion-emu run`` (SIGKILL on its parent's death), and tells the
ranks its pid, so that each rank arms the same signal against it knowing
whom to expect as its parent (:mod:`zion_emu._parent_death`)."""

from __future__ import annotations

import os
import sys

from torch.distributed import run
from torch.distributed.elastic.multiprocessing.api import SignalException

from zion_emu import _parent_death


def main(argv: list[str]) -> int:
    _parent_death.die_with_parent()
    os.environ[_parent_death.LAUNCHER_PID_ENV] = str(os.getpid())
    try:
        run.main(argv)
    except SignalException as e:
        return 128 + int(e.sigval)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
