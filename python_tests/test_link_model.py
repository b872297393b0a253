"""The link model: routes, max-min fair sharing, congestion-unaware and ASTRA link models.

Each test works its expected time by hand first."""

import pytest

from zion_emu import sim

GB = 1e9


def two_npus(bandwidth: float = 10 * GB, latency_s: float = 1e-6):
    # Two NPUs joined by one duplex link.
    return sim.build_dimension_topology([("Ring", 2, bandwidth, latency_s)])


def test_one_transfer_takes_latency_plus_bytes_over_bandwidth():
    t = two_npus()
    r = sim.simulate_transfers(t, [{"src": 0, "dst": 1, "bytes": 1e9}])
    # 1e9 B / 10 GB/s = 0.1 s, plus 1 us latency.
    assert r["makespan"] == pytest.approx(0.1 + 1e-6, rel=1e-12)


def test_two_transfers_on_one_link_each_get_half():
    t = two_npus()
    r = sim.simulate_transfers(t, [{"src": 0, "dst": 1, "bytes": 1e9}, {"src": 0, "dst": 1, "bytes": 1e9}])
    # Each at 5 GB/s: 0.2 s, plus latency.
    for start, end in r["timings"]:
        assert start == 0
        assert end == pytest.approx(0.2 + 1e-6, rel=1e-12)


def test_late_arrival_shares_then_the_survivor_speeds_up():
    t = two_npus(latency_s=0)
    S, B, t0 = 1e9, 10 * GB, 0.04
    r = sim.simulate_transfers(t, [
        {"src": 0, "dst": 1, "bytes": S},
        {"src": 0, "dst": 1, "bytes": S, "not_before": t0},
    ])
    # A alone until t0 (sends B*t0), then both at B/2 until A's rest is sent:
    a_end = t0 + (S - B * t0) / (B / 2)
    # B has sent the same S - B*t0 by then and finishes its last B*t0 alone.
    b_end = a_end + (S - (S - B * t0)) / B
    (a0, a1), (b0, b1) = r["timings"]
    assert (a0, b0) == (0, pytest.approx(t0))
    assert a1 == pytest.approx(a_end, rel=1e-12)
    assert b1 == pytest.approx(b_end, rel=1e-12)


def test_opposite_directions_do_not_share():
    t = two_npus()
    r = sim.simulate_transfers(t, [{"src": 0, "dst": 1, "bytes": 1e9}, {"src": 1, "dst": 0, "bytes": 1e9}])
    assert r["makespan"] == pytest.approx(0.1 + 1e-6, rel=1e-12)


def test_when_one_flow_ends_the_other_takes_the_whole_link():
    t = two_npus(latency_s=0)
    r = sim.simulate_transfers(t, [
        {"src": 0, "dst": 1, "bytes": 1e9},
        {"src": 0, "dst": 1, "bytes": 2e9},
    ])
    # Both at 5 GB/s until the 1 GB one ends at 0.2 s; the other has 1 GB
    # left and takes it at the full 10 GB/s: 0.2 + 0.1.
    assert r["timings"][0][1] == pytest.approx(0.2, rel=1e-12)
    assert r["timings"][1][1] == pytest.approx(0.3, rel=1e-12)


def test_dependencies_start_after_their_predecessor():
    t = two_npus(latency_s=2e-6)
    r = sim.simulate_transfers(t, [
        {"src": 0, "dst": 1, "bytes": 1e8},
        {"src": 1, "dst": 0, "bytes": 1e8, "deps": [0]},
    ])
    one = 0.01 + 2e-6
    assert r["timings"][1][0] == pytest.approx(one)
    assert r["makespan"] == pytest.approx(2 * one)


def test_unaware_link_model_ignores_sharing():
    t = two_npus()
    r = sim.simulate_transfers(t, [{"src": 0, "dst": 1, "bytes": 1e9}] * 2, link_model="unaware")
    # hops * alpha + bytes / B, whatever else is on the link.
    assert r["makespan"] == pytest.approx(1e-6 + 0.1, rel=1e-12)


def test_astra_link_model_queues_messages_fifo_in_whole_nanoseconds():
    t = two_npus(bandwidth=50 * (1 << 30), latency_s=500e-9)
    m = 32768
    r = sim.simulate_transfers(t, [{"src": 0, "dst": 1, "bytes": m}] * 2, link_model="astra", endpoint_delay_s=10e-9)
    # floor(500 + 32768 / 53.6870912) = floor(1110.35) = 1110 ns per message;
    # the second waits for the first (FIFO, not shared), then + 10 ns endpoint delay each.
    assert round(r["timings"][0][1] * 1e9) == 1110 + 10
    assert round(r["timings"][1][1] * 1e9) == 2 * 1110 + 10


def test_bad_transfers_are_rejected_with_reasons():
    t = two_npus()
    with pytest.raises(ValueError, match="two different vertices"):
        sim.simulate_transfers(t, [{"src": 0, "dst": 0, "bytes": 1}])
    with pytest.raises(ValueError, match="finite and >= 0"):
        sim.simulate_transfers(t, [{"src": 0, "dst": 1, "bytes": -5}])
    with pytest.raises(ValueError, match="not an earlier transfer"):
        sim.simulate_transfers(t, [{"src": 0, "dst": 1, "bytes": 1, "deps": [0]}])
    with pytest.raises(ValueError, match="allowed: fair, unaware, astra"):
        sim.simulate_transfers(t, [{"src": 0, "dst": 1, "bytes": 1}], link_model="fast")


def test_pcie_plus_upi_path_is_limited_by_the_slower_link(platform):
    # OAM 0 hangs off PCIe switch 0 (uplinks to sockets 0 and 1); socket 5 is
    # one UPI hop from socket 0. With a 16 GB/s Gen4 x16, a 16 GB/s Gen3 x16
    # uplink and 10 GB/s UPI, the UPI link limits the copy.
    p = platform(**{"upi.link_bandwidth_gb_per_s": 10, "pcie.lane_bandwidth_gb_per_s.gen4": 1.0,
                    "pcie.lane_bandwidth_gb_per_s.gen3": 1.0})
    t = sim.build_topology(p.native)
    oam0, socket5 = t.find("oam", 0, 0), t.find("socket", 0, 5)
    route = t.route(oam0, socket5)
    names = [t.links[l]["link_class"] for l in route["paths"][0]]
    assert names == ["pcie_gen4_x16", "pcie_gen3_x16", "upi"]
    assert route["bandwidth_bytes_per_s"] == 10 * GB
    r = sim.simulate_transfers(t, [{"src": oam0, "dst": socket5, "bytes": 1e9}])
    latency = (150 + 150 + 70) * 1e-9  # two PCIe hops and one UPI hop (zion preset)
    assert r["makespan"] == pytest.approx(latency + 1e9 / (10 * GB), rel=1e-12)


def test_opposite_node_of_a_ring_is_reached_both_ways_evenly(platform):
    t = sim.build_topology(platform(**{"fabric.topology": "ring"}).native)
    route = t.route(t.find("oam", 0, 0), t.find("oam", 0, 4))
    assert len(route["paths"]) == 2 and route["hops"] == 4
    assert route["bandwidth_bytes_per_s"] == 2 * 25 * GB


def test_host_staged_nic_traffic_goes_through_a_socket(platform):
    staged = sim.build_topology(platform("zionex", **{"nic.gpudirect": False}).native)
    direct = sim.build_topology(platform("zionex").native)
    for t, through_socket in ((staged, True), (direct, False)):
        r = t.route(t.find("oam", 0, 0), t.find("oam", 1, 0))
        kinds = {t.vertices[t.links[l]["dst"]]["kind"] for l in r["paths"][0]}
        assert "tor_switch" in kinds and "nic" in kinds
        assert ("socket" in kinds) == through_socket


def test_a_flow_held_back_elsewhere_leaves_its_share_to_the_others(platform):
    # Max-min fairness, not equal split: OAM 0 -> socket 5 crosses the
    # switch-0 uplink and a 2 GB/s UPI link; OAM 0 -> socket 0 crosses only
    # the OAM 0 PCIe link (16 GB/s). Both share the OAM 0 -> switch link.
    # The UPI-bound flow gets 2 GB/s, the other the remaining 14 GB/s.
    p = platform(**{"upi.link_bandwidth_gb_per_s": 2, "pcie.lane_bandwidth_gb_per_s.gen4": 1.0,
                    "pcie.lane_bandwidth_gb_per_s.gen3": 1.0, "pcie.latency_ns": 0, "upi.latency_ns": 0})
    t = sim.build_topology(p.native)
    oam0, s0, s5 = t.find("oam", 0, 0), t.find("socket", 0, 0), t.find("socket", 0, 5)
    r = sim.simulate_transfers(t, [
        {"src": oam0, "dst": s5, "bytes": 2e9},
        {"src": oam0, "dst": s0, "bytes": 14e9},
    ])
    assert r["timings"][0][1] == pytest.approx(1.0, rel=1e-12)
    assert r["timings"][1][1] == pytest.approx(1.0, rel=1e-12)
