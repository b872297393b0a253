"""Sparse COO tensors on zion: what nn.EmbeddingBag(sparse=True) training needs."""

import torch

import zion_emu  # noqa: F401


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
