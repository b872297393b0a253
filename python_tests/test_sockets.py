"""CPU sockets as places for work and memory (zion_emu.socket).

zion preset: a socket has peak fp32 4.1216 TFLOP/s (28 cores), DDR 153.6 GB/s,
random-access efficiency 0.3; UPI links 20.8 GB/s, 70 ns; socket 0 -> PCIe
switch 0 is Gen3 x16 (12 GB/s, 150 ns), switch -> OAM 0 Gen4 x16 (24 GB/s,
150 ns); launch overhead 5 us. Socket 5 has a direct UPI link to socket 0.
"""

import json
import textwrap

import pytest
import torch

import zion_emu
from zion_emu import _C, sockets
from processes import child_env, run_python

SOCKET_FP32 = 4.1216e12
DDR = 153.6e9
RANDOM_ACCESS = 0.3
LAUNCH = 5e-6


def host() -> float:
    return _C.device.host_time()


def test_tensors_made_in_a_socket_scope_live_in_its_ddr_pool():
    before = sockets.memory(2).in_use
    with zion_emu.socket(2):
        x = torch.empty(1 << 20)  # 4 MiB
        assert sockets.current_socket() == 2
    y = torch.empty(1 << 20)
    assert sockets.socket_of(x) == 2 and sockets.socket_of(y) == -1
    assert not x.is_pinned()
    assert sockets.memory(2).in_use == before + 4 * (1 << 20)
    assert sockets.memory(2).peak >= before + 4 * (1 << 20)
    del x
    assert sockets.memory(2).in_use == before


def test_a_cpu_matmul_in_socket_2_is_charged_flops_over_the_socket_peak():
    a, b = torch.randn(512, 512), torch.randn(512, 512)
    ops0, busy0 = sockets.counters(2)["ops"], sockets.counters(2)["busy_s"]
    start = host()
    with zion_emu.socket(2):
        c = torch.mm(a, b)
    flops = 2 * 512 ** 3
    expected = flops / SOCKET_FP32  # 65.1 us; its 3 MiB of traffic takes only 20.5 us at DDR bandwidth
    assert sockets.counters(2)["ops"] == ops0 + 1
    assert sockets.counters(2)["busy_s"] - busy0 == pytest.approx(expected, rel=1e-9)
    assert host() - start == pytest.approx(expected, rel=1e-9)  # the host ran it
    assert torch.equal(c, a @ b)


def test_an_embedding_bag_on_a_ddr_table_is_priced_by_the_gather_model():
    with zion_emu.socket(3):
        table = torch.randn(100_000, 128)
    assert sockets.socket_of(table) == 3
    indices = torch.randint(0, 100_000, (10_000,))
    offsets = torch.arange(0, 10_000, 100)
    busy0 = sockets.counters(3)["busy_s"]
    with zion_emu.socket(3):
        outs = torch.ops.aten._embedding_bag_forward_only(table, indices, offsets)
    gathered = 10_000 * 128 * 4  # one random row of 512 B per index
    streamed = sum(t.numel() * t.element_size() for t in (indices, offsets, *outs))
    expected = gathered / (DDR * RANDOM_ACCESS) + streamed / DDR  # 111 us of gathers, memory-bound
    assert sockets.counters(3)["busy_s"] - busy0 == pytest.approx(expected, rel=1e-9)
    ref = torch.nn.functional.embedding_bag(indices, table, offsets, mode="sum")
    assert torch.equal(outs[0], ref)


def test_ops_on_zion_tensors_inside_a_socket_scope_stay_on_the_device():
    x = torch.ones(64, device="zion")
    busy0 = sockets.counters(1)["ops"]
    with zion_emu.socket(1):
        y = x * 2
    assert sockets.counters(1)["ops"] == busy0
    assert y.device.type == "zion"


def test_a_copy_from_socket_5_to_oam_0_crosses_upi_and_pcie_in_closed_form():
    n = 1 << 22  # 16 MiB
    with zion_emu.socket(5):
        x = torch.ones(n).pin_memory()
    assert x.is_pinned() and sockets.socket_of(x) == 5
    torch.zion.synchronize()
    start = host()
    x.to("zion:0")
    # socket 5 -UPI-> socket 0 -Gen3 x16-> switch 0 -Gen4 x16-> OAM 0: 70 + 150 + 150 ns, 12 GB/s bottleneck
    assert host() - start == pytest.approx(LAUNCH + 370e-9 + 4 * n / 12e9, rel=1e-9)


def test_a_pageable_socket_tensor_pays_the_staging_copy_too():
    n = 1 << 20
    with zion_emu.socket(5):
        x = torch.ones(n)
    torch.zion.synchronize()
    start = host()
    x.to("zion:0")
    assert host() - start == pytest.approx(4 * n / DDR + LAUNCH + 370e-9 + 4 * n / 12e9, rel=1e-9)


def test_scopes_nest_and_decorate():
    @zion_emu.socket(4)
    def make():
        return torch.empty(16), sockets.current_socket()

    with zion_emu.socket(1):
        t, inner = make()
        assert sockets.current_socket() == 1
    assert inner == 4 and sockets.socket_of(t) == 4


def test_a_socket_out_of_range_is_a_clear_error():
    with pytest.raises(IndexError, match=r"socket 8 does not exist; the platform has 8 sockets \(0..7\)"):
        zion_emu.socket(8)
    with pytest.raises(TypeError, match="socket index"):
        zion_emu.socket("2")


def test_ddr_out_of_memory_names_the_socket_and_loses_nothing(tmp_path):
    platform = tmp_path / "small.json"
    platform.write_text(json.dumps({"base": "zion", "socket": {"ddr_bytes": 64 << 20}}))
    script = textwrap.dedent("""
        import torch, zion_emu
        from zion_emu import sockets
        with zion_emu.socket(1):
            a = torch.full((10 << 20,), 3.0)          # 40 MiB of 64
            try:
                b = torch.empty(10 << 20)              # 40 more: too much
            except torch.OutOfMemoryError as e:
                print("OOM:", e)
            m = sockets.memory(1)
            print("in_use", m.in_use, "ooms", m.num_ooms, "intact", bool((a == 3.0).all()))
            del a
            c = torch.empty(10 << 20)                  # freed memory is reusable at once
            print("after", sockets.memory(1).in_use)
    """)
    r = run_python(script, env=child_env(ZION_PLATFORM=str(platform)))
    assert "out of DDR on socket 1 (pageable host memory)" in r.stdout
    assert "40.00 MiB" in r.stdout or "0.04 GiB" in r.stdout
    assert f"in_use {40 << 20} ooms 1 intact True" in r.stdout
    assert f"after {40 << 20}" in r.stdout


def test_zion_socket_environment_places_the_whole_process(tmp_path):
    script = "import torch, zion_emu\nfrom zion_emu import sockets\nx = torch.empty(8)\nprint(sockets.socket_of(x))\n"
    r = run_python(script, env=child_env(ZION_SOCKET="6"))
    assert r.stdout.strip() == "6"


def test_memory_stats_show_ddr_per_socket_beside_hbm():
    before = torch.zion.memory_stats()["ddr.socket_3.in_use_bytes"]
    with zion_emu.socket(3):
        x = torch.empty(1 << 18)  # 1 MiB
    stats = torch.zion.memory_stats()
    assert stats["ddr.socket_3.in_use_bytes"] == before + (1 << 20)
    assert stats["ddr.socket_3.capacity_bytes"] == 384 << 30
    assert "allocated_bytes.all.current" in stats and stats["capacity_bytes"] == 32 << 30
    del x


def test_a_socket_scope_places_tensors_after_set_platform_before_any_zion_tensor():
    done = run_python("""
        import torch, zion_emu
        zion_emu.set_platform(zion_emu.load_platform("zion"))
        with zion_emu.socket(1):
            t = torch.empty(1 << 10)
        print(zion_emu.sockets.socket_of(t), zion_emu.sockets.memory(1).in_use)
    """)
    assert done.stdout.split() == ["1", "4096"]


def test_a_python_dispatch_mode_in_a_socket_scope_changes_no_price():
    # torch records a call into a TorchDispatchMode (or a tensor subclass) as
    # "PythonDispatchMode"; the observer looks through it: the mm is still one
    # op, priced at flops over the socket's peak.
    from torch.utils._python_dispatch import TorchDispatchMode

    class PassThrough(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    a, b = torch.randn(512, 512), torch.randn(512, 512)
    ops0, busy0 = sockets.counters(2)["ops"], sockets.counters(2)["busy_s"]
    with zion_emu.socket(2), PassThrough():
        torch.mm(a, b)
    assert sockets.counters(2)["ops"] == ops0 + 1
    assert sockets.counters(2)["busy_s"] - busy0 == pytest.approx(2 * 512 ** 3 / SOCKET_FP32, rel=1e-9)


def test_a_zion_sparse_op_inside_a_socket_scope_stays_on_the_device():
    # zion runs a sparse op's CPU kernel on aliases of device memory: that is
    # the device's work, not the socket's.
    indices = torch.tensor([[3, 1, 3, 0]])
    sparse = torch.sparse_coo_tensor(indices, torch.ones(4, 8), (10, 8)).to("zion")
    ops0, in_use0 = sockets.counters(1)["ops"], sockets.memory(1).in_use
    with zion_emu.socket(1):
        c = sparse.coalesce()
    assert c.device.type == "zion" and c._nnz() == 3
    assert sockets.counters(1)["ops"] == ops0
    assert sockets.memory(1).in_use == in_use0


def test_a_sparse_update_of_a_ddr_table_costs_its_rows_not_the_table():
    # A sparse gradient is described by what it stores (values and indices),
    # as on zion: adding 512 rows into a table of 1,000 rows or of 200,000
    # costs the same.
    costs = []
    for rows in (1_000, 200_000):
        with zion_emu.socket(4):
            table = torch.zeros(rows, 64)
        grad = torch.sparse_coo_tensor(torch.randint(0, 1_000, (1, 512)), torch.ones(512, 64), (rows, 64))
        busy0 = sockets.counters(4)["busy_s"]
        with zion_emu.socket(4):
            table.add_(grad)
        costs.append(sockets.counters(4)["busy_s"] - busy0)
    assert costs[0] > 0 and costs[1] == pytest.approx(costs[0], rel=1e-12)


def test_an_op_that_raises_in_a_socket_scope_is_not_charged_and_warns_of_nothing():
    r = run_python("""
        import torch, zion_emu
        from zion_emu import _C
        x, out_of_range = torch.arange(10.0), torch.tensor([20])
        with zion_emu.socket(0):
            before = _C.device.host_time()
            try:
                x[out_of_range]
            except IndexError as e:
                print("raised", e)
            print("charged", _C.device.host_time() - before)
    """)
    assert "raised index 20 is out of bounds" in r.stdout
    assert "charged 0.0" in r.stdout
    assert "RecordFunction callback" not in r.stderr, r.stderr
