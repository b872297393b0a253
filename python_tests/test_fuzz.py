"""Fuzzing the input readers with hypothesis: the platform loader (random
files, random overrides of real fields, random command-line assignments) and
the ASTRA-sim importers. Whatever the input, the answer is a result or a
ConfigError / ValueError with a message; never a crash or another
exception. Inputs that load are also used: a platform that loads prices a
collective in finite, positive time, and so does an ASTRA-sim machine.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import zion_emu
from zion_emu import ConfigError, astra, sim

# Derandomized: the same examples on every run, so a test stays green or red
# for a reason (raise max_examples locally to search further).
FUZZ = settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])

_ZION = zion_emu.load_platform("zion").fields


def _leaf_paths(node: Any, prefix: str = "") -> list[str]:
    if isinstance(node, dict):
        return [p for k, v in node.items() for p in _leaf_paths(v, f"{prefix}{k}.")]
    if isinstance(node, list) and node and isinstance(node[0], (dict, list)):
        return [p for i, v in enumerate(node) for p in _leaf_paths(v, f"{prefix}{i}.")]
    return [prefix[:-1]]


PATHS = sorted(p for p in _leaf_paths(_ZION) if not p.startswith("sources"))

scalars = st.one_of(
    st.none(), st.booleans(),
    st.integers(min_value=-(1 << 70), max_value=1 << 70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
)
json_values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                            st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                           max_leaves=12)


def _expect_clear_error(error: BaseException) -> None:
    assert isinstance(error, (ConfigError, ValueError)), f"{type(error).__name__}: {error}"
    assert str(error).strip(), f"{type(error).__name__} without a message"


def _usable(platform: zion_emu.Platform) -> None:
    """A platform that loads answers a collective in finite, positive time."""
    ranks = min(platform.total_devices, 8)
    if ranks < 2:
        return
    try:
        t = sim.collective_time(platform, "all_reduce", 1 << 20, ranks)
    except (ConfigError, ValueError) as e:  # e.g. a variant whose algorithms cannot serve these ranks
        _expect_clear_error(e)
        return
    assert math.isfinite(t) and t > 0, (t, platform.fields)


def _load(*args: Any, **kwargs: Any) -> None:
    try:
        platform = zion_emu.load_platform(*args, **kwargs)
    except Exception as e:  # noqa: BLE001  (the assertion is on its type)
        _expect_clear_error(e)
        return
    _usable(platform)


@FUZZ
@given(overrides=st.dictionaries(st.sampled_from(PATHS), json_values, min_size=1, max_size=3))
def test_random_overrides_of_real_fields_load_or_raise_a_config_error(overrides):
    _load("zion", overrides=overrides)


@FUZZ
@given(overrides=st.dictionaries(st.text(max_size=20), json_values, min_size=1, max_size=3))
def test_random_override_paths_load_or_raise_a_config_error(overrides):
    _load("zion", overrides=overrides)


@FUZZ
@given(assignment=st.one_of(
    st.text(max_size=40),
    st.builds(lambda p, v: f"{p}={v}", st.sampled_from(PATHS), st.text(max_size=12)),
))
def test_random_command_line_assignments_load_or_raise_a_config_error(assignment):
    _load("zion", assignments=[assignment])


@FUZZ
@given(doc=st.one_of(
    json_values,
    st.dictionaries(st.sampled_from(sorted(_ZION)), json_values, max_size=4).map(lambda d: {"base": "zion", **d}),
    st.dictionaries(st.sampled_from(sorted(_ZION)), json_values, max_size=4),
))
def test_random_platform_files_load_or_raise_a_config_error(doc):
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "fuzz.json")
        with open(path, "w") as f:
            json.dump(doc, f)  # NaN and Infinity are written as the non-JSON tokens: also bad input
        _load(path)


@FUZZ
@given(raw=st.binary(max_size=64))
def test_random_bytes_as_a_platform_file_raise_a_config_error(raw):
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "fuzz.json")
        with open(path, "wb") as f:
            f.write(raw)
        _load(path)


# -- ASTRA-sim --------------------------------------------------------------

def _machine_usable(network: astra.AstraNetwork, system: astra.AstraSystem) -> None:
    if network.npus > 64:
        return  # the parse is what is fuzzed; large machines are the benchmarks' business
    try:
        machine = astra.AstraMachine(network, system)
        result = machine.run("all_reduce", 1 << 20)
    except Exception as e:  # noqa: BLE001
        _expect_clear_error(e)
        return
    assert math.isfinite(result.time) and result.time > 0, (network, system, result.time)


numbers = st.one_of(st.integers(min_value=-4, max_value=70), st.floats(allow_nan=True, allow_infinity=True),
                    st.text(max_size=4), st.none(), st.booleans())
network_docs = st.fixed_dictionaries({}, optional={
    "topology": st.one_of(st.lists(st.sampled_from(["Ring", "FullyConnected", "Switch", "Torus", ""]), max_size=3),
                          json_values),
    "npus_count": st.one_of(st.lists(numbers, max_size=3), numbers),
    "bandwidth": st.one_of(st.lists(numbers, max_size=3), numbers),
    "latency": st.one_of(st.lists(numbers, max_size=3), numbers),
    "extra": json_values,
})


@FUZZ
@given(doc=network_docs)
def test_random_astra_networks_parse_or_raise_a_config_error(doc):
    import yaml

    try:
        network = astra.parse_network(yaml.safe_dump(doc))
    except Exception as e:  # noqa: BLE001
        _expect_clear_error(e)
        return
    _machine_usable(network, astra.AstraSystem())


@FUZZ
@given(text=st.text(max_size=120))
def test_random_text_as_an_astra_network_raises_a_config_error_or_parses(text):
    try:
        astra.parse_network(text)
    except Exception as e:  # noqa: BLE001
        _expect_clear_error(e)


system_keys = ["endpoint-delay", "preferred-dataset-splits", "active-chunks-per-dimension", "local-mem-bw",
               "all-reduce-implementation", "all-to-all-implementation", "scheduling-policy", "unknown-key"]


@FUZZ
@given(doc=st.one_of(
    st.dictionaries(st.sampled_from(system_keys), st.one_of(numbers, st.lists(st.sampled_from(
        ["ring", "direct", "halvingDoubling", "doubleBinaryTree", "tree"]), max_size=3), json_values), max_size=5),
    json_values,
))
def test_random_astra_systems_parse_or_raise_a_config_error(doc):
    try:
        system = astra.parse_system(json.dumps(doc))
    except Exception as e:  # noqa: BLE001
        _expect_clear_error(e)
        return
    network = astra.parse_network("topology: [Ring]\nnpus_count: [4]\nbandwidth: [50]\nlatency: [500]\n")
    _machine_usable(network, system)


@pytest.mark.parametrize("text", ["", "null", "{}", "[]", '"x"', "1e400", '{"endpoint-delay": NaN}'])
def test_edge_case_astra_system_texts(text):
    try:
        astra.parse_system(text)
    except Exception as e:  # noqa: BLE001
        _expect_clear_error(e)
