"""The ``zion`` backend's rooted and list collectives, coalescing, batched
point-to-point and CPU tensors, in real processes: results equal gloo's on
CPU, and each collective's modeled time equals the collective model's for the
same devices.

gather and scatter have no operation of their own in the model: each is the
all_to_all whose only non-zero column (gather) or row (scatter) is the
root's, so the model prices the root's links carrying n - 1 tensors. The
size recorded is the root's buffer (n x the per-rank tensor), as nccl-tests
counts gather and scatter.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist

import zion_emu
from zion_emu import distributed as zd
from zion_emu import sim
from processes import run_python
from test_distributed import _Clock, _data, _init, _last, _spawn

F32 = 4


def _rooted(n: int, root: int, nbytes: float, to_root: bool) -> list[list[float]]:
    """Bytes rank i sends rank j in a gather (to_root) or scatter from ``root``."""
    return [[float(nbytes) if (j == root if to_root else i == root) else 0.0 for j in range(n)] for i in range(n)]


def _list_collectives_worker(rank: int, nprocs: int, store: str) -> None:
    gloo = _init(rank, nprocs, store)
    clock = _Clock(rank, nprocs, gloo)
    n, devices = nprocs, list(range(nprocs))

    # gather to rank 1
    x = _data(rank, (100,), seed=11)
    z = x.to("zion")
    gathered = [torch.empty(100, device="zion") for _ in range(n)] if rank == 1 else None
    record = clock.check(lambda: dist.gather(z, gathered, dst=1), "all_to_all", n * 100 * F32, devices,
                         all_to_all_bytes=_rooted(n, 1, 100 * F32, to_root=True))
    assert record["call"] == "gather"
    ref = [torch.empty(100) for _ in range(n)] if rank == 1 else None
    dist.gather(x, ref, dst=1, group=gloo)
    if rank == 1:
        assert all(torch.equal(g.cpu(), r) for g, r in zip(gathered, ref))
    if n == 4:
        # The fully connected zion fabric: the three senders' 400 bytes cross
        # their own links to the root at once: 6.6 us base latency + 0.6 us
        # link latency + 400 B / 25 GB/s = 7.216 us.
        assert record["algorithm"] == "direct"
        assert record["time"] == pytest.approx(6.6e-6 + 0.6e-6 + 400 / 25e9, rel=1e-9)

    # scatter from rank 0
    pieces = [_data(j, (3, 7), seed=12) for j in range(n)] if rank == 0 else None
    out = torch.empty(3, 7, device="zion")
    zion_pieces = [p.to("zion") for p in pieces] if rank == 0 else None
    record = clock.check(lambda: dist.scatter(out, zion_pieces, src=0), "all_to_all", n * 21 * F32, devices,
                         all_to_all_bytes=_rooted(n, 0, 21 * F32, to_root=False))
    assert record["call"] == "scatter"
    ref = torch.empty(3, 7)
    dist.scatter(ref, pieces, src=0, group=gloo)
    assert torch.equal(out.cpu(), ref) and torch.equal(ref, _data(rank, (3, 7), seed=12))

    # all_to_all with tensor lists, even: one closed form, as all_to_all_single
    ins = [_data(rank, (4, 2), seed=13 + j) for j in range(n)]
    outs = [torch.empty(4, 2, device="zion") for _ in range(n)]
    zins = [t.to("zion") for t in ins]
    record = clock.check(lambda: dist.all_to_all(outs, zins), "all_to_all", n * 8 * F32, devices)
    assert record["call"] == "all_to_all"
    ref = [torch.empty(4, 2) for _ in range(n)]
    dist.all_to_all(ref, ins, group=gloo)
    assert all(torch.equal(o.cpu(), r) for o, r in zip(outs, ref))

    # all_to_all with tensor lists, uneven: rank i sends rows[i][j] rows of 3
    # floats to rank j. gloo's list form takes equal sizes only; its
    # all_to_all_single over the concatenated lists moves the same elements.
    rows = [[(i + 2 * j) % 3 + 1 for j in range(n)] for i in range(n)]
    ins = [_data(rank, (rows[rank][j], 3), seed=20 + j) for j in range(n)]
    outs = [torch.empty(rows[j][rank], 3, device="zion") for j in range(n)]
    zins = [t.to("zion") for t in ins]
    matrix = [[float(r * 3 * F32) for r in row] for row in rows]
    clock.check(lambda: dist.all_to_all(outs, zins), "all_to_all", max(sum(row) for row in matrix), devices,
                all_to_all_bytes=matrix)
    send, recv = [t.numel() for t in ins], [rows[j][rank] * 3 for j in range(n)]
    ref = torch.empty(sum(recv))
    dist.all_to_all_single(ref, torch.cat([t.flatten() for t in ins]), recv, send, group=gloo)
    assert torch.equal(torch.cat([o.cpu().flatten() for o in outs]), ref)
    for j in range(n):  # and each piece is what rank j meant for this rank
        assert torch.equal(outs[j].cpu(), _data(j, (rows[j][rank], 3), seed=20 + rank))
    dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.multiproc
@pytest.mark.parametrize("nprocs", [2, 4])
def test_gather_scatter_and_list_all_to_all_equal_gloo_and_take_the_modeled_time(tmp_path, nprocs):
    _spawn(_list_collectives_worker, nprocs, tmp_path)


def _nn_functional_worker(rank: int, nprocs: int, store: str) -> None:
    import torch.distributed.nn.functional as dist_nn

    gloo = _init(rank, nprocs, store)
    platform, devices = zion_emu.current_platform(), list(range(nprocs))

    # all_gather with autograd: its backward is a reduce_scatter of the
    # gradients, as on NCCL (torch runs an all_to_all and a sum on other
    # backends). Gradient: the gloo reduce_scatter of the same pieces.
    x = _data(rank, (5,), seed=70).to("zion").requires_grad_()
    weights = [_data(rank, (5,), seed=71 + i) for i in range(nprocs)]
    outs = dist_nn.all_gather(x)
    sum((o * w.to("zion")).sum() for o, w in zip(outs, weights)).backward()
    record = _last()
    assert (record["op"], record["call"], record["devices"]) == ("reduce_scatter", "reduce_scatter", devices), record
    assert record["bytes"] == nprocs * 5 * F32
    assert record["time"] == pytest.approx(sim.collective(platform, "reduce_scatter", nprocs * 5 * F32, devices).time,
                                           rel=1e-9)
    ref = torch.empty(5)
    dist.reduce_scatter(ref, weights, group=gloo)
    assert torch.equal(x.grad.cpu(), ref)

    # _all_gather_base: NCCL's backward is a _reduce_scatter_base; on any
    # backend but NCCL torch raises "Backend not supported!".
    y = _data(rank, (3, 2), seed=80).to("zion").requires_grad_()
    gathered = dist_nn._all_gather_base(torch.empty(3 * nprocs, 2, device="zion"), y)
    v = _data(rank, (3 * nprocs, 2), seed=81)
    (gathered * v.to("zion")).sum().backward()
    record = _last()
    assert (record["op"], record["call"]) == ("reduce_scatter", "reduce_scatter_tensor"), record
    ref = torch.empty(3, 2)
    dist.reduce_scatter_tensor(ref, v, group=gloo)
    assert torch.equal(y.grad.cpu(), ref)
    assert torch.equal(gathered.detach().cpu().chunk(nprocs)[rank], y.detach().cpu())

    # A gloo group keeps torch's own path for other backends (all_to_all and a sum).
    c = _data(rank, (5,), seed=70).requires_grad_()
    sum((o * w).sum() for o, w in zip(dist_nn.all_gather(c, group=gloo), weights)).backward()
    torch.testing.assert_close(c.grad, x.grad.cpu())
    dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.multiproc
def test_nn_functional_all_gathers_backward_is_nccls_reduce_scatter(tmp_path):
    _spawn(_nn_functional_worker, 4, tmp_path)


def _coalescing_worker(rank: int, nprocs: int, store: str) -> None:
    gloo = _init(rank, nprocs, store)
    clock = _Clock(rank, nprocs, gloo)
    n, devices = nprocs, list(range(nprocs))

    # dist._coalescing_manager hands the backend one fused call, priced as one
    # collective of the total size: one base latency for the three tensors.
    xs = [_data(rank, (s,), seed=30 + s) for s in (10, 33, 7)]
    zs = [x.to("zion") for x in xs]

    def all_reduce_coalesced() -> None:
        with dist._coalescing_manager():
            for z in zs:
                dist.all_reduce(z)

    record = clock.check(all_reduce_coalesced, "all_reduce", 50 * F32, devices)
    assert record["call"] == "all_reduce_coalesced"
    with dist._coalescing_manager(group=gloo):
        for x in xs:
            dist.all_reduce(x, group=gloo)
    assert all(torch.equal(z.cpu(), x) for z, x in zip(zs, xs))

    # The same with a device and async_ops: the backend's start/endCoalescing
    # bracket the fused call, and the batch's one Work ends with it.
    zs = [x.to("zion") for x in xs]
    with dist._coalescing_manager(device=torch.device("zion", rank), async_ops=True) as cm:
        for z in zs:
            dist.all_reduce(z)
    assert len(cm.works) == 1
    cm.wait()
    assert clock.stream_time() == pytest.approx(_last()["end"], rel=1e-12)
    assert _last()["call"] == "all_reduce_coalesced"
    for x in xs:
        dist.all_reduce(x, group=gloo)
    assert all(torch.equal(z.cpu(), x) for z, x in zip(zs, xs))

    # all_gather_into_tensor and reduce_scatter_tensor, coalesced; gloo has no
    # fused form of these, and its single calls give the same results.
    ins = [_data(rank, (s,), seed=40 + s) for s in (6, 2)]
    outs = [torch.empty(n * s, device="zion") for s in (6, 2)]
    zins = [t.to("zion") for t in ins]

    def all_gather_coalesced() -> None:
        with dist._coalescing_manager():
            for o, i in zip(outs, zins):
                dist.all_gather_into_tensor(o, i)

    record = clock.check(all_gather_coalesced, "all_gather", n * 8 * F32, devices)
    assert record["call"] == "all_gather_into_tensor_coalesced"
    for o, i in zip(outs, ins):
        ref = torch.empty(o.numel())
        dist.all_gather_into_tensor(ref, i, group=gloo)
        assert torch.equal(o.cpu(), ref)

    ins = [_data(rank, (n * s,), seed=50 + s) for s in (5, 3)]
    outs = [torch.empty(s, device="zion") for s in (5, 3)]
    zins = [t.to("zion") for t in ins]

    def reduce_scatter_coalesced() -> None:
        with dist._coalescing_manager():
            for o, i in zip(outs, zins):
                dist.reduce_scatter_tensor(o, i)

    record = clock.check(reduce_scatter_coalesced, "reduce_scatter", n * 8 * F32, devices)
    assert record["call"] == "reduce_scatter_tensor_coalesced"
    for o, i in zip(outs, ins):
        ref = torch.empty(o.numel())
        dist.reduce_scatter_tensor(ref, i, group=gloo)
        assert torch.equal(o.cpu(), ref)

    # batch_isend_irecv around the ring, each rank receiving before it sends
    # (a blocking receive would deadlock here): one Work for the batch (the
    # backend coalesces, as NCCL's does), and after it the current stream
    # stands past the two transfers, each priced between its two devices.
    nxt, prv = (rank + 1) % n, (rank - 1) % n
    payload = torch.full((50,), float(rank), device="zion")
    got = torch.empty(50, device="zion")
    start = clock.latest_start(list(range(n)))
    reqs = dist.batch_isend_irecv([dist.P2POp(dist.irecv, got, prv), dist.P2POp(dist.isend, payload, nxt)])
    assert len(reqs) == 1
    reqs[0].wait()
    assert torch.equal(got.cpu(), torch.full((50,), float(prv)))
    hop = max(sim.collective_time(clock.platform, "send_recv", 200, [prv, rank]),
              sim.collective_time(clock.platform, "send_recv", 200, [rank, nxt]))
    assert clock.stream_time() >= start + hop
    dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.multiproc
@pytest.mark.parametrize("nprocs", [3])
def test_coalesced_calls_are_priced_as_one_collective_and_batched_p2p_does_not_deadlock(tmp_path, nprocs):
    _spawn(_coalescing_worker, nprocs, tmp_path)


def _shapes_and_dead_peer_worker(rank: int, nprocs: int, store: str) -> None:
    import time

    _init(rank, nprocs, store, timeout_s=60)
    # Entries with the right element count but another shape: NCCL checks counts only, and so do the ranks'
    # agreement; gloo, handed the shapes, refused on one rank and left the others waiting out the timeout.
    n, ones = nprocs, torch.ones(2, 3, device="zion")
    gathered = [torch.zeros(6, device="zion") for _ in range(n)] if rank == 0 else None
    dist.gather(ones * (rank + 1), gathered, dst=0)
    if rank == 0:
        assert [g.tolist() for g in gathered] == [[float(r + 1)] * 6 for r in range(n)]
    out = torch.zeros(2, 3, device="zion")
    dist.scatter(out, [torch.full((6,), float(r), device="zion") for r in range(n)] if rank == 0 else None, src=0)
    assert out.tolist() == [[float(rank)] * 3] * 2
    shaped = [torch.zeros((6,) if r % 2 else (2, 3), device="zion") for r in range(n)]
    dist.all_gather(shaped, ones * (rank + 1))
    assert [t.reshape(-1).tolist() for t in shaped] == [[float(r + 1)] * 6 for r in range(n)]
    part = torch.zeros(6, device="zion")
    dist.reduce_scatter(part, [torch.ones((2, 3) if r % 2 else (6,), device="zion") * (r + 1) for r in range(n)])
    assert part.tolist() == [float(n * (rank + 1))] * 6
    # A peer that exits before its side of a send or recv: named at once as a DistBackendError (the wait took
    # twice the group's timeout and ended in a RuntimeError about a store key).
    dist.barrier()
    if rank == 1:
        os._exit(0)
    started = time.monotonic()
    with pytest.raises(dist.DistBackendError, match="recv from rank 1: rank 1 has exited before issuing its side"):
        dist.recv(torch.empty(4, device="zion"), 1)
    assert time.monotonic() - started < 10
    os._exit(0)  # the group has lost rank 1: no orderly teardown


@pytest.mark.multiproc
def test_list_entries_of_another_shape_and_a_peer_that_exits_behave_as_nccl(tmp_path):
    _spawn(_shapes_and_dead_peer_worker, 2, tmp_path)


def _host_worker(rank: int, nprocs: int, store: str) -> None:
    gloo = _init(rank, nprocs, store)

    # A zion collective first, so there is a record to keep.
    z = torch.ones(8, device="zion")
    dist.all_reduce(z)
    before, clock = _last(), zion_emu.clock()

    # CPU tensors on the zion group go through gloo, unmodeled: results are
    # gloo's, the virtual clock and the last record stay as they were.
    x = _data(rank, (17,), seed=60)
    y = x.clone()
    dist.all_reduce(x)
    dist.all_reduce(y, group=gloo)
    assert torch.equal(x, y)
    outs = [torch.empty(17) for _ in range(nprocs)]
    dist.all_gather(outs, x)
    assert all(torch.equal(o, y) for o in outs)
    assert _last() == before and zion_emu.clock() == clock

    # Object collectives pickle into CPU tensors: the zion group carries them.
    objects: list[object] = [None] * nprocs
    dist.all_gather_object(objects, {"rank": rank, "name": f"r{rank}"})
    assert objects == [{"rank": r, "name": f"r{r}"} for r in range(nprocs)]
    shared = [f"from {rank}", rank] if rank == 0 else [None, None]
    dist.broadcast_object_list(shared, src=0)
    assert shared == ["from 0", 0]

    # CPU send/recv too.
    t = torch.arange(5.0) if rank == 0 else torch.empty(5)
    if rank == 0:
        dist.send(t, 1)
    elif rank == 1:
        dist.recv(t, 0)
        assert torch.equal(t, torch.arange(5.0))
    dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.multiproc
def test_cpu_tensors_and_object_collectives_go_through_gloo_unmodeled(tmp_path):
    _spawn(_host_worker, 2, tmp_path)


def _p2p_work_worker(rank: int, nprocs: int, store: str, tcp_port: int = 0) -> None:
    """Point-to-point as NCCL and gloo behave: tags pair transfers, a pending
    Work is polled and waited with a timeout without blocking its peer, and a
    future of a pending receive completes when the data arrives. With
    ``tcp_port``, the group meets through a TCPStore (torchrun's), whose
    client serializes its calls: a receive waiting for its sender's record
    there blocked this rank's next send until the store timed out."""
    import time
    from datetime import timedelta

    if tcp_port:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        dist.init_process_group("zion", init_method=f"tcp://127.0.0.1:{tcp_port}", rank=rank, world_size=nprocs,
                                timeout=timedelta(seconds=60))
        torch.zion.set_device(rank)
        gloo = dist.new_group(backend="gloo")
    else:
        gloo = _init(rank, nprocs, store)
    # Tags: received in the other order than sent, each pairs with its tag
    # (they were paired by order: "send of 8 bytes, but rank 1 receives 12").
    if rank == 0:
        a = dist.isend(torch.ones(2, device="zion"), 1, tag=1)
        b = dist.isend(torch.full((3,), 2.0, device="zion"), 1, tag=2)
        a.wait()
        b.wait()
    else:
        three, two = torch.empty(3, device="zion"), torch.empty(2, device="zion")
        w3, w2 = dist.irecv(three, 0, tag=2), dist.irecv(two, 0, tag=1)
        w3.wait()
        w2.wait()
        assert two.tolist() == [1.0, 1.0] and three.tolist() == [2.0, 2.0, 2.0]

    # A receive whose sender first waits for this rank: is_completed and
    # get_future answer at once (they finished the receive, and deadlocked).
    if rank == 0:
        hello = torch.empty(2, device="zion")
        dist.recv(hello, 1)
        dist.send(torch.full((3,), 7.0, device="zion"), 1)
        dist.send(torch.full((3,), 8.0, device="zion"), 1)
    else:
        x, y = torch.empty(3, device="zion"), torch.empty(3, device="zion")
        wx, wy = dist.irecv(x, 0), dist.irecv(y, 0)
        started = time.monotonic()
        assert not wx.is_completed()
        future = wy.get_future()
        assert time.monotonic() - started < 5 and not future.done()
        dist.send(torch.ones(2, device="zion"), 0)
        assert future.wait()[0].tolist() == [8.0, 8.0, 8.0]
        while not wx.is_completed():
            time.sleep(0.01)
        wx.wait()
        assert x.tolist() == [7.0, 7.0, 7.0] and wx.is_success()

    # wait(timeout) bounds the wait for a sender that is late.
    if rank == 1:
        late = torch.empty(1, device="zion")
        w = dist.irecv(late, 0)
        with pytest.raises(dist.DistBackendError, match="did not complete within the 300 ms timeout"):
            w.wait(timeout=timedelta(milliseconds=300))
        dist.barrier(group=gloo)
        w.wait()
        assert late.tolist() == [5.0]
    else:
        dist.barrier(group=gloo)
        dist.send(torch.full((1,), 5.0, device="zion"), 1)

    # Dropping a pending receive's Work does not wait for a sender that never
    # sends (it waited until the store timed out). Its own tag keeps it apart.
    if rank == 1:
        w = dist.irecv(torch.empty(2, device="zion"), 0, tag=9)
        started = time.monotonic()
        del w
        assert time.monotonic() - started < 2

    # Sends and receives whose Work is dropped unwaited still move their bytes, as NCCL's do: a
    # fire-and-forget isend hung its receiver (as gloo's does), its tensor gone with the Work.
    if rank == 0:
        dist.isend(torch.full((2,), 3.0, device="zion"), 1, tag=4)
        dist.isend(torch.full((2,), 4.0, device="zion"), 1, tag=4)
        dist.send(torch.full((2,), 5.0, device="zion"), 1, tag=4)
    else:
        first, second, third = (torch.empty(2, device="zion") for _ in range(3))
        dist.irecv(first, 0, tag=4)
        dist.recv(second, 0, tag=4)
        dist.recv(third, 0, tag=4)
        assert (first.tolist(), second.tolist(), third.tolist()) == ([3.0, 3.0], [4.0, 4.0], [5.0, 5.0])
    dist.barrier(group=gloo)

    # The stacked forms NCCL takes: an all_gather output of (ranks, n) and a
    # reduce_scatter input of (ranks, n); and an all_reduce of a channels_last
    # tensor. Results equal gloo's on the CPU.
    x = _data(rank, (4,), seed=21)
    out = torch.empty(nprocs, 4, device="zion")
    dist.all_gather_into_tensor(out, x.to("zion"))
    ref = torch.empty(nprocs * 4)
    dist.all_gather_into_tensor(ref, x, group=gloo)
    assert torch.equal(out.cpu().view(-1), ref)
    whole = _data(rank, (nprocs, 4), seed=22)
    part = torch.empty(4, device="zion")
    dist.reduce_scatter_tensor(part, whole.to("zion"))
    ref = torch.empty(4)
    dist.reduce_scatter_tensor(ref, whole.view(-1), group=gloo)
    assert torch.equal(part.cpu(), ref)
    image = _data(rank, (2, 3, 4, 5), seed=23).contiguous(memory_format=torch.channels_last)
    z = image.to("zion")
    assert z.is_contiguous(memory_format=torch.channels_last)
    dist.all_reduce(z)
    dist.all_reduce(image, group=gloo)
    assert torch.equal(z.cpu(), image)
    with pytest.raises(RuntimeError, match="needs tensors dense in their memory format"):
        dist.all_reduce(torch.ones(3, 4, device="zion").t())
    dist.barrier(group=gloo)


@pytest.mark.multiproc
@pytest.mark.parametrize("store", ["file", "tcp"])
def test_point_to_point_works_tags_timeouts_and_the_stacked_forms_behave_as_nccls(tmp_path, store):
    import socket

    port = 0
    if store == "tcp":
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    _spawn(_p2p_work_worker, 2, tmp_path, port)


def _mismatch_and_polling_worker(rank: int, nprocs: int, store: str) -> None:
    """A size mismatch is the Work's error, whenever the sender's side arrives, and the pair and the group stay
    usable; is_completed follows the modeled clock, as NCCL's work follows its kernels."""
    import time

    gloo = _init(rank, nprocs, store)
    # The receive issued after the sender's record is in the store: the mismatch was raised by irecv itself,
    # which left batch_isend_irecv's coalescing open, and every later collective of the group did nothing.
    if rank == 0:
        sent = dist.isend(torch.ones(4, device="zion"), 1)
        with pytest.raises(RuntimeError, match="send to rank 1 of 16 bytes, but rank 1 receives 12 bytes"):
            sent.wait()
    else:
        time.sleep(1)
        works = dist.batch_isend_irecv([dist.P2POp(dist.irecv, torch.empty(3, device="zion"), 0)])
        with pytest.raises(RuntimeError, match="recv from rank 0 of 12 bytes, but rank 0 sends 16 bytes"):
            works[0].wait()
    x = torch.full((2,), float(rank + 1), device="zion")
    dist.all_reduce(x)
    assert x.tolist() == [3.0, 3.0]
    # The next transfer of the pair on the same tag gets its own bytes (it got the failed send's and hung).
    if rank == 0:
        dist.send(torch.full((4,), 5.0, device="zion"), 1)
    else:
        got = torch.empty(4, device="zion")
        dist.recv(got, 0)
        assert got.tolist() == [5.0] * 4

    # all_to_all_single whose rows differ in width between input and output and between ranks, as gloo's and
    # NCCL's splits count each tensor's own rows (torchrec's sequence embeddings): it was refused.
    if rank == 0:
        shapes, splits = ((2, 4), (8,)), ([1, 1], [4, 4])
    else:
        shapes, splits = ((8,), (2, 4)), ([4, 4], [1, 1])
    source = (torch.arange(8.0) + 100 * rank).reshape(shapes[0])
    results = []
    for device, group in (("zion", None), ("cpu", gloo)):
        received = torch.empty(shapes[1], device=device)
        dist.all_to_all_single(received, source.to(device), output_split_sizes=splits[1],
                               input_split_sizes=splits[0], group=group)
        results.append(received.cpu())
    assert torch.equal(results[0], results[1])

    # last_collective of a group this rank is not in, or of a gloo group: an AttributeError on an int, and
    # "No backend type associated with device type zion".
    only_rank_0 = dist.new_group([0])
    if rank == 1:
        with pytest.raises(ValueError, match="this rank is not a member of the group"):
            zd.last_collective(only_rank_0)
    with pytest.raises(ValueError, match="the group has no zion backend \\(its backend is 'gloo'\\)"):
        zd.last_collective(gloo)

    # An async all_reduce of 16 MiB: not complete while the host's clock is before its modeled end, and a
    # loop that computes until it is ends once the clock passes it.
    torch.zion.synchronize()
    dist.barrier()
    torch.zion.synchronize()
    work = dist.all_reduce(torch.ones(4 << 20, device="zion"), async_op=True)
    end = _last()["end"]
    assert zion_emu.clock() < end and not work.is_completed()
    a = torch.ones(256, 256, device="zion")
    steps = 0
    while not work.is_completed():
        a = a @ a
        steps += 1
        assert steps < 100_000
    assert zion_emu.clock() >= end and steps > 1
    work.wait()
    dist.barrier(group=gloo)


@pytest.mark.multiproc
def test_a_size_mismatch_is_the_works_error_and_is_completed_follows_the_modeled_clock(tmp_path):
    _spawn(_mismatch_and_polling_worker, 2, tmp_path)


def test_a_group_let_go_with_the_gil_held_does_not_wait_forever_on_its_gloo_worker():
    # gloo's destructor joins its workers; a worker dropping a finished work
    # lets go of tensors whose Python objects outlived Python's references,
    # which takes the GIL. A group whose last reference goes from Python (DDP's
    # reducer collected at the end of a script) hung there. Here rank 0's
    # worker is still in an all_gather when its group goes, and rank 1 (a
    # Python thread, which needs the GIL) joins a second later.
    done = run_python("""
        import datetime, threading, time, torch, torch.distributed as dist, zion_emu
        from zion_emu._C import dist as zdist

        store = dist.HashStore()
        gloo, zion = [None, None], [None, None]

        def make(rank):
            gloo[rank] = dist.ProcessGroupGloo(dist.PrefixStore("zion/gloo/", store), rank, 2, datetime.timedelta(seconds=30))
            zion[rank] = zdist.ProcessGroupZion(store, gloo[rank], rank, 2, global_rank=rank, local_rank=rank)

        makers = [threading.Thread(target=make, args=(r,)) for r in (0, 1)]
        for t in makers: t.start()
        for t in makers: t.join()

        base = torch.zeros(8)
        work = gloo[0].allgather([[base[:4], base[4:]]], [torch.ones(4)])   # waits for rank 1
        del work, base                 # the work alone holds its tensors
        last = zion[0]
        zion[0] = gloo[0] = None       # `last` alone holds rank 0's group, and the group its gloo

        def rank_1_joins():
            time.sleep(1.0)
            gloo[1].allgather([[torch.zeros(4), torch.zeros(4)]], [torch.ones(4)]).wait()

        threading.Thread(target=rank_1_joins, daemon=True).start()
        start = time.monotonic()
        del last                       # with the GIL held
        print("let go after", time.monotonic() - start)
    """, timeout_s=60)
    # It let go once rank 1 had joined and the worker had finished, not before.
    assert float(done.stdout.split("let go after")[1]) >= 0.9
