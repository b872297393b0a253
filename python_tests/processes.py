"""The processes a test starts: a snippet in a fresh interpreter, the
``zion-emu`` command line, a launcher with its ranks, ranks spawned from the
test. Every one is bounded by a timeout and ends with its test, however the
test ends (passes, fails, times out: pytest-timeout's ``signal`` method raises
inside the test, so ``finally`` blocks run):

- a command runs in a session of its own, and its whole process group is
  killed when the test leaves it (:func:`started`, :func:`run`);
- ranks spawned from the test are killed and reaped (:func:`spawn`).

A child gets a clean environment (:func:`child_env`) and the default SIGINT
disposition, whatever the shell that started pytest gave it (see
:func:`started`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from zion_emu.cli.bench_collectives import spawned

REPO = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
TIMEOUT_S = 120

# What a launcher gives its ranks: none of it may leak from the test process
# (a test that plays a rank sets some) into a child that is not one.
_RANK_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
                   "MASTER_PORT", "TORCHELASTIC_RUN_ID", "ZION_RUN_DIR", "ZION_LAUNCHER_PID", "ZION_PRESENT_RANKS")


def child_env(**overrides: str | None) -> dict[str, str]:
    """The environment of a child: this one with the checkout first on
    PYTHONPATH, the ranks talking over loopback, and no ZION_PLATFORM nor rank
    variables unless given, nor cuda-compat's (ZION_CUDA_COMPAT, and
    CUDA_VISIBLE_DEVICES, which a machine's CI may set). ``NAME=None`` removes NAME."""
    env = dict(os.environ)
    for name in ("ZION_PLATFORM", "ZION_CUDA_COMPAT", "CUDA_VISIBLE_DEVICES", *_RANK_VARIABLES):
        env.pop(name, None)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    env["GLOO_SOCKET_IFNAME"] = "lo"
    for name, value in overrides.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return env


def kill_group(pgid: int) -> None:
    """SIGKILL to every process of the group, if any is left."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


@contextmanager
def started(argv: list[str], **popen: Any) -> Iterator[subprocess.Popen]:
    """Starts ``argv`` (environment :func:`child_env` unless ``env=``) in a
    session of its own; on leaving, kills its process group and reaps it.

    The child gets the default SIGINT disposition, as under a terminal. A
    shell that starts a job in the background (``nohup make test &``) has it
    ignore SIGINT, and an ignored signal stays ignored across fork and exec,
    so a child would never see a Ctrl-C a test sends. A handled signal is
    reset to the default by exec: the child is started with SIGINT handled
    here, for the moment of the fork."""
    popen.setdefault("env", child_env())
    previous = signal.getsignal(signal.SIGINT) if threading.current_thread() is threading.main_thread() else None
    if previous == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        proc = subprocess.Popen(argv, start_new_session=True, **popen)
    finally:
        if previous == signal.SIG_IGN:
            signal.signal(signal.SIGINT, previous)
    try:
        yield proc
    finally:
        kill_group(proc.pid)
        proc.kill()  # in case it left its group
        proc.wait(timeout=30)
        for pipe in (proc.stdin, proc.stdout, proc.stderr):
            if pipe:
                pipe.close()


def finish(proc: subprocess.Popen, timeout_s: float = TIMEOUT_S, input: str | None = None) -> tuple[str, str]:
    """Waits for a started process; fails the test with the end of its output
    past ``timeout_s``. Returns (stdout, stderr), '' where not captured."""
    try:
        out, err = proc.communicate(input, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        kill_group(proc.pid)
        out, err = proc.communicate()
        pytest.fail(f"{' '.join(map(str, proc.args))} did not finish in {timeout_s} s\n"
                    f"stdout:\n{(out or '')[-3000:]}\nstderr:\n{(err or '')[-3000:]}", pytrace=False)
    return out or "", err or ""


def run(argv: list[str], timeout_s: float = TIMEOUT_S, check: bool = False, **popen: Any) -> subprocess.CompletedProcess:
    """``subprocess.run(argv, capture_output=True, text=True)`` through
    :func:`started`: bounded by ``timeout_s`` (the test fails past it), and
    nothing it started outlives it. With ``check``, a non-zero exit fails the
    test with the output."""
    popen.setdefault("stdout", subprocess.PIPE)
    popen.setdefault("stderr", subprocess.PIPE)
    popen.setdefault("text", True)
    with started(argv, **popen) as proc:
        out, err = finish(proc, timeout_s)
    done = subprocess.CompletedProcess(argv, proc.returncode, out, err)
    if check and done.returncode != 0:
        pytest.fail(f"{' '.join(map(str, argv))}: exit {done.returncode}\nstdout:\n{out[-3000:]}\n"
                    f"stderr:\n{err[-4000:]}", pytrace=False)
    return done


def run_python(code: str, timeout_s: float = TIMEOUT_S, check: bool = True, **popen: Any) -> subprocess.CompletedProcess:
    """A snippet (dedented) in a fresh interpreter, from the checkout's root;
    see :func:`run`."""
    popen.setdefault("cwd", REPO)
    return run([PYTHON, "-c", textwrap.dedent(code)], timeout_s, check, **popen)


def zion_emu_cli(*args: str, timeout_s: float = 180, check: bool = True, **popen: Any) -> subprocess.CompletedProcess:
    """``python -m zion_emu ARGS``; see :func:`run`."""
    return run([PYTHON, "-m", "zion_emu", *args], timeout_s, check, **popen)


def torchrun(nproc: int, *args: str) -> list[str]:
    """The command line of plain torchrun on this node, ``nproc`` ranks, no
    restarts."""
    return [PYTHON, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", "--max-restarts=0",
            "--monitor-interval=0.2", *args]


def spawn(worker: Callable[..., None], nprocs: int, tmp_path: Any, *args: Any, timeout_s: float) -> list[int]:
    """Runs ``worker(rank, nprocs, store_path, *args)`` in ``nprocs`` processes
    and returns their pids, all ended and reaped; fails the test past
    ``timeout_s``, and fails it if a rank failed."""
    store = str(tmp_path / "store")
    deadline = time.monotonic() + timeout_s
    with spawned(worker, (nprocs, store, *args), nprocs) as ctx:
        while not ctx.join(timeout=1):
            if time.monotonic() > deadline:
                pytest.fail(f"{worker.__name__} on {nprocs} ranks did not finish in {timeout_s} s")
    return [p.pid for p in ctx.processes]


def alive(pid: int) -> bool:
    """Whether ``pid`` is a running process (a zombie, dead but not yet
    reaped by its parent, is not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def session_members(sid: int) -> list[int]:
    """The pids of the running processes in session ``sid``."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except (FileNotFoundError, ProcessLookupError):
                continue
            # After the name: state, ppid, pgrp, session.
            if int(fields[3]) == sid and fields[0] not in ("Z", "X"):
                pids.append(int(entry.name))
    return pids
