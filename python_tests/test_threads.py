"""Allocator, clocks and stats are shared by autograd and data-loader
threads: ops issued from several threads at once stay correct and leave the
pools exact."""

import gc
import subprocess
import threading
from contextlib import ExitStack

import pytest
import torch

import zion_emu  # noqa: F401
from processes import PYTHON, finish, started


def test_threads_on_several_devices_keep_results_and_memory_exact():
    # Earlier tests' garbage (tensors in reference cycles) is freed first, so
    # that no collection during the threads moves the baseline.
    gc.collect()
    torch.zion.synchronize()
    baseline = [torch.zion.memory_allocated(d) for d in range(4)]
    errors: list[BaseException] = []

    def work(device: int) -> None:
        try:
            g = torch.Generator().manual_seed(device)
            for _ in range(30):
                a = torch.randn(32, 32, generator=g)
                b = torch.randn(32, 32, generator=g, requires_grad=True)
                zb = b.detach().to(f"zion:{device}").requires_grad_()
                z = (a.to(f"zion:{device}") @ zb).relu().sum()
                z.backward()
                ref = (a @ b).relu().sum()
                ref.backward()
                assert z.item() == ref.item()
                assert torch.equal(zb.grad.cpu(), b.grad)
                pinned = torch.ones(256).pin_memory()
                assert pinned.to(f"zion:{device}").sum().item() == 256.0
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(d,)) for d in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    assert [torch.zion.memory_allocated(d) for d in range(4)] == baseline


_BACKWARD_THEN_EXIT = """
import torch, zion_emu
m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)).to("zion:1")
bag = torch.nn.EmbeddingBag(100, 8, mode="sum").to("zion")
m(torch.randn(8, 16, device="zion:1")).sum().backward()
bag(torch.randint(0, 100, (16,), device="zion"), torch.arange(0, 16, 2, device="zion")).sum().backward()
print("ok")
"""


@pytest.mark.slow
def test_the_interpreter_exits_cleanly_right_after_a_backward_pass():
    # Autograd's worker thread of a device may still hold the finished backward pass (with the Python
    # objects saved in its thread state) when the script ends; released during finalization, it used to
    # abort the process ("terminate called without an active exception") about one run in six. The
    # runs go side by side; each must exit with 0.
    with ExitStack() as stack:
        runs = [stack.enter_context(started([PYTHON, "-c", _BACKWARD_THEN_EXIT], stdout=subprocess.PIPE,
                                            stderr=subprocess.PIPE, text=True)) for _ in range(6)]
        for run in runs:
            out, err = finish(run, 180)
            assert (run.returncode, out.strip()) == (0, "ok"), err[-2000:]
