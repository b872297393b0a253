"""ASTRA-sim 2.0 compatibility: inputs read as ASTRA-sim reads them, and its
analytical backend's time reproduced exactly."""

import json

import pytest

from zion_emu import ConfigError, astra

NETWORK = "topology: [ Ring ]\nnpus_count: [ 8 ]\nbandwidth: [ 50.0 ]\nlatency: [ 500.0 ]\n"
SYSTEM = {
    "scheduling-policy": "LIFO", "endpoint-delay": 10, "active-chunks-per-dimension": 1,
    "preferred-dataset-splits": 4, "all-reduce-implementation": ["ring"],
    "all-gather-implementation": ["ring"], "reduce-scatter-implementation": ["ring"],
    "all-to-all-implementation": ["ring"], "collective-optimization": "localBWAware", "local-mem-bw": 50,
    "boost-mode": 0,
}


def machine(network=NETWORK, system=None):
    return astra.AstraMachine(astra.parse_network(network), astra.parse_system(json.dumps(system or SYSTEM)))


def test_worked_ring_all_reduce_is_117780_ns():
    # m = 1 MiB / (4 splits * 8) = 32768 B; B = 50 * 2^30 B/s = 53.687 B/ns;
    # M = 50 B/ns. Per chunk: 2*7*(floor(500 + 610.35) + 10) + 7*3*floor(655.36) + 10
    # = 14*1120 + 7*1965 + 10 = 29445 ns; 4 chunks one after another.
    per_chunk = 2 * 7 * (1110 + 10) + 7 * 3 * 655 + 10
    assert 4 * per_chunk == 117780
    r = machine().run("all_reduce", 1 << 20)
    assert round(r.time * 1e9, 6) == 117780
    assert r.algorithm == "ring"


def test_step_simulation_of_the_worked_case_agrees():
    m = machine()
    r = m.model("all_reduce").run("all_reduce", float(1 << 20), list(range(8)), "ring", "astra", 0, [], True)
    assert not r.closed_form
    assert round(r.time * 1e9, 6) == 117780


def test_active_chunks_run_together_and_queue_on_links():
    one = machine().run("all_reduce", 1 << 20).time
    two = machine(system={**SYSTEM, "active-chunks-per-dimension": 2}).run("all_reduce", 1 << 20).time
    # Two chunks at once share each link FIFO: no faster, but the waves halve
    # the per-chunk endpoint delays and reductions overlap with transfers.
    assert 0.5 * one < two <= one


def test_two_dimensions_run_hierarchically():
    net = "topology: [ Ring, Switch ]\nnpus_count: [ 4, 2 ]\nbandwidth: [ 50.0, 25.0 ]\nlatency: [ 500.0, 1000.0 ]\n"
    system = {**SYSTEM, "all-reduce-implementation": ["ring", "direct"]}
    r = machine(net, system).run("all_reduce", 1 << 20)
    assert r.algorithm == "hierarchical" and r.time > 0


@pytest.mark.parametrize("network,message", [
    ("topology: [ Ring ]\nnpus_count: [ 8 ]\nbandwidth: [ 50.0 ]\n", "'latency' is missing"),
    ("topology: [ Torus ]\nnpus_count: [ 8 ]\nbandwidth: [ 50.0 ]\nlatency: [ 1 ]\n", "allowed: Ring, FullyConnected, Switch"),
    ("topology: [ Ring ]\nnpus_count: [ 8, 2 ]\nbandwidth: [ 50.0 ]\nlatency: [ 1 ]\n", "has 2 entries but topology has 1"),
    ("topology: [ Ring ]\nnpus_count: [ 8 ]\nbandwidth: [ -5 ]\nlatency: [ 1 ]\n", "must be > 0 GB/s"),
    ("topology: [ Ring ]\nnpus_count: [ 1 ]\nbandwidth: [ 5 ]\nlatency: [ 1 ]\n", "must be >= 2"),
    ("topology: [ Ring\n", "not valid YAML"),
    ("- 1\n- 2\n", "expected a mapping"),
    ("topology: [ Ring ]\nnpus_count: [ 8 ]\nbandwidth: [ 50.0 ]\nlatency: [ 1 ]\nlinks: 3\n", "'links' is not a network field"),
])
def test_malformed_network_inputs(network, message):
    with pytest.raises(ConfigError, match=message):
        astra.parse_network(network)


@pytest.mark.parametrize("system,message", [
    ('{"endpoint-delay": -1}', "'endpoint-delay' must be a number >= 0"),
    ('{"preferred-dataset-splits": 0}', "must be a whole number >= 1"),
    ('{"all-reduce-implementation": ["magic"]}', "allowed: ring, direct, halvingDoubling, doubleBinaryTree"),
    ('{"endpoint-delay": 10,', "not valid JSON"),
    ('{"warp-speed": 9}', "'warp-speed' is not an ASTRA-sim system field"),
])
def test_malformed_system_inputs(system, message):
    with pytest.raises(ConfigError, match=message):
        astra.parse_system(system)


def test_unreadable_files_are_named(tmp_path):
    with pytest.raises(ConfigError, match="cannot be read"):
        astra.load(tmp_path / "missing.yml")


# --- ASTRA-sim 2.0's system layer and analytical backends, event by event -------------------------
#
# 8 NPUs, 50 GB/s (x 2^30 / 1e9 = 53.687 B/ns), 500 ns per link, endpoint delay 10 ns, local memory
# 50 GB/s (50 B/ns), 1 MiB in 4 splits of 256 KiB, one split at a time: the total is 4 chunks.
# Per message over one link: floor(500 + m / 53.687) ns in flight, and the link is busy
# floor(m / 53.687) ns. 32 KiB (chunk / 8): 1110 in flight, 610 busy. 256 KiB: 5382 in flight.
# A packet reaches the algorithm 10 ns after it is created (at the stream's start or when one
# arrives), plus 3 x floor(32768 / 50) = 1965 ns when it carries a reduction.

def emulation_machine(topology, implementation):
    net = f"topology: [ {topology} ]\nnpus_count: [ 8 ]\nbandwidth: [ 50.0 ]\nlatency: [ 500.0 ]\n"
    system = {"endpoint-delay": 10, "preferred-dataset-splits": 4, "active-chunks-per-dimension": 1,
              "local-mem-bw": 50, **{key: [implementation] for key in astra._OPS.values()}}
    return astra.AstraMachine(astra.parse_network(net), astra.parse_system(json.dumps(system)))


RING_HOP, SWITCH_PATH, BUSY, ENDPOINT, REDUCE = 1110, 2 * 1110, 610, 10, 3 * 655

EMULATED = [
    # ring all_to_all: n(n-1)/2 = 28 packets of 32 KiB to the ring neighbour, one at a time.
    ("Ring", "ring", "all_to_all", 4 * (ENDPOINT + 28 * (RING_HOP + ENDPOINT)), 125_480),
    ("FullyConnected", "ring", "all_to_all", 4 * (ENDPOINT + 28 * (RING_HOP + ENDPOINT)), 125_480),
    # through the switch each packet crosses two links, store and forward.
    ("Switch", "ring", "all_to_all", 4 * (ENDPOINT + 28 * (SWITCH_PATH + ENDPOINT)), 249_800),
    # direct all_to_all: 7 packets at once to the 7 others; the uplink sends them 610 ns apart and
    # each round is a permutation of the downlinks, so the last lands at 6 x 610 + 2 x 1110.
    ("Switch", "direct", "all_to_all", 4 * (ENDPOINT + 6 * BUSY + SWITCH_PATH + ENDPOINT), 23_600),
    # direct reduce_scatter: the same, and the last packet's reduction.
    ("Switch", "direct", "reduce_scatter", 4 * (ENDPOINT + 6 * BUSY + SWITCH_PATH + ENDPOINT + REDUCE), 31_460),
    # direct all_reduce: the second half goes once all 7 first-half packets are in: the 4th
    # reduction ends at 10 + 3 x 610 + 2220 + 10 + 1965 = 6035 (the 7th arrived at 5890); 4 packets
    # leave then and one per later reduction, 610 ns apart on the uplink: the last lands at
    # 6035 + 6 x 610 + 2220.
    ("Switch", "direct", "all_reduce",
     4 * (ENDPOINT + 3 * BUSY + SWITCH_PATH + ENDPOINT + REDUCE + 6 * BUSY + SWITCH_PATH + ENDPOINT), 47_700),
    # ring all_gather: 7 packets of the whole 256 KiB chunk.
    ("Ring", "ring", "all_gather", 4 * (ENDPOINT + 7 * (5382 + ENDPOINT)), 151_016),
    # ring all_reduce: 14 packets, 7 of them reduced.
    ("Ring", "ring", "all_reduce", 4 * (ENDPOINT + 14 * (RING_HOP + ENDPOINT) + 7 * REDUCE), 117_780),
]


@pytest.mark.parametrize("topology,implementation,op,hand_worked,astra_sim", EMULATED)
def test_congestion_aware_emulation_gives_astra_sims_nanoseconds(topology, implementation, op, hand_worked,
                                                                 astra_sim):
    assert hand_worked == astra_sim
    assert emulation_machine(topology, implementation).emulate(op, 1 << 20) == astra_sim


@pytest.mark.parametrize("topology,implementation,op,hand_worked,astra_sim", [
    # unaware: each message alone, floor(hops x 500 + 610.35): ring neighbour 1110, switch 1610.
    ("Ring", "ring", "all_reduce", 4 * (ENDPOINT + 14 * (RING_HOP + ENDPOINT) + 7 * REDUCE), 117_780),
    ("Switch", "direct", "all_to_all", 4 * (ENDPOINT + 1610 + ENDPOINT), 6_520),
])
def test_congestion_unaware_emulation_gives_astra_sims_nanoseconds(topology, implementation, op, hand_worked,
                                                                   astra_sim):
    assert hand_worked == astra_sim
    assert emulation_machine(topology, implementation).emulate(op, 1 << 20, congestion_aware=False) == astra_sim


def test_emulation_refuses_what_it_does_not_cover():
    m = emulation_machine("Ring", "ring")
    assert m.emulation_refusal("broadcast") == "broadcast is not emulated; allowed: all_reduce, all_gather, " \
                                               "reduce_scatter, all_to_all"
    hd = astra.AstraMachine(astra.parse_network(NETWORK),
                            astra.parse_system(json.dumps({**SYSTEM, "all-reduce-implementation": ["halvingDoubling"]})))
    with pytest.raises(ConfigError, match="all-reduce-implementation is halving_doubling; the emulation covers ring and direct"):
        hd.emulate("all_reduce", 1 << 20)
    with pytest.raises(ValueError, match="leave empty messages"):
        m.emulate("all_reduce", 16)
    big = astra.AstraMachine(astra.parse_network(NETWORK.replace("[ 8 ]", "[ 4096 ]")), astra.parse_system(json.dumps(SYSTEM)))
    with pytest.raises(ValueError, match="packets .* is more than the 20000000 emulated at most"):
        big.emulate("all_to_all", 1 << 40)  # a ring all_to_all of 4096 NPUs: 4 x 4096 x 8.4 M packets


def test_nccl_tests_sizes_of_all_gather_are_npus_times_astra_sims():
    m = emulation_machine("Ring", "ring")
    r = m.emulated("all_gather", 8 << 20)  # 8 MiB gathered = 1 MiB from each NPU
    assert round(r.time * 1e9) == 151_016 and r.algorithm == "ring"
    assert r.busbw == pytest.approx((8 << 20) / r.time * 7 / 8)
