"""``python -m zion_emu bench-collectives``: nccl-tests through the zion backend.

The argument checks run in-process. The runs spawn a few ranks through the real
command line (a subprocess, bounded by a timeout): each row's modeled time is
the collective model's for the same ranks, op and bytes, algbw = bytes / time
and busbw = algbw x the nccl-tests factor worked out here by hand.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest

from processes import PYTHON, child_env, finish, started, zion_emu_cli
from zion_emu import load_platform, sim
from zion_emu.__main__ import main
from zion_emu.cli.bench_collectives import BYTES_PER_ROW, bench_sizes, calls_for, spawned

RUN_TIMEOUT_S = 180


def _error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert main(["bench-collectives", *argv]) == 2
    return capsys.readouterr().err


def test_bad_arguments_are_one_line_naming_what_is_allowed(capsys: pytest.CaptureFixture[str]) -> None:
    err = _error(capsys, "--nproc", "9")
    assert "--nproc 9 does not fit platform 'zion': it has 8 devices" in err
    err = _error(capsys, "--op", "all_reduse")
    assert "invalid choice: 'all_reduse'" in err
    for op in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast"):
        assert op in err
    assert "--nproc must be at least 1" in _error(capsys, "--nproc", "0")
    assert "--iters must be at least 1" in _error(capsys, "--iters", "0")
    assert "--root 4 is not a rank (0..3)" in _error(capsys, "--nproc", "4", "--op", "broadcast", "--root", "4")
    assert "invalid choice: 'rign'" in _error(capsys, "--algo", "rign")
    # 8 ranks of all_gather need 8 floats: 16 bytes hold none.
    err = _error(capsys, "--op", "all_gather", "--min-bytes", "8", "--max-bytes", "16")
    assert "no size from --min-bytes to --max-bytes holds one float per rank" in err and "the smallest is 32 bytes" in err
    # An algorithm that cannot run over the ranks is refused before they start (they started, then failed).
    err = _error(capsys, "--algo", "halving_doubling", "--nproc", "3", "--max-bytes", "64")
    assert ("--algo halving_doubling: all_reduce over 3 ranks: no algorithm applies (halving_doubling needs a "
            "power-of-two number of ranks, got 3)") in err


def test_sizes_round_to_whole_elements_per_rank_and_large_ones_run_fewer_calls() -> None:
    assert bench_sizes("all_reduce", 8, [8, 16, 32]) == [8, 16, 32]
    # all_gather over 8 ranks: multiples of 8 floats = 32 bytes; 8 and 16 hold none.
    assert bench_sizes("all_gather", 8, [8, 16, 32, 64, 100]) == [32, 64, 96]
    assert calls_for(1024, 20, 5) == (5, 20)
    assert calls_for(BYTES_PER_ROW // 4, 20, 5) == (4, 4)
    assert calls_for(BYTES_PER_ROW * 2, 20, 5) == (1, 1)


def _bench(*argv: str) -> list[dict]:
    return json.loads(zion_emu_cli("bench-collectives", "--json", *argv, timeout_s=RUN_TIMEOUT_S).stdout)


# nccl-tests' bus bandwidth factors (PERFORMANCE.md), by hand for n ranks.
def _factor(op: str, n: int) -> float:
    return {"all_reduce": 2 * (n - 1) / n, "all_gather": (n - 1) / n, "reduce_scatter": (n - 1) / n,
            "all_to_all": (n - 1) / n, "broadcast": 1.0, "reduce": 1.0}[op]


def _check_rows(rows: list[dict], op: str, n: int, sizes: list[int], algo: str = "auto", link_model: str = "fair") -> None:
    platform = load_platform("zion")
    assert [r["bytes"] for r in rows] == sizes
    for r in rows:
        expected = sim.collective_time(platform, op, r["bytes"], n, algo, link_model)
        assert r["op"] == op and r["ranks"] == n and r["link_model"] == link_model
        assert r["time_ns"] == pytest.approx(expected * 1e9, rel=1e-6), r
        assert r["algbw_gbps"] == pytest.approx(r["bytes"] / expected / 1e9, rel=1e-6)
        assert r["busbw_gbps"] == pytest.approx(r["algbw_gbps"] * _factor(op, n), rel=1e-9)
        assert r["host_us"] > 0 and r["iters"] == 2


@pytest.mark.slow
@pytest.mark.multiproc
def test_every_op_on_two_ranks_takes_the_modeled_time() -> None:
    ops = ["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast"]
    rows = _bench("--nproc", "2", *[a for op in ops for a in ("--op", op)], "--min-bytes", "16", "--max-bytes", "16K",
                  "--step-factor", "32", "--iters", "2", "--warmup", "1")
    assert [r["op"] for r in rows] == [op for op in ops for _ in range(3)]
    for op in ops:
        _check_rows([r for r in rows if r["op"] == op], op, 2, [16, 512, 16384])
    # zion: OAMs 0 and 1 share a 25 GB/s link per direction, 0.6 us apart; a
    # 2-rank ring all_reduce is 2 steps of alpha + S / (2 x 25 GB/s) after the
    # 6.6 us base latency: 16 B -> 6.6 + 2 x (0.6 + 0.00032) us = 7.80064 us.
    assert rows[0]["algorithm"] == "ring"
    assert rows[0]["time_us"] == pytest.approx(6.6 + 2 * (0.6 + 16 / (2 * 25e9) * 1e6), rel=1e-6)


@pytest.mark.slow
@pytest.mark.multiproc
def test_four_ranks_with_a_chosen_algorithm_and_link_model_beside_plain_gloo() -> None:
    rows = _bench("--nproc", "4", "--min-bytes", "1K", "--max-bytes", "1M", "--step-factor", "1024", "--iters", "2",
                  "--warmup", "1", "--algo", "ring", "--link-model", "unaware", "--vs-gloo")
    _check_rows(rows, "all_reduce", 4, [1024, 1 << 20], "ring", "unaware")
    assert {r["algorithm"] for r in rows} == {"ring"}
    assert all(r["gloo_us"] > 0 for r in rows)  # the same calls through a plain gloo group, side by side


@pytest.mark.slow
@pytest.mark.multiproc
def test_ctrl_c_keeps_the_rows_measured_and_prints_no_traceback(tmp_path) -> None:
    # The launcher and every rank printed a KeyboardInterrupt traceback, and the rows were lost.
    out = tmp_path / "out.txt"
    temp = tmp_path / "tmp"
    temp.mkdir()
    argv = [PYTHON, "-m", "zion_emu", "bench-collectives", "--nproc", "2", "--max-bytes", str(1 << 28), "--iters", "500"]
    env = child_env(TMPDIR=str(temp))
    with open(out, "w") as stdout, started(argv, stdout=stdout, stderr=subprocess.PIPE, text=True, env=env) as proc:
        deadline = time.monotonic() + 120
        while "float" not in out.read_text() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert proc.poll() is None, "it ended before a row was measured"
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C at the terminal: the whole foreground group
        _, err = finish(proc, 60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert "zion-emu: interrupted; the rows above were measured before it" in err
    text = out.read_text()
    assert "float" in text and "# Avg bus bandwidth" in text
    # The rank that lost its peer raised; torch's spawn leaves its traceback file behind unless removed.
    assert not list(temp.iterdir())


def _rank_that_raises_or_sleeps(rank: int) -> None:
    if rank == 0:
        raise ValueError("rank 0 gives up")
    time.sleep(600)


@pytest.mark.multiproc
def test_spawned_ranks_are_killed_and_leave_no_traceback_file(tmp_path, monkeypatch) -> None:
    # torch's spawn writes a raising rank's traceback to $TMPDIR for join to read, and never removes it:
    # each failed bench-collectives run left a pytorch-errorfile-*.pickle behind.
    import tempfile
    import torch.multiprocessing as mp

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)  # read TMPDIR again
    with pytest.raises(mp.ProcessRaisedException, match="rank 0 gives up"):
        with spawned(_rank_that_raises_or_sleeps, (), 2) as ctx:
            deadline = time.monotonic() + 60
            while not ctx.join(timeout=0.5):
                assert time.monotonic() < deadline, "rank 0 did not raise"
    assert not ctx.processes[1].is_alive()  # the sleeping rank was killed on leaving
    assert not list(tmp_path.iterdir())
