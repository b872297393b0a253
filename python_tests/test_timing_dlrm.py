"""Timing-only mode against real mode on the DLRM example: on every config
that fits in real mode, the same modeled time per iteration (within 0.1%)
and the same peak HBM on every device (exactly), on one rank and on two.
Each run goes through ``python -m zion_emu run`` in a subprocess, bounded by
a timeout; the two checks of a case share its pair of runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import pytest

from processes import REPO, child_env, zion_emu_cli

EXAMPLE = REPO / "examples" / "dlrm" / "dlrm.py"
TIMEOUT_S = 600
CONFIGS = ["small", "paper", "mlperf"]  # mlperf at its default 1M-row cap


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str, int], tuple[dict, dict]]:
    cache: dict[tuple[str, int], tuple[dict, dict]] = {}

    def run(mode: str, nproc: int, config: str, out: Path) -> dict:
        zion_emu_cli("run", "--nproc", str(nproc), "--quiet-report", "--report", str(out), str(EXAMPLE),
                     "--config", config, "--device", "zion", "--num-batches", "3", "--no-progress",
                     timeout_s=TIMEOUT_S, env=child_env(ZION_MODE=mode, OMP_NUM_THREADS="1"))
        return json.loads(out.read_text())

    def get(config: str, nproc: int) -> tuple[dict, dict]:
        if (config, nproc) not in cache:
            where = tmp_path_factory.mktemp(f"{config}-{nproc}")
            cache[config, nproc] = (run("real", nproc, config, where / "real.json"),
                                    run("timing", nproc, config, where / "timing.json"))
        return cache[config, nproc]

    return get


def _peaks(report: dict[str, Any]) -> dict[tuple[int, int], int]:
    return {(d["rank"], d["device"]): d["peak_hbm_bytes"] for d in report["devices"]}


@pytest.mark.slow
@pytest.mark.multiproc
@pytest.mark.timeout(2 * TIMEOUT_S)
@pytest.mark.parametrize("nproc", [1, 2])
@pytest.mark.parametrize("config", CONFIGS)
def test_timing_only_models_the_same_time_per_iteration(reports, config, nproc):
    real, timing = reports(config, nproc)
    assert (real["mode"], timing["mode"]) == ("real", "timing")
    assert real["iterations"] == timing["iterations"] == 3
    assert timing["iteration_s"] == pytest.approx(real["iteration_s"], rel=1e-3)


@pytest.mark.slow
@pytest.mark.multiproc
@pytest.mark.timeout(2 * TIMEOUT_S)
@pytest.mark.parametrize("nproc", [1, 2])
@pytest.mark.parametrize("config", CONFIGS)
def test_timing_only_accounts_the_same_peak_hbm(reports, config, nproc):
    real, timing = reports(config, nproc)
    assert len(_peaks(real)) == nproc
    assert _peaks(timing) == _peaks(real)


@pytest.mark.slow
@pytest.mark.multiproc
@pytest.mark.timeout(2 * TIMEOUT_S)
def test_torchrec_distributed_model_parallel_runs_in_timing_only_mode_at_real_modes_time_and_peak(tmp_path):
    # torchrec's planner and sharding unchanged: table-wise, row-wise,
    # column-wise and data-parallel tables, fbgemm's fused optimizer.
    script = REPO / "examples" / "torchrec_dlrm.py"
    out = {}
    for flag in ("", "--timing-only"):
        path = tmp_path / f"report{flag}.json"
        zion_emu_cli("run", *([flag] if flag else []), "--nproc", "2", "--quiet-report", "--report", str(path),
                     str(script), "--device", "zion", "--iters", "3", timeout_s=TIMEOUT_S,
                     env=child_env(OMP_NUM_THREADS="1"))
        out[flag] = json.loads(path.read_text())
    real, timing = out[""], out["--timing-only"]
    assert (real["mode"], timing["mode"]) == ("real", "timing")
    assert timing["iteration_s"] == pytest.approx(real["iteration_s"], rel=1e-3)
    assert _peaks(timing) == _peaks(real)
