"""The DLRM example (examples/dlrm/dlrm.py): the same script gives the same
losses, bit for bit, on the CPU and on zion, in one process and on two ranks
(zion backend vs gloo), and the model-parallel split computes the same model
as one process. Multi-rank runs go through torchrun in a subprocess, each
bounded by a timeout.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

import zion_emu
from processes import child_env, run, torchrun

REPO = Path(zion_emu.__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "dlrm"
sys.path.insert(0, str(EXAMPLE))

import dlrm  # noqa: E402
from data import SyntheticData  # noqa: E402
from placement import table_owners  # noqa: E402

TORCHRUN_TIMEOUT_S = 240
TINY = ["--config", "tiny", "--no-progress"]


def _lines(output: str, prefix: str) -> list[list[str]]:
    return [line.split() for line in output.splitlines() if line.startswith(prefix)]


def _losses(output: str) -> list[str]:
    """The loss of every printed iteration, as printed (the float's repr)."""
    return [fields[fields.index("loss") + 1] for fields in _lines(output, "iter ")]


def _summary(output: str) -> dict[str, str]:
    (fields,) = _lines(output, "summary ")
    return dict(zip(fields[1::2], fields[2::2]))


def _run_here(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert dlrm.main(list(argv)) == 0
    return capsys.readouterr().out


def _torchrun(nproc: int, *argv: str) -> str:
    done = run(torchrun(nproc, str(EXAMPLE / "dlrm.py"), *argv), timeout_s=TORCHRUN_TIMEOUT_S, check=True,
               env=child_env(OMP_NUM_THREADS="1"))
    return done.stdout


# --- one process ---------------------------------------------------------------

@pytest.mark.parametrize("optimizer", ["sgd", "adagrad"])
def test_one_zion_device_gives_the_cpu_loss_trace_bit_for_bit(capsys, optimizer):
    cpu = _run_here(capsys, *TINY, "--device", "cpu", "--optimizer", optimizer)
    zion = _run_here(capsys, *TINY, "--device", "zion", "--optimizer", optimizer)
    assert len(_losses(cpu)) == 4
    assert _losses(zion) == _losses(cpu)
    # Training moves the loss: the four printed values are not all one number.
    assert len(set(_losses(cpu))) > 1

    s = _summary(zion)
    per_iter_ms, samples_per_s = float(s["modeled_ms_per_iter"]), float(s["modeled_samples_per_s"])
    # 32 samples per modeled iteration.
    assert samples_per_s == pytest.approx(32 / (per_iter_ms / 1e3), rel=1e-5)
    assert 0 < per_iter_ms < 1e3
    assert int(s["peak_hbm_bytes"]) > 0
    assert "modeled_ms_per_iter" not in _summary(cpu)


def test_print_freq_prints_every_nth_iteration_and_the_last(capsys):
    out = _run_here(capsys, *TINY, "--device", "cpu", "--num-batches", "7", "--print-freq", "3")
    assert [fields[1] for fields in _lines(out, "iter ")] == ["3", "6", "7"]


def test_explicit_flags_override_the_config(capsys):
    out = _run_here(capsys, *TINY, "--device", "cpu", "--arch-sparse-feature-size", "6", "--arch-mlp-bot", "13-6",
                    "--mini-batch-size", "8", "--num-batches", "2")
    header = out.splitlines()[0]
    assert " dim 6 " in header and " bot 13-6 " in header and " global_batch 8 " in header
    assert len(_losses(out)) == 2 and _summary(out)["global_batch"] == "8"


# --- data and placement ----------------------------------------------------------

def test_data_is_the_same_whatever_the_world_size():
    rows = [50, 80, 120]
    whole = SyntheticData("criteo-synthetic", rows, 13, 2, 32, 0, 1, [0, 1, 2], seed=5).batch(3)
    owners = table_owners(rows, 2)
    # By bytes: table 2 (120 rows) to rank 0, then 80 and 50 to rank 1, the lighter one each time.
    assert owners == [[2], [0, 1]]
    halves = [SyntheticData("criteo-synthetic", rows, 13, 2, 32, r, 2, owned, seed=5).batch(3)
              for r, owned in enumerate(owners)]
    assert torch.equal(torch.cat([h.dense for h in halves]), whole.dense)
    assert torch.equal(torch.cat([h.labels for h in halves]), whole.labels)
    # Each rank has its tables' indices for the whole batch.
    (table2,), (table0, table1) = halves[0].indices, halves[1].indices
    assert all(torch.equal(a, b) for a, b in zip([table0, table1, table2], whole.indices))
    assert all(int(i.min()) >= 0 and int(i.max()) < n for i, n in zip(whole.indices, rows))
    # Another batch draws other numbers.
    assert not torch.equal(SyntheticData("random", rows, 13, 2, 32, 0, 1, [0], seed=5).batch(4).dense,
                           SyntheticData("random", rows, 13, 2, 32, 0, 1, [0], seed=5).batch(3).dense)


def test_criteo_synthetic_indices_follow_a_power_law():
    data = SyntheticData("criteo-synthetic", [100000], 13, 50, 200, 0, 1, [0], seed=0)
    counts = torch.bincount(data.batch(0).indices[0], minlength=100000).sort(descending=True).values
    # P(row of rank k) ~ (k+1)^-1.05 over 1e5 rows: the hottest row takes
    # 1 / sum_k (k+1)^-1.05, about 9% of 10,000 lookups; uniform would give 0.1.
    assert 600 < counts[0] < 1200
    assert counts[:100].sum() > 0.35 * counts.sum()


def test_tables_of_different_lookup_counts_get_their_own_offsets():
    data = SyntheticData("random", [40, 50, 60], 13, [3, 1, 3], 8, 0, 1, [0, 1, 2], seed=0)
    batch = data.batch(0)
    assert [len(i) for i in batch.indices] == [24, 8, 24]
    assert torch.equal(batch.offsets[0], torch.arange(0, 24, 3)) and torch.equal(batch.offsets[1], torch.arange(8))
    assert batch.offsets[2] is batch.offsets[0]  # one tensor per lookup count, copied to the device once


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["real", "timing"])
def test_batches_made_by_data_loader_workers_train_as_those_made_on_the_training_thread(mode):
    # --num-workers: the same batches, in order, from worker processes, so
    # the same losses bit for bit, modeled time and peak HBM.
    def train(workers: int) -> str:
        return run([sys.executable, str(EXAMPLE / "dlrm.py"), *TINY, "--num-batches", "6", "--num-workers",
                    str(workers)], timeout_s=TORCHRUN_TIMEOUT_S, check=True,
                   env=child_env(OMP_NUM_THREADS="1", ZION_MODE=mode)).stdout

    here, workers = train(0), train(2)
    assert len(_losses(here)) == 6
    assert _losses(workers) == _losses(here)
    summary_here, summary_workers = _summary(here), _summary(workers)
    for key in ("modeled_ms_per_iter", "peak_hbm_bytes", "iters"):
        assert summary_workers[key] == summary_here[key]


# --- bad input ---------------------------------------------------------------------

def _usage_error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    with pytest.raises(SystemExit) as exit_info:
        dlrm.parse_args(list(argv))
    assert exit_info.value.code == 2
    return capsys.readouterr().err


def test_bad_flags_are_named_with_what_is_allowed(capsys):
    err = _usage_error(capsys, "--config", "tiny", "--arch-mlp-bot", "13-8-5")
    assert "--arch-mlp-bot 13-8-5 ends in 5" in err and "--arch-sparse-feature-size is 4" in err

    err = _usage_error(capsys, "--config", "huge")
    assert "--config" in err and all(name in err for name in ("tiny", "small", "paper", "mlperf"))

    err = _usage_error(capsys, "--config", "tiny", "--arch-embedding-size", "10-x-3")
    assert "--arch-embedding-size '10-x-3'" in err and "dashes" in err

    err = _usage_error(capsys, "--config", "tiny", "--arch-mlp-top", "8-2")
    assert "--arch-mlp-top 8-2 ends in 2" in err

    err = _usage_error(capsys, "--config", "tiny", "--arch-mlp-bot", "12-8-4")
    assert "starts with 12" in err and "--data criteo-synthetic has 13" in err

    err = _usage_error(capsys, "--config", "tiny", "--device", "tpu")
    assert "cpu" in err and "zion" in err and "cuda" in err

    err = _usage_error(capsys, "--config", "tiny", "--num-batches", "0")
    assert "--num-batches is 0" in err

    err = _usage_error(capsys, "--config", "tiny", "--num-workers", "-1")
    assert "--num-workers is -1; it must be 0" in err and "worker processes" in err


def test_a_batch_that_does_not_split_over_the_ranks_is_refused(capsys, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.setenv("RANK", "0")
    assert dlrm.main([*TINY, "--device", "cpu"]) == 2
    assert "--mini-batch-size 32 does not split evenly over 3 ranks" in capsys.readouterr().err


# --- several ranks (torchrun) ----------------------------------------------------------

@pytest.mark.slow
@pytest.mark.multiproc
def test_two_ranks_zion_give_the_gloo_cpu_losses_bit_for_bit_and_the_one_process_losses(capsys):
    # Balanced by bytes, these tables interleave: largest first to the lighter
    # rank, 120 -> r0, 100 -> r1, 90 -> r1 (100 < 120), 80 -> r0, 70 -> r1,
    # 60 -> r0, 50 -> r0 (tie at 260: the lower rank), 40 -> r1, 30 -> r1.
    rows = ("--arch-embedding-size", "120-50-100-60-90-40-70-80-30")
    gloo = _torchrun(2, *TINY, *rows, "--device", "cpu")
    zion = _torchrun(2, *TINY, *rows, "--device", "zion")
    assert len(_losses(gloo)) == 4
    assert _losses(zion) == _losses(gloo)
    assert float(_summary(zion)["modeled_samples_per_s"]) > 0
    assert "# rank 0 tables 0,1,3,7 table_bytes 4960" in gloo and "# rank 1 tables 2,4,5,6,8 table_bytes 5280" in gloo

    # Tables split 4 + 5 over the ranks, exchanged by all_to_all and put back
    # in table order, and MLPs under DDP compute the one-process model: equal
    # up to summation order.
    one = _run_here(capsys, *TINY, *rows, "--device", "cpu")
    assert [float(v) for v in _losses(gloo)] == pytest.approx([float(v) for v in _losses(one)], rel=1e-5)


@pytest.mark.slow
@pytest.mark.multiproc
def test_eight_ranks_train_and_report_modeled_samples_per_second():
    out = _torchrun(8, *TINY, "--device", "zion", "--mini-batch-size", "64", "--num-batches", "3")
    losses = [float(v) for v in _losses(out)]
    assert len(losses) == 3 and all(math.isfinite(v) for v in losses)
    s = _summary(out)
    assert s["ranks"] == "8" and float(s["modeled_samples_per_s"]) > 0
    # Byte-balanced (python_tests/test_dlrm_placement.py): the 8 largest tables one per rank, the smallest
    # (30 rows) to rank 7, which holds the lightest of them (40 rows).
    assert "ranks 8 tables 9 (per rank 1-1-1-1-1-1-1-2)" in out
    assert "# rank 7 tables 5,8 table_bytes 1120 in_hbm 1120 in_ddr 0" in out


@pytest.mark.slow
@pytest.mark.multiproc
def test_ranks_that_own_no_tables_still_take_part_in_the_exchange():
    two_tables = ("--arch-embedding-size", "50-80", "--mini-batch-size", "30", "--num-batches", "2")
    gloo = _torchrun(3, *TINY, *two_tables, "--device", "cpu")
    assert "ranks 3 tables 2 (per rank 1-1-0)" in gloo
    zion = _torchrun(3, *TINY, *two_tables, "--device", "zion")
    assert _losses(zion) == _losses(gloo) and len(_losses(gloo)) == 2


_THREADS_AFTER_MAIN = """
import os, runpy, sys
out, sys.argv = sys.argv[1], sys.argv[2:]
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
finally:
    names = sorted(open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task"))
    with open(os.path.join(out, "threads." + os.environ["RANK"]), "w") as f:
        f.write(",".join(names))
"""

_TEARDOWN_CASES = {
    "dlrm-cpu": ["dlrm/dlrm.py", *TINY, "--num-batches", "2", "--device", "cpu"],
    "dlrm-zion": ["dlrm/dlrm.py", *TINY, "--num-batches", "2", "--device", "zion"],
    "cuda-style-cpu": ["cuda_dlrm_reference_style.py", "--num-batches", "2", "--mini-batch-size", "16"],
    "torchrec-cpu": ["torchrec_dlrm.py", "--device", "cpu"],
}


@pytest.mark.multiproc
@pytest.mark.parametrize("case", list(_TEARDOWN_CASES))
def test_gloos_worker_threads_are_joined_before_the_interpreter_exits(tmp_path, case):
    # A gloo worker still alive at interpreter teardown may drop the last
    # reference to a collective's tensor there and abort the rank ("terminate
    # called without an active exception", now and then, under load). So each
    # example frees its model and destroys the group, whose backend joins them.
    script = tmp_path / "threads_after_main.py"
    script.write_text(_THREADS_AFTER_MAIN)
    example, *argv = _TEARDOWN_CASES[case]
    run(torchrun(2, str(script), str(tmp_path), str(EXAMPLE.parent / example), *argv),
        timeout_s=TORCHRUN_TIMEOUT_S, check=True, env=child_env(OMP_NUM_THREADS="1"))
    for rank in range(2):
        threads = (tmp_path / f"threads.{rank}").read_text().split(",")
        assert "pt_gloo_runloop" not in threads and "gloo_tcp_loop" not in threads, (rank, threads)
