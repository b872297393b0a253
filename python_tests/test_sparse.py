"""Sparse COO tensors on zion: what nn.EmbeddingBag(sparse=True) training needs."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import zion_emu  # noqa: F401
from zion_emu import _C


def test_sparse_coo_round_trip_and_accessors():
    i = torch.tensor([[0, 1, 1], [2, 0, 2]])
    v = torch.tensor([3.0, 4.0, 5.0])
    s = torch.sparse_coo_tensor(i, v, (2, 3))
    z = s.to("zion")
    assert z.is_sparse and z.device == torch.device("zion:0") and z._nnz() == 3
    assert z._values().is_zion and z._indices().is_zion
    assert torch.equal(z.to_dense().cpu(), s.to_dense())
    assert torch.equal(z.coalesce().to_dense().cpu(), s.coalesce().to_dense())


def test_dense_add_sparse_in_place():
    s = torch.sparse_coo_tensor(torch.tensor([[0, 1, 1], [2, 0, 2]]), torch.tensor([3.0, 4.0, 5.0]), (2, 3))
    d = torch.ones(2, 3, device="zion")
    d.add_(s.to("zion"), alpha=2)
    assert torch.equal(d.cpu(), torch.ones(2, 3).add_(s, alpha=2))


def _busy(f) -> float:
    torch.zion.synchronize()
    before = _C.device.counters(0)["busy_s"]
    f()
    torch.zion.synchronize()
    return _C.device.counters(0)["busy_s"] - before


def test_a_sparse_gradient_step_on_a_zion_table_is_priced_by_the_rows_it_touches():
    # The device hands the pricing a sparse tensor as what it stores (values [3, 64], 3 indices), so
    # SGD's add_ costs what the op cost model gives those rows, not a pass over the 100,000-row table.
    from zion_emu import sim
    table = torch.zeros(100_000, 64, device="zion")
    grad = torch.sparse_coo_tensor(torch.tensor([[3, 7, 11]]), torch.ones(3, 64), (100_000, 64)).to("zion")
    values = sim.TensorDesc([3, 64])
    values.sparse_index_elements = 3
    model = sim.OpCostModel.for_oam(zion_emu.current_platform())
    expected = model.cost(sim.OpCall("aten::add_.Tensor", [sim.TensorDesc([100_000, 64]), values],
                                     [sim.TensorDesc([100_000, 64])]))
    assert expected.work.bytes == 3 * 64 * 4 + 3 * 8 and expected.work.gathered_bytes == 2 * 3 * 64 * 4
    assert _busy(lambda: table.add_(grad, alpha=-0.1)) == pytest.approx(expected.device_time, rel=1e-9)
    assert torch.equal(table.cpu()[[3, 7, 11]], torch.full((3, 64), -0.1))


def test_embedding_bag_sparse_with_mlp_trains_20_steps_bit_equal_to_cpu():
    def train(device: str) -> tuple[list[float], torch.Tensor]:
        torch.manual_seed(0)
        bag = torch.nn.EmbeddingBag(100, 8, mode="sum", sparse=True)
        mlp = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
        bag, mlp = bag.to(device), mlp.to(device)
        sparse_opt = torch.optim.SGD(bag.parameters(), lr=0.05)
        dense_opt = torch.optim.Adagrad(mlp.parameters(), lr=0.05)
        g = torch.Generator().manual_seed(1)
        losses = []
        for _ in range(20):
            idx = torch.randint(0, 100, (32,), generator=g).to(device)
            offsets = torch.arange(0, 32, 4).to(device)
            y = torch.rand(8, 1, generator=g).to(device)
            loss = torch.nn.functional.binary_cross_entropy_with_logits(mlp(bag(idx, offsets)), y)
            sparse_opt.zero_grad()
            dense_opt.zero_grad()
            loss.backward()
            assert bag.weight.grad.is_sparse
            sparse_opt.step()
            dense_opt.step()
            losses.append(loss.item())
        return losses, bag.weight.detach().cpu()

    cpu_losses, cpu_weight = train("cpu")
    zion_losses, zion_weight = train("zion")
    assert zion_losses == cpu_losses
    assert torch.equal(zion_weight, cpu_weight)


def _coo() -> torch.Tensor:
    return torch.sparse_coo_tensor(torch.tensor([[0, 1, 1], [2, 0, 2]]), torch.tensor([3.0, 4.0, 5.0]), (2, 3))


def test_clone_of_a_sparse_zion_tensor_is_a_copy_on_the_same_device():
    z = _coo().to("zion:1")
    c = z.clone()
    assert c.is_sparse and c.device == torch.device("zion:1") and c._nnz() == 3
    assert c._values().data_ptr() != z._values().data_ptr()
    c._values().mul_(2)  # the clone owns its values
    assert torch.equal(z.to_dense().cpu(), _coo().to_dense())
    assert torch.equal(c.to_dense().cpu(), 2 * _coo().to_dense())


def test_sparse_copy_between_host_and_zion_both_ways_converts_dtype_and_charges_the_link():
    src = _coo()
    dst = torch.sparse_coo_tensor(torch.zeros(2, 0, dtype=torch.long), torch.zeros(0, dtype=torch.float64), (5, 5),
                                  device="zion")
    torch.zion.synchronize()
    start = _C.device.host_time()
    dst.copy_(src)  # blocking, pageable: two staged H2D copies, indices then values
    # dst keeps its dtype (float64): the values are converted on the host, then moved as 24 bytes
    expected = sum(b / 153.6e9 + 5e-6 + 300e-9 + b / 12e9 for b in (6 * 8, 3 * 8))
    assert _C.device.host_time() - start == pytest.approx(expected, rel=1e-9)
    assert dst.device == torch.device("zion:0") and dst.dtype == torch.float64 and dst.shape == (2, 3)
    assert torch.equal(dst.to_dense().cpu(), src.to_dense().double())
    back = torch.sparse_coo_tensor(torch.zeros(2, 0, dtype=torch.long), torch.zeros(0), (2, 3))
    back.copy_(dst)
    assert back.device.type == "cpu" and back.dtype == torch.float32
    assert torch.equal(back.to_dense(), src.to_dense())


def test_copy_between_dense_and_sparse_is_refused_as_on_the_cpu():
    with pytest.raises(RuntimeError, match=r"copy_\(\) between dense and sparse Tensors is not implemented"):
        torch.zeros(2, 3, device="zion").copy_(_coo().to("zion"))
    with pytest.raises(RuntimeError, match=r"copy_\(\) between dense and sparse Tensors is not implemented"):
        _coo().to("zion").copy_(torch.zeros(2, 3, device="zion"))


def test_a_user_dispatch_mode_around_a_sparse_backward_sees_every_op_and_changes_nothing():
    """Autograd clones a sparse gradient it does not own; a mode that keeps its arguments makes it do so."""
    seen = []

    class Keep(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append((func, args))
            return func(*args, **(kwargs or {}))

    def grad(device: str) -> torch.Tensor:
        torch.manual_seed(0)
        bag = torch.nn.EmbeddingBag(10, 4, mode="sum", sparse=True).to(device)
        idx, off = torch.tensor([1, 2, 3, 4, 2]).to(device), torch.tensor([0, 2]).to(device)
        with Keep():
            bag(idx, off).pow(2).sum().backward()
        return bag.weight.grad

    cpu, seen_cpu = grad("cpu"), len(seen)
    seen.clear()
    zion = grad("zion")
    assert zion.is_sparse and zion.device.type == "zion"
    assert torch.equal(zion.to_dense().cpu(), cpu.to_dense())
    assert len(seen) == seen_cpu and any(func is torch.ops.aten.clone.default for func, _ in seen)


def test_sparse_tensors_stay_on_a_device_other_than_the_current_one():
    z = _coo().to("zion:3")  # the current device is zion:0
    results = [z, z + z, z.coalesce(), z * 2, z.clone(), z.to("zion:5").to("zion:3")]
    for r in results:
        assert r.device == torch.device("zion:3") and r._values().device == r._indices().device == r.device
    assert z.to("zion:5")._values().device == torch.device("zion:5")
    assert torch.equal((z + z).to_dense().cpu(), 2 * _coo().to_dense())
    bag = torch.nn.EmbeddingBag(10, 4, sparse=True).to("zion:2")
    bag(torch.tensor([1, 2], device="zion:2"), torch.tensor([0], device="zion:2")).sum().backward()
    assert bag.weight.grad.device == bag.weight.grad._values().device == torch.device("zion:2")


def test_sparse_ops_called_again_and_again_on_changing_arguments_stay_those_of_the_cpu():
    # A sparse argument's CPU stand-in is reused from call to call (a spare kept per thread): each call
    # must see its own indices, values, shape, dtype and coalesced flag, never the last call's.
    g = torch.Generator().manual_seed(0)
    cases = []
    for rows, dim, nnz, dtype in [(7, 3, 5, torch.float32), (11, 2, 9, torch.float64), (7, 3, 0, torch.float32),
                                  (5, 4, 12, torch.float32), (11, 2, 1, torch.float64)]:
        i = torch.randint(0, rows, (1, nnz), generator=g)
        v = torch.randn(nnz, dim, generator=g).to(dtype)
        s = torch.sparse_coo_tensor(i, v, (rows, dim))
        cases.append((s, torch.randn(rows, dim, generator=g).to(dtype)))
        cases.append((s.coalesce(), torch.randn(rows, dim, generator=g).to(dtype)))
    for _ in range(2):
        for s, d in cases:
            z, zd = s.to("zion"), d.to("zion")
            assert torch.equal(zd.add_(z, alpha=0.5).cpu(), d.clone().add_(s, alpha=0.5))
            assert z.is_coalesced() == s.is_coalesced()
            c = z.coalesce()
            assert c.is_coalesced() and torch.equal(c._indices().cpu(), s.coalesce()._indices())
            assert torch.equal(c._values().cpu(), s.coalesce()._values())
            assert torch.equal((z * 3).to_dense().cpu(), (s * 3).to_dense())


def test_a_sparse_gradient_added_to_a_table_is_freed_when_dropped():
    # The stand-in kept for the next call lets go of the gradient's indices and values: once the user
    # drops the gradient, its HBM is free again.
    table = torch.zeros(1000, 16, device="zion")
    torch.zion.synchronize()
    before = torch.zion.memory_allocated()
    grad = torch.sparse_coo_tensor(torch.randint(0, 1000, (1, 300)), torch.randn(300, 16), (1000, 16)).to("zion")
    assert torch.zion.memory_allocated() > before
    table.add_(grad, alpha=-0.1)
    del grad
    assert torch.zion.memory_allocated() == before


def test_a_fresh_sparse_result_becomes_a_zion_tensor_with_the_cpus_contents_flags_and_memory():
    # A sparse CPU result that nothing else holds (an embedding bag's gradient) is made the zion tensor
    # itself rather than wrapped anew (sparse.cpp): it must end up exactly as a fresh sparse zion tensor,
    # on the op's device (not the current one), with the CPU result's indices, values, sizes and
    # coalesced flag, its values counted in that device's HBM and given back when it goes.
    torch.manual_seed(5)
    weight = torch.randn(30, 4)
    cases = [(torch.tensor([3, 7, 3, 29, 0]), torch.tensor([0, 2])), (torch.tensor([5]), torch.tensor([0]))]
    for indices, offsets in cases:
        grads = {}
        for device in ("cpu", "zion:2"):
            bag = torch.nn.EmbeddingBag(30, 4, mode="sum", sparse=True).to(device)
            with torch.no_grad():
                bag.weight.copy_(weight)
            bag(indices.to(device), offsets.to(device)).pow(2).sum().backward()
            grads[device] = bag.weight.grad
        cpu, z = grads["cpu"], grads["zion:2"]
        assert torch.zion.current_device() == 0
        assert z.is_sparse and z.device == z._indices().device == z._values().device == torch.device("zion:2")
        assert z.layout == torch.sparse_coo and z.dtype == cpu.dtype and z.shape == cpu.shape
        assert (z.sparse_dim(), z.dense_dim(), z.is_coalesced()) == (cpu.sparse_dim(), cpu.dense_dim(),
                                                                   cpu.is_coalesced())
        assert torch.equal(z._indices().cpu(), cpu._indices()) and torch.equal(z._values().cpu(), cpu._values())
        assert torch.equal(z.coalesce().to_dense().cpu(), cpu.coalesce().to_dense())
        assert not z.requires_grad and z.grad_fn is None
        torch.zion.synchronize(2)
        held = torch.zion.memory_allocated(2)
        values_bytes = z._values().untyped_storage().nbytes()
        del bag, grads, z
        assert torch.zion.memory_allocated(2) <= held - values_bytes


_SPARSE_OPS_WITH_A_CPU_KERNEL = {
    # ops whose generic kernel (written for dense tensors) zion took before,
    # where the CPU runs its own sparse kernel
    "sum": lambda s: s.sum(),
    "sum(dtype=float64)": lambda s: s.sum(dtype=torch.float64),
    "sum over dim 1": lambda s: torch.sparse.sum(s, 1),
    "pow(2).sum()": lambda s: s.pow(2).sum(),
    "mv": lambda s: s @ torch.arange(3.0, device=s.device),
    "permute": lambda s: s.permute(1, 0),
    "unsqueeze": lambda s: s.unsqueeze(0),
    "stack": lambda s: torch.stack([s, s]),
    "isinf": lambda s: torch.isinf(s),
    "neg": lambda s: s.neg(),
    "mul by 2": lambda s: s * 2,
    "div by 2": lambda s: s / 2,
    "add": lambda s: s + s,
    "sub": lambda s: s - s * 3,
    "tanh": lambda s: s.tanh(),
    "abs_": lambda s: s.clone().abs_(),
    "any": lambda s: s.any(),
    "mm with a dense matrix": lambda s: torch.mm(s, torch.ones(3, 2, device=s.device)),
    "addmm": lambda s: torch.addmm(torch.ones(4, 2, device=s.device), s, torch.ones(3, 2, device=s.device)),
    "norm": lambda s: s.norm(),
}


@pytest.mark.parametrize("name", list(_SPARSE_OPS_WITH_A_CPU_KERNEL))
def test_sparse_ops_run_the_cpus_sparse_kernel_and_give_its_result(name):
    fn = _SPARSE_OPS_WITH_A_CPU_KERNEL[name]
    i = torch.tensor([[0, 2, 3], [1, 1, 0]])
    v = torch.tensor([1.0, -2.5, 0.4])
    cpu = fn(torch.sparse_coo_tensor(i, v, (4, 3)).coalesce())
    zion = fn(torch.sparse_coo_tensor(i, v, (4, 3)).to("zion").coalesce())
    assert zion.device.type == "zion"
    assert (zion.layout, zion.dtype, zion.shape) == (cpu.layout, cpu.dtype, cpu.shape)
    if cpu.is_sparse:
        assert zion.is_coalesced() == cpu.is_coalesced()
        assert torch.equal(zion.cpu().to_dense(), cpu.to_dense())
    else:
        assert torch.equal(zion.cpu(), cpu)


def test_the_norm_of_sparse_embedding_gradients_is_a_number_as_on_the_cpu():
    # a hand-written gradient norm over nn.EmbeddingBag(sparse=True) gradients
    norms = []
    for device in ("cpu", "zion"):
        torch.manual_seed(0)
        bag = torch.nn.EmbeddingBag(10, 4, mode="sum", sparse=True).to(device)
        bag(torch.tensor([1, 2, 4, 5, 4, 3], device=device), torch.tensor([0, 3], device=device)).sum().backward()
        norm = sum(p.grad.coalesce().pow(2).sum() for p in bag.parameters()).sqrt()
        assert norm.dim() == 0 and norm.layout == torch.strided
        norms.append(norm.cpu())
    assert torch.equal(norms[0], norms[1])
