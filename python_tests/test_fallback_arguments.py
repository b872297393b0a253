"""How zion hands an op's arguments to its CPU kernel (csrc/device/aten/fallback.cpp):
a tensor passed twice is one tensor to the kernel, an out= result keeps the
flags the kernel set, a CPU scalar may be read but never written, and generic
kernels that pick a device's kernel themselves run CPU's. Each case compares
with the CPU: the same values and flags, or the same kind of refusal."""

import warnings

import pytest
import torch

import zion_emu  # noqa: F401  (registers the device)

SAME_DEVICE = "Expected all tensors to be on the same device, but found at least two devices, zion:0 and cpu!"


def _both(make):
    """``make(device)`` on the CPU and on zion."""
    return make("cpu"), make("zion")


def _error(run, device):
    with pytest.raises(RuntimeError) as e:
        run(device)
    return str(e.value)


# A tensor passed twice.
@pytest.mark.parametrize("run", [
    lambda d: torch.tensor([1.0, 0.0, 3.0], device=d).logical_and_(torch.ones(2, 3, device=d)),
    lambda d: (lambda x: torch.mul(torch.ones(2, 3, device=d), x, out=x))(torch.tensor([1.0, 0.0, 3.0], device=d)),
], ids=["logical_and_", "mul_out_into_an_input"])
def test_an_output_that_is_also_an_input_is_not_resized_to_the_broadcast_shape(run):
    # Each argument got its own alias: the kernel saw two tensors, resized the
    # output to [2, 3] and read the input it was overwriting.
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "An output with one or more elements was resized"
        message = _error(run, "cpu")
        assert _error(run, "zion") == message == "output with shape [3] doesn't match the broadcast shape [2, 3]"


@pytest.mark.parametrize("shape,message", [
    ((3,), "2D tensor expected, got 1D tensor for input"),
    ((), "2D tensor expected, got 0D tensor for input"),
    ((1, 3), "size mismatch, input: [1, 3], v1: [2], v2: [3]"),
    ((2, 3, 1), "2D tensor expected, got 3D tensor for input"),
])
def test_addr_in_place_refuses_a_self_it_would_have_to_broadcast_as_the_cpu_does(shape, message):
    # The CPU kernel tells addr_ from addr(out=self) by its arguments' C++ identity; through the fallback they were
    # two arguments, so zion broadcast self and resized it to [2, 3], its values the outer product's.
    def run(d):
        torch.zeros(shape, device=d).addr_(torch.ones(2, device=d), torch.arange(3.0, device=d))

    assert _error(run, "cpu") == _error(run, "zion") == message
    cpu, zion = _both(lambda d: torch.full((2, 3), 0.5, device=d))
    for x in (cpu, zion):
        x.addr_(torch.tensor([1.0, 2.0], device=x.device), torch.arange(3.0, device=x.device), beta=2, alpha=3)
    assert torch.equal(zion.cpu(), cpu)
    # addr(out=self) broadcasts self on both devices.
    cpu, zion = _both(lambda d: torch.ones(3, device=d))
    for x in (cpu, zion):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "An output with one or more elements was resized"
            torch.addr(x, torch.ones(2, device=x.device), torch.arange(3.0, device=x.device), out=x)
    assert zion.shape == cpu.shape == (2, 3)


def test_an_op_on_one_tensor_twice_gives_the_cpus_values():
    cpu, zion = _both(lambda d: torch.arange(6.0, device=d).reshape(2, 3))
    for x in (cpu, zion):
        torch.add(x, x, out=x)
        x.mul_(x)
        torch.addcmul(x, x, x, value=0.5, out=x)
    assert torch.equal(zion.cpu(), cpu)


# Flags an out= kernel sets.
@pytest.mark.parametrize("solve", [
    lambda A, B, out: torch.linalg.solve(A, B, left=False, out=out),
    lambda A, B, out: torch.linalg.lu_solve(*torch.linalg.lu_factor(A), B, left=False, out=out),
], ids=["solve", "lu_solve"])
def test_a_complex_out_result_keeps_the_conjugate_bit_its_kernel_set(solve):
    # It lost it: every imaginary part came back with the wrong sign.
    g = torch.Generator().manual_seed(0)
    A = torch.randn(3, 3, dtype=torch.complex64, generator=g) + 3 * torch.eye(3)
    B = torch.randn(2, 3, dtype=torch.complex64, generator=g)
    cpu, zion = _both(lambda d: torch.empty(0, dtype=torch.complex64, device=d))
    solve(A, B, cpu)
    solve(A.to("zion"), B.to("zion"), zion)
    assert zion.is_conj() == cpu.is_conj()
    assert torch.equal(zion.cpu().resolve_conj(), cpu.resolve_conj())


# CPU scalars beside zion tensors.
@pytest.mark.parametrize("write", [
    lambda y: y.add_(torch.tensor(2.0, device="zion")),
    lambda y: torch.mul(torch.tensor([2.0, 3.0], device="zion"), 2, out=y),
    lambda y: torch.add(torch.ones(1, 1, device="zion"), torch.ones(1, 1, device="zion"), out=y),
], ids=["add_", "mul_out", "add_out"])
def test_a_cpu_scalar_is_never_written_by_a_zion_op(write):
    # As CUDA: a 0-dim CPU tensor may only be read. It used to be written
    # (then an internal assert) or resized.
    y = torch.tensor(1.0)
    with pytest.raises(RuntimeError, match=SAME_DEVICE):
        write(y)
    assert y.shape == () and y.item() == 1.0


def test_cpu_scalars_and_index_tensors_are_read_and_the_op_priced():
    # The formulas read their inputs by position: a CPU scalar or index left
    # out of them made "the op cost formula expects ..." errors.
    cpu, zion = _both(lambda d: torch.arange(5.0, device=d))
    for x in (cpu, zion):
        x[torch.tensor([0, 2])] = torch.tensor(7.0)
        x.index_put_((torch.tensor([1]),), torch.tensor(9.0), accumulate=True)
    assert torch.equal(zion.cpu(), cpu)
    a = torch.arange(4.0).reshape(2, 2)
    z = torch.addmm(torch.tensor(1.0), a.to("zion"), a.to("zion"))
    assert torch.equal(z.cpu(), torch.addmm(torch.tensor(1.0), a, a))
    assert "aten::addmm" not in zion_emu.cost.guessed_ops(0)


def test_a_cpu_tensor_of_values_for_an_index_put_is_refused():
    # Index tensors may be on the CPU, as with CUDA; the values written may not.
    x = torch.arange(5.0, device="zion")
    with pytest.raises(RuntimeError, match=SAME_DEVICE):
        x.index_put_((torch.tensor([1, 2], device="zion"),), torch.tensor([1.0, 2.0]))
    assert x.cpu().tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]


# Generic kernels that choose a device's kernel themselves.
def test_generic_kernels_that_pick_a_device_kernel_run_the_cpus():
    cpu, zion = _both(lambda d: torch.tensor([1 + 2j, 3 - 1j], dtype=torch.complex64, device=d))
    cpu.conj_physical_()
    zion.conj_physical_()  # "DispatchStub: missing kernel for zion"
    assert torch.equal(zion.cpu(), cpu)

    a = torch.tensor([[1.0, 2.0, 2.0], [3.0, 3.0, 1.0]])
    for d in ("cpu", "zion"):
        values, indices = torch.empty(0, device=d), torch.empty(0, dtype=torch.long, device=d)
        torch.mode(a.to(d), 1, out=(values, indices))  # "mode only supports CPU, CUDA and XPU"
        assert values.cpu().tolist() == [2.0, 3.0] and indices.cpu().tolist() == [2, 1]

    A = torch.randn(3, 3, dtype=torch.complex64, generator=torch.Generator().manual_seed(0))
    outs = {}
    for d in ("cpu", "zion"):
        U, S, V = (torch.empty(0, dtype=t, device=d) for t in (torch.complex64, torch.float32, torch.complex64))
        torch.svd(A.to(d), out=(U, S, V))
        outs[d] = [t.cpu().resolve_conj() for t in (U, S, V)]
    assert all(torch.equal(z, c) for z, c in zip(outs["zion"], outs["cpu"]))


def test_attention_runs_the_kernel_the_cpu_chooses_and_gives_its_results_bit_for_bit():
    # scaled_dot_product_attention asks its device for a fused kernel; zion had
    # none, so 4-D inputs took the math path (several small ops), 2e-7 off the
    # CPU's fused kernel. zion now chooses as the CPU does.
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 4, 8, generator=g, requires_grad=True) for _ in range(3))
    mask = torch.rand(4, 4, generator=g) > 0.3
    for kwargs in ({}, {"is_causal": True}, {"attn_mask": mask}):
        cpu = torch.nn.functional.scaled_dot_product_attention(q, k, v, **kwargs)
        on = [t.detach().to("zion").requires_grad_() for t in (q, k, v)]
        zkw = {name: (m.to("zion") if isinstance(m, torch.Tensor) else m) for name, m in kwargs.items()}
        zion = torch.nn.functional.scaled_dot_product_attention(*on, **zkw)
        assert torch.equal(zion.cpu(), cpu), kwargs
        grads = torch.autograd.grad(cpu.sum(), (q, k, v))
        zgrads = torch.autograd.grad(zion.sum(), on)
        assert all(torch.equal(z.cpu(), c) for z, c in zip(zgrads, grads)), kwargs
    with torch.profiler.profile() as prof:
        torch.nn.functional.scaled_dot_product_attention(*(t.detach().to("zion") for t in (q, k, v)))
    assert "aten::_scaled_dot_product_flash_attention_for_cpu" in {e.name for e in prof.events()}
    guessed = zion_emu.cost.guessed_ops(0)
    assert not any("attention" in name for name in guessed), guessed
