"""torch.save and torch.load with zion tensors: the device index is kept,
map_location moves tensors to zion or to the CPU, and storage sharing survives."""

import io

import torch

import zion_emu  # noqa: F401  (registers the device)


def saved(obj) -> io.BytesIO:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    buffer.seek(0)
    return buffer


def test_a_zion_tensor_comes_back_on_its_device():
    t = torch.arange(6.0, device="zion:1").reshape(2, 3)
    loaded = torch.load(saved(t))
    assert loaded.device == torch.device("zion", 1)
    assert torch.equal(loaded.cpu(), t.cpu())


def test_map_location_moves_tensors_between_cpu_and_zion():
    cpu = torch.arange(5.0)
    on_zion = torch.load(saved(cpu), map_location="zion")
    assert on_zion.device == torch.device("zion", 0) and torch.equal(on_zion.cpu(), cpu)
    on_zion_2 = torch.load(saved(cpu), map_location="zion:2")
    assert on_zion_2.device == torch.device("zion", 2)

    back = torch.load(saved(on_zion_2), map_location="cpu")
    assert back.device == torch.device("cpu") and torch.equal(back, cpu)


def test_shared_storage_stays_shared():
    base = torch.zeros(6, device="zion")
    view = base[2:4]
    loaded_base, loaded_view = torch.load(saved([base, view]), map_location="zion:3")
    loaded_view.fill_(7)
    assert loaded_base.device == torch.device("zion", 3)
    assert loaded_base.cpu().tolist() == [0, 0, 7, 7, 0, 0]


def test_a_module_state_dict_round_trips_through_zion_and_cpu():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2)).to("zion")
    x = torch.randn(3, 8)
    expected = model(x.to("zion")).cpu()
    buffer = saved(model.state_dict())

    on_cpu = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    on_cpu.load_state_dict(torch.load(buffer, map_location="cpu"))
    assert torch.equal(on_cpu(x), expected)

    buffer.seek(0)
    state = torch.load(buffer, map_location="zion")
    assert all(v.is_zion for v in state.values())
    on_zion = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2)).to("zion")
    on_zion.load_state_dict(state)
    assert torch.equal(on_zion(x.to("zion")).cpu(), expected)
