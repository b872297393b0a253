"""Timing-only mode with embedding tables in the sockets' DDR
(zion_emu/socket_tensor.py): storage-less CPU tensors inside
``zion_emu.socket(i)``, priced and accounted as real mode prices and
accounts real ones."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable

import pytest

from processes import REPO, child_env, run_python, zion_emu_cli

EXAMPLE = REPO / "examples" / "dlrm" / "dlrm.py"
TIMEOUT_S = 600

# The small config's 8 tables are 100,000 x 64 fp32 (25.6 MB; 51.2 MB with
# Adagrad's state). --hbm-budget 120M keeps two tables with their state in HBM
# (102.4 MB) and puts the other six in the socket's DDR.
CASES = {
    "ddr-sgd": ["--table-placement", "ddr"],
    "auto-adagrad": ["--table-placement", "auto", "--hbm-budget", "120M", "--optimizer", "adagrad"],
}


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str, int], tuple[dict, dict, str]]:
    cache: dict[tuple[str, int], tuple[dict, dict, str]] = {}

    def run(mode: str, nproc: int, case: str, out: Path) -> tuple[dict, str]:
        r = zion_emu_cli("run", "--nproc", str(nproc), "--quiet-report", "--report", str(out), str(EXAMPLE),
                         "--config", "small", "--device", "zion", "--num-batches", "3", "--no-progress", *CASES[case],
                         timeout_s=TIMEOUT_S, env=child_env(ZION_MODE=mode, OMP_NUM_THREADS="1"))
        return json.loads(out.read_text()), r.stdout

    def get(case: str, nproc: int) -> tuple[dict, dict, str]:
        if (case, nproc) not in cache:
            where = tmp_path_factory.mktemp(f"{case}-{nproc}")
            real, stdout = run("real", nproc, case, where / "real.json")
            timing, _ = run("timing", nproc, case, where / "timing.json")
            cache[case, nproc] = (real, timing, stdout)
        return cache[case, nproc]

    return get


def _hbm_peaks(report: dict[str, Any]) -> dict[tuple[int, int], int]:
    return {(d["rank"], d["device"]): d["peak_hbm_bytes"] for d in report["devices"]}


def _ddr_peaks(report: dict[str, Any]) -> dict[tuple[int, int], int]:
    return {(s["rank"], s["socket"]): s["peak_ddr_bytes"] for s in report["sockets"]}


@pytest.mark.slow
@pytest.mark.multiproc
@pytest.mark.timeout(2 * TIMEOUT_S)
@pytest.mark.parametrize("nproc", [1, 2])
@pytest.mark.parametrize("case", sorted(CASES))
def test_ddr_tables_model_the_same_iteration_and_peaks_as_real_mode(reports, case, nproc):
    real, timing, stdout = reports(case, nproc)
    assert (real["mode"], timing["mode"]) == ("real", "timing")
    assert "place ddr socket" in stdout
    if case.startswith("auto"):
        assert "place hbm" in stdout  # a mix: some tables in HBM, the rest in DDR
    assert timing["iteration_s"] == pytest.approx(real["iteration_s"], rel=1e-3)
    assert len(_hbm_peaks(real)) == nproc
    assert _hbm_peaks(timing) == _hbm_peaks(real)
    # The tables' bytes (25.6 MB each) are in the socket's pool in both modes, to the byte.
    assert min(_ddr_peaks(real).values()) > 25_600_000
    assert _ddr_peaks(timing) == _ddr_peaks(real)
    # Every socket op of the step is priced as in real mode.
    assert [s["busy_s"] for s in timing["sockets"]] == pytest.approx([s["busy_s"] for s in real["sockets"]],
                                                                     rel=1e-9)


def _timing(code: str) -> str:
    return run_python(code, env={**os.environ, "ZION_MODE": "timing", "PYTHONWARNINGS": "default"}).stdout


def test_a_table_in_a_sockets_ddr_holds_no_host_bytes():
    # A 25M x 64 fp32 table (6.4 GB) with Adagrad's state (6.4 GB more) in
    # socket 1's DDR: the pool counts 12.8 GB; the process's peak resident
    # memory grows by less than an eighth of one table (holding it would add all of it).
    out = _timing("""
        import resource, torch, zion_emu
        from torch import nn
        from zion_emu import sockets
        from zion_emu.socket_tensor import SocketTensor
        torch.ones(1, device="zion")
        rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        rows, dim = 25_000_000, 64
        with zion_emu.socket(1):
            table = nn.utils.skip_init(nn.EmbeddingBag, rows, dim, mode="sum", sparse=True, device="cpu")
            with torch.no_grad():
                table.weight.uniform_(-0.01, 0.01)
            opt = torch.optim.Adagrad(table.parameters(), foreach=False)
            idx = torch.randint(0, rows, (8192,))
            offsets = torch.arange(0, 8192, 4)
            pooled = table(idx, offsets).to("zion")
            pooled.sum().backward()
            opt.step()
        assert isinstance(table.weight, SocketTensor) and sockets.socket_of(table.weight) == 1
        assert table.weight.grad.is_sparse and table.weight.grad._indices().numel() == 8192  # real indices
        table_bytes = rows * dim * 4
        m = sockets.memory(1)
        assert m.peak >= 2 * table_bytes and m.in_use >= 2 * table_bytes, m
        grew = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - rss_before
        assert grew < table_bytes / 8, (grew, rss_before)
        print("ddr_peak", m.peak, "grew", grew)
    """)
    assert int(out.split("ddr_peak")[1].split()[0]) >= 2 * 25_000_000 * 64 * 4


def test_a_sockets_ddr_pool_raises_its_out_of_memory_error_at_modeled_capacity():
    out = _timing("""
        import torch, zion_emu
        from zion_emu import sockets
        capacity = sockets.memory(0).capacity
        with zion_emu.socket(0):
            a = torch.empty(capacity // 8, dtype=torch.float32)  # half the pool, no host bytes
            assert sockets.memory(0).in_use == capacity // 2
            try:
                b = torch.empty(capacity // 8 + 1, dtype=torch.float32)
            except torch.OutOfMemoryError as e:
                print("oom", "out of DDR on socket 0" in str(e), sockets.memory(0).num_ooms)
            del a
            print("after", sockets.memory(0).in_use)
    """)
    assert "oom True 1" in out and "after 0" in out


def test_a_copy_to_the_oam_and_its_gradient_are_priced_as_in_real_mode():
    # Socket 0 -> zion:0 is the OAM's home socket path (no UPI): a pageable
    # [4096, 256] fp32 copy (4 MiB) costs the host a staging copy at DDR
    # bandwidth and the transfer; the gradient crosses back the same way.
    code = """
        import torch, zion_emu
        from zion_emu import sockets
        torch.ones(1, device="zion"); torch.zion.synchronize()
        with zion_emu.socket(0):
            x = torch.zeros(4096, 256, requires_grad=True)
            t0 = zion_emu.clock()
            y = x.to("zion")
            torch.zion.synchronize(); t1 = zion_emu.clock()
            y.sum().backward()
            torch.zion.synchronize(); t2 = zion_emu.clock()
        print("times", t1 - t0, t2 - t1, type(x).__name__, type(x.grad).__name__, tuple(x.grad.shape),
              sockets.memory(0).in_use)
    """
    real = run_python(code, env={**os.environ, "ZION_MODE": "real"}).stdout.split("times")[1].split()
    timing = _timing(code).split("times")[1].split()
    assert float(timing[0]) == pytest.approx(float(real[0]), rel=1e-9)
    assert float(timing[1]) == pytest.approx(float(real[1]), rel=1e-9)
    assert real[2:4] == ["Tensor", "Tensor"] and timing[2:4] == ["SocketTensor", "SocketTensor"]
    assert timing[4] == real[4] == "(4096," and timing[5:] == real[5:]  # the gradient lives outside the pool


def test_reading_a_socket_tensors_value_is_a_counted_placeholder():
    out = _timing("""
        import warnings, torch, zion_emu
        warnings.simplefilter("always")
        with zion_emu.socket(0):
            t = torch.ones(3, 4)
            with warnings.catch_warnings(record=True) as caught:
                for _ in range(3):
                    v = t.sum().item()
        print("value", v, "warnings", sum("timing-only" in str(w.message) for w in caught))
        reads = [r for r in zion_emu.placeholder_reads() if r["what"] == "item()"]
        print("reads", [(r["count"], r["dtype"], r["site"].split(":")[-1]) for r in reads])
    """)
    assert "value 0.0" in out
    assert "warnings 1" in out  # once per call site
    assert "reads [(3, 'Float', '8')]" in out  # line 8 of the snippet (its first line is empty): the .item()


def test_real_mode_keeps_real_cpu_tensors_in_the_socket():
    out = run_python("""
        import torch, zion_emu
        from zion_emu import sockets
        with zion_emu.socket(1):
            t = torch.ones(1000)
        print(type(t).__name__, sockets.socket_of(t), float(t.sum()))
    """, env={**os.environ, "ZION_MODE": "real"}).stdout
    assert "Tensor 1 1000.0" in out


def test_a_socket_value_that_an_op_needs_is_a_clear_error_naming_the_op():
    # As for a storage-less zion tensor: an index computed from storage-less
    # floats, or an op whose result's shape depends on values, raise at once.
    out = _timing("""
        import torch, zion_emu
        with zion_emu.socket(0):
            x = torch.rand(10)
            i = (x * 10).long()
            weight = torch.rand(10, 4)
            cases = {"index": lambda: x[i], "index_select": lambda: x.index_select(0, i),
                     "embedding_bag": lambda: torch.nn.functional.embedding_bag(i, weight, torch.tensor([0])),
                     "nonzero": lambda: x.nonzero(), "unique": lambda: i.unique()}
            for name, f in cases.items():
                try:
                    f()
                    print(name, "ran")
                except RuntimeError as e:
                    print(name, "|", str(e).split(";")[0].split(" (")[0])
            real = x.index_select(0, torch.tensor([1, 2]))  # real indices: fine
            print("real indices", type(real).__name__, list(real.shape))
    """)
    assert "index | zion timing-only: aten::index uses a storage-less torch.int64 socket tensor as its 'indices'" in out
    assert "index_select | zion timing-only: aten::index_select uses a storage-less torch.int64 socket tensor as " \
           "its 'index'" in out
    assert "embedding_bag | zion timing-only: aten::_embedding_bag_forward_only uses a storage-less torch.int64 " \
           "socket tensor as its 'indices'" in out
    assert "nonzero | zion timing-only: aten::nonzero needs the values of a storage-less socket tensor" in out
    assert "unique | zion timing-only: aten::_unique2 needs the values of a storage-less socket tensor" in out
    assert "real indices SocketTensor [2]" in out
    assert " ran" not in out
