"""torchrun's launcher for ``zion-emu run --nproc N``, ending quietly on a
signal: Ctrl-C reaches the ranks too, they write their partial reports, and
the launcher exits with 128 + the signal number instead of a traceback.

It dies with ``zion-emu run`` (SIGKILL on its parent's death), and tells the
ranks its pid, so that each rank arms the same signal against it knowing
whom to expect as its parent (:mod:`zion_emu._parent_death`)."""

from __future__ import annotations

import gc
import os
import sys

from torch.distributed import run
from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

from zion_emu import _parent_death


def main(argv: list[str]) -> int:
    gc.freeze()  # torch's modules, out of the collector's passes: about a second less at exit (zion_emu.launch)
    _parent_death.die_with_parent()
    os.environ[_parent_death.LAUNCHER_PID_ENV] = str(os.getpid())
    try:
        run.main(argv)
    except SignalException as e:
        return 128 + int(e.sigval)
    except ChildFailedError as e:
        # torchrun's own message is a traceback around the failure; the rank's
        # error is already on stderr above. The exit code is the failed rank's.
        rank, failure = e.get_first_failure()
        code = failure.exitcode if failure.exitcode > 0 else 128 - failure.exitcode  # -N: killed by signal N
        print(f"zion-emu: rank {rank} failed with exit code {code}; the other ranks were stopped", file=sys.stderr)
        return code
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
