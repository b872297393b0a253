"""bench/timing_mode_bench.py, run small: its table has every mode and column,
real and timing-only mode agree on the modeled time and peak HBM, and bad
arguments are refused. The rates themselves are not checked here (they are
the machine's); bench/README.md records them."""

from __future__ import annotations

import pytest

from processes import PYTHON, REPO, child_env, run


@pytest.mark.slow
def test_the_bench_prints_every_mode_and_the_modes_agree() -> None:
    done = run([PYTHON, str(REPO / "bench" / "timing_mode_bench.py"), "--configs", "tiny", "--num-batches", "3",
                "--repeat", "2"], timeout_s=300, check=True, env=child_env(OMP_NUM_THREADS="1"), cwd=REPO)
    lines = done.stdout.splitlines()
    assert "median of 2 run(s) per mode" in lines[0]
    header = [c.strip() for c in lines[1].strip("|").split("|")]
    assert "ops/s of the training step, batches made ahead" in header
    rows = {cells[1]: cells for cells in ([c.strip() for c in l.strip("|").split("|")] for l in lines[3:9])}
    assert set(rows) == {"real", "timing", "cpu eager", "timing / real", "timing / cpu eager",
                         "timing, each run's training-step ops/s"}
    ahead = header.index("ops/s of the training step, batches made ahead")
    for mode in ("real", "timing", "cpu eager"):
        assert len(rows[mode]) == len(header)
        assert float(rows[mode][ahead].replace(",", "")) > 0
    assert rows["timing / real"][header.index("modeled ms/iter")] == "equal"
    assert rows["real"][header.index("modeled ms/iter")] == rows["timing"][header.index("modeled ms/iter")]
    assert len(rows["timing, each run's training-step ops/s"][ahead].split(", ")) == 2


def test_a_repeat_below_one_is_refused() -> None:
    done = run([PYTHON, str(REPO / "bench" / "timing_mode_bench.py"), "--repeat", "0"], timeout_s=60, cwd=REPO)
    assert done.returncode == 2
    assert "--repeat must be at least 1, got 0" in done.stderr
