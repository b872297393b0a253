"""Timing-only mode against real mode on the DLRM example: on every config
that fits in real mode, the same modeled time per iteration (within 0.1%)
and the same peak HBM on every device (exactly), on one rank and on two.
Each run goes through ``python -m zion_emu run`` in a subprocess, bounded by
a timeout."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from processes import REPO, child_env, zion_emu_cli

EXAMPLE = REPO / "examples" / "dlrm" / "dlrm.py"
TIMEOUT_S = 600


def _report(tmp_path: Path, mode: str, nproc: int, config: str) -> dict:
    out = tmp_path / f"{mode}.json"
    zion_emu_cli("run", "--nproc", str(nproc), "--quiet-report", "--report", str(out), str(EXAMPLE),
                 "--config", config, "--device", "zion", "--num-batches", "3", "--no-progress",
                 timeout_s=TIMEOUT_S, env=child_env(ZION_MODE=mode, OMP_NUM_THREADS="1"))
    return json.loads(out.read_text())


@pytest.mark.slow
@pytest.mark.multiproc
@pytest.mark.timeout(2 * TIMEOUT_S)
@pytest.mark.parametrize("nproc", [1, 2])
@pytest.mark.parametrize("config", ["small", "paper", "mlperf"])  # mlperf at its default 1M-row cap
def test_timing_only_models_the_same_time_and_memory_as_real_mode(tmp_path, config, nproc):
    real = _report(tmp_path, "real", nproc, config)
    timing = _report(tmp_path, "timing", nproc, config)
    assert (real["mode"], timing["mode"]) == ("real", "timing")
    assert real["iterations"] == timing["iterations"] == 3
    assert timing["iteration_s"] == pytest.approx(real["iteration_s"], rel=1e-3)
    peaks = lambda r: {(d["rank"], d["device"]): d["peak_hbm_bytes"] for d in r["devices"]}  # noqa: E731
    assert len(peaks(real)) == nproc
    assert peaks(timing) == peaks(real)
