"""Bad input: every case raises a clear error that names what was wrong and
what is allowed, and never crashes, hangs or answers silently.

Covered: platform names, files and overrides (Python and the command line),
device indices, tensors on several devices, ops zion cannot run, op cost
formulas, collectives that disagree across ranks, worlds larger than the
platform, ASTRA-sim inputs, and a trace that cannot be written.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

import zion_emu
from zion_emu import ConfigError, astra, sim
from processes import child_env, run_python, spawn, zion_emu_cli

CLI_TIMEOUT_S = 120
JOIN_TIMEOUT_S = 90
GROUP_TIMEOUT_S = 10


# -- platforms --------------------------------------------------------------

def test_an_unknown_platform_name_lists_the_presets():
    with pytest.raises(ConfigError, match=r"unknown platform 'zion2'; presets: .*hgx-h100.*zion, zionex"):
        zion_emu.load_platform("zion2")


def test_set_platform_with_an_unknown_name_lists_the_presets():
    with pytest.raises(ConfigError, match=r"unknown platform 'nope'; presets: "):
        zion_emu.set_platform("nope")


def test_a_platform_file_that_is_not_json_says_where_it_breaks(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text('{"base": "zion", "nodes": ')
    with pytest.raises(ConfigError, match=r"broken.json' is not valid JSON: .*line 1, column 27"):
        zion_emu.load_platform(path)


def test_a_platform_file_holding_an_array_says_an_object_is_wanted(tmp_path):
    path = tmp_path / "list.json"
    path.write_text("[1, 2]")
    with pytest.raises(ConfigError, match="must hold a JSON object, got array"):
        zion_emu.load_platform(path)


def test_a_partial_platform_file_names_the_missing_field(tmp_path):
    path = tmp_path / "partial.json"
    path.write_text('{"name": "mine", "nodes": 1}')  # no "base", so every field must be there
    with pytest.raises(ConfigError, match=r"partial.json': field '\w+' is missing; a platform file without \"base\" "
                                          r"must give every field: to change only some, start it with \{\"base\": \"zion\""):
        zion_emu.load_platform(path)


def test_a_platform_file_with_an_unknown_field_lists_the_allowed_ones(tmp_path):
    path = tmp_path / "typo.json"
    path.write_text('{"base": "zion", "fabric": {"topolgy": "ring"}}')
    with pytest.raises(ConfigError, match=r"unknown field 'fabric.topolgy'; allowed here: .*topology"):
        zion_emu.load_platform(path)


def test_an_override_of_an_unknown_field_lists_the_allowed_ones():
    with pytest.raises(ConfigError, match=r"unknown field 'oam.hbm_gb' \(at 'oam'\); allowed: count, efficiency, "
                                          r"hbm_bandwidth_gb_per_s, hbm_bytes"):
        zion_emu.load_platform("zion", overrides={"oam.hbm_gb": 3})


def test_an_override_of_the_wrong_type_says_what_the_field_takes():
    with pytest.raises(ConfigError, match=r"'oam.hbm_bytes' must be a positive integer number of bytes, "
                                          r"got \"lots\" \(string\)"):
        zion_emu.load_platform("zion", overrides={"oam.hbm_bytes": "lots"})


def test_an_override_key_that_is_not_a_path_is_refused():
    with pytest.raises(ConfigError, match=r"override keys are dotted field paths \(str\), got 3"):
        zion_emu.load_platform("zion", overrides={3: 1})


def test_an_enumerated_field_lists_its_values():
    with pytest.raises(ConfigError, match=r"'fabric.topology' is \"torus\" \(string\); allowed: fully_connected, "
                                          r"hybrid_cube_mesh, ring, switch"):
        zion_emu.load_platform("zion", overrides={"fabric.topology": "torus"})


@pytest.mark.parametrize("field, value, message", [
    ("oam.hbm_bytes", 0, r"'oam.hbm_bytes' must be a positive integer number of bytes, got 0"),
    ("oam.hbm_bytes", -(1 << 30), r"'oam.hbm_bytes' must be a positive integer number of bytes, got -1073741824"),
    ("fabric.link_bandwidth_gb_per_s", 0, r"'fabric.link_bandwidth_gb_per_s' must be > 0, got 0"),
    ("upi.link_bandwidth_gb_per_s", -1, r"'upi.link_bandwidth_gb_per_s' must be > 0, got -1"),
    ("oam.count", 0, r"'oam.count' must be an integer from 1 to 1073741824, got 0"),
    ("nodes", -2, r"'nodes' must be an integer from 1 to 4096, got -2"),
])
def test_zero_or_negative_capacities_counts_and_bandwidths_are_refused(field, value, message):
    with pytest.raises(ConfigError, match=message):
        zion_emu.load_platform("zion", overrides={field: value})


@pytest.mark.parametrize("overrides, message", [
    ({"nodes": 2147483647}, r"'nodes' must be an integer from 1 to 4096, got 2147483647"),
    # 8,192 OAMs took 118 s and 19 GB for one all_reduce; 65,536 ran out of memory
    ({"nodes": 1024}, r"nodes x oam.count is 1024 x 8 = 8192 OAMs; at most 4096 are modeled"),
    ({"socket.count": 100000}, r"nodes x socket.count is 1 x 100000 = 100000 sockets; at most 4096 are modeled"),
    ({"collectives.pipeline_chunks": 10**9}, r"'collectives.pipeline_chunks' must be an integer from 1 to 1024, got "
                                            r"1000000000"),
])
def test_a_machine_too_large_to_model_is_refused_with_the_bound(overrides, message):
    # Past these sizes building the topology or a pipelined plan would run
    # for minutes or exhaust memory instead of answering.
    with pytest.raises(ConfigError, match=message):
        zion_emu.load_platform("zion", overrides=overrides)


def test_an_oam_list_naming_a_missing_oam_gives_the_allowed_range():
    with pytest.raises(ConfigError, match=r"'pcie.switches.1.oams' lists OAM 2, but there are 2 OAMs \(allowed 0..1\)"):
        zion_emu.load_platform("zion", overrides={"oam.count": 2})


@pytest.mark.parametrize("field, value, message", [
    ("fabric.link_bandwidth_gb_per_s", 1e308, "must be from 1e-6 to 1e18, got 1e+308"),
    # 1e-300 FLOP/s made modeled times infinite: NaN shares in the report, Infinity in its JSON
    ("oam.peak_flops.fp32", 1e-300, "must be from 1e-6 to 1e18, got 1e-300"),
    ("pcie.lane_bandwidth_gb_per_s.gen3", 1e-300, "must be from 1e-6 to 1e18, got 1e-300"),
    ("oam.launch_overhead_ns", 1e300, "must be at most 1e12 (ns: 1000 s), got 1e+300"),
    ("fabric.latency_ns", 1e13, "must be at most 1e12 (ns: 1000 s), got 10000000000000.0"),
])
def test_a_rate_or_latency_that_would_overflow_the_model_is_refused_at_load(field, value, message):
    with pytest.raises(ConfigError, match=re.escape(field) + ".*" + re.escape(message)):
        zion_emu.load_platform("zion", overrides={field: value})


def test_a_chain_of_base_files_past_64_is_refused(tmp_path):
    # 10,000 files crashed the process (the stack).
    for i in range(70):
        (tmp_path / f"p{i}.json").write_text(f'{{"base": "p{i + 1}.json"}}' if i < 69 else '{"base": "zion"}')
    with pytest.raises(ConfigError, match=r"p0.json' builds on more than 64 files through \"base\""):
        zion_emu.load_platform(str(tmp_path / "p0.json"))
    assert zion_emu.load_platform(str(tmp_path / "p10.json")).name == "zion"  # 60 files and the preset's: fine


def test_json_nested_past_64_levels_is_refused_not_a_crash(tmp_path):
    # 100,000 nested objects in a platform file killed the process with SIGSEGV (the stack).
    path = tmp_path / "deep.json"
    path.write_text('{"base": "zion", "oam": ' + '{"a": ' * 100_000 + "1" + "}" * 100_000 + "}")
    result = _cli("info", "--platform", str(path))
    assert result.returncode == 2, result.stderr
    assert f"platform file '{path}' nests objects or lists deeper than 64 levels" in result.stderr
    with pytest.raises(ConfigError, match=r"override 'oam.x' nests objects or lists deeper than 64 levels"):
        zion_emu.load_platform("zion", assignments=["oam.x=" + "[" * 100_000 + "]" * 100_000])
    # 64 levels are parsed and checked as any document is.
    path.write_text('{"base": "zion", "oam": ' + '{"a": ' * 62 + "1" + "}" * 62 + "}")
    with pytest.raises(ConfigError, match=r"unknown field 'oam.a'"):
        zion_emu.load_platform(str(path))


def test_a_directory_given_as_a_platform_file_is_named_as_one(tmp_path):
    # It said "not valid JSON: ... empty input".
    with pytest.raises(ConfigError, match=re.escape(f"platform file '{tmp_path / 'p.json'}' is a directory, not a file")):
        (tmp_path / "p.json").mkdir()
        zion_emu.load_platform(str(tmp_path / "p.json"))


def test_a_number_past_a_doubles_range_is_a_config_error(tmp_path):
    # nlohmann's out_of_range came out as a bare RuntimeError.
    with pytest.raises(ConfigError, match=r"override 'fabric.link_bandwidth_gb_per_s=1e400'.*number overflow"):
        zion_emu.load_platform("zion", assignments=["fabric.link_bandwidth_gb_per_s=1e400"])  # --set's form
    path = tmp_path / "big.json"
    path.write_text('{"base": "zion", "fabric": {"link_bandwidth_gb_per_s": 1e400}}')
    with pytest.raises(ConfigError, match=r"big.json' is not valid JSON.*number overflow"):
        zion_emu.load_platform(str(path))


# -- the command line -------------------------------------------------------

def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return zion_emu_cli(*args, timeout_s=CLI_TIMEOUT_S, check=False)


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "train.py"
    path.write_text("import torch\n"
                    "x = torch.ones(32, 32, device='zion')\n"
                    "for _ in range(2):\n"
                    "    (x @ x).sum().item()\n"
                    "print('script finished')\n")
    return path


@pytest.mark.parametrize("command", ["info", "run"])
@pytest.mark.parametrize("assignment, message", [
    ("oam.hbm_gb=3", r"unknown field 'oam.hbm_gb' \(at 'oam'\); allowed: count, efficiency"),
    ("oam.hbm_bytes=lots", r"'oam.hbm_bytes' must be a positive integer number of bytes, got \"lots\""),
    ("oam.hbm_bytes", r"override 'oam.hbm_bytes' must look like path.to.field=value \(e.g. fabric.topology=ring\)"),
])
def test_cli_set_errors_name_the_field_and_what_is_allowed(command, assignment, message, script, capsys):
    from zion_emu.__main__ import main

    args = ["info", "--set", assignment] if command == "info" else ["run", "--set", assignment, str(script)]
    assert main(args) == 2
    out, err = capsys.readouterr()
    assert "script finished" not in out  # refused before the script runs
    assert re.fullmatch(r"zion-emu: error: .*" + message + r".*\n", err), err


def test_cli_errors_from_a_real_process_are_one_line_and_exit_code_2(script):
    """The same, end to end through ``python -m zion_emu``: no traceback."""
    proc = _cli("run", "--platform", "zion3", "--set", "oam.hbm_bytes=lots", str(script))
    assert proc.returncode == 2 and "script finished" not in proc.stdout
    assert proc.stderr.startswith("zion-emu: error: unknown platform 'zion3'; presets: "), proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_a_trace_that_cannot_be_written_still_finishes_the_run_and_says_so(script, tmp_path):
    # The folder exists when the run starts (a missing one is refused then)
    # and is gone when the trace is written: the script removes it.
    target = tmp_path / "gone" / "trace.json"
    target.parent.mkdir()
    script.write_text(script.read_text() + f"import os; os.rmdir({str(target.parent)!r})\n")
    proc = _cli("run", "--trace", str(target), str(script))
    assert "script finished" in proc.stdout
    assert "modeled" in proc.stdout.lower()  # the report is printed
    assert f"could not write the trace to {target}: No such file or directory" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.returncode != 0  # a requested output is missing


# -- devices and tensors ----------------------------------------------------

# Every place that takes a device index: tensors, the current device, and torch.zion's calls.
@pytest.mark.parametrize("make", [
    pytest.param(lambda: torch.ones(2, device="zion:8"), id="ones(2, device=zion:8)"),
    pytest.param(lambda: torch.empty(1, device="zion:99"), id="empty(1, device=zion:99)"),
    pytest.param(lambda: torch.ones(2).to("zion:12"), id="ones(2).to(zion:12)"),
    pytest.param(lambda: torch.zion.get_device_properties(-1), id="zion.get_device_properties(-1)"),  # set_device(-1): nothing
    pytest.param(lambda: torch.zion.set_device(8), id="zion.set_device(8)"),
    pytest.param(lambda: torch.accelerator.set_device_index(8), id="accelerator.set_device_index(8)"),
    pytest.param(lambda: torch.zion.device(8), id="zion.device(8)"),
    pytest.param(lambda: torch.zion.synchronize(8), id="zion.synchronize(8)"),
    pytest.param(lambda: torch.zion.Stream(8), id="zion.Stream(8)"),
    pytest.param(lambda: torch.zion.memory_allocated("zion:9"), id="zion.memory_allocated(zion:9)"),
    pytest.param(lambda: torch.zion.get_device_properties(8), id="zion.get_device_properties(8)"),
    pytest.param(lambda: torch.zion.get_device_name("zion:8"), id="zion.get_device_name(zion:8)"),
    pytest.param(lambda: torch.zion.get_rng_state(8), id="zion.get_rng_state(8)"),
])
def test_a_device_index_out_of_range_names_the_range(make):
    with pytest.raises(IndexError, match=r"^zion: device index -?\d+ is out of range; platform 'zion' has 8 devices "
                                         r"per node \(zion:0 \.\. zion:7\)$"):
        make()


def test_a_device_that_is_not_zion_is_refused_as_the_current_device():
    with pytest.raises(ValueError, match="expected a zion device, got cpu"):
        torch.zion.set_device("cpu")


def test_tensors_on_two_devices_name_both_devices_and_the_op():
    # CUDA's wording; zion and cpu in either order, and two zion devices.
    same_device = r"Expected all tensors to be on the same device, but found at least two devices, "
    a, b = torch.ones(4, device="zion:0"), torch.ones(4, device="zion:1")
    with pytest.raises(RuntimeError, match=same_device + r"zion:0 and zion:1! \(when checking arguments for aten::add\)"):
        a + b
    with pytest.raises(RuntimeError, match=same_device + r"zion:0 and zion:1! \(when checking arguments for aten::mm\)"):
        a.view(2, 2) @ b.view(2, 2)
    with pytest.raises(RuntimeError, match=same_device + r"zion:0 and cpu! \(when checking arguments for aten::mul\)"):
        a * torch.ones(4)
    with pytest.raises(RuntimeError, match=same_device + r"zion:0 and cpu! \(when checking arguments for aten::add\)"):
        torch.ones(4) + a
    with pytest.raises(RuntimeError, match=same_device + r"zion:1 and cpu! \(when checking arguments for aten::cat\)"):
        torch.cat([torch.ones(4), b])


def test_a_convolution_over_two_devices_is_refused_and_one_on_another_device_stays_there():
    # It ran, with its result on the input's device; backward then failed on a gradient's device.
    same_device = r"Expected all tensors to be on the same device, but found at least two devices, "
    x, w, b = torch.randn(1, 2, 5, 5), torch.randn(3, 2, 3, 3), torch.randn(3)
    with pytest.raises(RuntimeError, match=same_device + r"zion:0 and zion:1! \(when checking arguments for "
                                                         r"convolution_overrideable\)"):
        torch.nn.functional.conv2d(x.to("zion:0"), w.to("zion:1"))
    with pytest.raises(RuntimeError, match=same_device + r"zion:2 and zion:0! \(when checking arguments for "
                                                         r"convolution_overrideable\)"):
        torch.nn.functional.conv2d(x.to("zion:2"), w.to("zion:2"), b.to("zion:0"))
    # All on zion:3 while zion:0 is current: the result and the gradients stay on zion:3, equal to the CPU's.
    xz, wz = x.to("zion:3").requires_grad_(), w.to("zion:3").requires_grad_()
    y = torch.nn.functional.conv2d(xz, wz, b.to("zion:3"))
    y.sum().backward()
    assert y.device == xz.grad.device == wz.grad.device == torch.device("zion:3")
    xc, wc = x.clone().requires_grad_(), w.clone().requires_grad_()
    yc = torch.nn.functional.conv2d(xc, wc, b)
    yc.sum().backward()
    assert torch.equal(y.detach().cpu(), yc.detach()) and torch.equal(wz.grad.cpu(), wc.grad)


@pytest.mark.parametrize("make, what", [
    # A zion result of quantize_per_tensor was a qint8 tensor that was not quantized; later ops failed elsewhere.
    (lambda: torch.quantize_per_tensor(torch.tensor([0.1, 0.5], device="zion"), 0.1, 0, torch.qint8),
     r"zion: an op's result is a quantized tensor \(QInt8\), and zion has no quantized tensors"),
    (lambda: torch.quantize_per_tensor(torch.tensor([0.1, 0.5]), 0.1, 0, torch.qint8).to("zion"),
     r"zion: aten::empty_quantized would make or use a quantized tensor on zion"),
    (lambda: torch.nested.nested_tensor([torch.ones(2), torch.ones(3)]).to("zion"),
     r"zion: aten::_to_copy would make or use a nested tensor \(torch.nested\) on zion"),
])
def test_quantized_and_nested_tensors_are_refused_by_name(make, what):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # quantized tensors' deprecation, nested tensors' prototype
        with pytest.raises(NotImplementedError, match=what):
            make()


def test_an_op_with_only_a_cuda_kernel_names_the_op_and_why():
    q = torch.ones(1, 4, 2, 8, device="zion")
    with pytest.raises(NotImplementedError, match=r"zion: operator aten::_flash_attention_forward is not supported "
                                                  r"on zion: zion runs each op through its CPU kernel, and this op "
                                                  r"has none"):
        torch.ops.aten._flash_attention_forward(q, q, q, None, None, 4, 4, 0.0, False, False)


_CSR = (torch.tensor([0, 1, 2]), torch.tensor([0, 1]), torch.tensor([1.0, 2.0]))


@pytest.mark.parametrize("make, layout, what", [
    (lambda: torch.eye(3).to_sparse_csr().to("zion"), "SparseCsr", "moving a tensor to zion"),
    (lambda: torch.eye(2).to_sparse_csc().to("zion:1"), "SparseCsc", "moving a tensor to zion"),
    (lambda: torch.eye(2).to_sparse_bsr((1, 1)).to("zion", torch.float64), "SparseBsr", "moving a tensor to zion"),
    (lambda: torch.sparse_csr_tensor(*_CSR, device="zion"), "SparseCsr", "aten::sparse_compressed_tensor"),
    (lambda: torch.sparse_compressed_tensor(*_CSR, (2, 2), layout=torch.sparse_csc, device="zion"), "SparseCsc",
     "aten::sparse_compressed_tensor"),
    (lambda: torch.eye(3, device="zion").to_sparse_csr(), "SparseCsr", "aten::to_sparse_csr"),
    (lambda: torch.eye(3, device="zion").to_sparse().to_sparse_csr(), "SparseCsr", "aten::to_sparse_csr"),
    (lambda: torch.eye(4, device="zion").to_sparse(layout=torch.sparse_bsc, blocksize=(2, 2)), "SparseBsc",
     "an op's result"),
])
@pytest.mark.filterwarnings("ignore:Sparse (CSR tensor support|invariant checks)")
def test_a_sparse_compressed_tensor_is_refused_before_it_reaches_zion(make, layout, what):
    """zion takes strided and sparse COO; a CSR/CSC/BSR/BSC zion tensor would fail at its first op."""
    with pytest.raises(NotImplementedError, match=rf"zion: {re.escape(what)} would make a {layout} tensor on zion, "
                                                  r"and zion supports only the strided and sparse COO layouts "
                                                  r"\(torch.strided, torch.sparse_coo\)\. Convert with \.to_dense\(\) "
                                                  r"or \.to_sparse\(\) first\."):
        make()


@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support")
def test_a_sparse_compressed_cpu_tensor_still_converts_and_reaches_zion_through_coo_or_dense():
    csr = torch.eye(3).to_sparse_csr()
    assert csr.to(torch.float64).layout == torch.sparse_csr  # CPU conversions are untouched
    assert torch.equal(csr.to_sparse().to("zion").to_dense().cpu(), torch.eye(3))
    assert torch.equal(csr.to_dense().to("zion").cpu(), torch.eye(3))


def test_set_platform_after_the_first_tensor_says_why_it_is_refused():
    held = torch.ones(4, device="zion")  # a live tensor: its pool holds memory
    with pytest.raises(RuntimeError, match=r"set_platform must come before any zion tensor is made; \d+ bytes are "
                                           r"allocated on the current platform 'zion'"):
        zion_emu.set_platform("hgx-h100")
    assert zion_emu.current_platform().name == "zion" and held.device.type == "zion"


def test_an_allocation_the_host_refuses_is_a_clear_error_and_leaves_the_statistics_as_they_were():
    # Under an address-space limit the host refuses a block the modeled pool
    # has room for: the error says so, and nothing of the request stays
    # counted (memory_allocated, the peaks, the allocation counts).
    out = run_python("""
        import resource, torch, zion_emu
        x = torch.ones(4, device="zion")
        vm = int(open("/proc/self/statm").read().split()[0]) * resource.getpagesize()
        resource.setrlimit(resource.RLIMIT_AS, (vm + (1 << 30), resource.RLIM_INFINITY))
        before = torch.zion.memory_stats()
        try:
            torch.empty(4 << 30, dtype=torch.uint8, device="zion")
        except RuntimeError as e:
            print(str(e).splitlines()[0])
        after = torch.zion.memory_stats()
        print(sorted(k for k in before if before[k] != after[k]), torch.zion.memory_allocated())
        print(torch.ones(2, device="zion").sum().item())
    """, env=child_env(ASAN_OPTIONS=os.environ.get("ASAN_OPTIONS", "") + ":allocator_may_return_null=1")).stdout.splitlines()
    assert re.fullmatch(r"zion: zion:0 cannot back an allocation of 4\.00 GiB with host memory: the modeled HBM pool "
                        r"has room, but the host refused the bytes \(.*can't allocate memory.*\)\. Real mode keeps "
                        r"every byte of a zion tensor in host memory; .* Existing tensors are intact\.", out[0]), out[0]
    assert out[1:] == ["[] 16", "2.0"]


def test_an_out_of_memory_message_writes_each_size_in_a_unit_that_shows_it():
    # A 1 MiB pool: in GiB every figure of the message read 0.00.
    out = run_python("""
        import torch, zion_emu
        zion_emu.set_platform("zion", overrides={"oam.hbm_bytes": 1 << 20})
        held = torch.empty(1000, dtype=torch.uint8, device="zion")
        try:
            torch.empty(3 << 19, dtype=torch.uint8, device="zion")
        except torch.OutOfMemoryError as e:
            print(str(e).splitlines()[0])
    """).stdout.splitlines()
    assert out == ["zion: out of HBM on zion:0. Tried to allocate 1.50 MiB (1572864 bytes); 1000 bytes of its 1.00 MiB "
                   "HBM capacity are in use (1023.02 KiB free). Existing tensors are intact."]


@pytest.mark.parametrize("hold", ["pinned", "socket"])
def test_set_platform_with_host_memory_in_a_socket_pool_says_why_it_is_refused(hold):
    # The new platform's socket pools start at zero: a buffer of the old ones
    # freed after the switch would have counted them below zero.
    out = run_python(f"""
        import torch, zion_emu
        from zion_emu import _C
        if {hold!r} == "pinned":
            held = torch.ones(1 << 10).pin_memory()
        else:
            with zion_emu.socket(1):
                held = torch.ones(1 << 10)
        try:
            zion_emu.set_platform("zionex")
        except RuntimeError as e:
            print(str(e).splitlines()[0])
        print(zion_emu.current_platform().name, held.sum().item())
        del held
        zion_emu.set_platform("zionex")
        print(zion_emu.current_platform().name, min(_C.host_memory.stats(s)["in_use"] for s in range(_C.host_memory.sockets())))
    """).stdout.splitlines()
    assert out == [
        "zion: set_platform must come before any pinned or socket-placed host memory is made; 4096 bytes are held in "
        "the socket pools of the current platform 'zion' (pin_memory() buffers, tensors made under "
        "zion_emu.socket(i)); free them first",
        "zion 1024.0",
        "zionex 0",
    ]


# -- op cost formulas -------------------------------------------------------

@pytest.fixture
def formula_op():
    """An op whose formula a test replaces with a broken one; afterwards it is
    priced as the elementwise op it is (one FLOP per element, bytes in and out)."""
    name = "aten::sinh"
    yield name
    zion_emu.cost.register(name, lambda call: (call.outputs[0].numel(),
                                               sum(t.bytes() for t in (*call.inputs, *call.outputs))))


@pytest.mark.parametrize("formula, error, message", [
    (lambda call: (-1.0, 8), RuntimeError, r"op cost formula for aten::sinh returned negative flops \(-1\)"),
    (lambda call: (1.0, float("nan")), RuntimeError, r"op cost formula for aten::sinh returned NaN bytes"),
    (lambda call: "garbage", RuntimeError, r"op cost formula for aten::sinh must return an OpWork, a dict \(flops, bytes, op_class, "
                                          r"gathered_bytes\) or, through zion_emu.cost.register, a \(flops, bytes\) "
                                          r"pair; got str"),
    (lambda call: 1 / 0, ZeroDivisionError, r"op cost formula for aten::sinh raised ZeroDivisionError"),
])
def test_a_cost_formula_returning_garbage_names_the_op_when_it_runs(formula_op, formula, error, message):
    x = torch.ones(4, device="zion")
    zion_emu.cost.register(formula_op, formula)
    with pytest.raises(error, match=message):
        torch.sinh(x)


def test_a_constant_cost_with_a_negative_count_is_refused_at_registration():
    with pytest.raises(ValueError, match=r"op cost formula for aten::cosh: flops must be a finite count >= 0, got -5"):
        zion_emu.cost.register("aten::cosh", {"flops": -5, "bytes": 0})


def test_a_cost_formula_for_an_op_torch_does_not_know_is_refused():
    with pytest.raises(ValueError, match=r"no operator 'aten::no_such_op' is registered with torch \(names are ATen "
                                         r"schema names such as 'aten::mm'"):
        zion_emu.cost.register("aten::no_such_op", {"flops": 1, "bytes": 1})


# -- ASTRA-sim inputs -------------------------------------------------------

@pytest.mark.parametrize("text, message", [
    ("topology: [Ring\n", r"ASTRA-sim input network: not valid YAML"),
    ("- 1\n- 2\n", r"expected a mapping with topology, npus_count, bandwidth, latency"),
    ("topology: [Ring]\nnpus_count: [4]\nbandwidth: [50]\n", r"'latency'"),
    ("topology: [Torus]\nnpus_count: [4]\nbandwidth: [50]\nlatency: [500]\n",
     r"'topology'.*Ring, FullyConnected, Switch"),
    ("topology: [Ring]\nnpus_count: [four]\nbandwidth: [50]\nlatency: [500]\n", r"'npus_count' must hold numbers"),
    ("topology: [Ring]\nnpus_count: [4]\nbandwidth: [50]\nlatency: [.nan]\n", r"'latency' must hold finite numbers"),
    ("topology: [Ring]\nnpus_count: [4]\nbandwidth: [.inf]\nlatency: [5]\n", r"'bandwidth' must hold finite numbers"),
    ("topology: [Ring]\nnpus_count: [4]\nbandwidth: [0]\nlatency: [5]\n",
     r"'bandwidth' must be > 0 GB/s and finite, got 0"),
    ("topology: [Ring, Ring]\nnpus_count: [4]\nbandwidth: [5, 5]\nlatency: [5, 5]\n",
     r"'npus_count' has 1 entries but topology has 2 dimensions"),
])
def test_malformed_astra_network_files_name_the_key(text, message):
    with pytest.raises(ConfigError, match=message):
        astra.parse_network(text)


@pytest.mark.parametrize("text, message", [
    ("{not json", r"ASTRA-sim input system: not valid JSON"),
    ("[1]", r"ASTRA-sim input system: expected a JSON object"),
    ('{"preferred-dataset-splits": Infinity}', r"'preferred-dataset-splits' must be a whole number >= 1"),
    ('{"all-reduce-implementation": ["ringg"]}', r"names 'ringg'; allowed: ring, direct, halvingDoubling"),
    ('{"endpoint_delay": 10}', r"'endpoint_delay' is not an ASTRA-sim system field known here; known: endpoint-delay"),
])
def test_malformed_astra_system_files_say_what_is_expected(text, message):
    with pytest.raises(ConfigError, match=message):
        astra.parse_system(text)


def test_an_astra_file_that_cannot_be_read_names_the_path(tmp_path):
    missing = tmp_path / "net.yml"
    with pytest.raises(ConfigError, match=r"ASTRA-sim input '.*net.yml' cannot be read: No such file or directory"):
        astra.load(missing)


# -- collectives across ranks ------------------------------------------------

def _spawn(worker: Any, nprocs: int, tmp_path: Any, *args: Any) -> None:
    spawn(worker, nprocs, tmp_path, *args, timeout_s=JOIN_TIMEOUT_S)


def _init(rank: int, nprocs: int, store: str) -> None:
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("zion", init_method=f"file://{store}", rank=rank, world_size=nprocs,
                            timeout=timedelta(seconds=GROUP_TIMEOUT_S))
    torch.zion.set_device(rank)


def _collective_mismatch_worker(rank: int, nprocs: int, store: str) -> None:
    _init(rank, nprocs, store)
    x = torch.ones(4, device="zion")
    # Each rank names a different reduction: refused on both, the group stays usable.
    with pytest.raises(RuntimeError, match=r"all_reduce: ranks name different reduce ops \(rank 0: SUM, rank 1: MAX\)"):
        dist.all_reduce(x, op=dist.ReduceOp.SUM if rank == 0 else dist.ReduceOp.MAX)
    with pytest.raises(RuntimeError, match=r"sizes differ across ranks"):
        dist.all_gather_into_tensor(torch.empty(8 + 2 * rank, device="zion"), torch.ones(4 + rank, device="zion"))
    with pytest.raises(RuntimeError, match=r"dtypes differ across ranks"):
        dist.broadcast(torch.ones(4, device="zion", dtype=torch.float32 if rank else torch.int64), src=0)
    # Reductions the data cannot take.
    with pytest.raises(RuntimeError, match=r"Cannot use ReduceOp.BAND with non-integral dtype"):
        dist.all_reduce(torch.ones(4, device="zion"), op=dist.ReduceOp.BAND)
    with pytest.raises(RuntimeError, match=r"reduce op PREMUL_SUM is not supported; the zion backend reduces with SUM, AVG"):
        dist.all_reduce(torch.ones(4, device="zion"), op=dist._make_nccl_premul_sum(2.0))
    y = torch.full((3,), float(rank + 1), device="zion")
    dist.all_reduce(y)
    assert torch.equal(y.cpu(), torch.full((3,), 3.0))
    dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.multiproc
def test_collectives_that_disagree_across_ranks_raise_on_every_rank(tmp_path):
    _spawn(_collective_mismatch_worker, 2, tmp_path)


def _world_too_large_worker(rank: int, nprocs: int, store: str, platform_file: str) -> None:
    os.environ["ZION_PLATFORM"] = platform_file
    os.environ.pop("LOCAL_RANK", None)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    begin = time.monotonic()
    with pytest.raises(Exception, match=r"rank 1 would be OAM 0 of node 1, but platform 'one-oam' has 1 node\(s\) "
                                        r"x 1 OAMs = 1 devices; choose a platform with more nodes"
                       if rank == 1 else r"."):
        dist.init_process_group("zion", init_method=f"file://{store}", rank=rank, world_size=nprocs,
                                timeout=timedelta(seconds=GROUP_TIMEOUT_S))
        dist.all_reduce(torch.ones(2, device="zion"))
    assert time.monotonic() - begin < GROUP_TIMEOUT_S + 20


@pytest.mark.slow
@pytest.mark.multiproc
def test_a_world_larger_than_the_platform_is_an_error_naming_the_sizes(tmp_path):
    one_oam = tmp_path / "one-oam.json"
    one_oam.write_text('{"base": "zion", "name": "one-oam", "oam": {"count": 1}, "pcie": {"switches": ['
                       '{"generation": "gen4", "uplink_generation": "gen3", "uplink_lanes": 16, "oam_lanes": 16, '
                       '"nic_lanes": 16, "sockets": [0, 1, 2, 3, 4, 5, 6, 7], "oams": [0], "nics": [0, 1, 2, 3]}]}}')
    zion_emu.load_platform(one_oam)  # the platform itself is valid
    _spawn(_world_too_large_worker, 2, tmp_path, str(one_oam))
