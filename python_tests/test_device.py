"""The zion device: registration, numerics equal to CPU, aliasing, memory
pools and out-of-memory, device errors, and modeled time."""

import pytest
import torch

import zion_emu  # noqa: F401  (registers the device)
from zion_emu import _C
from processes import run_python

GIB = 1 << 30


def test_device_is_registered_like_cuda():
    assert torch.zion.is_available()
    assert torch.zion.device_count() == 8  # OAMs per node of the zion preset
    t = torch.ones(2).zion()
    assert t.is_zion and t.device == torch.device("zion", 0)
    assert torch.empty(3, device="zion:5").device.index == 5


def test_results_equal_cpu_bit_for_bit():
    torch.manual_seed(0)
    a, b = torch.randn(64, 48), torch.randn(48, 32)
    za, zb = a.to("zion"), b.to("zion")
    assert torch.equal((za @ zb).cpu(), a @ b)
    assert torch.equal((za.sin() * 3 + 1).cpu(), a.sin() * 3 + 1)
    assert torch.equal(za.sum(dim=0).cpu(), a.sum(dim=0))
    assert torch.equal(torch.softmax(za, dim=1).cpu(), torch.softmax(a, dim=1))
    assert za.max().item() == a.max().item()


def test_mlp_training_matches_cpu_exactly():
    def train(device):
        torch.manual_seed(1)
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)).to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        g = torch.Generator().manual_seed(2)
        losses = []
        for _ in range(10):
            x = torch.randn(8, 16, generator=g).to(device)
            y = torch.randn(8, 1, generator=g).to(device)
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses

    assert train("zion") == train("cpu")


def test_views_in_place_and_out_share_storage():
    z = torch.zeros(3, 4, device="zion")
    row = z[1]
    row.add_(5)  # in place through a view
    assert z.cpu()[1].tolist() == [5.0] * 4
    t = z.t()
    assert t.data_ptr() == z.data_ptr() and t.is_zion
    out = torch.empty(0, device="zion")
    torch.add(torch.ones(5, device="zion"), 1, out=out)  # out= resized by the kernel
    assert out.shape == (5,) and out.cpu().tolist() == [2.0] * 5


def test_memory_stats_follow_allocations():
    torch.zion.synchronize()
    base = torch.zion.memory_allocated()
    torch.zion.reset_peak_memory_stats()
    x = torch.empty(1024, device="zion")  # 4 KiB
    assert torch.zion.memory_allocated() == base + 4096
    del x
    assert torch.zion.memory_allocated() == base
    assert torch.zion.max_memory_allocated() == base + 4096


def test_out_of_memory_names_device_request_and_capacity_and_loses_nothing():
    keep = torch.arange(10.0, device="zion:1")
    before = torch.zion.memory_allocated(1)
    capacity = torch.zion.mem_get_info(1)[1]
    assert capacity == 32 * GIB  # zion preset HBM per OAM
    with pytest.raises(torch.OutOfMemoryError, match=r"zion:1.*Tried to allocate 32.00 GiB.*of its 32.00 GiB"):
        torch.empty(capacity // 4, device="zion:1")
    assert torch.zion.memory_allocated(1) == before
    assert keep.cpu().tolist() == list(map(float, range(10)))
    ok = torch.empty(1000, device="zion:1")  # freed memory is usable at once
    assert ok.numel() == 1000


def test_a_resize_or_set_that_runs_out_of_memory_leaves_the_tensor_as_it_was():
    # resize_ set the new sizes before growing the storage (as the CPU's and CUDA's do): after the
    # OutOfMemoryError the tensor claimed 1.2 GB of elements on its 40-byte storage.
    capacity = torch.zion.mem_get_info(1)[1]
    a = torch.arange(10.0, device="zion:1")[2:]
    for grow in (lambda: a.resize_(capacity // 2), lambda: a.resize_(capacity // 4, 3),
                 lambda: a.set_(a.untyped_storage(), 1, (capacity // 4,), (1,))):
        with pytest.raises(torch.OutOfMemoryError):
            grow()
        assert a.shape == (8,) and a.stride() == (1,) and a.storage_offset() == 2
        assert a.cpu().tolist() == list(map(float, range(2, 10)))
    other = torch.ones(4, device="zion:1")
    with pytest.raises(torch.OutOfMemoryError):
        a.set_(other.untyped_storage(), 0, (capacity // 4,), (1,))
    assert a.untyped_storage().data_ptr() != other.untyped_storage().data_ptr() and a.storage_offset() == 2
    assert a.cpu().tolist() == list(map(float, range(2, 10)))


def test_a_0_dim_cpu_tensor_is_a_scalar_on_either_side_and_in_place():
    # As with CUDA; a CPU tensor with dimensions is refused (test_bad_input.py).
    z = torch.ones(3, device="zion")
    assert (z + torch.tensor(2.0)).cpu().tolist() == [3.0] * 3
    assert (torch.tensor(2.0) * z).cpu().tolist() == [2.0] * 3
    z.add_(torch.tensor(1.0))
    assert z.cpu().tolist() == [2.0] * 3


def test_matmul_takes_its_roofline_time_plus_launch_overhead():
    # zion preset: fp32 peak 15 TFLOP/s, matmul efficiency 0.6, launch 5 us.
    # 1024^3 matmul: compute 2*1024^3 / 9e12 = 238.6 us >> memory 3*4 MiB / 600 GB/s.
    a = torch.randn(1024, 1024, device="zion")
    b = torch.randn(1024, 1024, device="zion")
    start, end = torch.zion.Event(enable_timing=True), torch.zion.Event(enable_timing=True)
    torch.zion.synchronize()  # an idle stream: the launch overhead is not hidden behind earlier work
    start.record()
    a @ b
    end.record()
    end.synchronize()
    expected_ms = (2 * 1024**3 / (15e12 * 0.6) + 5e-6) * 1e3
    assert start.elapsed_time(end) == pytest.approx(expected_ms, rel=1e-9)


def test_streams_have_their_own_clocks():
    s = torch.zion.Stream()
    assert s.device_type == torch.device("zion").type or str(s.device).startswith("zion")
    x = torch.randn(256, 256, device="zion")
    with torch.zion.stream(s):
        x @ x
    t_side = _C.device.stream_time(0, s.stream_id)
    torch.zion.synchronize()
    assert _C.device.host_time() >= t_side > 0


def test_counters_record_flops():
    before = _C.device.counters(2)["flops"]
    a = torch.randn(32, 16, device="zion:2")
    b = torch.randn(16, 8, device="zion:2")
    a @ b
    assert _C.device.counters(2)["flops"] - before >= 2 * 32 * 16 * 8


def test_bare_import_torch_is_enough():
    out = run_python("import torch; x = torch.ones(3, device='zion'); print(x.device, (x * 2).sum().item())")
    assert out.stdout.split() == ["zion:0", "6.0"]


def test_host_blocks_of_kernel_outputs_are_kept_for_reuse_and_freed_by_empty_cache():
    # A zion op's CPU kernel allocates its output (here 1 MiB) from host blocks that are kept when the
    # tensor dies, so the next step reuses the same bytes instead of faulting in fresh pages. CPU eager
    # allocations are not touched, and the HBM pool accounts for the tensor either way.
    torch.zion.empty_cache()
    assert _C.device.kernel_host_cached_bytes() == 0
    x = torch.ones(1 << 18, device="zion")
    y = x.exp()
    ptr, used = y.data_ptr(), torch.zion.memory_allocated()
    del y
    assert _C.device.kernel_host_cached_bytes() == 1 << 20
    assert torch.zion.memory_allocated() == used - (1 << 20)
    y = x.exp()
    assert y.data_ptr() == ptr and _C.device.kernel_host_cached_bytes() == 0
    del y
    on_cpu = torch.ones(1 << 18).exp()
    del on_cpu
    assert _C.device.kernel_host_cached_bytes() == 1 << 20
    torch.zion.empty_cache()
    assert _C.device.kernel_host_cached_bytes() == 0


def test_spare_aliases_take_each_arguments_metadata_and_let_its_memory_go():
    # An op's CPU aliases are kept after the call and made the next call's
    # aliases (csrc/device/aten/tensor_alias.cpp): each must take its new
    # argument's bytes, dtype, sizes, strides, offset and conj bit, and must
    # not keep the old argument's memory.
    torch.manual_seed(3)
    base = torch.zeros(6, 5, dtype=torch.float64)
    cases = [
        torch.randn(4, 3),
        torch.randn(2, 3, 5)[:, 1],  # an offset view
        torch.randn(5, 4).t(),  # transposed strides
        torch.arange(7, dtype=torch.int64),
        base[2:, 1:4] + 1,
        torch.randn(3, dtype=torch.complex64).conj(),  # conj bit
        torch.ones(1),
    ]
    for _ in range(3):
        for cpu in cases:
            z = cpu.to("zion")
            assert torch.equal((z + 1).cpu(), cpu + 1)
            assert torch.equal((z * z).cpu(), cpu * cpu)
            assert torch.equal(z.clone().cpu(), cpu.clone())
    torch.zion.synchronize()
    before = torch.zion.memory_allocated()
    x = torch.ones(1 << 16, device="zion")  # 256 KiB
    y = x + 1
    del x, y
    assert torch.zion.memory_allocated() == before


def _trained_weights(device: str, optimizer: type, **options) -> torch.Tensor:
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 16).to(device)
    opt = optimizer(model.parameters(), lr=1e-2, **options)
    inputs = torch.Generator().manual_seed(1)
    for _ in range(5):
        x = torch.randn(4, 8, generator=inputs).to(device)
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()
    return model.weight.detach().cpu()


@pytest.mark.parametrize("optimizer", [torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW, torch.optim.Adagrad,
                                       torch.optim.RMSprop, torch.optim.NAdam, torch.optim.RAdam, torch.optim.ASGD])
def test_optimizers_take_cudas_foreach_path_and_each_path_equals_the_cpus(optimizer):
    # torch.optim defaults to foreach for zion tensors, as for CUDA ones (README, "Limits and guarantees").
    from torch.optim.optimizer import _default_to_fused_or_foreach

    assert _default_to_fused_or_foreach([torch.zeros(1, device="zion")], False, False) == (False, True)
    assert _default_to_fused_or_foreach([torch.zeros(1)], False, False) == (False, False)
    for foreach in (False, True):
        assert torch.equal(_trained_weights("zion", optimizer, foreach=foreach),
                           _trained_weights("cpu", optimizer, foreach=foreach))
    assert torch.equal(_trained_weights("zion", optimizer), _trained_weights("cpu", optimizer, foreach=True))
    if optimizer in (torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW, torch.optim.Adagrad, torch.optim.RMSprop):
        assert torch.equal(_trained_weights("zion", optimizer), _trained_weights("cpu", optimizer))
