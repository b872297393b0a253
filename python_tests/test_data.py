"""Data ingestion from reader hosts (zion_emu.data.ReaderService).

zion preset: 4 front-end NICs of 100 Gb/s per node, 5 us latency; DDR
153.6 GB/s per socket."""

import pytest
import torch

import zion_emu  # noqa: F401
from zion_emu import _C
from zion_emu.data import ReaderService

DDR = 153.6e9
NIC_LATENCY = 5e-6


def host() -> float:
    return _C.device.host_time()


def batches(n, size=256):
    return [(torch.randn(size, 13), torch.randn(size)) for _ in range(n)]


BATCH_BYTES = 256 * 13 * 4 + 256 * 4  # 14,336


def test_a_tiny_nic_makes_ingestion_the_bottleneck_in_closed_form():
    service = ReaderService(batches(4), nic_bandwidth_bytes_per_s=1e6)
    per_batch = BATCH_BYTES / 1e6 + NIC_LATENCY  # 14.341 ms on the wire
    staging = BATCH_BYTES / DDR
    torch.zion.synchronize()
    start = host()
    seen = list(service)
    s = service.summary()
    # The readers start at the first request; batch k arrives at start + k * per_batch; the host waits
    # for each, then stages it.
    assert host() == pytest.approx(start + 4 * per_batch + staging, rel=1e-12)
    assert s.wait_s == pytest.approx(4 * per_batch - 3 * staging, rel=1e-12)
    assert s.bottleneck == "ingestion"
    assert s.network_limit_samples_per_s == pytest.approx(1e6 / (BATCH_BYTES / 256))
    assert len(seen) == 4 and all(x.is_pinned() for x, _ in seen)
    with pytest.raises(ValueError, match="front-end NIC share"):
        service.readers_needed(10 * s.network_limit_samples_per_s)


def test_readers_bound_the_rate_when_preprocessing_is_slow():
    # 2 readers, 100 us per sample: a 256-sample batch every 12.8 ms.
    service = ReaderService(batches(3), readers=2, preprocess_s_per_sample=1e-4)
    share = 4 * 100e9 / 8  # the whole node's front-end bandwidth, one rank
    wire = BATCH_BYTES / share + NIC_LATENCY
    torch.zion.synchronize()
    start = host()
    list(service)
    s = service.summary()
    assert host() == pytest.approx(start + 3 * 12.8e-3 + wire + BATCH_BYTES / DDR, rel=1e-9)
    assert s.reader_limit_samples_per_s == pytest.approx(2 / 1e-4)
    assert s.bottleneck == "ingestion"
    assert service.readers_needed(50_000) == 5  # 50k samples/s x 100 us each


def test_a_busy_trainer_is_the_bottleneck_and_batches_reach_the_device():
    service = ReaderService(batches(4), device="zion:0")
    w = torch.randn(13, 4096, device="zion")
    for x, y in service:
        assert x.device.type == "zion" and y.device.type == "zion"
        for _ in range(20):
            (x @ w).sum()
        torch.zion.synchronize()
    s = service.summary()
    assert s.bottleneck == "training"
    assert s.wait_s < 0.05 * s.elapsed_s


@pytest.mark.parametrize("kwargs, message", [
    ({"readers": 0}, "readers must be a positive integer"),
    ({"preprocess_s_per_sample": -1.0}, "preprocess_s_per_sample must be >= 0"),
    ({"samples_per_batch": 0}, "samples_per_batch must be positive"),
    ({"nic_bandwidth_bytes_per_s": 0.0}, "NIC share must be positive"),
])
def test_bad_reader_settings_are_clear_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ReaderService([], **kwargs)
