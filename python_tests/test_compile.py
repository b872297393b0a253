"""torch.compile on zion: backend="aot_eager" traces a graph that then runs op
by op on zion, with eager's numerics, FLOPs and modeled time. Inductor, which
would generate kernels that run outside the device, refuses with a message."""

import pytest
import torch

import zion_emu  # noqa: F401  (registers the device)
from zion_emu.timeline import counters


def small_function(a, b):
    return torch.relu(a @ b + 1).sum(dim=0)


def test_aot_eager_function_equals_eager_and_is_priced_the_same():
    torch.manual_seed(0)
    a = torch.randn(64, 64, device="zion")
    b = torch.randn(64, 64, device="zion")
    compiled = torch.compile(small_function, backend="aot_eager")
    compiled(a, b)  # traces
    before = counters()
    expected = small_function(a, b)
    middle = counters()
    out = compiled(a, b)
    after = counters()
    assert out.is_zion and torch.equal(out.cpu(), expected.cpu())
    assert after.ops - middle.ops == middle.ops - before.ops
    assert after.flops - middle.flops == middle.flops - before.flops
    assert after.busy_s - middle.busy_s == pytest.approx(middle.busy_s - before.busy_s, rel=1e-12)


def test_aot_eager_mlp_forward_and_backward_equal_eager():
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)).to("zion")
    x = torch.randn(4, 8, device="zion")

    compiled_out = torch.compile(model, backend="aot_eager")(x)
    compiled_out.sum().backward()
    compiled_grads = [p.grad.cpu() for p in model.parameters()]
    model.zero_grad()
    eager_out = model(x)
    eager_out.sum().backward()

    assert torch.equal(compiled_out.cpu(), eager_out.cpu())
    assert all(torch.equal(c, p.grad.cpu()) for c, p in zip(compiled_grads, model.parameters()))


def test_inductor_refuses_a_zion_graph_by_name():
    a = torch.randn(4, 4, device="zion")
    with pytest.raises(RuntimeError, match=r"zion: torch.compile's default backend \(inductor\).*backend='aot_eager'"):
        torch.compile(lambda t: (t * 2).sum())(a)
