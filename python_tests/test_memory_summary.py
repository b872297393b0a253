"""``torch.zion.memory_summary`` and ``memory_stats``: torch.cuda's table and
keys for a zion device.

The hand-worked case runs in a fresh interpreter, so nothing else has touched
the device: a 1 MiB tensor (the small pool: CUDA's allocator serves requests
of up to 1 MiB, its kSmallSize, from it), a 3 MiB one (the large pool) and a
1 KiB one, then the 1 MiB one freed; two empty tensors beside them take
nothing and are not counted, as on CUDA (its caching allocator skips a
request of 0 bytes). Every figure of the table is worked out
below from those four steps, and the table equals, line for line, what
torch.cuda.memory_summary's own formatter prints for the same statistics
with CUDA's names swapped for zion's.
"""

from __future__ import annotations

import json

import pytest
import torch

from processes import run_python

KIB, MIB = 1 << 10, 1 << 20

SCRIPT = """
import json
import torch
import zion_emu  # noqa: F401

a = torch.empty(MIB // 4, device="zion:3")      # 1 MiB: small pool
b = torch.empty(3 * MIB // 4, device="zion:3")  # 3 MiB: large pool
c = torch.empty(KIB // 4, device="zion:3")      # 1 KiB: small pool
empty = [torch.empty(0, device="zion:3"), torch.zeros(0, 5, device="zion:3")]  # not counted
del a
stats = torch.zion.memory_stats(3)

# torch.cuda.memory_summary's own formatter, fed the same statistics.
import torch.cuda.memory as cuda_memory
cuda_memory.memory_stats = lambda device=None: stats
cuda = cuda_memory.memory_summary(3)
cuda_short = cuda_memory.memory_summary(3, abbreviated=True)
print(json.dumps({"stats": stats, "summary": torch.zion.memory_summary("zion:3"),
                  "short": torch.zion.memory_summary(3, abbreviated=True), "cuda": cuda, "cuda_short": cuda_short,
                  "default_device": torch.zion.memory_summary() == torch.zion.memory_summary(0)}))
""".replace("MIB", str(MIB)).replace("KIB", str(KIB))


@pytest.fixture(scope="module")
def worked() -> dict:
    return json.loads(run_python(SCRIPT, timeout_s=120).stdout.strip().splitlines()[-1])


def test_memory_stats_keys_are_torch_cudas_and_the_pools_add_up(worked: dict):
    s = worked["stats"]
    current, peak = 3 * MIB + KIB, 4 * MIB + KIB  # after del a; before it
    assert (s["allocated_bytes.all.current"], s["allocated_bytes.all.peak"]) == (current, peak)
    assert (s["allocated_bytes.all.allocated"], s["allocated_bytes.all.freed"]) == (peak, MIB)
    assert [s[f"allocated_bytes.large_pool.{k}"] for k in ("current", "peak", "allocated", "freed")] == \
        [3 * MIB, 3 * MIB, 3 * MIB, 0]
    # The small pool: a (1 MiB) then c (1 KiB) live together, then a is freed.
    assert [s[f"allocated_bytes.small_pool.{k}"] for k in ("current", "peak", "allocated", "freed")] == \
        [KIB, MIB + KIB, MIB + KIB, MIB]
    assert [s[f"allocation.{p}.{k}"] for p in ("all", "large_pool", "small_pool")
            for k in ("current", "peak", "allocated", "freed")] == [2, 3, 3, 1, 1, 1, 1, 0, 1, 2, 2, 1]
    for metric in ("allocated_bytes", "reserved_bytes", "active_bytes", "requested_bytes", "allocation", "segment",
                   "active"):
        for k in ("current", "allocated", "freed"):
            assert s[f"{metric}.all.{k}"] == s[f"{metric}.large_pool.{k}"] + s[f"{metric}.small_pool.{k}"]
        # No caching: reserved, active and requested bytes are the allocated bytes; every allocation a segment.
        twin = "allocated_bytes" if metric.endswith("bytes") else "allocation"
        for p in ("all", "large_pool", "small_pool"):
            for k in ("current", "peak", "allocated", "freed"):
                assert s[f"{metric}.{p}.{k}"] == s[f"{twin}.{p}.{k}"], (metric, p, k)
    assert s["inactive_split_bytes.all.peak"] == 0 and s["oversize_allocations.peak"] == 0
    assert s["num_ooms"] == 0 and s["capacity_bytes"] == 32 << 30


def test_memory_summary_is_torch_cudas_table_with_the_hand_worked_figures(worked: dict):
    lines = worked["summary"].splitlines()
    assert len(lines) == 47 and all(len(line) == 77 for line in lines)  # 75 columns inside the | |
    assert lines[1] == "|                  PyTorch zion memory summary, device ID 3                 |"
    assert lines[3] == "|            zion OOMs: 0            |        zion alloc retries: 0         |"
    assert lines[5] == "|        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  |"
    # Bytes take the unit in which the row's "all" figure is below 768 of it: 3 MiB + 1 KiB = 3073 KiB.
    def pools(name: str) -> list[str]:  # a metric's all, large pool and small pool rows
        i = next(k for k in range(len(lines)) if lines[k].startswith(f"| {name:<21} |"))
        return [line[25:] for line in lines[i:i + 3]]

    assert pools("Allocated memory") == ["   3073 KiB |   4097 KiB |   4097 KiB |   1024 KiB |",
                                         "   3072 KiB |   3072 KiB |   3072 KiB |      0 KiB |",
                                         "      1 KiB |   1025 KiB |   1025 KiB |   1024 KiB |"]
    for same in ("Active memory", "Requested memory", "GPU reserved memory"):
        assert pools(same) == pools("Allocated memory"), same
    assert pools("Non-releasable memory") == ["      0 B   |      0 B   |      0 B   |      0 B   |"] * 3
    assert pools("Allocations") == ["       2    |       3    |       3    |       1    |",
                                    "       1    |       1    |       1    |       0    |",
                                    "       1    |       2    |       2    |       1    |"]
    for same in ("Active allocs", "GPU reserved segments"):
        assert pools(same) == pools("Allocations"), same
    assert pools("Oversize allocations")[0] == pools("Oversize GPU segments")[0] == \
        "       0    |       0    |       0    |       0    |"
    assert lines[-1] == "|" + "=" * 75 + "|"


def test_memory_summary_matches_torch_cudas_formatter_line_for_line(worked: dict):
    for ours, cuda in ((worked["summary"], worked["cuda"]), (worked["short"], worked["cuda_short"])):
        assert ours == cuda.replace("PyTorch CUDA memory", "PyTorch zion memory").replace(
            "CUDA OOMs", "zion OOMs").replace("cudaMalloc retries", "zion alloc retries")
    short = worked["short"].splitlines()
    assert len(short) == 29 and "from large pool" not in worked["short"]
    assert worked["default_device"]


def test_memory_summary_of_a_bad_device_names_the_range():
    import zion_emu  # noqa: F401

    with pytest.raises(Exception, match="out of range"):
        torch.zion.memory_summary(99)


def test_sizes_past_768_of_a_unit_move_to_the_next_as_torch_cudas_do():
    from zion_emu.device import _summary_count, _summary_size

    assert _summary_size(767 * KIB, 767 * KIB) == "785408 B  "
    assert _summary_size(768 * KIB, 768 * KIB) == "   768 KiB"
    assert _summary_size(5 * KIB, 768 * MIB) == "     0 MiB"  # the row's unit, from its "all" figure
    assert _summary_count(749_999, 749_999) == " 749999   "
    assert _summary_count(750_000, 750_000) == "    750 K "
    assert _summary_size(3 << 40, 3 << 40) == "  3072 GiB"
