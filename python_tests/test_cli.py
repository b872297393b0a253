"""The command line (``python -m zion_emu``): info, collectives, tour.

Commands run in-process through ``main([...])``; numbers come from the model
(the CLI only formats them), except the ASTRA-sim worked case and the
paper's ring vs fully connected ratios.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from zion_emu import load_platform, sim
from zion_emu.__main__ import main
from zion_emu.cli import CliError
from zion_emu.cli.sizes import parse_size
from processes import zion_emu_cli

ASTRA_NETWORK = "topology: [ Ring ]\nnpus_count: [ 8 ]\nbandwidth: [ 50.0 ]\nlatency: [ 500.0 ]\n"
ASTRA_SYSTEM = {
    "endpoint-delay": 10, "preferred-dataset-splits": 4, "active-chunks-per-dimension": 1, "local-mem-bw": 50,
    "all-reduce-implementation": ["ring"], "all-gather-implementation": ["ring"],
    "reduce-scatter-implementation": ["ring"], "all-to-all-implementation": ["ring"],
}
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def astra_files(tmp_path: Path) -> tuple[str, str]:
    net, system = tmp_path / "net.yml", tmp_path / "sys.json"
    net.write_text(ASTRA_NETWORK)
    system.write_text(json.dumps(ASTRA_SYSTEM))
    return str(net), str(system)


def run_ok(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert main(list(argv)) == 0
    return capsys.readouterr().out


def table_rows(out: str) -> list[list[str]]:
    """Rows of nccl-tests-style tables: size, count, type, redop, root, time, algbw, busbw, algorithm."""
    rows = [line.split() for line in out.splitlines() if not line.startswith("#")]
    return [r for r in rows if len(r) == 9 and r[0].isdigit()]


# --- info -------------------------------------------------------------------------------------------

def test_info_names_every_link_class_of_zion_and_draws_one_node(capsys: pytest.CaptureFixture[str]) -> None:
    out = run_ok(capsys, "info")
    names = [c["name"] for c in sim.build_topology(load_platform("zion").native).link_classes]
    assert names  # upi, pcie_*, fabric, nic, frontend_nic
    for name in names:
        assert f"\n  {name} " in out
    # The drawing: sockets over PCIe switches over OAMs, then the fabric by its topology.
    assert "CPU7" in out and "[PCIe3 NIC3]" in out and "OAM7" in out
    assert "fabric: fully_connected, 28 links x 25 GB/s" in out
    # Zion's fabric: 8 OAMs fully connected = 8·7/2 = 28 links.
    assert "UPI: 24 links" in out


@pytest.mark.parametrize("preset", ["zion", "zionex", "hgx-a100", "hgx-h100"])
def test_info_drawing_stays_small_for_two_to_eight_sockets(capsys: pytest.CaptureFixture[str], preset: str) -> None:
    out = run_ok(capsys, "info", "--platform", preset)
    drawing = out.split("One node:\n", 1)[1].splitlines()
    assert 6 <= len(drawing) <= 15
    assert max(len(line) for line in drawing) <= 100
    sockets = load_platform(preset).get("socket.count")
    assert all(f"CPU{s}" in "\n".join(drawing) for s in range(sockets))
    assert all(f"OAM{o}" in "\n".join(drawing) for o in range(8))


def test_info_json_is_the_merged_fields_plus_link_classes(capsys: pytest.CaptureFixture[str]) -> None:
    doc = json.loads(run_ok(capsys, "info", "--json", "--set", "fabric.topology=ring"))
    assert doc["name"] == "zion"
    assert doc["fabric"]["topology"] == "ring"
    fabric = next(c for c in doc["link_classes"] if c["name"] == "fabric")
    assert fabric["bandwidth_gb_per_s"] == pytest.approx(25.0)
    assert fabric["links_per_node"] == 8  # a ring of 8 OAMs


# --- collectives: sizes and table -------------------------------------------------------------------

def test_sizes_are_powers_of_two_like_nccl_tests() -> None:
    assert parse_size("8") == 8
    assert parse_size("1K") == 1024
    assert parse_size("1M") == 1048576
    assert parse_size("8G") == 8 * 2**30
    assert parse_size("4k") == 4096
    with pytest.raises(CliError, match="12Q"):
        parse_size("12Q")


def test_all_reduce_table_8_to_8G_has_31_rows_and_busbw_is_algbw_times_2_n_minus_1_over_n(
        capsys: pytest.CaptureFixture[str]) -> None:
    out = run_ok(capsys, "collectives", "--op", "all_reduce", "--ranks", "8", "--min-bytes", "8", "--max-bytes", "8G")
    rows = table_rows(out)
    assert len(rows) == 31  # 2^3 .. 2^33
    assert [int(r[0]) for r in rows] == [2**k for k in range(3, 34)]
    # size, count, type, redop, root, time, algbw, busbw, algorithm
    assert rows[0][1:5] == ["2", "float", "sum", "-1"]
    for r in rows:
        algbw, busbw = float(r[6]), float(r[7])
        assert busbw == pytest.approx(algbw * 2 * 7 / 8, abs=0.005 * 1.75 + 0.005)  # both printed to 0.01
    assert "# Avg bus bandwidth" in out
    assert "zion" in out and "all_reduce" in out and "8 ranks" in out and "link model fair" in out


def test_step_factor_and_k_m_suffixes_set_the_rows(capsys: pytest.CaptureFixture[str]) -> None:
    out = run_ok(capsys, "collectives", "--min-bytes", "1K", "--max-bytes", "1M", "--step-factor", "4")
    assert [int(r[0]) for r in table_rows(out)] == [1024, 4096, 16384, 65536, 262144, 1048576]


def test_sizes_are_whole_elements_per_rank_as_nccl_tests_counts_them(capsys: pytest.CaptureFixture[str]) -> None:
    # Rows of 7 B (count 1) and a 13 B all_gather (count 3 over 8 ranks) were printed.
    out = run_ok(capsys, "collectives", "--op", "all_gather", "--min-bytes", "13", "--max-bytes", "128")
    # 13, 26, 52, 104 B rounded down to whole floats per rank (32 B over 8 ranks): 0, 0, 32, 96
    assert [(int(r[0]), int(r[1])) for r in table_rows(out)] == [(32, 8), (96, 24)]
    out = run_ok(capsys, "collectives", "--min-bytes", "7", "--max-bytes", "32", "--dtype", "double")
    assert [(int(r[0]), int(r[1])) for r in table_rows(out)] == [(8, 1), (24, 3)]  # 14 -> 8 (a repeat), 28 -> 24
    assert main(["collectives", "--op", "all_gather", "--min-bytes", "13", "--max-bytes", "13"]) == 2
    assert "no size from 13 to 13 bytes holds one float per rank for all_gather over 8 ranks; the smallest is 32 " \
           "bytes" in capsys.readouterr().err


def test_json_rows_carry_the_nccl_tests_fields(capsys: pytest.CaptureFixture[str]) -> None:
    rows = json.loads(run_ok(capsys, "collectives", "--op", "all_gather", "--ranks", "4", "--min-bytes", "1M",
                             "--max-bytes", "4M", "--dtype", "double", "--json"))
    assert [r["bytes"] for r in rows] == [1 << 20, 2 << 20, 4 << 20]
    p = load_platform()
    for r in rows:
        assert {"bytes", "count", "type", "time_us", "time_ns", "algbw_gbps", "busbw_gbps", "algorithm", "op",
                "ranks", "link_model"} <= set(r)
        assert (r["op"], r["ranks"], r["link_model"], r["type"]) == ("all_gather", 4, "fair", "double")
        assert r["count"] == r["bytes"] // 8
        model = sim.collective(p, "all_gather", r["bytes"], 4)
        assert r["time_us"] == pytest.approx(model.time * 1e6)
        assert r["algorithm"] == model.algorithm
        # all_gather: busbw = algbw x (n-1)/n, algbw = bytes / time, GB = 1e9 B.
        assert r["algbw_gbps"] == pytest.approx(r["bytes"] / (r["time_us"] * 1e-6) / 1e9)
        assert r["busbw_gbps"] == pytest.approx(r["algbw_gbps"] * 3 / 4)


def test_astra_sim_worked_case_takes_117780_ns(capsys: pytest.CaptureFixture[str],
                                              astra_files: tuple[str, str]) -> None:
    # ASTRA-sim 2.0 analytical backend, 8-NPU ring, 1 MiB all-reduce, ring implementation, 4 splits.
    net, system = astra_files
    rows = json.loads(run_ok(capsys, "collectives", "--astra-network", net, "--astra-system", system, "--op",
                             "all_reduce", "--min-bytes", "1M", "--max-bytes", "1M", "--link-model", "astra", "--json"))
    assert len(rows) == 1
    assert rows[0]["time_ns"] == 117780
    assert rows[0]["time_us"] == 117.78
    assert rows[0]["ranks"] == 8 and rows[0]["link_model"] == "astra" and rows[0]["algorithm"] == "ring"


def test_astra_input_defaults_to_astra_mode_in_the_table(capsys: pytest.CaptureFixture[str],
                                                         astra_files: tuple[str, str]) -> None:
    net, system = astra_files
    out = run_ok(capsys, "collectives", "--astra-network", net, "--astra-system", system,
                 "--min-bytes", "1M", "--max-bytes", "1M")
    assert "link model astra" in out and "8 NPUs" in out
    assert table_rows(out)[0][5] == "117.78"


def test_the_choices_are_the_models_name_tables(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["collectives", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "{" + ",".join(sim.collective_op_names()) + "}" in text
    assert "{" + ",".join(sim.algorithm_names()) + "}" in text
    assert "--link-model MODEL" in text and "links: " + ", ".join(sim.link_model_names()) in text
    # --mode is offered for its ASTRA-sim backends: the link models and astra-unaware.
    assert "--mode {" + ",".join([*sim.link_model_names(), "astra-unaware"]) + "}" in text


def test_mode_is_still_accepted_as_the_old_name_of_link_model(capsys: pytest.CaptureFixture[str]) -> None:
    args = ("collectives", "--min-bytes", "1M", "--max-bytes", "1M", "--json")
    new = json.loads(run_ok(capsys, *args, "--link-model", "unaware"))
    old = json.loads(run_ok(capsys, *args, "--mode", "unaware"))
    assert old == new and new[0]["link_model"] == "unaware"


# --- collectives: plots -----------------------------------------------------------------------------

def test_plot_writes_a_png(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    png = tmp_path / "busbw.png"
    out = run_ok(capsys, "collectives", "--max-bytes", "1M", "--plot", str(png))
    assert png.read_bytes()[:8] == PNG_MAGIC
    assert f"# plot: {png}" in out


def test_compare_topologies_prints_fully_connected_over_ring_ratios(capsys: pytest.CaptureFixture[str],
                                                                     tmp_path: Path) -> None:
    png = tmp_path / "compare.png"
    out = run_ok(capsys, "collectives", "--compare-topologies", str(png), "--min-bytes", "1M", "--max-bytes", "1G")
    assert png.read_bytes()[:8] == PNG_MAGIC
    ratios = {line.split()[0]: float(line.split()[-1].rstrip("x"))
              for line in out.splitlines() if line.strip().startswith(("all_reduce", "all_to_all"))}
    # p = 8, equal links: fully connected vs bidirectional ring is 7/2 = 3.5x for all_reduce
    # (7 links per rank instead of 2) and 8x for all_to_all (the ring's mean hop count on top).
    assert ratios["all_to_all"] >= 2
    assert ratios["all_to_all"] == pytest.approx(8, rel=0.02)
    assert ratios["all_reduce"] == pytest.approx(3.5, rel=0.02)


# --- bad input: one line on stderr, exit code 2 -----------------------------------------------------

@pytest.mark.parametrize("argv, problem", [
    (["collectives", "--op", "all_sum"], "all_sum"),
    (["collectives", "--algo", "spiral"], "spiral"),
    (["collectives", "--link-model", "psychic"], "psychic"),
    (["collectives", "--min-bytes", "12Q"], "12Q"),
    (["collectives", "--min-bytes", "1M", "--max-bytes", "1K"], "--min-bytes"),
    (["collectives", "--ranks", "16"], "8 devices"),
    (["collectives", "--platform", "zionex", "--ranks", "256"], "128 devices"),
    (["collectives", "--plot", "/nonexistent-folder/out.png"], "/nonexistent-folder"),
    (["collectives", "--platform", "no-such-machine"], "no-such-machine"),
    (["collectives", "--set", "fabric.topology=torus"], "fabric.topology"),
    (["collectives", "--algo", "in_switch"], "in_switch"),
    (["collectives", "--op", "broadcast", "--root", "9"], "root 9"),
    (["collectives", "--astra-system", "sys.json"], "--astra-network"),
    (["info", "--set", "oam.nonsense=1"], "oam.nonsense"),
    (["teleport"], "teleport"),
])
def test_bad_input_is_one_line_and_exit_code_2(capsys: pytest.CaptureFixture[str], argv: list[str],
                                               problem: str) -> None:
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("zion-emu: error: ")
    assert problem in lines[0]


def test_astra_ranks_must_match_the_npu_count(capsys: pytest.CaptureFixture[str], astra_files: tuple[str, str]) -> None:
    net, system = astra_files
    assert main(["collectives", "--astra-network", net, "--astra-system", system, "--ranks", "4"]) == 2
    assert "8 NPUs" in capsys.readouterr().err


# --- tour and the module entry point ----------------------------------------------------------------

def test_tour_shows_the_platform_two_sweeps_and_which_fabric_wins(capsys: pytest.CaptureFixture[str]) -> None:
    out = run_ok(capsys, "tour")
    assert out.startswith("zion: ")
    rows = table_rows(out)
    sizes = [8 * 8**k for k in range(10)]  # 8 B .. 1 GiB, x8
    assert [int(r[0]) for r in rows] == sizes * 2
    assert "all_reduce at 1 GiB: a fully_connected fabric is 3.50x faster than a ring one" in out
    assert "all_to_all at 1 GiB: a fully_connected fabric is" in out


def test_tours_fabric_verdict_compares_two_fabrics_when_the_topology_is_set(capsys: pytest.CaptureFixture[str]) -> None:
    # With --set fabric.topology=ring both sides of the comparison were the ring: "1.00x faster".
    out = run_ok(capsys, "tour", "--set", "fabric.topology=ring")
    assert out.startswith("zion: ")
    assert "all_reduce at 1 GiB: a fully_connected fabric is 3.50x faster than a ring one" in out
    # The other --set fields still apply to both sides: links at half zion's 25 GB/s halve both.
    slower = run_ok(capsys, "tour", "--set", "fabric.topology=ring", "--set", "fabric.link_bandwidth_gb_per_s=12.5")
    assert "3.50x faster than a ring one (busbw 87.47 GB/s fully connected vs 25.00 GB/s ring)" in slower


@pytest.mark.parametrize("preset", ["zionex", "hgx-a100", "hgx-h100"])
def test_tour_runs_on_every_preset(capsys: pytest.CaptureFixture[str], preset: str) -> None:
    # hgx-h100 reduces in its NVSwitch; the ring / fully connected variants must drop that, not fail.
    out = run_ok(capsys, "tour", "--platform", preset)
    assert out.startswith(f"{preset}: ") and out.count(" faster than ") == 2


def test_python_dash_m_zion_emu_runs_a_command() -> None:
    # Its errors through a real process: test_bad_input.py.
    ok = zion_emu_cli("collectives", "--max-bytes", "64", "--json", timeout_s=120)
    assert len(json.loads(ok.stdout)) == 4  # 8, 16, 32, 64


@pytest.mark.parametrize("mode,topology,implementation,op,expected_ns", [
    ("astra", "Switch", "direct", "all_to_all", 23_600),
    ("astra-unaware", "Switch", "direct", "all_to_all", 6_520),
    ("astra", "Ring", "ring", "all_reduce", 117_780),
])
def test_mode_astra_emulates_astra_sim(capsys: pytest.CaptureFixture[str], tmp_path: Path, mode: str, topology: str,
                                       implementation: str, op: str, expected_ns: int) -> None:
    net, system = tmp_path / "net.yml", tmp_path / "sys.json"
    net.write_text(ASTRA_NETWORK.replace("Ring", topology))
    impl = {k: [implementation] for k in ("all-reduce-implementation", "all-gather-implementation",
                                          "reduce-scatter-implementation", "all-to-all-implementation")}
    system.write_text(json.dumps({**ASTRA_SYSTEM, **impl}))
    rows = json.loads(run_ok(capsys, "collectives", "--astra-network", str(net), "--astra-system", str(system),
                             "--mode", mode, "--op", op, "--min-bytes", "1M", "--max-bytes", "1M", "--json"))
    assert rows[0]["time_ns"] == expected_ns and rows[0]["algorithm"] == implementation


def test_mode_astra_unaware_needs_astra_input(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["collectives", "--mode", "astra-unaware"]) == 2
    assert "it needs --astra-network" in capsys.readouterr().err
