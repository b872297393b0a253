"""Op cost model (csrc/sim/op_cost.h): roofline times from ATen names and shapes.

Every expected number is worked by hand from the overrides below, so a test
does not depend on the zion preset's values.
"""

from typing import Callable, Dict

import pytest

from zion_emu import sim
from zion_emu.platform import Platform

T = sim.TensorDesc

# OAM: 1 TFLOP/s fp32, 2 tf32, 4 bf16; 100 GB/s = 1e11 bytes/s of HBM.
OAM_OVERRIDES: Dict[str, float] = {
    "oam.peak_flops.fp32": 1e12,
    "oam.peak_flops.tf32": 2e12,
    "oam.peak_flops.bf16": 4e12,
    "oam.hbm_bandwidth_gb_per_s": 100,
    "oam.efficiency.matmul": 0.5,
    "oam.efficiency.convolution": 0.5,
    "oam.efficiency.elementwise": 0.8,
    "oam.efficiency.reduction": 0.5,
    "oam.efficiency.embedding_random_access": 0.25,
    "oam.launch_overhead_ns": 5000,
}
# Socket: 2 TFLOP/s fp32, 50 GB/s of DDR, gathers at 10 % of it.
SOCKET_OVERRIDES: Dict[str, float] = {
    "socket.peak_flops.fp32": 2e12,
    "socket.ddr_bandwidth_gb_per_s": 50,
    "socket.ddr_random_access_efficiency": 0.1,
}


def approx(x: float) -> object:
    return pytest.approx(x, rel=1e-12)


@pytest.fixture
def zion(platform: Callable[..., Platform]) -> Platform:
    return platform("zion", **OAM_OVERRIDES, **SOCKET_OVERRIDES)


@pytest.fixture
def oam(zion: Platform) -> sim.OpCostModel:
    return sim.OpCostModel.for_oam(zion)


def mm_call(m: int, k: int, n: int, dtype: str = "fp32") -> sim.OpCall:
    return sim.OpCall("aten::mm", [T([m, k], dtype), T([k, n], dtype)], [T([m, n], dtype)])


def embedding_bag_call() -> sim.OpCall:
    # DLRM paper table: 1M rows x dim 64, batch 2048 x 100 lookups.
    return sim.OpCall(
        "aten::_embedding_bag",
        [T([1_000_000, 64]), T([204_800], "int64"), T([2048], "int64")],
        [T([2048, 64])],
    )


def test_mm_compute_bound(oam: sim.OpCostModel) -> None:
    # 1024^3: flops = 2 * 1024^3 = 2147483648; compute = 2^31 / (1e12 * 0.5) = 4.294967296 ms.
    # bytes = 3 * 1024^2 * 4 = 12582912; memory = 12582912 / (1e11 * 0.5) = 0.25165824 ms.
    cost = oam.cost(mm_call(1024, 1024, 1024))
    assert cost.work.flops == 2147483648
    assert cost.work.bytes == 12582912
    assert cost.work.op_class == sim.OpClass.matmul
    assert cost.compute_time == approx(4.294967296e-3)
    assert cost.memory_time == approx(2.5165824e-4)
    assert cost.device_time == cost.compute_time
    assert cost.launch_overhead == approx(5e-6)  # reported apart, not in device_time
    assert not cost.guessed and cost.formula == "aten::mm"


def test_mm_memory_bound(oam: sim.OpCostModel) -> None:
    # [4096, 8] @ [8, 4096]: flops = 2 * 4096 * 8 * 4096 = 268435456; compute = 0.536870912 ms.
    # bytes = (4096*8 + 8*4096 + 4096*4096) * 4 = 67371008; memory = 67371008 / 5e10 = 1.34742016 ms.
    cost = oam.cost(mm_call(4096, 8, 4096))
    assert cost.compute_time == approx(5.36870912e-4)
    assert cost.memory_time == approx(1.34742016e-3)
    assert cost.device_time == cost.memory_time


def test_bf16_and_tf32_use_their_own_peak(oam: sim.OpCostModel) -> None:
    # Same 2^31 FLOPs: bf16 at 4e12 * 0.5 -> 1.073741824 ms; tf32 at 2e12 * 0.5 -> 2.147483648 ms.
    assert oam.cost(mm_call(1024, 1024, 1024, "bf16")).compute_time == approx(1.073741824e-3)
    assert oam.cost(mm_call(1024, 1024, 1024, "tf32")).compute_time == approx(2.147483648e-3)
    # bf16 moves half the bytes: 3 * 1024^2 * 2 = 6291456.
    assert oam.cost(mm_call(1024, 1024, 1024, "bf16")).work.bytes == 6291456


def test_addmm_counts_the_product_and_reads_the_bias(oam: sim.OpCostModel) -> None:
    # bias [256] + [128, 64] @ [64, 256]: flops = 2 * 128 * 64 * 256 = 4194304 (bias add not
    # counted, as in torch.utils.flop_counter); bytes = (256 + 8192 + 16384 + 32768) * 4 = 230400.
    call = sim.OpCall("aten::addmm", [T([256]), T([128, 64]), T([64, 256])], [T([128, 256])])
    cost = oam.cost(call)
    assert cost.work.flops == 4194304
    assert cost.work.bytes == 230400
    assert cost.compute_time == approx(4194304 / 5e11)
    assert cost.memory_time == approx(230400 / 5e10)


def test_bmm(oam: sim.OpCostModel) -> None:
    # [16, 128, 64] @ [16, 64, 32]: flops = 2 * 16 * 128 * 64 * 32 = 8388608;
    # bytes = (131072 + 32768 + 65536) * 4 = 917504.
    call = sim.OpCall("aten::bmm", [T([16, 128, 64]), T([16, 64, 32])], [T([16, 128, 32])])
    cost = oam.cost(call)
    assert cost.work.flops == 8388608
    assert cost.work.bytes == 917504


def test_fused_attention_counts_flop_counters_products(oam: sim.OpCostModel) -> None:
    # query [2, 4, 128, 64], key [2, 4, 256, 64], value [2, 4, 256, 32]; B H = 8, L = 128, S = 256.
    # Forward (Q K^T, P V): 2 * 8 * 128 * 256 * (64 + 32) = 50331648.
    # Backward (Q K^T again, dP, dV, dQ, dK): 2 * 8 * 128 * 256 * (3 * 64 + 2 * 32) = 134217728.
    # torch.utils.flop_counter's sdpa counts give the same (checked on the CPU below).
    q, k, v, out = T([2, 4, 128, 64]), T([2, 4, 256, 64]), T([2, 4, 256, 32]), T([2, 4, 128, 32])
    fwd = oam.cost(sim.OpCall("aten::_scaled_dot_product_flash_attention_for_cpu", [q, k, v], [out, T([2, 4, 128])]))
    bwd = oam.cost(sim.OpCall("aten::_scaled_dot_product_flash_attention_for_cpu_backward",
                              [out, q, k, v, out, T([2, 4, 128])], [q, k, v]))
    assert (fwd.work.flops, bwd.work.flops) == (50331648, 134217728)
    # bytes: every input read and output written once, 4 bytes an element
    assert fwd.work.bytes == 4 * (65536 + 131072 + 65536 + 32768 + 1024)
    from torch.utils.flop_counter import sdpa_backward_flop_count, sdpa_flop_count
    shapes = ([2, 4, 128, 64], [2, 4, 256, 64], [2, 4, 256, 32])
    assert (sdpa_flop_count(*shapes), sdpa_backward_flop_count([2, 4, 128, 32], *shapes)) == (50331648, 134217728)


def test_conv2d_flops_from_weight_and_output(oam: sim.OpCostModel) -> None:
    # ResNet-like 3x3: input [8, 64, 56, 56], weight [128, 64, 3, 3], output [8, 128, 56, 56].
    # flops = 2 * out.numel() * (C_in / groups) * 3 * 3 = 2 * 3211264 * 576 = 3699376128.
    # bytes = (1605632 + 73728 + 128 + 3211264) * 4 = 19563008.
    call = sim.OpCall(
        "aten::convolution",
        [T([8, 64, 56, 56]), T([128, 64, 3, 3]), T([128])],
        [T([8, 128, 56, 56])],
        int_args=[0],  # not transposed
    )
    cost = oam.cost(call)
    assert cost.work.flops == 3699376128
    assert cost.work.op_class == sim.OpClass.convolution
    assert cost.compute_time == approx(3699376128 / 5e11)
    assert cost.memory_time == approx(19563008 / 5e10)

    # groups = 2 halves the weight ([128, 32, 3, 3]) and so the FLOPs.
    grouped = sim.OpCall(
        "aten::convolution_overrideable",
        [T([8, 64, 56, 56]), T([128, 32, 3, 3])],
        [T([8, 128, 56, 56])],
    )
    assert oam.cost(grouped).work.flops == 3699376128 / 2

    # Backward with grad_input and grad_weight requested: two forward convolutions.
    backward = sim.OpCall(
        "aten::convolution_backward",
        [T([8, 128, 56, 56]), T([8, 64, 56, 56]), T([128, 64, 3, 3])],
        [T([8, 64, 56, 56]), T([128, 64, 3, 3]), T([128])],
        int_args=[0, 1, 1, 1],
    )
    assert oam.cost(backward).work.flops == 2 * 3699376128


def test_elementwise_add_is_memory_bound(oam: sim.OpCostModel) -> None:
    # [1000, 1000] + [1000] (broadcast): flops = 1e6; bytes = (1e6 + 1e3 + 1e6) * 4 = 8004000.
    # memory = 8004000 / (1e11 * 0.8) = 0.10005 ms; compute = 1e6 / (1e12 * 0.8) = 1.25 us.
    call = sim.OpCall("aten::add.Tensor", [T([1000, 1000]), T([1000])], [T([1000, 1000])])
    cost = oam.cost(call)
    assert cost.work.flops == 1e6
    assert cost.work.bytes == 8004000
    assert cost.memory_time == approx(1.0005e-4)
    assert cost.compute_time == approx(1.25e-6)
    assert cost.device_time == cost.memory_time
    assert cost.formula == "aten::add"  # overload ".Tensor" falls back to the base name
    inplace = sim.OpCall("aten::add_.Tensor", [T([1000, 1000]), T([1000])], [T([1000, 1000])])
    assert oam.cost(inplace).formula == "aten::add"  # in-place: the functional op's work


def test_sum_reduction(oam: sim.OpCostModel) -> None:
    # sum of [1024, 1024] to a scalar: flops = 1048576; bytes = (1048576 + 1) * 4 = 4194308.
    # memory = 4194308 / (1e11 * 0.5) = 83.88616 us; compute = 1048576 / 5e11 = 2.097152 us.
    cost = oam.cost(sim.OpCall("aten::sum.dim_IntList", [T([1024, 1024])], [T([])]))
    assert cost.work.op_class == sim.OpClass.reduction
    assert cost.work.flops == 1048576
    assert cost.memory_time == approx(8.388616e-5)
    assert cost.compute_time == approx(2.097152e-6)


def test_embedding_bag_gathers_at_random_access_efficiency(oam: sim.OpCostModel) -> None:
    # gathered = 204800 rows * 64 * 4 bytes = 52428800 at 1e11 * 0.25 -> 2.097152 ms;
    # streamed = indices 1638400 + offsets 16384 + output 524288 = 2179072 at 1e11 * 0.8 -> 27.2384 us.
    # flops = 204800 * 64 sum-pooling adds = 13107200 at 1e12 * 0.8 -> 16.384 us.
    cost = oam.cost(embedding_bag_call())
    assert cost.work.op_class == sim.OpClass.embedding_bag
    assert cost.work.gathered_bytes == 52428800
    assert cost.work.bytes == 2179072
    assert cost.work.flops == 13107200
    assert cost.memory_time == approx(2.097152e-3 + 2.72384e-5)
    assert cost.device_time == cost.memory_time
    # Priced as streaming, the gather would look 0.8 / 0.25 = 3.2x faster.
    assert cost.memory_time > 52428800 / 8e10 * 3


def test_unknown_op_is_guessed_elementwise_like(oam: sim.OpCostModel) -> None:
    # bytes = 40 in + 40 out; flops = output numel = 10; memory = 80 / (1e11 * 0.8) = 1 ns.
    cost = oam.cost(sim.OpCall("mylib::mystery", [T([10])], [T([10])]))
    assert cost.guessed
    assert cost.formula == "default"
    assert cost.work.flops == 10 and cost.work.bytes == 80
    assert cost.memory_time == approx(1e-9)
    assert not oam.has_formula("mylib::mystery")


def test_views_cost_nothing(oam: sim.OpCostModel) -> None:
    cost = oam.cost(sim.OpCall("aten::view", [T([64, 64])], [T([4096])]))
    assert cost.device_time == 0 and cost.launch_overhead == 0 and not cost.guessed


def test_register_formula_overrides_a_builtin(oam: sim.OpCostModel, zion: Platform) -> None:
    # 1e9 FLOPs at 1e12 * 0.5 -> 2 ms, whatever the shapes.
    oam.register_formula("aten::mm", lambda call: sim.OpWork(flops=1e9, bytes=0, op_class="matmul"))
    cost = oam.cost(mm_call(1024, 1024, 1024))
    assert cost.compute_time == approx(2e-3)
    assert cost.formula == "aten::mm" and not cost.guessed
    # Formulas belong to one model: a new one has the built-in.
    assert sim.OpCostModel.for_oam(zion).cost(mm_call(1024, 1024, 1024)).work.flops == 2147483648


def test_register_formula_extends_a_new_name(oam: sim.OpCostModel) -> None:
    # Two [n, n] matmuls fused: 4 n^3 flops, n = 512 -> 536870912 flops -> 1.073741824 ms.
    def fused_mlp(call: sim.OpCall) -> Dict[str, object]:
        n = call.inputs[0].sizes[0]
        return {"flops": 4 * n**3, "bytes": 3 * call.inputs[0].bytes(), "op_class": "matmul"}

    oam.register_formula("mylib::fused_mlp", fused_mlp)
    assert oam.has_formula("mylib::fused_mlp")
    assert "mylib::fused_mlp" in oam.formula_names()
    cost = oam.cost(sim.OpCall("mylib::fused_mlp", [T([512, 512])], [T([512, 512])]))
    assert not cost.guessed
    assert cost.compute_time == approx(1.073741824e-3)
    # A constant dict works too.
    oam.register_formula("mylib::fixed", {"flops": 0, "bytes": 8e7, "op_class": "elementwise"})
    assert oam.cost(sim.OpCall("mylib::fixed")).memory_time == approx(8e7 / 8e10)


def test_formula_returning_negative_bytes_names_the_op(oam: sim.OpCostModel) -> None:
    oam.register_formula("mylib::broken", lambda call: sim.OpWork(flops=1, bytes=-5))
    with pytest.raises(ValueError, match=r"mylib::broken.*negative bytes"):
        oam.cost(sim.OpCall("mylib::broken"))


def test_exception_in_a_python_formula_names_the_op(oam: sim.OpCostModel) -> None:
    def failing(call: sim.OpCall) -> sim.OpWork:
        raise KeyError("no shapes")

    oam.register_formula("mylib::failing", failing)
    with pytest.raises(KeyError, match="mylib::failing") as info:
        oam.cost(sim.OpCall("mylib::failing"))
    assert isinstance(info.value.__cause__, KeyError)


def test_socket_uses_ddr_bandwidth(zion: Platform) -> None:
    socket = sim.OpCostModel.for_socket(zion)
    assert socket.unit.memory_bandwidth == 50e9
    # The same add as on the OAM: 8004000 bytes at 5e10 bytes/s (CPU efficiency 1.0) = 160.08 us.
    add = sim.OpCall("aten::add.Tensor", [T([1000, 1000]), T([1000])], [T([1000, 1000])])
    cost = socket.cost(add)
    assert cost.memory_time == approx(1.6008e-4)
    assert cost.launch_overhead == 0  # a CPU kernel is a function call
    # The embedding bag's gathers at ddr_random_access_efficiency 0.1:
    # 52428800 / 5e9 = 10.48576 ms, plus 2179072 / 5e10 = 43.58144 us streamed.
    assert socket.cost(embedding_bag_call()).memory_time == approx(1.048576e-2 + 4.358144e-5)


def test_invalid_unit_names_the_field() -> None:
    unit = sim.ComputeUnit("oam", peak_flops={"fp32": 1e12}, memory_bandwidth=0.0)
    with pytest.raises(ValueError, match="oam.memory_bandwidth"):
        sim.OpCostModel(unit)


def test_transposed_convolution_counts_its_input_positions(oam: sim.OpCostModel) -> None:
    # conv_transpose2d: input [2, 8, 5, 5], weight [8, 4, 3, 3] (C_in 8, C_out 4), stride 2, padding 1,
    # output_padding 1 -> output [2, 4, 10, 10]. It is the input gradient of Conv2d(4, 8, 3, stride 2,
    # padding 1) on [2, 4, 10, 10] -> [2, 8, 5, 5], whose FLOPs are 2 * 2 * (5 * 5) * (8 * 4 * 3 * 3) = 28800.
    # Counted over the output's 10 x 10 positions, as a forward convolution, it would be 4x that: 115200.
    call = sim.OpCall("aten::convolution", [T([2, 8, 5, 5]), T([8, 4, 3, 3])], [T([2, 4, 10, 10])], int_args=[1])
    assert oam.cost(call).work.flops == 28800
    assert oam.cost(sim.OpCall("aten::conv_transpose2d", call.inputs, call.outputs)).work.flops == 28800
    # Backward, grad_input and grad_weight: two of them; grad_weight alone: one.
    backward = sim.OpCall("aten::convolution_backward", [T([2, 4, 10, 10]), T([2, 8, 5, 5]), T([8, 4, 3, 3])],
                          [T([2, 8, 5, 5]), T([8, 4, 3, 3])], int_args=[1, 1, 1, 0])
    assert oam.cost(backward).work.flops == 2 * 28800
    backward.int_args = [1, 0, 1, 0]
    assert oam.cost(backward).work.flops == 28800


def test_transposed_convolution_on_zion_is_priced_as_one() -> None:
    # The same shapes run on the device: the counters see the 28800 FLOPs worked out above, and the
    # backward pass (grad_input and grad_weight; no bias) twice that.
    import torch

    from zion_emu.timeline import counters

    x = torch.randn(2, 8, 5, 5, device="zion:7", requires_grad=True)
    w = torch.randn(8, 4, 3, 3, device="zion:7", requires_grad=True)
    before = counters(7).flops
    y = torch.nn.functional.conv_transpose2d(x, w, stride=2, padding=1, output_padding=1)
    assert y.shape == (2, 4, 10, 10)
    assert counters(7).flops - before == 28800
    grad = torch.ones_like(y)
    before = counters(7).flops
    y.backward(grad)
    assert counters(7).flops - before == 2 * 28800
    expected = torch.nn.functional.conv_transpose2d(x.detach().cpu(), w.detach().cpu(), stride=2, padding=1,
                                                    output_padding=1)
    assert torch.equal(y.detach().cpu(), expected)


def _sparse(sizes: list, nnz_indices: int) -> sim.TensorDesc:
    """A sparse COO tensor as the device describes it: its values' sizes and its indices."""
    t = T(sizes)
    t.sparse_index_elements = nnz_indices
    assert t.is_sparse()
    return t


def test_a_sparse_gradient_added_into_a_dense_table_touches_only_its_rows(oam: sim.OpCostModel) -> None:
    # SGD with a sparse gradient: table [1M, 64] fp32, 1000 rows of grad (values [1000, 64], 1000 indices).
    # flops = 64000 adds at 1e12 * 0.8 -> 80 ns.
    # streamed = values 256000 + indices 8000 = 264000 bytes at 1e11 * 0.8 -> 3.3 us;
    # gathered = read + write of the 64000 landing elements = 512000 bytes at 1e11 * 0.25 -> 20.48 us.
    table, grad = T([1_000_000, 64]), _sparse([1000, 64], 1000)
    assert grad.bytes() == 264000
    cost = oam.cost(sim.OpCall("aten::add_.Tensor", [table, grad], [table]))
    assert (cost.work.flops, cost.work.bytes, cost.work.gathered_bytes) == (64000, 264000, 512000)
    assert cost.work.op_class == sim.OpClass.embedding_bag
    assert cost.memory_time == approx(3.3e-6 + 20.48e-6)
    assert cost.device_time == cost.memory_time
    # Out of place, the table is first copied into the result: + 2 x 256,000,000 bytes streamed -> + 6.4 ms.
    out = oam.cost(sim.OpCall("aten::add.Tensor", [table, grad], [table]))
    assert out.work.bytes == 264000 + 512_000_000 and out.work.gathered_bytes == 512000
    assert out.memory_time == approx((264000 + 512_000_000) / 8e10 + 20.48e-6)
    # Dense + dense is the elementwise pass it always was: 3 x 256 MB at 8e10 -> 9.6 ms.
    dense = oam.cost(sim.OpCall("aten::add_.Tensor", [table, table], [table]))
    assert dense.work.gathered_bytes == 0 and dense.memory_time == approx(9.6e-3)
    assert oam.cost(sim.OpCall("aten::sub_.Tensor", [table, grad], [table])).memory_time == approx(3.3e-6 + 20.48e-6)


def test_adagrads_sparse_mask_and_dense_times_sparse_touch_only_the_sparse_rows(oam: sim.OpCostModel) -> None:
    # Adagrad's sparse step: std = state_sum.sparse_mask(grad), with state_sum [1M, 64] fp32 and a coalesced
    # gradient of 1000 rows (values [1000, 64], 1000 indices); the result holds the same 1000 rows.
    table, grad, rows = T([1_000_000, 64]), _sparse([1000, 64], 1000), _sparse([1000, 64], 1000)
    # streamed = the mask's indices 8000 + the result (256000 values + 8000 indices) = 272000 bytes at 8e10 -> 3.4 us;
    # gathered = the 64000 elements read from the table = 256000 bytes at 2.5e10 -> 10.24 us; no FLOPs.
    mask = oam.cost(sim.OpCall("aten::sparse_mask", [table, grad], [rows]))
    assert (mask.work.flops, mask.work.bytes, mask.work.gathered_bytes) == (0, 272000, 256000)
    assert mask.work.op_class == sim.OpClass.embedding_bag
    assert mask.memory_time == approx(3.4e-6 + 10.24e-6)
    # dense * sparse, as the CPU's sparse_mask computes it (a socket's table): the sparse side's values are read
    # too: streamed 264000 + 264000 = 528000 bytes -> 6.6 us; the same 10.24 us gathered; 64000 multiplies.
    for call in (sim.OpCall("aten::mul.Tensor", [table, grad], [rows]),
                 sim.OpCall("aten::mul.Tensor", [grad, table], [rows])):
        mul = oam.cost(call)
        assert (mul.work.flops, mul.work.bytes, mul.work.gathered_bytes) == (64000, 528000, 256000)
        assert mul.memory_time == approx(6.6e-6 + 10.24e-6)
    # Dense * dense is the elementwise pass it always was: 3 x 256 MB at 8e10 -> 9.6 ms.
    assert oam.cost(sim.OpCall("aten::mul.Tensor", [table, table], [table])).memory_time == approx(9.6e-3)
    # coalesce of a gradient of 1000 rows into 900: reads what it stores (264000 bytes), writes 900 rows
    # (230400 + 7200 bytes): 501600 bytes at 8e10 -> 6.27 us; one add per stored value.
    co = oam.cost(sim.OpCall("aten::_coalesce", [grad], [_sparse([900, 64], 900)]))
    assert (co.work.flops, co.work.bytes) == (64000, 501600)
    assert co.memory_time == approx(6.27e-6)


def test_sparse_mask_on_zion_costs_the_same_for_a_small_and_a_large_table() -> None:
    import torch

    def modeled_us(rows: int) -> float:
        table = torch.zeros(rows, 16, device="zion:6")
        grad = torch.sparse_coo_tensor(torch.tensor([[1, 5, 7]]), torch.ones(3, 16), (rows, 16)).coalesce().to("zion:6")
        start, end = torch.zion.Event(enable_timing=True), torch.zion.Event(enable_timing=True)
        with torch.zion.device(6):
            start.record()
            masked = table.sparse_mask(grad)
            end.record()
        end.synchronize()
        assert torch.equal(masked.cpu().to_dense(), table.cpu().sparse_mask(grad.cpu()).to_dense())
        return start.elapsed_time(end) * 1e3

    assert modeled_us(1000) == pytest.approx(modeled_us(1_000_000), rel=1e-9)


def test_the_composite_embedding_bag_backward_is_priced_by_its_results_layout(oam: sim.OpCostModel) -> None:
    # Batch 2048 x 100 lookups of dim 64 into a [1M, 64] table.
    grad, indices, offsets = T([2048, 64]), T([204_800], "int64"), T([2048], "int64")
    # sparse=True: the gradient's values hold one grad row per lookup, written in order; everything streams:
    # grad 524288 + indices 1638400 + offsets 16384 + values 52428800 + value indices 1638400 = 56246272 bytes.
    sparse = oam.cost(sim.OpCall("aten::_embedding_bag_backward", [grad, indices, offsets],
                                 [_sparse([204_800, 64], 204_800)]))
    assert (sparse.work.bytes, sparse.work.gathered_bytes) == (56246272, 0)
    assert sparse.memory_time == approx(56246272 / 8e10)
    # sparse=False: the dense [1M, 64] gradient is written (256 MB) and each lookup's row accumulated at random.
    dense = oam.cost(sim.OpCall("aten::_embedding_bag_backward", [grad, indices, offsets], [T([1_000_000, 64])]))
    assert dense.work.bytes == 524288 + 1638400 + 16384 + 256_000_000
    assert dense.work.gathered_bytes == 2 * 204_800 * 64 * 4


def test_index_add_and_index_put_touch_only_the_rows_they_land_on(oam: sim.OpCostModel) -> None:
    # A parameter server's row update: table [1M, 64] fp32, 1000 rows of source (64000 elements), 1000 indices.
    # streamed = index 8000 + source 256000 = 264000 bytes at 8e10 -> 3.3 us;
    # gathered = read + write of 64000 landing elements = 512000 bytes at 2.5e10 -> 20.48 us.
    table, index, source = T([1_000_000, 64]), T([1000], "int64"), T([1000, 64])
    add_ = oam.cost(sim.OpCall("aten::index_add_", [table, index, source], [table]))
    assert (add_.work.flops, add_.work.bytes, add_.work.gathered_bytes) == (64000, 264000, 512000)
    assert add_.memory_time == approx(3.3e-6 + 20.48e-6)
    # Out of place, the table is first copied into the result: + 2 x 256 MB streamed.
    add = oam.cost(sim.OpCall("aten::index_add", [table, index, source], [table]))
    assert add.work.bytes == 264000 + 512_000_000 and add.work.gathered_bytes == 512000
    # index_put_ (self, indices..., values), as _index_put_impl_: the same rows' work.
    put_ = oam.cost(sim.OpCall("aten::index_put_", [table, index, source], [table]))
    assert (put_.work.bytes, put_.work.gathered_bytes) == (264000, 512000)
    assert put_.memory_time == oam.cost(sim.OpCall("aten::_index_put_impl_", [table, index, source], [table])).memory_time
    put = oam.cost(sim.OpCall("aten::index_put", [table, index, source], [table]))
    assert put.work.bytes == 264000 + 512_000_000
