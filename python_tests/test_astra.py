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
