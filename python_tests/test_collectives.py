"""Timed collectives against closed forms worked by hand, and against the
Zion paper's fully-connected vs ring comparison."""

import pytest

import zion_emu
from zion_emu import sim

GB = 1e9
GIB = 1 << 30


def test_ring_all_reduce_on_a_switch_is_2_n_minus_1_steps_of_alpha_plus_S_over_nB(platform):
    # hgx-a100: each GPU reaches the NVSwitch over 12 links x 20 GB/s = B;
    # GPU -> switch -> GPU is two links of 300 ns = alpha. The ring runs both
    # ways with half the data each, so each GPU's uplink carries S/n per step.
    p = platform("hgx-a100")
    n, S, B, alpha = 8, 256 * 2**20, 12 * 20.0 * GB, 2 * 300e-9
    expected = 2 * (n - 1) * (alpha + S / (n * B))
    r = sim.collective(p, "all_reduce", S, n, algo="ring")
    assert r.closed_form
    assert r.time == pytest.approx(expected, rel=1e-9)
    assert r.busbw == pytest.approx(S / expected * 2 * (n - 1) / n, rel=1e-9)


def test_ring_on_a_ring_fabric_uses_both_directions(platform):
    # zion with a ring fabric: 25 GB/s per link per direction, 600 ns per hop.
    p = platform(**{"fabric.topology": "ring"})
    n, S, B, alpha = 8, 64 * 2**20, 25 * GB, 600e-9
    expected = 2 * (n - 1) * (alpha + S / (2 * n * B))
    assert sim.collective_time(p, "all_reduce", S, n, algo="ring") == pytest.approx(expected, rel=1e-9)


# A hybrid cube mesh (zion's OAMs as two fully connected quads 0-3 and 4-7
# plus links i <-> i+4; 25 GB/s per link per direction, 600 ns per hop). In
# rank order 3 -> 4 and 7 -> 0 are not links, so NCCL's ring search lays its
# channels over rings of direct links instead: on a DGX-1's cube mesh, four
# rings at once with the data split among them (NVIDIA/nccl#299). The mesh
# holds two link-disjoint such rings through all eight (0-1-2-3-7-5-6-4 and
# 0-2-6-7-4-5-1-3), and each runs both ways: four rings, S/4n per step each.
CUBE = {"fabric.topology": "hybrid_cube_mesh"}
CUBE_LINKS = {frozenset((i, j)) for q in (0, 4) for i in range(q, q + 4) for j in range(q, q + 4) if i < j} | {
    frozenset((i, i + 4)) for i in range(4)}


def test_the_cube_mesh_holds_two_link_disjoint_rings_of_direct_links_through_all_eight(platform):
    rings = sim.collective_model(platform(**CUBE)).rings(list(range(8)))
    assert rings == [[0, 1, 2, 3, 7, 5, 6, 4], [0, 2, 6, 7, 4, 5, 1, 3]]
    hops = [frozenset((r[i], r[(i + 1) % 8])) for r in rings for i in range(8)]
    assert set(hops) == CUBE_LINKS and len(hops) == len(CUBE_LINKS) == 16  # every link once
    # A fully connected fabric keeps its one ring in rank order.
    assert sim.collective_model(platform()).rings(list(range(8))) == [list(range(8))]


@pytest.mark.parametrize("op,steps", [("all_reduce", 14), ("reduce_scatter", 7), ("all_gather", 7)])
def test_ring_on_a_hybrid_cube_mesh_runs_its_two_rings_of_direct_links_both_ways(platform, op, steps):
    p = platform(**CUBE)
    n, S, B, alpha = 8, 64 * 2**20, 25 * GB, 600e-9
    r = sim.collective(p, op, S, n, algo="ring")
    assert r.closed_form
    assert r.time == pytest.approx(steps * (alpha + S / (4 * n * B)), rel=1e-9)
    # The same steps simulated transfer by transfer.
    slow = sim.collective(p, op, S, n, algo="ring", force_simulation=True)
    assert not slow.closed_form and slow.time == pytest.approx(r.time, rel=1e-9)
    # Against the one ring (both ways) of a fully connected fabric: half the bytes per link.
    full = sim.collective(platform(), op, S, n, algo="ring")
    assert full.time == pytest.approx(steps * (alpha + S / (2 * n * B)), rel=1e-9)


@pytest.mark.parametrize("ranks,rings", [
    ([0, 1, 2, 3], [[0, 1, 2, 3]]),  # one quad: 3 links each, room for one ring
    ([0, 1, 4, 5], [[0, 1, 5, 4]]),  # the quads' links 0-1, 4-5 and the links 1-5, 4-0
    ([0, 1, 2, 3, 4, 5], [[0, 2, 3, 1, 5, 4]]),  # 4 and 5 have two links each
])
def test_a_subset_of_the_cube_mesh_rings_over_its_direct_links(platform, ranks, rings):
    p = platform(**CUBE)
    assert sim.collective_model(p).rings(ranks) == rings
    assert all(frozenset((r[i], r[i - 1])) in CUBE_LINKS for r in rings for i in range(len(r)))
    n, S, B, alpha = len(ranks), 64 * 2**20, 25 * GB, 600e-9
    expected = 2 * (n - 1) * (alpha + S / (2 * len(rings) * n * B))
    assert sim.collective_time(p, "all_reduce", S, ranks, algo="ring") == pytest.approx(expected, rel=1e-9)


def test_a_cube_mesh_subset_without_a_ring_of_direct_links_keeps_rank_order_over_routes(platform):
    # 0, 1, 2, 4: 4's only link among them is to 0, so no ring of direct
    # links passes through all four; the ring runs in rank order and 2 -> 4
    # is routed through a third GPU (0 or 6), sharing links: slower than the
    # 4-rank ring of direct links (2,016.9 us at 64 MiB).
    p = platform(**CUBE)
    assert sim.collective_model(p).rings([0, 1, 2, 4]) == [[0, 1, 2, 4]]
    S = 64 * 2**20
    routed = sim.collective_time(p, "all_reduce", S, [0, 1, 2, 4], algo="ring")
    direct = sim.collective_time(p, "all_reduce", S, [0, 1, 4, 5], algo="ring")
    assert direct == pytest.approx(6 * (600e-9 + S / (8 * 25 * GB)), rel=1e-9)
    assert routed > 1.2 * direct


def test_chains_on_a_cube_mesh_run_down_and_up_each_ring_from_any_root(platform):
    # Broadcast (and reduce) pipelined in 8 chunks down a chain of 8 ranks:
    # 8 + 8 - 2 steps of alpha + piece / B when every hop is one link. On
    # the cube mesh a chain runs each way round each of the two rings from
    # the root (from root 3: 3-7-5-6-4-0-1-2, 3-2-1-0-4-6-5-7, ...), four
    # chains on link-disjoint directions, so a piece is S / 8 / 4. (In rank
    # order 3 -> 4 would not be a link.)
    p = platform(**CUBE)
    S, B, alpha = 64 * 2**20, 25 * GB, 600e-9
    expected = 14 * (alpha + S / 8 / 4 / B)
    for op in ("broadcast", "reduce"):
        for root in (0, 3, 6):
            r = sim.collective(p, op, S, 8, algo="ring", root=root)
            assert r.closed_form and r.time == pytest.approx(expected, rel=1e-9), (op, root)
    # One chain on a fully connected fabric: a piece is S / 8.
    assert sim.collective_time(platform(), "broadcast", S, 8, algo="ring") == pytest.approx(14 * (alpha + S / 8 / B), rel=1e-9)


def test_base_latency_is_charged_once_per_collective(platform):
    p0 = platform("hgx-a100")
    p1 = platform("hgx-a100", **{"collectives.base_latency_ns": 6600})
    t0 = sim.collective_time(p0, "all_reduce", 1 << 20, 8, algo="ring")
    t1 = sim.collective_time(p1, "all_reduce", 1 << 20, 8, algo="ring")
    assert t1 - t0 == pytest.approx(6.6e-6, rel=1e-9)


def test_direct_all_to_all_on_fully_connected_is_one_step(platform):
    # zion: 8 OAMs fully connected, 25 GB/s per pair; each sends S/n to
    # each peer on its own link at once.
    p = platform()
    n, S, B, alpha = 8, 512 * 2**20, 25 * GB, 600e-9
    r = sim.collective(p, "all_to_all", S, n, algo="direct")
    assert r.time == pytest.approx(alpha + S / n / B, rel=1e-9)
    assert r.busbw == pytest.approx(S / r.time * (n - 1) / n, rel=1e-9)


def test_uneven_all_to_all_ends_with_its_largest_message(platform):
    p = platform()
    n = 4
    sizes = [[0 if i == j else 1e6 for j in range(n)] for i in range(n)]
    sizes[2][3] = 50e6  # one hot pair, as embedding exchanges have
    r = sim.collective(p, "all_to_all", 0, n, algo="direct", all_to_all_bytes=sizes)
    # Every pair has its own 25 GB/s link; the hot pair decides.
    assert r.time == pytest.approx(600e-9 + 50e6 / (25 * GB), rel=1e-9)
    assert not r.closed_form  # unequal flows: simulated step by step


@pytest.mark.parametrize("op", ["all_reduce", "all_to_all"])
def test_fully_connected_beats_bidirectional_ring(platform, op):
    # p = 8, equal per-link bandwidth, large messages. all_reduce: ring
    # 2(n-1)/n * S / 2B vs direct 2 S / (n B): 3.5x. all_to_all: on the ring
    # each link carries (1 + 2 + 3 + 4/2) S/n = 8 S/n, vs S/n: 8x.
    S = 8 * GIB
    ring = platform(**{"fabric.topology": "ring"})
    full = platform(**{"fabric.topology": "fully_connected"})
    ratio = sim.collective_time(ring, op, S, 8) / sim.collective_time(full, op, S, 8)
    assert ratio == pytest.approx({"all_reduce": 3.5, "all_to_all": 8.0}[op], rel=1e-3)


@pytest.mark.parametrize("name,op,algo", [
    ("zion", "all_reduce", "ring"),
    ("zion", "all_reduce", "direct"),
    ("zion", "all_reduce", "halving_doubling"),
    ("zion", "reduce_scatter", "ring"),
    ("zion", "all_gather", "direct"),
    ("zion", "all_to_all", "direct"),
    ("zion", "broadcast", "ring"),
    ("zion", "reduce", "direct"),
    ("hgx-a100", "all_reduce", "ring"),
    ("hgx-h100", "all_reduce", "in_switch"),
    ("zionex", "all_reduce", "hierarchical"),
])
def test_closed_form_equals_step_by_step_simulation(platform, name, op, algo):
    p = platform(name)
    ranks = 16 if algo == "hierarchical" else 8
    model = sim.collective_model(p)
    fast = model.run(op, float(64 << 20), list(range(ranks)), algo, "fair")
    slow = model.run(op, float(64 << 20), list(range(ranks)), algo, "fair", 0, [], True)
    assert fast.closed_form and not slow.closed_form and slow.transfers > 0
    assert slow.time == pytest.approx(fast.time, rel=1e-9)


def test_auto_picks_the_fastest_algorithm(platform):
    # The topology model's auto (NCCL's tuner off: it picks by NCCL's own
    # figures instead, test_nccl_tuning.py).
    p = platform("hgx-h100", **{"collectives.nccl_tuner.enabled": False})
    S = 1 * GIB
    best = sim.collective(p, "all_reduce", S, 8)
    for algo in ("ring", "direct", "halving_doubling", "double_binary_tree", "in_switch"):
        assert best.time <= sim.collective_time(p, "all_reduce", S, 8, algo=algo) * (1 + 1e-12)
    assert best.algorithm == "in_switch"


def test_hierarchical_crosses_nodes_over_nics(platform):
    # zionex: 2 nodes x 8 GPUs. Intra-node 16 ranks would need 2 nodes; an
    # inter-node all_reduce is slower than the same ranks count inside a node.
    p = platform("zionex")
    inside = sim.collective_time(p, "all_reduce", 256 << 20, list(range(8)))
    across = sim.collective_time(p, "all_reduce", 256 << 20, [0, 1, 2, 3, 8, 9, 10, 11])
    assert across > inside
    r = sim.collective(p, "all_reduce", 256 << 20, 16)
    assert r.algorithm in {"hierarchical", "ring", "direct", "halving_doubling", "double_binary_tree"}


def test_send_recv_between_nodes_pays_the_nic(platform):
    # zionex, GPUDirect: oam -> pcie -> nic -> tor -> nic -> pcie -> oam. The
    # 200 Gb/s NIC (25 GB/s) sits behind PCIe Gen4 x16 (24 GB/s effective),
    # so PCIe is the bottleneck. Latency: 4 PCIe hops x 150 ns + 2 NIC links
    # x (1000 ns NIC + 600/2 ns ToR).
    p = platform("zionex")
    S = 1e9
    t = sim.collective_time(p, "send_recv", S, [0, 8])
    assert t == pytest.approx(S / 24e9 + (4 * 150 + 2 * 1300) * 1e-9, rel=1e-9)
    assert t > sim.collective_time(p, "send_recv", S, [0, 1])


def test_rank_lists_and_counts_agree(platform):
    p = platform()
    assert sim.collective_time(p, "all_reduce", 1 << 20, 4) == sim.collective_time(p, "all_reduce", 1 << 20, [0, 1, 2, 3])


def test_bus_bandwidth_factors_are_nccl_tests():
    assert sim.bus_bandwidth_factor("all_reduce", 8) == pytest.approx(1.75)
    for op in ("reduce_scatter", "all_gather", "all_to_all"):
        assert sim.bus_bandwidth_factor(op, 8) == pytest.approx(0.875)
    for op in ("broadcast", "reduce", "send_recv"):
        assert sim.bus_bandwidth_factor(op, 8) == 1


def test_each_name_table_is_bound_from_its_one_cpp_table(platform):
    # The CLI's choices, the platform loader's checks and the errors below all
    # read these lists, in this order.
    assert sim.collective_op_names() == ["all_reduce", "reduce_scatter", "all_gather", "all_to_all", "broadcast",
                                         "reduce", "send_recv"]
    assert sim.algorithm_names() == ["auto", "ring", "direct", "halving_doubling", "double_binary_tree",
                                     "hierarchical", "in_switch"]
    assert sim.link_model_names() == ["fair", "unaware", "astra"]
    assert sim.topology_names() == ["fully_connected", "hybrid_cube_mesh", "ring", "switch"]
    assert sim.dimension_kind_names() == ["Ring", "FullyConnected", "Switch"]
    with pytest.raises(ValueError, match="unknown link model 'fast'; allowed: " + ", ".join(sim.link_model_names())):
        sim.collective_time(platform(), "all_reduce", 1024, 8, link_model="fast")


def test_bad_requests_name_the_problem(platform):
    p = platform()
    with pytest.raises(IndexError, match="8 devices"):
        sim.collective_time(p, "all_reduce", 1024, [0, 9])
    with pytest.raises(ValueError, match="power-of-two number of ranks, got 6"):
        sim.collective_time(p, "all_reduce", 1024, 6, algo="halving_doubling")
    with pytest.raises(ValueError, match="unknown collective 'allreduce'; allowed: all_reduce"):
        sim.collective_time(p, "allreduce", 1024, 8)
    with pytest.raises(ValueError, match="unknown collective algorithm 'tree'"):
        sim.collective_time(p, "all_reduce", 1024, 8, algo="tree")
    with pytest.raises(ValueError, match="listed twice"):
        sim.collective_time(p, "all_reduce", 1024, [1, 1])
    with pytest.raises(ValueError, match="in_switch needs"):
        sim.collective_time(p, "all_reduce", 1024, 8, algo="in_switch")
    with pytest.raises(ValueError, match="4x4 matrix"):
        sim.collective(p, "all_to_all", 0, 4, all_to_all_bytes=[[1, 2], [3, 4]])


@pytest.fixture(scope="module")
def zionex_1024():
    import zion_emu

    return zion_emu.load_platform("zionex", overrides={"nodes": 128})


@pytest.mark.parametrize("S", [3 * 2**20, GIB])
def test_a_ring_over_1024_ranks_is_paced_by_its_inter_node_hop_at_any_size(zionex_1024, S):
    # zionex, 128 nodes: too many transfers to simulate (2 x 1024 x 1023), so
    # estimated step by step. Each of the n-1 steps sends S/(2n) each way
    # around the ring. The slowest flow is the one between nodes: OAM ->
    # PCIe switch -> NIC -> ToR -> NIC -> PCIe switch -> OAM, latency
    # 2 x (150 + 150 + 1300) ns, paced by the OAM's 24 GB/s gen4 x16 link.
    # (The hop inside a node, 600 ns + S/(2n) / 34.29 GB/s, is shorter.)
    n, base = 1024, 6.6e-6
    expected = base + (n - 1) * (2 * (150 + 150 + 1300) * 1e-9 + S / (2 * n) / (24 * GB))
    r = sim.collective(zionex_1024, "all_gather", S, n, algo="ring")
    assert not r.closed_form
    assert r.time == pytest.approx(expected, rel=1e-12)
    # The size-independent lines kept per rank set give what planning at this size gives.
    planned = sim.collective(zionex_1024, "all_gather", S, n, algo="ring", force_simulation=True)
    assert r.time == pytest.approx(planned.time, rel=1e-12)


def test_auto_over_1024_ranks_picks_the_fastest_of_the_algorithms_forced_one_by_one(zionex_1024):
    n = 1024
    for S in (2**20, 5 * 2**20):
        forced = {algo: sim.collective_time(zionex_1024, "all_gather", S, n, algo=algo)
                  for algo in ("ring", "direct", "halving_doubling", "hierarchical")}
        auto = sim.collective(zionex_1024, "all_gather", S, n)
        assert auto.time == min(forced.values())
        assert auto.algorithm == min(forced, key=forced.get) == "hierarchical"
        # direct (a million transfers) is estimated step by step, from its lines at any size
        planned = sim.collective(zionex_1024, "all_gather", S, n, algo="direct", force_simulation=True)
        assert forced["direct"] == pytest.approx(planned.time, rel=1e-12)


def test_auto_prices_an_all_to_all_over_128_ranks_whose_plans_are_too_large_to_simulate_cheaply():
    # 128 x 127 transfers exceed auto's simulation limit for every algorithm;
    # auto then times them as if each were forced, and picks the fastest.
    p = zion_emu.load_platform("zionex")
    auto = sim.collective(p, "all_to_all", 128 << 20, 128)
    best = min((sim.collective(p, "all_to_all", 128 << 20, 128, algo=a) for a in ("direct", "ring")),
               key=lambda r: r.time)
    assert (auto.algorithm, auto.time) == (best.algorithm, best.time)


@pytest.mark.parametrize("name", ["zion", "hgx-h100"])
def test_one_rank_copies_an_out_of_place_collective_at_hbm_speed_and_runs_nothing_in_place(name):
    # One rank priced only the base latency: an 8 GiB all_gather showed 1.3 PB/s. NCCL copies the input to
    # the output of an out-of-place call (c10d's all_gather, reduce_scatter, all_to_all) and launches nothing
    # for an in-place one (c10d's all_reduce, broadcast, reduce). zion: 1000 GB/s HBM, 6.6 us base latency:
    # 8 GiB read and written is 2 x 8 GiB / 1000 GB/s = 17.18 ms.
    p = zion_emu.load_platform(name)
    hbm, base = p.get("oam.hbm_bandwidth_gb_per_s") * GB, p.get("collectives.base_latency_ns") * 1e-9
    S = 8 * GIB
    for op in ("all_gather", "reduce_scatter", "all_to_all"):
        assert sim.collective_time(p, op, S, [2]) == pytest.approx(base + 2 * S / hbm, rel=1e-12), op
    for op in ("all_reduce", "broadcast", "reduce"):
        assert sim.collective_time(p, op, S, [2]) == pytest.approx(base, rel=1e-12), op
    if name == "zion":
        assert base + 2 * S / hbm == pytest.approx(0.0171864692, rel=1e-9)
