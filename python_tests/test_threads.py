"""Allocator, clocks and stats are shared by autograd and data-loader
threads: ops issued from several threads at once stay correct and leave the
pools exact."""

import threading

import torch

import zion_emu  # noqa: F401


def test_threads_on_several_devices_keep_results_and_memory_exact():
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
