"""The handshake through shared memory: ranks on one host agree on each
collective through a segment instead of a gloo all-gather; the verdicts, the
errors and the modeled times are those of the gloo path (ZION_HANDSHAKE=gloo),
a dead or late rank is an error within the timeout, and no segment stays in
/dev/shm."""

from __future__ import annotations

import glob
import json
import os
import signal
import time
from datetime import timedelta
from typing import Any

import pytest
import torch
import torch.distributed as dist

import zion_emu.distributed as zd  # registers the backend
from processes import spawn

JOIN_TIMEOUT_S = 120


def _segments(pid: int) -> list[str]:
    """The handshake segments in /dev/shm that the process ``pid`` created."""
    return glob.glob(f"/dev/shm/zion-emu-handshake-{os.getuid()}-{pid}-*")


def _init(rank: int, nprocs: int, store: str, timeout_s: float, handshake: str | None) -> None:
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    if handshake is None:
        os.environ.pop("ZION_HANDSHAKE", None)
    else:
        os.environ["ZION_HANDSHAKE"] = handshake
    dist.init_process_group("zion", init_method=f"file://{store}", rank=rank, world_size=nprocs,
                            timeout=timedelta(seconds=timeout_s))
    torch.zion.set_device(rank)


def _records_worker(rank: int, nprocs: int, store: str, handshake: str | None, out: str) -> None:
    _init(rank, nprocs, store, 60, handshake)
    expected = "gloo" if handshake == "gloo" else "shm"
    assert zd.backend().handshake == expected
    # The segment (rank 0 creates it) is gone from /dev/shm once every rank has mapped it.
    if rank == 0:
        assert not _segments(os.getpid())
    records = []
    x = torch.arange(6, dtype=torch.float32, device="zion") * (rank + 1)
    torch.zion.synchronize()
    for step in range(3):
        dist.all_reduce(x)
        records.append(zd.last_collective())
        y = torch.empty(6 * nprocs, device="zion")
        dist.all_gather_into_tensor(y, x)
        records.append(zd.last_collective())
        dist.broadcast(x, src=step % nprocs)
        records.append(zd.last_collective())
        send = [rank + 1 + j for j in range(nprocs)]  # uneven splits
        recv = [j + 1 + rank for j in range(nprocs)]
        got = torch.empty(sum(recv), device="zion")
        dist.all_to_all_single(got, torch.full((sum(send),), float(rank), device="zion"), recv, send)
        records.append(zd.last_collective())
        assert torch.equal(got.cpu(), torch.cat([torch.full((recv[j],), float(j)) for j in range(nprocs)]))
    dist.barrier()
    records.append(zd.last_collective())
    # A mismatch raises on every rank through either path, and the group stays usable.
    with pytest.raises(RuntimeError, match=r"sizes differ across ranks \(elements per rank: rank 0: 4, rank 1: 5"):
        dist.all_reduce(torch.ones(4 + rank, device="zion"))
    # reduce_scatter: entry j of each rank's list must have rank j's output size
    entries = [torch.ones(3 + (rank == 1 and j == 0), device="zion") for j in range(nprocs)]
    with pytest.raises(RuntimeError, match=r"rank 1's input list has 4 elements at index 0, where rank 0's output has 3"):
        dist.reduce_scatter(torch.empty(3, device="zion"), entries)
    # all_gather: entry i of each rank's output list must have rank i's input size
    entries = [torch.empty(3 + (rank == 0 and j == 1), device="zion") for j in range(nprocs)]
    with pytest.raises(RuntimeError, match=r"rank 1's input has 3 elements, where rank 0's output list has 4 at index 1"):
        dist.all_gather(entries, torch.ones(3, device="zion"))
    with pytest.raises(RuntimeError, match=r"the output list's entry for this rank \(index 0\) has 4 elements; the input has 3"
                       if rank == 0 else "failed on rank"):
        dist.all_gather([torch.empty(3 + (j == 0), device="zion") for j in range(nprocs)], torch.ones(3, device="zion"))
    with pytest.raises(RuntimeError, match="ranks are in different collectives"):
        if rank == 0:
            dist.broadcast(torch.ones(2, device="zion"), src=0)
        else:
            dist.all_reduce(torch.ones(2, device="zion"))
    z = torch.full((3,), float(rank + 1), device="zion")
    dist.all_reduce(z)
    assert torch.equal(z.cpu(), torch.full((3,), float(nprocs * (nprocs + 1) // 2)))
    with open(f"{out}-{rank}.json", "w") as f:
        json.dump([{k: r[k] for k in ("call", "start", "end", "algorithm", "devices", "bytes")} for r in records], f)
    dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.multiproc
def test_the_shared_memory_handshake_prices_and_refuses_as_the_gloo_one_does(tmp_path):
    nprocs = 3
    results = {}
    for handshake in (None, "gloo"):
        run = tmp_path / (handshake or "shm")
        run.mkdir()
        pids = spawn(_records_worker, nprocs, run, handshake, str(run / "records"), timeout_s=JOIN_TIMEOUT_S)
        assert not _segments(pids[0])
        results[handshake] = [json.loads((run / f"records-{r}.json").read_text()) for r in range(nprocs)]
    # Bit-identical modeled times, collective by collective, rank by rank.
    assert results[None] == results["gloo"]
    assert len(results[None][0]) == 13 and results[None][0][-1]["end"] > results[None][0][0]["end"] > 0


def _mixed_choice_worker(rank: int, nprocs: int, store: str) -> None:
    # One rank cannot take the shared-memory path (told so here; on another
    # host it could not map the segment): every rank goes through gloo alike.
    _init(rank, nprocs, store, 60, "gloo" if rank == 1 else None)
    assert zd.backend().handshake == "gloo"
    x = torch.full((3,), float(rank + 1), device="zion")
    dist.all_reduce(x)
    assert torch.equal(x.cpu(), torch.full((3,), 6.0))
    with pytest.raises(RuntimeError, match="dtypes differ across ranks"):
        dist.all_reduce(torch.ones(4, device="zion", dtype=torch.float32 if rank == 0 else torch.float64))
    dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.multiproc
def test_when_one_rank_cannot_use_shared_memory_every_rank_uses_gloo(tmp_path):
    pids = spawn(_mixed_choice_worker, 3, tmp_path, timeout_s=JOIN_TIMEOUT_S)
    assert not _segments(pids[0])


def _dead_rank_worker(rank: int, nprocs: int, store: str, timeout_s: float) -> None:
    _init(rank, nprocs, store, timeout_s, None)
    assert zd.backend().handshake == "shm"
    dist.all_reduce(torch.ones(2, device="zion"))  # every rank is up
    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)  # dies without a word
    begin = time.monotonic()
    # Seen directly, or relayed by the other survivor if it saw it first.
    with pytest.raises(dist.DistBackendError,
                       match=rf"all_reduce on rank {rank} of {nprocs}: lost the other ranks .* shared memory: "
                             r"(rank [02] gave up on the group earlier: )?rank 1 \(pid \d+\) has exited"):
        dist.all_reduce(torch.ones(4, device="zion"))
    assert time.monotonic() - begin < 10  # seen dead, long before the timeout
    os._exit(0)  # rank 1 is gone: no orderly teardown of the group


@pytest.mark.slow
@pytest.mark.multiproc
def test_a_killed_rank_is_an_error_naming_it_on_the_others_and_leaves_no_segment(tmp_path):
    store = str(tmp_path / "store")
    import torch.multiprocessing as mp

    ctx = mp.start_processes(_dead_rank_worker, args=(3, store, 60.0), nprocs=3, join=False, start_method="spawn")
    try:
        deadline = time.monotonic() + JOIN_TIMEOUT_S
        for p in ctx.processes:
            p.join(timeout=max(1.0, deadline - time.monotonic()))
        codes = [p.exitcode for p in ctx.processes]
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()
            p.join(timeout=10)
    assert codes == [0, -signal.SIGKILL, 0]
    assert not _segments(ctx.processes[0].pid)


def _left_rank_worker(rank: int, nprocs: int, store: str) -> None:
    _init(rank, nprocs, store, 60, None)
    dist.all_reduce(torch.ones(2, device="zion"))
    if rank == 1:
        dist.destroy_process_group()  # leaves the group, and lives on
        time.sleep(8)
        os._exit(0)
    begin = time.monotonic()
    with pytest.raises(dist.DistBackendError,
                       match=r"shared memory: (rank [02] gave up on the group earlier: )?rank 1 has left the group"):
        dist.all_reduce(torch.ones(4, device="zion"))
    assert time.monotonic() - begin < 10  # told at once, not at the timeout
    os._exit(0)


@pytest.mark.slow
@pytest.mark.multiproc
def test_a_rank_that_destroyed_its_group_is_an_error_naming_it_on_the_others(tmp_path):
    spawn(_left_rank_worker, 3, tmp_path, timeout_s=JOIN_TIMEOUT_S)


def _late_rank_worker(rank: int, nprocs: int, store: str, timeout_s: float) -> None:
    _init(rank, nprocs, store, timeout_s, None)
    dist.all_reduce(torch.ones(2, device="zion"))
    if rank == 1:
        time.sleep(timeout_s + 3)
        # Rank 0 gave up and left: this rank is told why.
        with pytest.raises(dist.DistBackendError,
                           match=r"shared memory: rank 0 gave up on the group earlier: rank\(s\) 1 did not issue it "
                                 r"within the group's timeout"):
            dist.all_reduce(torch.ones(4, device="zion"))
        os._exit(0)
    begin = time.monotonic()
    with pytest.raises(dist.DistBackendError,
                       match=rf"shared memory: rank\(s\) 1 did not issue it within the group's timeout \({timeout_s:g} s\)"):
        dist.all_reduce(torch.ones(4, device="zion"))
    assert timeout_s <= time.monotonic() - begin < timeout_s + 5
    os._exit(0)


@pytest.mark.slow
@pytest.mark.multiproc
def test_a_late_rank_is_an_error_at_the_groups_timeout(tmp_path):
    spawn(_late_rank_worker, 2, tmp_path, 2.0, timeout_s=JOIN_TIMEOUT_S)


def _forked_worker(rank: int, nprocs: int, store: str) -> None:
    _init(rank, nprocs, store, 60, None)
    x = torch.ones(2, device="zion")
    dist.all_reduce(x)
    if rank == 0:
        child = os.fork()
        if child == 0:
            code = 3
            try:
                dist.all_reduce(torch.ones(2, device="zion"))
            except RuntimeError as e:
                code = 0 if "forked from a rank" in str(e) else 4
            os._exit(code)
        deadline = time.monotonic() + 60
        while True:
            done, status = os.waitpid(child, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                os.kill(child, signal.SIGKILL)
                os.waitpid(child, 0)
                raise AssertionError("the forked child hung in a collective")
            time.sleep(0.05)
        assert os.waitstatus_to_exitcode(status) == 0
    # The ranks go on as before: the child's attempt wrote nothing to the segment.
    dist.all_reduce(x)
    assert torch.equal(x.cpu(), torch.full((2,), 4.0))
    dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.multiproc
def test_a_forked_child_of_a_rank_is_refused_and_the_ranks_go_on(tmp_path):
    spawn(_forked_worker, 2, tmp_path, timeout_s=JOIN_TIMEOUT_S)


def test_a_bad_handshake_choice_is_refused_naming_the_choices(monkeypatch):
    monkeypatch.setenv("ZION_HANDSHAKE", "pipes")
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")
    store = dist.HashStore()
    gloo = dist.ProcessGroupGloo(store, 0, 1, timedelta(seconds=10))
    from zion_emu._C import dist as _dist

    with pytest.raises(ValueError, match="ZION_HANDSHAKE is 'pipes'; use 'shm' .* or 'gloo'"):
        _dist.ProcessGroupZion(store, gloo, 0, 1, global_rank=0)
