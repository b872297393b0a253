"""Autocast on zion: the op lists and policies of CUDA's autocast, with CPU
numerics, so a zion autocast region computes what CPU autocast computes."""

import pytest
import torch

import zion_emu  # noqa: F401  (registers the device)


@pytest.fixture
def linear_and_input():
    torch.manual_seed(0)
    return torch.nn.Linear(16, 8), torch.randn(4, 16)


def test_autocast_is_available_for_zion_with_cudas_default_dtype():
    assert torch.amp.is_autocast_available("zion")
    assert torch.get_autocast_dtype("zion") == torch.float16  # as on CUDA
    assert not torch.is_autocast_enabled("zion")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_linear_under_autocast_equals_cpu_autocast(linear_and_input, dtype):
    linear, x = linear_and_input
    with torch.autocast("cpu", dtype=dtype):
        expected = linear(x)
    zlinear = linear.to("zion")
    with torch.autocast("zion", dtype=dtype):
        assert torch.is_autocast_enabled("zion")
        out = zlinear(x.to("zion"))
    assert out.dtype == dtype and out.is_zion
    assert expected.dtype == dtype
    assert torch.equal(out.cpu(), expected)
    assert zlinear.weight.dtype == torch.float32  # parameters are cast per op, not in place


def test_ops_on_cudas_fp32_list_run_in_fp32():
    x = torch.randn(8, 8, device="zion")
    with torch.autocast("zion", dtype=torch.bfloat16):
        h = x @ x  # lower precision
        y = torch.softmax(h, dim=1)  # fp32_set_opt_dtype
        z = torch.exp(h)  # fp32
        loss = torch.nn.functional.mse_loss(h, torch.zeros_like(h))  # fp32
    assert h.dtype == torch.bfloat16
    assert y.dtype == z.dtype == loss.dtype == torch.float32


def test_promote_ops_widen_to_the_widest_input():
    a = torch.randn(4, device="zion")
    b = torch.randn(4, device="zion", dtype=torch.bfloat16)
    with torch.autocast("zion", dtype=torch.bfloat16):
        assert torch.addcmul(a, b, b).dtype == torch.float32


def test_binary_cross_entropy_is_refused_as_on_cuda():
    p = torch.rand(4, device="zion")
    with torch.autocast("zion", dtype=torch.bfloat16):
        with pytest.raises(RuntimeError, match="unsafe to autocast"):
            torch.nn.functional.binary_cross_entropy(p, p)


def test_a_training_step_under_autocast_keeps_fp32_gradients(linear_and_input):
    linear, x = linear_and_input
    linear = linear.to("zion")
    with torch.autocast("zion", dtype=torch.bfloat16):
        loss = linear(x.to("zion")).float().pow(2).mean()
    loss.backward()
    assert linear.weight.grad.dtype == torch.float32 and linear.weight.grad.is_zion
