"""Copies between host and zion and between zion devices, timed in the link
model, and pinned host memory in per-socket DDR pools.

zion preset: socket 0 -> PCIe switch 0 is Gen3 x16 (12 GB/s, 150 ns), switch
-> OAM 0 is Gen4 x16 (24 GB/s, 150 ns); OAMs are fully connected at 25 GB/s,
600 ns; launch overhead 5 us; DDR 153.6 GB/s per socket."""

import pytest
import torch

import zion_emu  # noqa: F401
from zion_emu import _C

GIB = 1 << 30
LAUNCH = 5e-6


def host_time() -> float:
    return _C.device.host_time()


def test_pinned_memory_is_pinned_and_counted_on_a_socket():
    before = _C.host_memory.stats(0)["in_use"]
    x = torch.ones(1 << 10).pin_memory()
    assert x.is_pinned() and not torch.ones(3).is_pinned()
    assert _C.host_memory.stats(0)["in_use"] == before + 4096  # OAM 0's switch hangs off socket 0
    del x
    assert _C.host_memory.stats(0)["in_use"] == before


def test_pinned_h2d_takes_bytes_over_the_slowest_pcie_link_plus_latency():
    n = 1 << 20  # 4 MiB of fp32
    x = torch.ones(n).pin_memory()
    torch.zion.synchronize()
    start = host_time()
    x.to("zion")  # blocking: the host waits for the copy
    expected = LAUNCH + 300e-9 + 4 * n / 12e9
    assert host_time() - start == pytest.approx(expected, rel=1e-9)


def test_pageable_h2d_first_costs_the_host_a_staging_copy():
    n = 1 << 20
    x = torch.ones(n)
    torch.zion.synchronize()
    start = host_time()
    x.to("zion")
    expected = 4 * n / 153.6e9 + LAUNCH + 300e-9 + 4 * n / 12e9
    assert host_time() - start == pytest.approx(expected, rel=1e-9)


def test_two_copies_on_two_streams_over_one_link_take_twice_as_long():
    n = 1 << 22  # 16 MiB each: 1.398 ms on 12 GB/s, far above the launch overhead
    a, b = torch.ones(n).pin_memory(), torch.ones(n).pin_memory()
    busy = 4 * n / 12e9
    torch.zion.synchronize()
    s1, s2 = torch.zion.Stream(), torch.zion.Stream()
    start = host_time()
    with torch.zion.stream(s1):
        a.to("zion", non_blocking=True)
    with torch.zion.stream(s2):
        b.to("zion", non_blocking=True)
    torch.zion.synchronize()
    # The first starts after one launch; the second waits for the shared
    # link, then both latencies are paid after their bytes.
    assert host_time() - start == pytest.approx(LAUNCH + 2 * busy + 300e-9, rel=1e-9)


def test_device_to_device_goes_over_the_fabric():
    n = 1 << 20
    x = torch.ones(n, device="zion:0")
    for d in range(2):
        torch.zion.synchronize(d)
    start = host_time()
    y = x.to("zion:1")  # on zion:1's current stream, over the OAM 0 - OAM 1 link
    torch.zion.synchronize(1)
    assert host_time() - start == pytest.approx(LAUNCH + 600e-9 + 4 * n / 25e9, rel=1e-9)
    assert y.device == torch.device("zion:1") and torch.equal(y.cpu(), x.cpu())


def test_pinned_out_of_memory_names_the_socket_and_loses_nothing():
    keep = torch.arange(5.0).pin_memory()
    capacity = _C.host_memory.stats(0)["capacity"]
    assert capacity == 384 * GIB  # zion preset DDR per socket
    with pytest.raises(torch.OutOfMemoryError, match=r"out of DDR on socket 0 \(pinned host memory\).*of its 384.00 GiB"):
        torch.empty(capacity // 4 + 1, pin_memory=True)
    assert keep.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0] and keep.is_pinned()


@pytest.mark.parametrize("make", [
    lambda: torch.arange(24, dtype=torch.float32).reshape(2, 3, 4),  # contiguous: copied as bytes
    lambda: torch.arange(24, dtype=torch.float32).reshape(2, 3, 4).permute(2, 0, 1),  # dense, permuted
    lambda: torch.arange(48, dtype=torch.float32).reshape(4, 12)[:, ::2],  # strided, with gaps
    lambda: torch.arange(6, dtype=torch.float32).expand(4, 6),  # overlapping (stride 0)
    lambda: torch.randn(3, 5, dtype=torch.complex64).conj(),  # lazy conjugate bit
    lambda: torch.tensor([True, False, True]),
    lambda: torch.tensor(7, dtype=torch.int16),  # zero-dim
    lambda: torch.randn(70000),  # over copy_'s grain size: copy_ on several threads
])
def test_small_and_large_copies_both_ways_are_bit_exact_with_the_same_layout(make):
    x = make()
    z = x.to("zion")
    assert z.stride() == torch.empty_like(x).stride()  # preserve_format, as on the CPU
    back = z.cpu()
    assert back.dtype == x.dtype and back.shape == x.shape
    assert torch.equal(back.resolve_conj(), x.resolve_conj())
    d = torch.empty_like(x.resolve_conj(), device="zion")
    d.copy_(x)
    assert torch.equal(d.cpu(), x.resolve_conj())
    out = torch.empty_like(x.resolve_conj())
    out.copy_(z)
    assert torch.equal(out, x.resolve_conj())


def test_a_copy_within_one_zion_tensor_is_that_of_the_cpu():
    x = torch.arange(10, dtype=torch.float32)
    z = x.to("zion")
    with pytest.raises(RuntimeError, match="refer to a single memory location"):
        x[2:8].copy_(x[0:6])
    with pytest.raises(RuntimeError, match="refer to a single memory location"):
        z[2:8].copy_(z[0:6])  # a partial overlap, refused as on the CPU
    assert torch.equal(z.cpu(), x)
    x[5:].copy_(x[:5])
    z[5:].copy_(z[:5])  # disjoint parts of one tensor
    assert torch.equal(z.cpu(), x)
    z.copy_(z)
    assert torch.equal(z.cpu(), x)
