"""torch.zion.comm: torch.cuda.comm's functions on zion devices. Results are
the CPU's arithmetic; copies issued at once (broadcast, scatter, the copies
of reduce_add) share links by max-min fair share, each on its route.

zion preset: 8 OAMs fully connected, each pair one 25 GB/s fabric link with
600 ns latency; 5 us launch overhead. Every number below is read from the
platform's fields."""

import pytest
import torch

import zion_emu
from zion_emu import _C, sim
from processes import run_python

DEVICES = list(range(8))


def fields() -> tuple[float, float, float]:
    """(launch overhead s, fabric link bytes/s, fabric latency s) of the active platform."""
    p = zion_emu.current_platform()
    return (p.get("oam.launch_overhead_ns") * 1e-9, p.get("fabric.link_bandwidth_gb_per_s") * 1e9,
            p.get("fabric.latency_ns") * 1e-9)


def settle() -> float:
    """The host waits for every device; returns its clock."""
    for d in DEVICES:
        torch.zion.synchronize(d)
    return _C.device.host_time()


def test_torch_zion_comm_is_registered_and_torch_nn_parallel_comm_sends_zion_tensors_to_it():
    import torch.nn.parallel.comm as parallel_comm
    import torch.zion.comm

    assert torch.zion.comm is zion_emu.comm
    assert parallel_comm.broadcast._zion_original is not None
    x = torch.arange(4.0, device="zion:0")
    copies = parallel_comm.broadcast(x, [0, 3])
    assert copies[0] is x and copies[1].device == torch.device("zion:3") and torch.equal(copies[1].cpu(), x.cpu())


def test_broadcast_gives_the_source_device_the_tensor_itself_and_copies_elsewhere():
    x = torch.randn(5, 3)
    z = x.to("zion:2")
    out = torch.zion.comm.broadcast(z, devices=["zion:2", 0, torch.device("zion", 7)])
    assert out[0] is z
    assert [t.device.index for t in out] == [2, 0, 7] and all(torch.equal(t.cpu(), x) for t in out)
    host = torch.zion.comm.broadcast(x, [1, 4])  # from host memory: every device gets a copy
    assert [t.device.index for t in host] == [1, 4] and all(torch.equal(t.cpu(), x) for t in host)
    outs = [torch.empty(5, 3, device=f"zion:{d}") for d in (2, 5)]
    assert torch.zion.comm.broadcast(z, out=outs) == tuple(outs)
    assert all(torch.equal(t.cpu(), x) for t in outs)
    with pytest.raises(RuntimeError, match="Exactly one of 'devices' and 'out'"):
        torch.zion.comm.broadcast(z)
    with pytest.raises(RuntimeError, match="same shape as the source"):
        torch.zion.comm.broadcast(z, out=[torch.empty(2, device="zion:1")])


def test_broadcast_coalesced_packs_each_dtype_into_buffers_of_at_most_buffer_size():
    g = torch.Generator().manual_seed(0)
    cpu = [torch.randn(16, generator=g), torch.randint(0, 9, (3, 4), generator=g), torch.randn(40, generator=g),
           torch.randn(2, 2, generator=g).half(), torch.randn(8, generator=g), torch.randn(300, generator=g)]
    tensors = [t.to("zion:1") for t in cpu]
    buffer_size = 240  # bytes: float32 buffers [16 + 40 elements] (224 B), [8], [300] (each would overflow the last)
    out = torch.zion.comm.broadcast_coalesced(tensors, ["zion:1", 0, 6], buffer_size=buffer_size)
    assert len(out) == 3 and all(a is b for a, b in zip(out[0], tensors))  # devices[0] gets the inputs themselves
    for device, copies in zip((0, 6), out[1:]):
        assert [t.device.index for t in copies] == [device] * len(cpu)
        assert all(t.dtype == c.dtype and torch.equal(t.cpu(), c) for t, c in zip(copies, cpu))
        storage = [t.untyped_storage().data_ptr() for t in copies]
        # Views of flat buffers: tensors 0 and 2 share one, 4 and 5 have one each; each dtype has its own.
        assert storage[0] == storage[2] and len({storage[0], storage[1], storage[3], storage[4], storage[5]}) == 5
        copies[0].add_(1)  # a view has a version counter of its own
        assert copies[2]._version == 0
    with pytest.raises(RuntimeError, match="must appear as the first on devices list"):
        torch.zion.comm.broadcast_coalesced(tensors, [0, 1])


def test_reduce_add_adds_in_torch_order_root_first_then_the_others_in_input_order():
    g = torch.Generator().manual_seed(1)
    # Magnitudes far apart, so that another order of additions rounds differently.
    cpu = [torch.randn(1000, generator=g) * 10.0 ** (3 * i) for i in range(4)]
    inputs = [t.to(f"zion:{i}") for i, t in enumerate(cpu)]
    root_first = torch.zion.comm.reduce_add(inputs, destination=0)
    assert root_first.device == torch.device("zion:0")
    assert torch.equal(root_first.cpu(), cpu[0] + cpu[1] + cpu[2] + cpu[3])
    root_third = torch.zion.comm.reduce_add(inputs, destination="zion:2")
    assert torch.equal(root_third.cpu(), cpu[2] + cpu[0] + cpu[1] + cpu[3])
    assert not torch.equal(root_third.cpu(), cpu[0] + cpu[1] + cpu[2] + cpu[3])  # the order is seen
    with pytest.raises(RuntimeError, match="destination zion:5 to hold one of the inputs"):
        torch.zion.comm.reduce_add(inputs, destination=5)


def test_reduce_add_coalesced_sums_each_tensor_over_devices():
    g = torch.Generator().manual_seed(2)
    per_device = [[torch.randn(7, generator=g), torch.randn(3, 3, generator=g).double(), torch.randn(500, generator=g)]
                  for _ in range(3)]
    inputs = [[t.to(f"zion:{d}") for t in ts] for d, ts in enumerate(per_device)]
    sums = torch.zion.comm.reduce_add_coalesced(inputs, destination=0, buffer_size=64)
    for i, s in enumerate(sums):
        want = per_device[0][i] + per_device[1][i] + per_device[2][i]
        assert s.device == torch.device("zion:0") and s.dtype == want.dtype and torch.equal(s.cpu(), want)


def test_scatter_splits_by_chunk_sizes_along_dim_onto_the_given_streams():
    x = torch.arange(60.0).reshape(3, 20)
    z = x.to("zion:0")
    streams = [None, torch.zion.Stream(3), torch.zion.Stream(5)]
    before = {d: _C.device.stream_time(d, streams[i].stream_id) for i, d in ((1, 3), (2, 5))}
    settle()
    chunks = torch.zion.comm.scatter(z, devices=[0, 3, 5], chunk_sizes=[2, 8, 10], dim=1, streams=streams)
    assert chunks[0].device.index == 0 and chunks[0]._base is z  # already there: a view, as in torch
    assert [c.device.index for c in chunks] == [0, 3, 5]
    assert all(torch.equal(c.cpu(), w) for c, w in zip(chunks, x.split([2, 8, 10], dim=1)))
    for i, d in ((1, 3), (2, 5)):  # each chunk landed on its stream
        assert _C.device.stream_time(d, streams[i].stream_id) > before[d]
    equal = torch.zion.comm.scatter(z, devices=[1, 2, 4])  # equal chunks along dim 0
    assert [tuple(c.shape) for c in equal] == [(1, 20)] * 3
    out = [torch.empty(1, 20, device="zion:6"), torch.empty(2, 20, device="zion:7")]
    assert torch.zion.comm.scatter(z, out=out) == tuple(out)
    assert torch.equal(out[0].cpu(), x[:1]) and torch.equal(out[1].cpu(), x[1:])
    with pytest.raises(RuntimeError, match="same length"):
        torch.zion.comm.scatter(z, devices=[0, 1], chunk_sizes=[3])
    with pytest.raises(RuntimeError, match="stream at index 1"):
        torch.zion.comm.scatter(z, devices=[0, 1], streams=[None, torch.zion.Stream(2)])


def test_gather_concatenates_on_the_destination_or_into_out():
    parts = [torch.randn(2, d + 1) for d in range(4)]
    zparts = [p.to(f"zion:{i + 1}") for i, p in enumerate(parts)]
    g = torch.zion.comm.gather(zparts, dim=1, destination=3)
    assert g.device == torch.device("zion:3") and torch.equal(g.cpu(), torch.cat(parts, dim=1))
    on_host = torch.zion.comm.gather(zparts, dim=-1, destination="cpu")
    assert on_host.device.type == "cpu" and torch.equal(on_host, torch.cat(parts, dim=1))
    out = torch.empty(2, 10, device="zion:0")
    assert torch.zion.comm.gather(zparts, dim=1, out=out) is out and torch.equal(out.cpu(), torch.cat(parts, 1))
    with pytest.raises(RuntimeError, match="invalid shape"):
        torch.zion.comm.gather(zparts, dim=0)


def test_broadcast_over_a_fully_connected_fabric_sends_each_copy_over_its_own_link():
    launch, link_bw, latency = fields()
    size = 1 << 24  # bytes
    x = torch.empty(size // 4, device="zion:0")
    t0 = settle()
    torch.zion.comm.broadcast(x, DEVICES)
    # zion:0 gets x itself; the host issues the 7 copies one after another
    # (copy k after k launches), each alone on the 0 -> k link.
    for k in DEVICES[1:]:
        assert _C.device.stream_time(k) - t0 == pytest.approx(k * launch + latency + size / link_bw, rel=1e-9)
    # A copy issued afterwards over a link the batch used queues behind it
    # (on a stream of zion:1 the batch did not use, so only the link holds it).
    s = torch.zion.Stream(1)
    end_of_batch_on_link = t0 + launch + size / link_bw
    with torch.zion.stream(s):
        x.to("zion:1")
    assert _C.device.stream_time(1, s.stream_id) - t0 == pytest.approx(
        launch + size / link_bw + latency + size / link_bw, rel=1e-9)
    assert _C.device.stream_time(1, s.stream_id) > end_of_batch_on_link


def test_copies_sharing_a_link_share_it_when_issued_at_once_and_queue_when_issued_one_by_one():
    launch, link_bw, latency = fields()
    size = 1 << 24
    a, b = torch.empty(size // 4, device="zion:1"), torch.empty(size // 4, device="zion:1")
    s1, s2 = torch.zion.Stream(0), torch.zion.Stream(0)
    busy = size / link_bw
    t0 = settle()
    # Issued at once: a starts after one launch, b after two; then they share
    # the 1 -> 0 link half and half until a is done; b ends alone.
    dst = [torch.empty_like(a, device="zion:0"), torch.empty_like(b, device="zion:0")]
    torch.ops.zion.copy_batch([a, b], dst, [s1.stream_id, s2.stream_id])
    assert _C.device.stream_time(0, s1.stream_id) - t0 == pytest.approx(2 * busy + latency, rel=1e-9)
    assert _C.device.stream_time(0, s2.stream_id) - t0 == pytest.approx(launch + 2 * busy + latency, rel=1e-9)
    # One by one (copy_), each from a stream of its own on zion:1: the second
    # waits for the link, then has it whole.
    r1, r2 = torch.zion.Stream(1), torch.zion.Stream(1)
    t0 = settle()
    for s, r, t in ((s1, r1, a), (s2, r2, b)):
        with torch.zion.stream(s), torch.zion.stream(r):
            t.to("zion:0")
    assert _C.device.stream_time(0, s1.stream_id) - t0 == pytest.approx(launch + busy + latency, rel=1e-9)
    assert _C.device.stream_time(0, s2.stream_id) - t0 == pytest.approx(launch + 2 * busy + latency, rel=1e-9)


def test_copies_issued_at_once_onto_one_stream_run_side_by_side_as_one_grouped_kernel():
    launch, link_bw, latency = fields()
    size = 1 << 24
    sources = [torch.empty(size // 4, device=f"zion:{k}") for k in DEVICES[1:]]
    landed = [torch.empty(size // 4, device="zion:0") for _ in sources]
    t0 = settle()
    # reduce_add's copies: zion:1..7 -> zion:0's current stream, each over its
    # own link; the stream is done when the last issued (after 7 launches) is.
    torch.ops.zion.copy_batch(sources, landed, [])
    assert _C.device.stream_time(0) - t0 == pytest.approx(7 * launch + latency + size / link_bw, rel=1e-9)


def test_a_peer_copy_runs_on_the_source_stream_behind_a_two_way_barrier_as_cuda_does():
    launch, link_bw, latency = fields()
    size = 1 << 24
    busy = size / link_bw
    outs = {k: torch.empty(size // 4, device=f"zion:{k}") for k in DEVICES[1:]}
    # Model parallelism: outputs of zion:1..7 moved to zion:0. Each copy waits
    # for zion:0's current stream, which waits for the copy: one after another.
    t0 = settle()
    for k in DEVICES[1:]:
        outs[k].to("zion:0")
    assert _C.device.stream_time(0) - t0 == pytest.approx(launch + 7 * (latency + busy), rel=1e-9)
    assert _C.device.stream_time(3) - t0 == pytest.approx(launch + 3 * (latency + busy), rel=1e-9)  # ran on zion:3
    # Each onto a stream of its own on zion:0: the copies overlap, one link each.
    streams = {k: torch.zion.Stream(0) for k in DEVICES[1:]}
    t0 = settle()
    for k in DEVICES[1:]:
        with torch.zion.stream(streams[k]):
            outs[k].to("zion:0")
    for k in DEVICES[1:]:
        assert _C.device.stream_time(0, streams[k].stream_id) - t0 == pytest.approx(
            k * launch + latency + busy, rel=1e-9)
    # The copy also waits for the work that made its source (zion:2's stream).
    t0 = settle()
    torch.zion.comm.broadcast(torch.empty(size // 4, device="zion:5"), [5, 2])  # keeps zion:2's stream busy
    outs[2].to("zion:6")
    assert _C.device.stream_time(6) - t0 == pytest.approx(launch + 2 * (latency + busy), rel=1e-9)


RING = """
    import pytest, torch, zion_emu
    from zion_emu import _C, sim
    zion_emu.set_platform("zion", overrides={"fabric.topology": "ring", "oam.launch_overhead_ns": 0})
    p = zion_emu.current_platform()
    link_bw, latency = p.get("fabric.link_bandwidth_gb_per_s") * 1e9, p.get("fabric.latency_ns") * 1e-9
    t = sim.build_topology(p.native)
    oam = [t.find("oam", 0, k) for k in range(8)]
    # The routes the ring really has from OAM 0: k hops clockwise for k <= 3,
    # 8 - k anticlockwise for k >= 5, both ways (half the bytes each) to 4.
    first_links = {}
    for k in range(1, 8):
        r = t.route(oam[0], oam[k])
        assert r["hops"] == min(k, 8 - k) and len(r["paths"]) == (2 if k == 4 else 1)
        first_links[k] = {t.links[p[0]]["dst"] for p in r["paths"]}
    assert all(first_links[k] == {oam[1]} for k in (1, 2, 3)) and first_links[4] == {oam[1], oam[7]}
    size = 1 << 24
    x = torch.empty(size // 4, device="zion:0")
    for d in range(8):
        torch.zion.synchronize(d)
    t0 = _C.device.host_time()
    torch.zion.comm.broadcast(x, range(8))
    # Link 0 -> 1 carries the copies to 1, 2 and 3 and half of 4's; all
    # start at once (no launch overhead here). Progressive filling: the four
    # flows get a quarter each (every other link they cross carries fewer);
    # 4's half (S/2) is done at 2 S/B; then 1, 2, 3 share a third each and
    # finish together once the link has carried 3.5 S: at 3.5 S/B, plus
    # their hops' latency. Link 0 -> 7 mirrors it for 7, 6, 5.
    want = {1: 3.5 * size / link_bw + latency, 2: 3.5 * size / link_bw + 2 * latency,
            3: 3.5 * size / link_bw + 3 * latency, 4: 2 * size / link_bw + 4 * latency}
    want.update({8 - k: want[k] for k in (1, 2, 3)})
    for k, w in want.items():
        got = _C.device.stream_time(k) - t0
        assert got == pytest.approx(w, rel=1e-9), (k, got, w)
    # The broadcast ends with the 3-hop copies: 3.5 S/B plus 3 latencies.
    assert max(_C.device.stream_time(k) for k in range(8)) - t0 == pytest.approx(
        3.5 * size / link_bw + 3 * latency, rel=1e-9)
    print("ok")
"""


def test_broadcast_over_a_ring_shares_the_links_out_of_the_source_by_fair_share():
    assert run_python(RING).stdout.strip().endswith("ok")
