"""A process a launcher started dies with its launcher.

torchrun (and ``zion-emu run``, through it) starts each rank in a session of
its own, so a launcher killed with SIGKILL leaves its ranks running: nothing
sends them a signal, and a rank blocked in a collective waits out the group
timeout, or forever in a loop that needs no peer. Each rank therefore asks
the kernel for SIGKILL when its parent dies (Linux ``PR_SET_PDEATHSIG``).
That signal fires when the *thread* that forked the child exits; torch
elastic starts its workers from the agent's main thread, which lives as long
as the agent.

A process is a rank when torch elastic's worker variables are set
(``TORCHELASTIC_RUN_ID`` and ``LOCAL_RANK``), or when ``zion-emu run``
started it (``ZION_RUN_DIR``). Elsewhere, and off Linux, this does nothing.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

# The launcher's pid, exported by a launcher for the processes it starts
# (zion_emu.cli.agent does): a child that sees another parent when it arms
# the signal knows its launcher died before it could.
LAUNCHER_PID_ENV = "ZION_LAUNCHER_PID"
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>

_armed = False


def started_by_launcher(env: "os._Environ[str] | dict[str, str]" = os.environ) -> bool:
    """Whether this process is one a launcher started: a torch elastic worker
    or a process of a ``zion-emu run``."""
    return ("TORCHELASTIC_RUN_ID" in env and "LOCAL_RANK" in env) or "ZION_RUN_DIR" in env


def die_with_parent() -> bool:
    """Arms SIGKILL on the death of this process's parent, and dies now if the
    parent is already gone. Returns whether it armed (Linux only)."""
    global _armed
    if _armed:
        return True
    # Read and dropped here so that this process's own children, whose parent
    # is this process, do not compare their parent with the launcher.
    launcher = os.environ.pop(LAUNCHER_PID_ENV, None)
    if not sys.platform.startswith("linux"):
        return False
    parent = int(launcher) if launcher and launcher.isdigit() else os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    _armed = True
    # The parent may have died between this process starting and the prctl
    # call; then no signal will come, and the parent is someone else now.
    if os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGKILL)
    return True


def die_with_launcher() -> bool:
    """:func:`die_with_parent` in a process a launcher started; nothing
    elsewhere. Returns whether it armed."""
    return die_with_parent() if started_by_launcher() else False
