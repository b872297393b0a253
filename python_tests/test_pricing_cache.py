"""Each thread remembers the prices of each operator by the shapes they stand
for (op_pricing.cpp, up to kRememberedPrices = 1024 per operator): a call
with the same dtypes, sizes and int_args, under the same platform, formula
table and precision settings, is charged that price again. These tests hold
it to what a fresh cost model prices each call at, through changes of shape,
dtype, platform, precision and registered formulas, and count the formula
runs (`_C.device.formula_runs()`) to show that a price is remembered."""

from __future__ import annotations

import json
import threading

import pytest
import torch
from pytest import approx

import zion_emu  # noqa: F401  (registers the device)
from zion_emu import _C, sim
from zion_emu.timeline import counters
from processes import run_python

DEVICE = 6  # a device of its own, so other tests' ops do not land between the readings


def busy_s(f) -> float:
    """Modeled device seconds that `f` adds to zion:DEVICE."""
    before = counters(DEVICE).busy_s
    f()
    return counters(DEVICE).busy_s - before


def fresh_price(name: str, inputs: list, outputs: list) -> float:
    """Device seconds of one call, priced by a cost model made now for the current platform."""
    model = sim.OpCostModel(_C.device.compute_unit())
    return model.cost(sim.OpCall(name, inputs, outputs)).device_time


@pytest.mark.parametrize("repeat", [1, 2, 3])
def test_each_call_of_add_is_charged_its_own_shape_and_dtype(repeat: int):
    # Sizes and dtypes alternate, so a remembered price of the wrong call would show.
    cases = [([4096], torch.float32, "fp32"), ([4096], torch.float32, "fp32"), ([12288], torch.float32, "fp32"),
             ([4096], torch.bfloat16, "bf16"), ([4096], torch.int64, "int64"), ([64, 64], torch.float32, "fp32"),
             ([4096], torch.float32, "fp32")]
    for _ in range(repeat):
        for sizes, dtype, name in cases:
            x = torch.ones(sizes, dtype=dtype, device=f"zion:{DEVICE}")
            t = busy_s(lambda: x + 1)
            desc = sim.TensorDesc(sizes, name)
            assert t == approx(fresh_price("aten::add.Tensor", [desc], [desc]), rel=1e-9), (sizes, name)


@pytest.mark.parametrize("shapes", [3, 11, 40])
def test_shapes_in_turn_are_each_charged_their_own_price(shapes: int):
    # A layer-by-layer step calls one operator on many shapes in turn, the
    # same ones every step: each is priced once, and charged its own price
    # on every later call.
    sizes = [[256 * (k + 1)] for k in range(shapes)]
    tensors = [torch.ones(s, device=f"zion:{DEVICE}") for s in sizes]
    expected = [fresh_price("aten::add.Tensor", [sim.TensorDesc(s, "fp32")], [sim.TensorDesc(s, "fp32")])
                for s in sizes]
    for x in tensors:  # the first round prices them
        x + 1
    runs = _C.device.formula_runs()
    for _ in range(3):
        for s, x, price in zip(sizes, tensors, expected):
            assert busy_s(lambda: x + 1) == approx(price, rel=1e-9), s
    assert _C.device.formula_runs() == runs  # every price was remembered


def test_past_1024_shapes_an_operator_starts_afresh_and_prices_stay_right():
    # More shapes than an operator keeps (a script making new shapes all the
    # time): the table is emptied and refilled; every call still costs its own price.
    sizes = [[k + 1] for k in range(1100)]
    tensors = [torch.ones(s, device=f"zion:{DEVICE}") for s in sizes]
    model = sim.OpCostModel(_C.device.compute_unit())
    expected = [model.cost(sim.OpCall("aten::neg", [sim.TensorDesc(s, "fp32")], [sim.TensorDesc(s, "fp32")])).device_time
                for s in sizes]
    for _ in range(2):
        for s, x, price in zip(sizes, tensors, expected):
            assert busy_s(lambda: torch.neg(x)) == approx(price, rel=1e-9), s


def test_strides_do_not_enter_the_price():
    # A transposed view has the sizes of a contiguous tensor and other strides: the same price.
    a = torch.ones(64, 32, device=f"zion:{DEVICE}")
    b = torch.ones(32, 64, device=f"zion:{DEVICE}").t()
    assert b.shape == a.shape and b.stride() != a.stride()
    desc = sim.TensorDesc([64, 32], "fp32")
    expected = fresh_price("aten::add.Tensor", [desc], [desc])
    assert busy_s(lambda: a + 1) == approx(expected, rel=1e-9)
    assert busy_s(lambda: b + 1) == approx(expected, rel=1e-9)


def sparse_desc(values_sizes: list, sparse_dim: int) -> "sim.TensorDesc":
    desc = sim.TensorDesc(values_sizes, "fp32")
    desc.sparse_index_elements = sparse_dim * values_sizes[0]
    return desc


def test_sparse_calls_are_each_charged_their_own_price():
    # A sparse tensor is priced by its values' sizes and its number of
    # indices: the first two here have the same values ([6, 4]) and 6 or 12
    # indices, the third more values, the fourth is dense with the values'
    # sizes. Each call, in turn and again, costs what a fresh model prices it.
    def sparse(size, sparse_dim, nnz):
        indices = torch.stack([torch.arange(nnz) % size[d] for d in range(sparse_dim)])
        return torch.sparse_coo_tensor(indices, torch.ones(nnz, *size[sparse_dim:]), size).to(f"zion:{DEVICE}")

    cases = [(sparse([10, 4], 1, 6), sparse_desc([6, 4], 1)), (sparse([5, 5, 4], 2, 6), sparse_desc([6, 4], 2)),
             (sparse([10, 4], 1, 9), sparse_desc([9, 4], 1)),
             (torch.ones(6, 4, device=f"zion:{DEVICE}"), sim.TensorDesc([6, 4], "fp32"))]
    prices = [fresh_price("aten::mul.Tensor", [desc], [desc]) for _, desc in cases]
    assert len(set(prices)) == len(prices)  # each case is told apart by its price
    for round_ in range(3):
        for (x, desc), expected in zip(cases, prices):
            assert busy_s(lambda: x * 2) == approx(expected, rel=1e-9), desc.sizes
        if round_ == 0:
            runs = _C.device.formula_runs()
    assert _C.device.formula_runs() == runs  # after the first round, every price was remembered


def training_step(width: int) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, width), torch.nn.ReLU(), torch.nn.Linear(width, 1))
    model = model.to(f"zion:{DEVICE}")
    x = torch.randn(8, 16).to(f"zion:{DEVICE}")
    model(x).sigmoid().sum().backward()


def test_a_training_step_costs_the_same_on_a_thread_that_has_priced_nothing():
    for width in (32, 32, 48):  # warm: this thread has priced these ops before
        training_step(width)
    warm = busy_s(lambda: (training_step(32), training_step(48)))
    fresh = []
    thread = threading.Thread(target=lambda: fresh.append(busy_s(lambda: (training_step(32), training_step(48)))))
    thread.start()
    thread.join()
    assert warm > 0 and warm == approx(fresh[0], rel=1e-9)


_SCRIPT = """
import json, torch, zion_emu
from zion_emu import _C, sim
from zion_emu.timeline import counters

def busy(f):
    before = counters(0).busy_s
    f()
    return counters(0).busy_s - before

def fresh(name, inputs, outputs, formula=None):
    model = sim.OpCostModel(_C.device.compute_unit())
    if formula is not None:
        model.register_formula(name, formula)
    return model.cost(sim.OpCall(name, inputs, outputs)).device_time

out = {}
d = sim.TensorDesc([4096], "fp32")
x = torch.ones(4096, device="zion")
out["builtin"] = [[busy(lambda: x + 1), fresh("aten::add.Tensor", [d], [d])] for _ in range(2)]
# neg, priced here on this platform, is called again on the same shapes on the next one (below).
out["neg"] = [[busy(lambda: torch.neg(x)), fresh("aten::neg", [d], [d])]]

# A registered formula runs on every call: it may read anything (here a Python variable).
scale = [1]
zion_emu.cost.register("aten::add.Tensor", lambda call: {"flops": 0, "bytes": 1e6 * scale[0], "op_class": "elementwise"})
out["registered"] = []
for s in (1, 2, 3):
    scale[0] = s
    const = {"flops": 0, "bytes": 1e6 * s, "op_class": "elementwise"}
    out["registered"].append([busy(lambda: x + 1), fresh("aten::add.Tensor", [d], [d], const)])

# Another platform: a new cost model (the registered formula carries over).
del x
zion_emu.set_platform("hgx-a100")
x = torch.ones(4096, device="zion")
scale[0] = 5
const = {"flops": 0, "bytes": 5e6, "op_class": "elementwise"}
out["new_platform"] = [busy(lambda: x + 1), fresh("aten::add.Tensor", [d], [d], const)]
# The same shapes as neg's last call, which a remembered price of the old platform's model stood for.
out["neg"].append([busy(lambda: torch.neg(x)), fresh("aten::neg", [d], [d])])

# The precision settings price fp32 matmuls: the same shapes, priced afresh when they change.
a, b = torch.ones(1024, 1024, device="zion"), torch.ones(1024, 1024, device="zion")
m = sim.TensorDesc([1024, 1024], "fp32")
out["mm"] = []
for precision in ("highest", "high", "medium", "highest"):
    torch.set_float32_matmul_precision(precision)
    call = sim.OpCall("aten::mm", [m, m], [m],
                      fp32_matmul={"highest": "fp32", "high": "tf32", "medium": "bf16"}[precision])
    expected = sim.OpCostModel(_C.device.compute_unit()).cost(call).device_time
    out["mm"].append([busy(lambda: a @ b), expected])
print(json.dumps(out))
"""


def test_a_remembered_price_gives_way_to_formulas_platforms_and_precision():
    out = json.loads(run_python(_SCRIPT).stdout.splitlines()[-1])
    for key in ("builtin", "registered", "mm", "neg"):
        for charged, expected in out[key]:
            assert charged == approx(expected, rel=1e-9), key
    charged, expected = out["new_platform"]
    assert charged == approx(expected, rel=1e-9)
    # The registered formula's prices follow its variable: 1, 2, 3 MB; and fp32, tf32, bf16, fp32 differ.
    registered = [c for c, _ in out["registered"]]
    assert registered[1] == approx(2 * registered[0]) and registered[2] == approx(3 * registered[0])
    assert out["neg"][0][0] != approx(out["neg"][1][0], rel=1e-3)  # the two platforms price neg apart
    mm = [c for c, _ in out["mm"]]
    assert mm[0] > mm[1] > mm[2] and mm[3] == approx(mm[0], rel=1e-9)
