"""A zion backward pass runs on the thread that called it, as a CPU one does;
ZION_AUTOGRAD_DEVICE_THREADS=1 keeps autograd's worker thread per device."""

import threading

import torch
import torch.utils.checkpoint

import zion_emu  # noqa: F401
from processes import child_env, run_python


def _model(device: str) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)).to(device)


def test_backward_runs_on_the_calling_thread_and_the_switch_is_put_back():
    seen: list[tuple[int, bool]] = []
    x = torch.randn(4, 8, device="zion", requires_grad=True)
    y = (x * 2).sum()
    x.register_hook(lambda g: seen.append((threading.get_ident(), torch.autograd.is_multithreading_enabled())))
    y.backward()
    assert seen == [(threading.get_ident(), False)]
    assert torch.autograd.is_multithreading_enabled()  # the caller's setting is as it was
    assert torch.equal(x.grad.cpu(), torch.full((4, 8), 2.0))


def test_a_backward_that_raises_puts_the_switch_back():
    x = torch.randn(3, device="zion", requires_grad=True)

    def fail(_):
        raise RuntimeError("hook failed")

    x.register_hook(fail)
    try:
        x.sum().backward()
    except RuntimeError as e:
        assert "hook failed" in str(e)
    else:
        raise AssertionError("the hook's error was lost")
    assert torch.autograd.is_multithreading_enabled()


def test_a_user_that_turned_multithreading_off_keeps_it_off():
    x = torch.randn(3, device="zion", requires_grad=True)
    with torch.autograd.set_multithreading_enabled(False):
        x.sum().backward()
        assert not torch.autograd.is_multithreading_enabled()
    assert torch.autograd.is_multithreading_enabled()
    assert torch.equal(x.grad.cpu(), torch.ones(3))


def test_reentrant_checkpoint_and_autograd_grad_match_cpu_bit_for_bit():
    results = {}
    for device in ("cpu", "zion"):
        m = _model(device)
        x = torch.randn(6, 8, generator=torch.Generator().manual_seed(1)).to(device).requires_grad_()
        (gx,) = torch.autograd.grad(m(x).sum(), x)
        torch.utils.checkpoint.checkpoint(m, x, use_reentrant=True).sum().backward()  # backward inside backward
        results[device] = [gx.cpu(), x.grad.cpu()] + [p.grad.cpu() for p in m.parameters()]
    for a, b in zip(results["cpu"], results["zion"]):
        assert torch.equal(a, b)


def test_backward_ops_run_on_their_forward_ops_stream():
    side = torch.zion.Stream()
    streams = []
    x = torch.randn(4, device="zion", requires_grad=True)
    with torch.zion.stream(side):
        y = x * 3
    y.register_hook(lambda g: streams.append(torch.zion.current_stream()))
    x.register_hook(lambda g: streams.append(torch.zion.current_stream()))
    y.sum().backward()
    torch.zion.synchronize()
    assert streams == [side, side]
    assert torch.zion.current_stream().stream_id == 0  # the caller is back on the default stream


_THREAD_OF_BACKWARD = """
import threading, torch, zion_emu
seen = []
x = torch.randn(3, device="zion", requires_grad=True)
x.register_hook(lambda g: seen.append(threading.get_ident()))
x.sum().backward()
print("worker" if seen[0] != threading.get_ident() else "caller")
"""


def test_the_environment_variable_keeps_a_worker_thread_per_device_and_refuses_other_values():
    on = run_python(_THREAD_OF_BACKWARD, env=child_env(ZION_AUTOGRAD_DEVICE_THREADS="1"))
    assert on.stdout.strip() == "worker"
    bad = run_python(_THREAD_OF_BACKWARD, check=False, env=child_env(ZION_AUTOGRAD_DEVICE_THREADS="yes"))
    assert bad.returncode != 0
    assert "ZION_AUTOGRAD_DEVICE_THREADS='yes'" in bad.stderr and "expected 0" in bad.stderr


def test_a_cpu_backward_leaves_the_device_unstarted():
    # autograd's engine asks every registered device for its count at a
    # process's first backward pass; zion answers without starting itself,
    # so a CPU-only process (a gloo rank beside zion ones) never starts it.
    run_python("""
        import torch, zion_emu
        x = torch.randn(8, requires_grad=True)
        (x * 2).sum().backward()
        assert not torch.zion.is_initialized()
        zion_emu.set_platform("hgx-h100")  # still the script's choice
        y = torch.ones(4, device="zion", requires_grad=True)
        (y * 3).sum().backward()
        assert torch.zion.get_device_name() == "hgx-h100 OAM" and y.grad.cpu().tolist() == [3.0] * 4
    """)
