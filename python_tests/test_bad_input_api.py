"""Bad input to the Python API, conflicting command-line options and bad
ZION_* values read at import: each is an error that names what was wrong and
what is allowed (the CLI's: one line and exit code 2), not an error from deep
inside, nor a choice made silently."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import zion_emu
from zion_emu import ConfigError, sim
from zion_emu.__main__ import main
from processes import child_env, run, run_python, zion_emu_cli

ASTRA_NETWORK = "topology: [ Ring ]\nnpus_count: [ 8 ]\nbandwidth: [ 50.0 ]\nlatency: [ 500.0 ]\n"
TOP_LEVEL_FIELDS = ("collectives, description, fabric, frontend_nic, name, nic, nodes, oam, pcie, socket, sources, "
                    "tor_switch, upi")


@pytest.fixture(scope="module")
def zion() -> zion_emu.Platform:
    return zion_emu.load_platform("zion")


# --- zion_emu.sim.collective ------------------------------------------------------------------------

def test_a_platform_name_where_a_platform_is_expected_says_how_to_load_one() -> None:
    with pytest.raises(TypeError, match=r"expected a Platform \(zion_emu.load_platform\(name\)\), got str 'zion'"):
        sim.collective("zion", "all_reduce", 1024, ranks=8)  # type: ignore[arg-type]


@pytest.mark.parametrize("ranks, shown", [
    (8.0, "got float 8.0"),
    ("8", "got str '8'"),  # was device 8, one past the last
    ("01", "got str '01'"),  # was devices 0 and 1
])
def test_ranks_that_are_neither_a_count_nor_device_ids_are_refused(zion: zion_emu.Platform, ranks: object,
                                                                   shown: str) -> None:
    with pytest.raises(TypeError, match=f"ranks must be a device count \\(an integer\\) or a list of device ids, "
                                        f"{shown}"):
        sim.collective(zion, "all_reduce", 1024, ranks)  # type: ignore[arg-type]


def test_device_ids_must_be_integers(zion: zion_emu.Platform) -> None:
    with pytest.raises(TypeError, match=r"ranks must be device ids \(integers\), got \[0.0, 1.5\]"):
        sim.collective(zion, "all_reduce", 1024, [0.0, 1.5])  # type: ignore[list-item]
    # numpy's integers are integers.
    four = sim.collective_time(zion, "all_reduce", 1024, 4)
    assert sim.collective_time(zion, "all_reduce", 1024, np.int64(4)) == four
    assert sim.collective_time(zion, "all_reduce", 1024, np.arange(4)) == four


def test_all_to_all_bytes_must_be_a_matrix(zion: zion_emu.Platform) -> None:
    with pytest.raises(TypeError, match="all_to_all_bytes must be a 4x4 matrix, row i the bytes rank i sends to each "
                                        "rank; row 0 is 1"):
        sim.collective(zion, "all_to_all", 0, 4, all_to_all_bytes=[1, 2])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="row 1 is '1024'"):
        sim.collective(zion, "all_to_all", 0, 2, all_to_all_bytes=[[0, 1024], "1024"])  # type: ignore[list-item]
    # A numpy matrix is a matrix (its truth value was asked, which numpy refuses).
    sizes = [[(i + 1) * (j + 1) * 1024 for j in range(4)] for i in range(4)]
    assert (sim.collective(zion, "all_to_all", 0, 4, all_to_all_bytes=np.array(sizes)).time
            == sim.collective(zion, "all_to_all", 0, 4, all_to_all_bytes=sizes).time)


# --- zion_emu.load_platform and Platform.get ---------------------------------------------------------

def test_overrides_must_be_a_mapping_and_assignments_a_list() -> None:
    with pytest.raises(TypeError, match=r"overrides maps dotted field paths to values, e.g. \{'fabric.topology': "
                                        r"'ring'\}; got list \['a'\] \(command-line 'path=value' strings go in "
                                        r"assignments=\)"):
        zion_emu.load_platform("zion", overrides=["a"])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"assignments is a list of 'path=value' strings, got the string "
                                        r"'fabric.topology=ring'; pass \['fabric.topology=ring'\]"):
        zion_emu.load_platform("zion", assignments="fabric.topology=ring")  # type: ignore[arg-type]
    assert zion_emu.load_platform("zion", assignments=["fabric.topology=ring"]).get("fabric.topology") == "ring"


@pytest.mark.parametrize("path, message", [
    ("bogus.path", f"no field 'bogus.path'; allowed: {TOP_LEVEL_FIELDS}"),
    ("oam.nonsense", "no field 'oam.nonsense' (at 'oam'); allowed: count, efficiency, hbm_bandwidth_gb_per_s, "
                     "hbm_bytes, launch_overhead_ns, peak_flops"),
    ("nodes.x", "no field 'nodes.x': 'nodes' is a value, not an object"),
    ("pcie.switches.4", "no field 'pcie.switches.4' (at 'pcie.switches'); allowed: an index 0..3"),
    ("pcie.switches.first", "no field 'pcie.switches.first' (at 'pcie.switches'); allowed: an index 0..3"),
])
def test_get_of_a_path_the_platform_lacks_names_what_it_has_there(zion: zion_emu.Platform, path: str,
                                                                  message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        zion.get(path)
    assert str(raised.value) == f"platform 'zion': {message}"


def test_get_reads_fields_and_list_items_and_takes_only_strings(zion: zion_emu.Platform) -> None:
    assert zion.get("oam.count") == 8
    assert zion.get("pcie.switches.0.oams") == [0, 1]
    with pytest.raises(TypeError, match=r"platform field paths are dotted strings \(e.g. 'oam.hbm_bytes'\), got 3"):
        zion.get(3)  # type: ignore[arg-type]


# --- torch.zion.comm ---------------------------------------------------------------------------------

def test_reduce_add_of_no_tensors_says_it_needs_one() -> None:
    with pytest.raises(RuntimeError, match="reduce_add expects at least one input tensor, got none"):
        torch.zion.comm.reduce_add([])


# --- conflicting command-line options ---------------------------------------------------------------

def _one_line_error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert main(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert captured.out == "" and len(lines) == 1 and lines[0].startswith("zion-emu: error: "), captured
    return lines[0]


@pytest.mark.parametrize("argv, message", [
    (["collectives", "--mode", "astra", "--link-model", "fair"],
     "argument --link-model: not allowed with argument --mode"),
    (["collectives", "--link-model", "fair", "--mode", "astra"],
     "argument --mode: not allowed with argument --link-model"),
    (["bench-collectives", "--mode", "unaware", "--link-model", "fair"],
     "argument --link-model: not allowed with argument --mode"),
])
def test_link_model_and_its_other_name_mode_are_not_taken_together(capsys: pytest.CaptureFixture[str],
                                                                    argv: list[str], message: str) -> None:
    assert message in _one_line_error(capsys, argv)


def test_astra_network_is_not_combined_with_platform_options(capsys: pytest.CaptureFixture[str],
                                                              tmp_path: Path) -> None:
    net = tmp_path / "net.yml"
    net.write_text(ASTRA_NETWORK)
    line = _one_line_error(capsys, ["collectives", "--astra-network", str(net), "--platform", "hgx-h100",
                                    "--set", "fabric.topology=bogus"])
    assert line == ("zion-emu: error: --astra-network is the machine, so --platform and --set would be ignored: "
                    "give --astra-network or the platform options, not both")
    assert "so --set would be" in _one_line_error(capsys, ["collectives", "--astra-network", str(net),
                                                           "--set", "fabric.topology=ring"])


# --- bad ZION_* values read when zion_emu is imported ------------------------------------------------

BAD_ENVIRONMENT = [
    ("ZION_PROFILER_HOST_TIME", "bogus", "ZION_PROFILER_HOST_TIME must be one of wall, modeled, got 'bogus'"),
    ("ZION_AUTOGRAD_DEVICE_THREADS", "2", "ZION_AUTOGRAD_DEVICE_THREADS='2': expected 0 (backward on the calling "
                                          "thread) or 1 (autograd's worker thread per zion device, as on CUDA)"),
]


@pytest.mark.parametrize("name, value, message", BAD_ENVIRONMENT)
def test_the_cli_says_a_bad_environment_value_in_one_line(name: str, value: str, message: str) -> None:
    done = zion_emu_cli("info", check=False, env=child_env(**{name: value}))
    assert (done.returncode, done.stdout, done.stderr) == (2, "", f"zion-emu: error: {message}\n")


def test_python_m_without_a_space_says_a_bad_environment_value_in_one_line() -> None:
    done = run([sys.executable, "-mzion_emu", "info"], check=False, env=child_env(ZION_PROFILER_HOST_TIME="bogus"))
    assert (done.returncode, done.stdout, done.stderr) == (2, "", f"zion-emu: error: {BAD_ENVIRONMENT[0][2]}\n")


def test_the_console_script_says_a_bad_environment_value_in_one_line() -> None:
    # What pip's zion-emu script runs: the package is imported under its name.
    script = ("import sys; sys.argv[0] = '/usr/local/bin/zion-emu'\n"
              "from zion_emu.__main__ import main\n"
              "sys.exit(main(['info']))\n")
    done = run([sys.executable, "-c", script], env=child_env(ZION_PROFILER_HOST_TIME="bogus"))
    assert (done.returncode, done.stderr) == (2, f"zion-emu: error: {BAD_ENVIRONMENT[0][2]}\n")


@pytest.mark.parametrize("name, value, message", BAD_ENVIRONMENT)
def test_import_torch_refuses_a_bad_environment_value_naming_it(name: str, value: str, message: str) -> None:
    # torch loads zion_emu as a device backend and wraps its error in "Failed
    # to load the backend extension: zion"; the cause above it is zion_emu's.
    done = run_python("import torch", check=False, env=child_env(**{name: value}))
    assert done.returncode == 1
    assert f"ValueError: {message}\n" in done.stderr
    assert done.stderr.rstrip().endswith("RuntimeError: Failed to load the backend extension: zion. You can disable "
                                         "extension auto-loading with TORCH_DEVICE_BACKEND_AUTOLOAD=0.")
