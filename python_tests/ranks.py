"""Spawning the ranks of a multi-process test, bounded by a timeout."""

from __future__ import annotations

import time
from typing import Any, Callable

import pytest
import torch.multiprocessing as mp


def spawn(worker: Callable[..., None], nprocs: int, tmp_path: Any, *args: Any, timeout_s: float) -> list[int]:
    """Runs ``worker(rank, nprocs, store_path, *args)`` in ``nprocs`` processes
    and returns their pids, all ended and reaped; fails the test past ``timeout_s``."""
    store = str(tmp_path / "store")
    ctx = mp.start_processes(worker, args=(nprocs, store, *args), nprocs=nprocs, join=False, start_method="spawn")
    deadline = time.monotonic() + timeout_s
    try:
        while not ctx.join(timeout=1):
            if time.monotonic() > deadline:
                pytest.fail(f"{worker.__name__} on {nprocs} ranks did not finish in {timeout_s} s")
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()
            p.join(timeout=10)
    return [p.pid for p in ctx.processes]
