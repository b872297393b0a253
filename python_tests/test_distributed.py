"""The ``zion`` torch.distributed backend, in real processes: results equal
gloo's on CPU bit for bit, each collective's modeled time equals the
collective model's for the same devices, and faults raise on every rank.

Each test spawns its ranks with torch.multiprocessing and bounds them with a
timeout; the workers assert, and a failing assertion fails the test with the
rank's traceback.
"""

from __future__ import annotations

import os
import time
from datetime import timedelta
from typing import Any, Callable

import pytest
import torch
import torch.distributed as dist

import zion_emu
import zion_emu.distributed as zd  # registers the backend
from zion_emu import _C, sim
from processes import PYTHON, run, spawn

JOIN_TIMEOUT_S = 120


def _spawn(worker: Any, nprocs: int, tmp_path: Any, *args: Any) -> list[int]:
    return spawn(worker, nprocs, tmp_path, *args, timeout_s=JOIN_TIMEOUT_S)


def _init(rank: int, nprocs: int, store: str, timeout_s: float = 60) -> "dist.ProcessGroup":
    """The zion default group, and a gloo group over the same ranks for reference results."""
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("zion", init_method=f"file://{store}", rank=rank, world_size=nprocs,
                            timeout=timedelta(seconds=timeout_s))
    torch.zion.set_device(rank)
    return dist.new_group(backend="gloo")


def _last(group: Any = None) -> dict[str, Any]:
    """This rank's last communication in ``group`` as the backend recorded it."""
    return zd.last_collective(group)


def _data(rank: int, shape: tuple[int, ...], seed: int = 0) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(1000 * seed + rank))


class _Clock:
    """Reads one rank's virtual clocks and checks a collective against the model."""

    def __init__(self, rank: int, nprocs: int, gloo: "dist.ProcessGroup") -> None:
        self.rank, self.nprocs, self.gloo = rank, nprocs, gloo
        self.platform = zion_emu.current_platform()
        self.launch_overhead = torch.zion.get_device_properties().launch_overhead_s

    def stream_time(self) -> float:
        return _C.device.stream_time(torch.zion.current_device(), torch.zion.current_stream().stream_id)

    def latest_start(self, among: list[int]) -> float:
        """Staggers the ranks (rank r issues r extra ops), lines host and streams
        up, and returns the latest start among the ranks ``among``: the
        communication can begin once the slowest host has issued it."""
        for _ in range(self.rank):
            torch.ones(4, device="zion").add_(1)
        torch.zion.synchronize()
        host = torch.tensor([zion_emu.clock()], dtype=torch.float64)
        hosts = [torch.empty_like(host) for _ in range(self.nprocs)]
        dist.all_gather(hosts, host, group=self.gloo)  # CPU tensors: no modeled time
        return max(hosts[r].item() for r in among) + self.launch_overhead

    def check(self, run: Callable[[], Any], op: str, nbytes: float, devices: list[int],
              all_to_all_bytes: list[list[float]] | None = None, among: list[int] | None = None,
              root: int = 0) -> dict[str, Any]:
        """Runs one communication among ``among`` (every rank by default) with
        its inputs already on the device, and checks its start, its end on the
        current stream and its duration against the model."""
        start = self.latest_start(among if among is not None else list(range(self.nprocs)))
        run()
        after = self.stream_time()
        record = _last()
        expected = sim.collective(self.platform, op, nbytes, devices, root=root, all_to_all_bytes=all_to_all_bytes).time
        assert record["op"] == op and record["devices"] == devices, record
        assert record["bytes"] == nbytes, record
        assert record["start"] == pytest.approx(start, rel=1e-12, abs=1e-15), (record, start)
        # The current stream, after wait(), stands at the common end.
        assert after - start == pytest.approx(expected, rel=1e-9), (record, expected)
        assert record["time"] == pytest.approx(expected, rel=1e-9)
        return record


def _collectives_worker(rank: int, nprocs: int, store: str) -> None:
    gloo = _init(rank, nprocs, store)
    clock = _Clock(rank, nprocs, gloo)
    n, devices = nprocs, list(range(nprocs))
    f32 = 4

    # all_reduce, every reduction gloo has.
    for op in (dist.ReduceOp.SUM, dist.ReduceOp.AVG, dist.ReduceOp.MIN, dist.ReduceOp.MAX, dist.ReduceOp.PRODUCT):
        x = _data(rank, (1000,), seed=1)
        z = x.to("zion")
        clock.check(lambda: dist.all_reduce(z, op=op), "all_reduce", 1000 * f32, devices)
        dist.all_reduce(x, op=op, group=gloo)
        assert torch.equal(z.cpu(), x), op

    # broadcast from rank 1
    x = _data(rank, (257,), seed=2)
    z = x.to("zion")
    clock.check(lambda: dist.broadcast(z, src=1), "broadcast", 257 * f32, devices, root=1)
    dist.broadcast(x, src=1, group=gloo)
    assert torch.equal(z.cpu(), x)

    # reduce to rank 1 (only the root's result is defined)
    x = _data(rank, (300,), seed=9)
    z = x.to("zion")
    clock.check(lambda: dist.reduce(z, dst=1), "reduce", 300 * f32, devices, root=1)
    dist.reduce(x, dst=1, group=gloo)
    if rank == 1:
        assert torch.equal(z.cpu(), x)

    # all_gather_into_tensor and all_gather: sim counts the per-rank output
    x = _data(rank, (250,), seed=3)
    z, out = x.to("zion"), torch.empty(n * 250, device="zion")
    clock.check(lambda: dist.all_gather_into_tensor(out, z), "all_gather", n * 250 * f32, devices)
    ref = torch.empty(n * 250)
    dist.all_gather_into_tensor(ref, x, group=gloo)
    assert torch.equal(out.cpu(), ref)
    outs = [torch.empty(250, device="zion") for _ in range(n)]
    clock.check(lambda: dist.all_gather(outs, z), "all_gather", n * 250 * f32, devices)
    assert torch.equal(torch.cat([o.cpu() for o in outs]), ref)

    # reduce_scatter_tensor: sim counts the per-rank input
    x = _data(rank, (n * 125,), seed=4)
    z, out = x.to("zion"), torch.empty(125, device="zion")
    clock.check(lambda: dist.reduce_scatter_tensor(out, z), "reduce_scatter", n * 125 * f32, devices)
    ref = torch.empty(125)
    dist.reduce_scatter_tensor(ref, x, group=gloo)
    assert torch.equal(out.cpu(), ref)
    chunks = [c.to("zion") for c in x.chunk(n)]
    clock.check(lambda: dist.reduce_scatter(out, chunks), "reduce_scatter", n * 125 * f32, devices)
    dist.reduce_scatter(ref, [c.contiguous() for c in x.chunk(n)], group=gloo)  # gloo may sum in another order here
    assert torch.equal(out.cpu(), ref)

    # reduce_scatter of uneven entries (rank j gets j + 3 elements): gloo's
    # result, priced as ProcessGroupNCCL runs it, one reduce per rank in a
    # group, which the model prices as one reduce of the whole input
    pieces = [j + 3 for j in range(n)]
    x = _data(rank, (sum(pieces),), seed=8)
    chunks = [c.to("zion") for c in x.split(pieces)]
    out = torch.empty(pieces[rank], device="zion")
    clock.check(lambda: dist.reduce_scatter(out, chunks), "reduce", sum(pieces) * f32, devices)
    assert _last()["call"] == "reduce_scatter"
    ref = torch.empty(pieces[rank])
    dist.reduce_scatter(ref, [c.contiguous() for c in x.split(pieces)], group=gloo)
    assert torch.equal(out.cpu(), ref)

    # all_gather of uneven entries (rank j contributes j + 2 elements), which
    # gloo refuses and NCCL runs: ProcessGroupNCCL broadcasts each rank's
    # input from that rank in one group, which the model prices as one
    # broadcast of the whole output; the entries are the ranks' inputs
    pieces = [j + 2 for j in range(n)]
    z = _data(rank, (pieces[rank],), seed=10).to("zion")
    outs = [torch.full((pieces[j],), -1.0, device="zion") for j in range(n)]
    clock.check(lambda: dist.all_gather(outs, z), "broadcast", sum(pieces) * f32, devices, root=0)
    assert _last()["call"] == "all_gather"
    for j in range(n):
        assert torch.equal(outs[j].cpu(), _data(j, (pieces[j],), seed=10)), j

    # all_to_all_single, even splits
    x = _data(rank, (n * 6, 5), seed=5)
    z, out = x.to("zion"), torch.empty(n * 6, 5, device="zion")
    clock.check(lambda: dist.all_to_all_single(out, z), "all_to_all", n * 30 * f32, devices)
    ref = torch.empty(n * 6, 5)
    dist.all_to_all_single(ref, x, group=gloo)
    assert torch.equal(out.cpu(), ref)

    # all_to_all_single, uneven: rank i sends rows[i][j] rows of 5 floats to rank j
    rows = [[(i + 2 * j) % 3 + 1 for j in range(n)] for i in range(n)]
    send, recv = rows[rank], [rows[j][rank] for j in range(n)]
    x = _data(rank, (sum(send), 5), seed=6)
    z, out = x.to("zion"), torch.empty(sum(recv), 5, device="zion")
    matrix = [[float(r * 5 * f32) for r in row] for row in rows]
    largest = max(sum(row) for row in matrix)
    clock.check(lambda: dist.all_to_all_single(out, z, recv, send), "all_to_all", largest, devices,
                all_to_all_bytes=matrix)
    ref = torch.empty(sum(recv), 5)
    dist.all_to_all_single(ref, x, recv, send, group=gloo)
    assert torch.equal(out.cpu(), ref)

    # barrier: an all-reduce of one byte, and the host waits for it
    record = clock.check(lambda: dist.barrier(), "all_reduce", 1, devices)
    assert zion_emu.clock() == pytest.approx(record["end"], rel=1e-12)

    # send/recv in pairs (0 -> 1, 2 -> 3): send_recv between the two devices
    peer = rank ^ 1
    x = _data(rank, (333,), seed=7)
    z = x.to("zion") if rank % 2 == 0 else torch.empty(333, device="zion")
    pair = [rank, peer] if rank % 2 == 0 else [peer, rank]
    clock.check(lambda: dist.send(z, peer) if rank % 2 == 0 else dist.recv(z, peer), "send_recv", 333 * f32, pair,
                among=pair)
    if rank % 2 == 1:
        assert torch.equal(z.cpu(), _data(peer, (333,), seed=7))

    # async: the collective runs on the communication stream; the current
    # stream waits only at wait()
    z = torch.ones(64, device="zion")
    torch.zion.synchronize()
    before = clock.stream_time()
    work = dist.all_reduce(z, async_op=True)
    assert clock.stream_time() == before
    work.wait()
    assert clock.stream_time() == pytest.approx(_last()["end"], rel=1e-12)
    assert torch.equal(z.cpu(), torch.full((64,), float(n)))
    dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.multiproc
@pytest.mark.parametrize("nprocs", [2, 4])
def test_collectives_equal_gloo_and_take_the_modeled_time(tmp_path, nprocs):
    _spawn(_collectives_worker, nprocs, tmp_path)


def _freed_at_once_worker(rank: int, nprocs: int, store: str) -> None:
    _init(rank, nprocs, store)
    base = torch.zion.memory_allocated()
    late = []
    # gloo's worker thread drops its reference to a finished work a moment
    # after wait() returns: the HBM of a collective's tensors must not wait
    # for it, or peaks depend on thread timing. Many rounds, so a view that
    # owned the bytes would be caught holding them.
    for i in range(300):
        x = torch.ones(4096, device="zion")
        gathered = torch.empty(4096 * nprocs, device="zion")
        dist.broadcast(x, 0)
        dist.all_reduce(x)
        dist.all_gather_into_tensor(gathered, x)
        del x, gathered
        if torch.zion.memory_allocated() != base:
            late.append(i)
    assert late == [], f"rank {rank}: HBM still held after the call returned in rounds {late[:10]}"
    dist.destroy_process_group()


@pytest.mark.multiproc
def test_a_collectives_hbm_is_freed_when_the_caller_lets_go(tmp_path):
    _spawn(_freed_at_once_worker, 2, tmp_path)


def _two_rank_all_reduce_worker(rank: int, nprocs: int, store: str) -> None:
    _init(rank, nprocs, store)
    z = torch.ones(4, device="zion")  # 16 bytes
    dist.all_reduce(z)
    rec = _last()
    # zion: OAMs 0 and 1 share a 25 GB/s link per direction, 600 ns apart; a
    # 2-rank ring takes 2(n-1) steps of alpha + S/(nB), plus the platform's
    # 6.6 us base latency: 6.6 us + 2 x (0.6 us + 16 B / (2 x 25 GB/s)) = 7.80064 us.
    assert rec["algorithm"] == "ring"
    assert rec["time"] == pytest.approx(6.6e-6 + 2 * (0.6e-6 + 16 / (2 * 25e9)), rel=1e-9)
    dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.multiproc
def test_two_rank_all_reduce_costs_base_latency_plus_two_ring_steps(tmp_path):
    _spawn(_two_rank_all_reduce_worker, 2, tmp_path)


def _sub_group_worker(rank: int, nprocs: int, store: str) -> None:
    gloo = _init(rank, nprocs, store)
    clock = _Clock(rank, nprocs, gloo)
    odd = dist.new_group([1, 3])
    if rank in (1, 3):
        x = _data(rank, (100,), seed=8)
        z = x.to("zion")
        # Only OAMs 1 and 3 take part, and the model prices just them.
        dist.all_reduce(z, group=odd)
        rec = _last(odd)
        assert rec["devices"] == [1, 3]
        assert rec["time"] == pytest.approx(sim.collective_time(clock.platform, "all_reduce", 400, [1, 3]), rel=1e-9)
        dist.all_reduce(x, group=dist.new_group([1, 3], backend="gloo"))
        assert torch.equal(z.cpu(), x)
    else:
        dist.new_group([1, 3], backend="gloo")  # every rank takes part in new_group
    dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.multiproc
def test_a_sub_group_is_priced_on_its_own_devices(tmp_path):
    _spawn(_sub_group_worker, 4, tmp_path)


def _faults_worker(rank: int, nprocs: int, store: str) -> None:
    _init(rank, nprocs, store, timeout_s=30)

    # Sizes that differ across ranks raise on every rank (gloo itself would
    # abort the process), and the group stays usable.
    with pytest.raises(RuntimeError, match=r"sizes differ across ranks \(elements per rank: rank 0: 4, rank 1: 5\)"):
        dist.all_reduce(torch.ones(4 + rank, device="zion"))
    with pytest.raises(RuntimeError, match="dtypes differ across ranks"):
        dist.all_reduce(torch.ones(4, device="zion", dtype=torch.float32 if rank == 0 else torch.float64))
    send = [2, 1] if rank == 0 else [1, 1]
    recv = [2, 2] if rank == 0 else [1, 1]  # rank 0 expects 2 rows from rank 1, which sends 1
    with pytest.raises(RuntimeError, match="rank 1 sends 1 elements to rank 0, which expects 2"):
        dist.all_to_all_single(torch.empty(sum(recv), device="zion"), torch.ones(sum(send), device="zion"), recv, send)

    # A CPU tensor in a zion collective: rank 0 passes CPU outputs; it is told
    # which device was wanted, and rank 1 stops too.
    outs = [torch.empty(2) if rank == 0 else torch.empty(2, device="zion") for _ in range(nprocs)]
    expected = "wanted device 'zion'" if rank == 0 else "failed on rank\\(s\\) 0"
    with pytest.raises(RuntimeError, match=expected):
        dist.all_gather(outs, torch.ones(2, device="zion"))
    # One rank's tensors on the CPU, the other's on zion: the CPU call would go
    # through gloo unmodeled, the zion one through the model; both ranks raise.
    x = torch.ones(2) if rank == 0 else torch.ones(2, device="zion")
    with pytest.raises(RuntimeError, match=r"ranks pass tensors on different devices \(rank 0: cpu, rank 1: zion\)"):
        dist.all_reduce(x)

    z = torch.full((3,), float(rank + 1), device="zion")
    dist.all_reduce(z)
    assert torch.equal(z.cpu(), torch.full((3,), 3.0))
    dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.multiproc
def test_mismatches_raise_on_every_rank_and_a_cpu_tensor_in_a_zion_call_is_refused(tmp_path):
    _spawn(_faults_worker, 2, tmp_path)


def _placement_worker(rank: int, nprocs: int, store: str) -> None:
    os.environ["LOCAL_RANK"] = "9"  # platform zion has OAMs 0..7
    with pytest.raises(Exception, match="LOCAL_RANK 9 is not an OAM of platform 'zion'"):
        _init(rank, nprocs, store, timeout_s=20)


@pytest.mark.multiproc
def test_a_rank_beyond_the_platform_is_an_error_naming_its_size(tmp_path):
    _spawn(_placement_worker, 1, tmp_path)


def _ddp_worker(rank: int, nprocs: int, store: str) -> None:
    import copy

    from torch.nn.parallel import DistributedDataParallel as DDP

    gloo = _init(rank, nprocs, store)
    torch.manual_seed(0)
    # What torch 2.13's DDP asks of a custom backend: an all_gather of the
    # parameter shapes and a broadcast of the module states (bucketed by
    # _broadcast_coalesced) at construction; before each forward a broadcast
    # of the buffers (BatchNorm's running statistics); an all_reduce per
    # gradient bucket, through Work.getFuture(). It never calls the
    # coalescing API (allreduce_coalesced, start/endCoalescing).
    cpu_model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    zion_model = copy.deepcopy(cpu_model).to("zion")
    # 200-byte buckets: the 6 parameters go out in several all-reduces.
    bucket_mb = 200 / 2**20
    zion_ddp, cpu_ddp = DDP(zion_model, bucket_cap_mb=bucket_mb), DDP(cpu_model, process_group=gloo, bucket_cap_mb=bucket_mb)
    zion_opt = torch.optim.SGD(zion_ddp.parameters(), lr=0.1)
    cpu_opt = torch.optim.SGD(cpu_ddp.parameters(), lr=0.1)
    zion_losses, cpu_losses = [], []
    for step in range(4):
        x = torch.randn(4, 8, generator=torch.Generator().manual_seed(10 * step + rank))
        # gloo DDP first: torch 2.13 can deadlock destroying a gloo group right
        # after its last backward (a finished work holding a Python object in
        # its thread state waits for the GIL on gloo's worker, which the
        # destructor joins holding the GIL); the zion backend avoids that.
        for ddp, opt, losses, inp in ((cpu_ddp, cpu_opt, cpu_losses, x), (zion_ddp, zion_opt, zion_losses, x.to("zion"))):
            loss = ddp(inp).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
    assert zion_losses == cpu_losses
    for pz, pc in zip(zion_model.parameters(), cpu_model.parameters()):
        assert torch.equal(pz.detach().cpu(), pc.detach())
    for bz, bc in zip(zion_model.buffers(), cpu_model.buffers()):
        assert torch.equal(bz.cpu(), bc)
    dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.multiproc
def test_ddp_on_zion_trains_like_gloo_ddp_on_cpu(tmp_path):
    _spawn(_ddp_worker, 2, tmp_path)


DDP_TIMES_SCRIPT = """
import sys, torch, torch.distributed as dist, zion_emu
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("zion", init_method="file://" + sys.argv[1], rank=0, world_size=1)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 1)).to("zion")
ddp = DDP(model)
ddp._set_ddp_runtime_logging_sample_rate(1)  # log every iteration
opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
x = torch.randn(64, 256, device="zion")
for _ in range(5):  # past the first iterations, whose forwards also rebuild the buckets
    opt.zero_grad()
    ddp(x).sum().backward()
    opt.step()
logged = ddp._get_ddp_logging_data()
start, end = torch.zion.Event(enable_timing=True), torch.zion.Event(enable_timing=True)
start.record()
model(x)  # the same forward, outside DDP, between two zion events
end.record()
end.synchronize()
print(logged["forward_compute_time"], round(start.elapsed_time(end) * 1e6), logged["backward_compute_time"],
      logged["backward_comm_time"])
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_ddp_logs_modeled_forward_backward_and_communication_times_without_a_warning(tmp_path):
    """DDP asks for a timer by device type; zion's reads the modeled clock, as CUDA's reads CUDA events."""
    script = tmp_path / "ddp_times.py"
    script.write_text(DDP_TIMES_SCRIPT)
    proc = run([PYTHON, str(script), str(tmp_path / "store")], timeout_s=JOIN_TIMEOUT_S, check=True)
    assert "Time stats are currently only collected" not in proc.stderr
    forward_ns, event_ns, backward_ns, comm_ns = map(int, proc.stdout.split())
    assert forward_ns == event_ns > 0  # modeled nanoseconds, not host time
    assert backward_ns > 0 and comm_ns > 0


EARLY_EXIT_TIMEOUT_S = 5


def _early_exit_worker(rank: int, nprocs: int, store: str) -> None:
    _init(rank, nprocs, store, timeout_s=EARLY_EXIT_TIMEOUT_S)
    dist.barrier()  # every rank is up
    if rank == 1:
        os._exit(0)  # leaves without a word
    begin = time.monotonic()
    with pytest.raises(dist.DistBackendError, match=f"all_reduce on rank {rank} of 4: lost the other ranks"):
        dist.all_reduce(torch.ones(4, device="zion"))
    assert time.monotonic() - begin < EARLY_EXIT_TIMEOUT_S + 5


@pytest.mark.slow
@pytest.mark.multiproc
def test_a_rank_that_exits_early_makes_the_others_raise_within_the_timeout(tmp_path):
    # Ranks next to the one that left see its connection close; the others
    # wait on them no longer than the group's timeout. Every process ends
    # and is reaped: none is left running or a zombie.
    begin = time.monotonic()
    pids = _spawn(_early_exit_worker, 4, tmp_path)
    assert time.monotonic() - begin < JOIN_TIMEOUT_S
    assert not [pid for pid in pids if os.path.exists(f"/proc/{pid}")]
