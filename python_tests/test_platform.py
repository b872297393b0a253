"""Platform presets: every field sourced, user files and overrides, and
errors that name the field and what is allowed."""

import json
import numbers

import pytest

import zion_emu
from zion_emu import ConfigError
from zion_emu.platform import PRESET_DIR

PRESETS = ["zion", "zionex", "hgx-a100", "hgx-h100"]


def leaves(node, path=""):
    if isinstance(node, dict):
        for k, v in node.items():
            yield from leaves(v, f"{path}.{k}" if path else k)
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from leaves(v, f"{path}.{i}")
    else:
        yield path, node


def test_presets_are_listed():
    assert set(PRESETS) <= set(zion_emu.preset_names())


@pytest.mark.parametrize("name", PRESETS)
def test_every_number_of_a_preset_names_its_source_or_says_it_is_an_assumption(name):
    p = zion_emu.load_platform(name)
    for path, value in leaves({k: v for k, v in p.fields.items() if k != "sources"}):
        if isinstance(value, (numbers.Number, bool)):
            source = p.source(path)
            assert source and len(source) > 10, f"{name}: {path} has no source"


def test_zion_defaults_follow_the_design():
    p = zion_emu.load_platform()
    assert p.name == "zion"
    assert p.get("socket.count") == 8 and p.get("oam.count") == 8
    assert p.get("upi.link_bandwidth_gb_per_s") == 20.8  # 10.4 GT/s x 2 B per transfer (Cooper Lake UPI)
    assert p.total_devices == 8


def test_zionex_is_16_nodes_of_8_accelerators_each_with_a_200g_nic():
    p = zion_emu.load_platform("zionex")
    assert (p.nodes, p.devices_per_node, p.total_devices) == (16, 8, 128)
    assert p.get("nic.count") == 8 and p.get("nic.bandwidth_gbit_per_s") == 200


def test_overrides_change_a_field_and_record_where_it_came_from():
    p = zion_emu.load_platform("zion", overrides={"fabric.topology": "ring", "pcie.switches.0.oams": [0, 1]},
                               assignments=["oam.hbm_bytes=1073741824"])
    assert p.get("fabric.topology") == "ring"
    assert p.get("oam.hbm_bytes") == 1 << 30
    assert p.source("oam.hbm_bytes").startswith("override")


def test_environment_selects_the_default_platform(monkeypatch):
    monkeypatch.setenv("ZION_PLATFORM", "hgx-a100")
    assert zion_emu.load_platform().name == "hgx-a100"


def test_a_user_file_builds_on_a_preset(tmp_path):
    f = tmp_path / "mine.json"
    f.write_text(json.dumps({"base": "zion", "name": "zion-big-hbm", "oam": {"hbm_bytes": 96 << 30}}))
    p = zion_emu.load_platform(str(f))
    assert p.name == "zion-big-hbm" and p.get("oam.hbm_bytes") == 96 << 30
    assert p.get("oam.count") == 8  # the rest from the base


def bad_file(tmp_path, doc):
    f = tmp_path / "bad.json"
    f.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return str(f)


@pytest.mark.parametrize("overrides,message", [
    ({"oam.hbm_bandwidth_gb_per_s": -1}, r"field 'oam.hbm_bandwidth_gb_per_s' must be > 0, got -1"),
    ({"fabric.link_bandwidth_gb_per_s": 0}, r"field 'fabric.link_bandwidth_gb_per_s' must be > 0, got 0"),
    ({"oam.hbm_bytes": 0}, r"'oam.hbm_bytes' must be a positive integer number of bytes"),
    ({"fabric.topology": "torus"}, r"fabric.topology' is \"torus\".*allowed: fully_connected, hybrid_cube_mesh, ring, switch"),
    ({"pcie.switches.0.oams": [0, 1, 9]}, r"pcie.switches.0.oams' lists OAM 9, but there are 8 OAMs \(allowed 0..7\)"),
    ({"pcie.switches.0.oams": [1]}, r"attach OAM 0 to no switch"),
    ({"pcie.switches.0.generation": "gen9"}, r"generation' is \"gen9\".*allowed: gen3, gen4, gen5"),
    ({"oam.efficiency.matmul": 1.5}, r"'oam.efficiency.matmul' must be in \(0, 1\]"),
    ({"nodes": "two"}, r"'nodes' must be an integer"),
    ({"upi.links": [[0, 0]]}, r"'upi.links' has entry \[0,0\]"),
    # a copy across the missing link failed only when it ran ("no route from socket7 to oam0")
    ({"upi.links": []}, r"'upi.links' leaves socket 1 unreachable from socket 0; the links must join all 8 sockets"),
    ({"nic.count": 0}, r"'pcie.switches.0.nics' lists NIC 0, but there are 0 NICs \(so the list must be empty\)"),
    ({"collectives.algorithm": "fastest"}, r"allowed: auto, ring, direct"),
    ({"fabric.in_switch_reduction": True}, r"only fabric.topology = switch can reduce in the switch"),
    ({"oam.hbm_byte": 1}, r"override of unknown field 'oam.hbm_byte' \(at 'oam'\); allowed: .*hbm_bytes"),
    ({"pcie.switches.7.oams": [1]}, r"'pcie.switches' is a list of 4; index '7' must be 0..3"),
])
def test_wrong_fields_are_errors_naming_the_field_and_what_is_allowed(overrides, message):
    with pytest.raises(ConfigError, match=message):
        zion_emu.load_platform("zion", overrides=overrides)


def test_unknown_preset_lists_the_presets():
    with pytest.raises(ConfigError, match=r"unknown platform 'zoin'; presets: hgx-a100, hgx-h100, zion, zionex"):
        zion_emu.load_platform("zoin")


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        zion_emu.load_platform(str(tmp_path / "nope.json"))
    with pytest.raises(ConfigError, match="is not valid JSON"):
        zion_emu.load_platform(bad_file(tmp_path, '{"base": "zion",'))
    with pytest.raises(ConfigError, match="must hold a JSON object"):
        zion_emu.load_platform(bad_file(tmp_path, "[1, 2]"))


def test_unknown_field_in_a_file_is_named_with_the_allowed_ones(tmp_path):
    with pytest.raises(ConfigError, match=r"unknown field 'oam.hbm_gb'; allowed here: count, efficiency, hbm_bandwidth_gb_per_s, hbm_bytes"):
        zion_emu.load_platform(bad_file(tmp_path, {"base": "zion", "oam": {"hbm_gb": 32}}))


def test_partial_file_without_base_names_the_missing_field(tmp_path):
    with pytest.raises(ConfigError, match=r"field 'nodes' is missing"):
        zion_emu.load_platform(bad_file(tmp_path, {"name": "x", "description": "y"}))


def test_a_file_that_is_its_own_base_is_a_cycle(tmp_path):
    f = tmp_path / "loop.json"
    f.write_text(json.dumps({"base": str(f)}))
    with pytest.raises(ConfigError, match="cycle"):
        zion_emu.load_platform(str(f))


def test_a_cycle_through_two_files_names_every_file_of_it(tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps({"base": "b.json"}))
    b.write_text(json.dumps({"base": "a.json"}))
    with pytest.raises(ConfigError) as raised:
        zion_emu.load_platform(str(a))
    assert str(raised.value) == (f"platform file '{a}' is its own base, through a cycle of \"base\": '{a}' -> '{b}' -> "
                                 f"'{a}'")


def test_malformed_assignment():
    with pytest.raises(ConfigError, match="path.to.field=value"):
        zion_emu.load_platform("zion", assignments=["fabric.topology"])


def test_presets_directory_holds_the_four_presets():
    assert {p.stem for p in PRESET_DIR.glob("*.json")} >= set(PRESETS)


def test_a_platform_file_that_is_not_utf8_is_a_config_error_naming_the_file_and_the_bytes(tmp_path):
    # The parser's message quotes the file's bytes; one that is not UTF-8 is
    # written as \xNN so that the error reaches Python whole, as a ConfigError.
    path = tmp_path / "latin.json"
    path.write_bytes(b'{"base": "zion", "name": "caf\xe9"}')
    with pytest.raises(ConfigError) as raised:
        zion_emu.load_platform(str(path))
    message = str(raised.value)
    assert message.startswith(f"platform file '{path}' is not valid JSON: ")
    assert "ill-formed UTF-8" in message and "'\"caf\\xe9\"'" in message
    # Well-formed UTF-8 in a message is kept as it is.
    with pytest.raises(ConfigError, match="^unknown platform 'café'; presets: "):
        zion_emu.load_platform("café")
