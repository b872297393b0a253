"""No process outlives its run.

- A test that fails or times out leaves nothing running: what it started
  through ``processes.started`` is killed with its process group, and
  pytest-timeout's configured method raises inside the test so that the
  ``finally`` doing it runs.
- No rank outlives its launcher: with ``zion-emu run --nproc 2`` or plain
  torchrun killed by SIGKILL mid-training (nothing can pass a signal on),
  every rank is gone within a few seconds, because each one asked the
  kernel for SIGKILL on its parent's death (``zion_emu._parent_death``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import textwrap
import time
from pathlib import Path

import pytest

from processes import PYTHON, REPO, alive, child_env, run, started, torchrun

START_TIMEOUT_S = 120
# The kernel sends the signal as the parent dies; this only bounds the test.
GONE_TIMEOUT_S = 30


def _wait_for_files(directory: Path, names: list[str], proc: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not all((directory / n).exists() for n in names):
        if proc.poll() is not None:
            pytest.fail(f"{proc.args} exited with {proc.returncode} before {names} were written")
        if time.monotonic() > deadline:
            pytest.fail(f"{names} not written in {timeout_s} s")
        time.sleep(0.1)


def _gone_within(pids: list[int], timeout_s: float) -> list[int]:
    """The pids still running after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return [p for p in pids if alive(p)]


def _kill(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


# -- a test that fails or times out ---------------------------------------------

# A process with a child of its own, both sleeping; it writes both pids.
_SLEEPER = textwrap.dedent("""
    import os, subprocess, sys, time
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    with open(sys.argv[1] + ".tmp", "w") as f:
        f.write(f"{os.getpid()} {child.pid}")
    os.replace(sys.argv[1] + ".tmp", sys.argv[1])
    time.sleep(600)
""")

_INNER_TESTS = textwrap.dedent('''
    import os, time

    from processes import PYTHON, started

    SLEEPER = {sleeper!r}


    def test_fails():
        with started([PYTHON, "-c", SLEEPER, os.path.join(os.environ["PIDS"], "fails")]):
            while not os.path.exists(os.path.join(os.environ["PIDS"], "fails")):
                time.sleep(0.05)
            assert False, "this test fails with its processes running"


    def test_times_out():
        with started([PYTHON, "-c", SLEEPER, os.path.join(os.environ["PIDS"], "times_out")]):
            while not os.path.exists(os.path.join(os.environ["PIDS"], "times_out")):
                time.sleep(0.05)
            time.sleep(600)
''')


@pytest.mark.slow
def test_a_test_that_fails_or_times_out_leaves_no_process_behind(tmp_path: Path) -> None:
    """Two tests run by a pytest of their own, with this suite's pytest.ini and
    a 15 s timeout: one fails and one hangs while each has two processes
    running. When that pytest is done, none of the four is left."""
    inner = tmp_path / "test_inner.py"
    inner.write_text(_INNER_TESTS.format(sleeper=_SLEEPER))
    pids_dir = tmp_path / "pids"
    pids_dir.mkdir()
    env = child_env(PIDS=str(pids_dir),
                    PYTHONPATH=os.pathsep.join([str(REPO / "python_tests"), child_env()["PYTHONPATH"]]))
    pids: list[int] = []
    try:
        done = run([PYTHON, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", str(REPO / "pytest.ini"),
                    "--rootdir", str(tmp_path), "-o", "timeout=15", str(inner)], timeout_s=180, env=env)
        for name in ("fails", "times_out"):
            pids += [int(p) for p in (pids_dir / name).read_text().split()]
        assert _gone_within(pids, 10) == [], "processes a failed or timed-out test started are still running"
        assert "2 failed" in done.stdout, done.stdout + done.stderr
        assert "this test fails with its processes running" in done.stdout
        assert "Timeout" in done.stdout, done.stdout
    finally:
        _kill(pids)


# -- a launcher killed with SIGKILL ------------------------------------------------

# Trains forever; each rank writes "pid ppid" once it has done an all-reduce.
_TRAIN_FOREVER = textwrap.dedent("""
    import os, pathlib, torch, torch.distributed as dist
    import zion_emu.distributed  # noqa: F401
    dist.init_process_group("zion")
    rank = dist.get_rank()
    model = torch.nn.Linear(64, 64).to(f"zion:{int(os.environ['LOCAL_RANK'])}")
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    step = 0
    while True:
        model(torch.ones(8, 64, device=model.weight.device)).sum().backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
        opt.step()
        opt.zero_grad()
        step += 1
        if step == 1:
            out = pathlib.Path(os.environ["PIDS"]) / f"rank{rank}"
            out.with_suffix(".tmp").write_text(f"{os.getpid()} {os.getppid()}")
            out.with_suffix(".tmp").replace(out)
""")


@pytest.mark.slow
@pytest.mark.multiproc
def test_no_rank_outlives_a_zion_emu_run_killed_with_sigkill(tmp_path: Path) -> None:
    with started([PYTHON, "-m", "zion_emu", "run", "--nproc", "2", "--quiet-report",
                  str(_write(tmp_path, _TRAIN_FOREVER))],
                 # A run killed with SIGKILL cannot remove its run folder: it is left in the test's own folder.
                 env=child_env(PIDS=str(_pids_dir(tmp_path)), OMP_NUM_THREADS="1", TMPDIR=str(tmp_path)),
                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) as proc:
        ranks = _rank_pids(tmp_path, proc)
        # zion-emu run -> torchrun's agent (a session of its own) -> the ranks (each in its own).
        agents = {ppid for _, ppid in ranks}
        assert len(agents) == 1 and agents != {proc.pid}
        (agent,) = agents
        # The agent is a fork of zion-emu run (torch is not imported a second time), in a session of its own.
        assert int(Path(f"/proc/{agent}/stat").read_text().rsplit(")", 1)[1].split()[1]) == proc.pid
        assert os.getsid(agent) == agent
        assert Path(f"/proc/{agent}/cmdline").read_bytes() == Path(f"/proc/{proc.pid}/cmdline").read_bytes()
        everyone = [pid for pid, _ in ranks] + list(agents)
        try:
            assert all(alive(p) for p in everyone)
            os.kill(proc.pid, signal.SIGKILL)
            assert _gone_within(everyone, GONE_TIMEOUT_S) == [], "ranks or the agent outlived zion-emu run"
        finally:
            _kill(everyone)


@pytest.mark.slow
@pytest.mark.multiproc
def test_no_rank_outlives_a_torchrun_agent_killed_with_sigkill(tmp_path: Path) -> None:
    with started(torchrun(2, str(_write(tmp_path, _TRAIN_FOREVER))),
                 env=child_env(PIDS=str(_pids_dir(tmp_path)), OMP_NUM_THREADS="1"),
                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) as proc:
        ranks = _rank_pids(tmp_path, proc)
        assert {ppid for _, ppid in ranks} == {proc.pid}  # plain torchrun: the agent is the ranks' parent
        pids = [pid for pid, _ in ranks]
        try:
            assert all(alive(p) for p in pids)
            os.kill(proc.pid, signal.SIGKILL)
            assert _gone_within(pids, GONE_TIMEOUT_S) == [], "ranks outlived torchrun's agent"
        finally:
            _kill(pids)


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "train_forever.py"
    path.write_text(text)
    return path


def _pids_dir(tmp_path: Path) -> Path:
    path = tmp_path / "pids"
    path.mkdir(exist_ok=True)
    return path


def _rank_pids(tmp_path: Path, proc: subprocess.Popen) -> list[tuple[int, int]]:
    """(pid, parent pid) of ranks 0 and 1, once both train."""
    pids_dir = _pids_dir(tmp_path)
    _wait_for_files(pids_dir, ["rank0", "rank1"], proc, START_TIMEOUT_S)
    return [tuple(int(v) for v in (pids_dir / f"rank{r}").read_text().split()) for r in (0, 1)]
