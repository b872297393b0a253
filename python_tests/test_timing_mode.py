"""Timing-only mode (ZION_MODE=timing): floating-point zion tensors have no
host bytes, integer and bool ones stay real, every op is priced as in real
mode, and the host reading a float value gets a counted placeholder.

The mode is read once per process, so each case runs a snippet in a fresh
interpreter (in both modes where the two are compared)."""

from __future__ import annotations

import json
import re
import signal
import textwrap

import pytest

from processes import child_env, run_python, zion_emu_cli

# A small training step whose modeled time and memory the two modes must agree on.
TRAINING_STEP = """
import json, torch, zion_emu
torch.manual_seed(0)
dev = torch.device("zion:0")
bag = torch.nn.EmbeddingBag(5000, 16, mode="sum", sparse=True, device=dev)
mlp = torch.nn.Sequential(torch.nn.Linear(16 + 13, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)).to(dev)
dense_opt = torch.optim.Adagrad(mlp.parameters(), lr=0.1)
sparse_opt = torch.optim.Adagrad(bag.parameters(), lr=0.1)  # sparse: coalesce, sparse_mask
for step in range(3):
    idx = torch.randint(0, 5000, (256,)).to(dev)
    off = (torch.arange(64) * 4).to(dev)
    x = torch.randn(64, 13).to(dev)
    y = torch.rand(64, 1).to(dev)
    z = torch.cat([bag(idx, off), x], dim=1)
    loss = torch.nn.functional.binary_cross_entropy_with_logits(mlp(z), y)
    dense_opt.zero_grad(); sparse_opt.zero_grad()
    loss.backward()
    dense_opt.step(); sparse_opt.step()
torch.zion.synchronize()
print(json.dumps({"mode": zion_emu.mode(), "clock": zion_emu.clock(),
                  "peak": torch.zion.max_memory_allocated(0), "now": torch.zion.memory_allocated(0),
                  "storage_less": zion_emu._C.device.is_storage_less(bag.weight),
                  "priced": zion_emu._C.device.priced_ops()}))
"""


def _run(code: str, mode: str, check: bool = True):
    return run_python(code, env=child_env(ZION_MODE=mode, OMP_NUM_THREADS="1"), check=check)


def _last_json(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])


# The end of a script run in both modes: its dict `out`, with the modeled clock, peak HBM and priced ops.
_REPORT_OUT = """
torch.zion.synchronize()
out["clock"] = zion_emu.clock()
out["peak"] = torch.zion.max_memory_allocated(0)
out["priced"] = zion_emu._C.device.priced_ops()
print(json.dumps(out))
"""


def _in_both_modes(code: str) -> tuple[dict, dict]:
    """What the script (which fills a dict `out`) reports in real and in timing-only mode."""
    code = textwrap.dedent(code) + _REPORT_OUT
    return _last_json(_run(code, "real").stdout), _last_json(_run(code, "timing").stdout)


def test_mode_is_real_by_default_and_timing_from_the_environment():
    code = "import zion_emu, torch; torch.empty(1, device='zion'); print(zion_emu.mode())"
    assert run_python(code, env=child_env(ZION_MODE=None)).stdout.split()[-1] == "real"
    assert _run(code, "timing").stdout.split()[-1] == "timing"


def test_an_unknown_mode_is_a_clear_error():
    done = _run("import torch, zion_emu; torch.empty(1, device='zion')", "fast", check=False)
    assert done.returncode != 0
    assert "ZION_MODE='fast' is not a mode" in done.stderr and "'timing'" in done.stderr


def test_floats_have_no_host_bytes_and_integers_stay_real():
    done = _run("""
        import torch, zion_emu
        from zion_emu import _C
        f = torch.empty(1 << 28, device="zion")          # 1 GiB of float32: no host bytes
        h = torch.empty(4, dtype=torch.float16, device="zion")
        i = torch.arange(10, device="zion")
        b = i > 4
        print(_C.device.is_storage_less(f), _C.device.is_storage_less(h), f.data_ptr() != h.data_ptr())
        print(_C.device.is_storage_less(i), _C.device.is_storage_less(b), i.sum().item(), b.sum().item())
        print(torch.zion.memory_allocated(0) >= (1 << 30))
    """, "timing")
    lines = done.stdout.split("\n")
    assert lines[0].split() == ["True", "True", "True"]
    assert lines[1].split() == ["False", "False", "45", "5"]
    assert lines[2] == "True"


def test_a_training_step_is_priced_and_accounted_as_in_real_mode():
    real = _last_json(_run(TRAINING_STEP, "real").stdout)
    timing = _last_json(_run(TRAINING_STEP, "timing").stdout)
    assert (real["mode"], timing["mode"]) == ("real", "timing")
    assert timing["storage_less"] and not real["storage_less"]
    assert timing["priced"] == real["priced"]
    assert timing["clock"] == pytest.approx(real["clock"], rel=1e-9)
    assert (timing["peak"], timing["now"]) == (real["peak"], real["now"])


STEP_ON_A_FINITE_LOSS = """
import json, torch, zion_emu
torch.manual_seed(0)
mlp = torch.nn.Sequential(torch.nn.Linear(13, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)).to("zion")
opt = torch.optim.SGD(mlp.parameters(), lr=0.1)
steps = 0
for step in range(3):
    loss = mlp(torch.randn(32, 13).to("zion")).square().mean()
    loss.backward()
    if torch.isfinite(loss):
        opt.step()
        steps += 1
    opt.zero_grad()
out = {"steps": steps, "nan": bool(torch.isnan(loss)), "inf": bool(torch.isinf(loss)),
       "reads": zion_emu.placeholder_reads()}
""" + _REPORT_OUT


def test_a_loop_that_steps_on_a_finite_loss_steps_as_in_real_mode():
    # The host reads a storage-less loss as 0.0: finite, not NaN, not infinite.
    real = _last_json(_run(STEP_ON_A_FINITE_LOSS, "real").stdout)
    timing = _last_json(_run(STEP_ON_A_FINITE_LOSS, "timing").stdout)
    assert real["steps"] == timing["steps"] == 3
    assert (timing["nan"], timing["inf"]) == (real["nan"], real["inf"]) == (False, False)
    assert (timing["priced"], timing["peak"]) == (real["priced"], real["peak"])
    assert timing["clock"] == pytest.approx(real["clock"], rel=1e-9)
    assert real["reads"] == []
    assert [(r["site"], r["what"], r["count"]) for r in timing["reads"]] == [
        ("<string>:10", "isfinite()", 3), ("<string>:14", "item()", 2)]


def test_ops_whose_meta_kernels_are_python_take_the_cpu_kernels_shapes_and_prices():
    # relu and log_sigmoid_forward (in binary_cross_entropy_with_logits) have
    # C++ shape rules in timing-only mode; their results must be real mode's,
    # also for an input that is not contiguous, where the Python Meta kernel's
    # strides differ from the CPU kernel's. binary_cross_entropy keeps its
    # Python Meta kernel and must run too.
    code = """
        import json, torch, zion_emu
        out = {}
        for name, x in [("contiguous", torch.empty(6, 5, device="zion").uniform_()),
                        ("transposed", torch.empty(5, 6, device="zion").uniform_().t())]:
            r = torch.relu(x)
            o, b = torch.ops.aten.log_sigmoid_forward(x)
            loss = torch.nn.functional.binary_cross_entropy_with_logits(x, torch.zeros(6, 5, device="zion"))
            # No C++ Meta kernel: its Python one goes through torch._prims, which
            # recursed without end while empty_strided had a Python Meta kernel.
            p, ones = torch.sigmoid(x), torch.ones(6, 5, device="zion")
            bce = torch.nn.functional.binary_cross_entropy(p, ones)
            grad = torch.ops.aten.binary_cross_entropy_backward(torch.ones((), device="zion"), p, ones, None, 1)
            out[name] = [[list(t.shape), list(t.stride()), t.untyped_storage().nbytes(), str(t.dtype)]
                         for t in (r, o, b, loss, bce, grad)]
    """
    real, timing = _in_both_modes(code)
    assert timing["transposed"][1][1] == [5, 1]  # the CPU kernel's contiguous result
    assert timing == real


def test_convolutions_forward_and_backward_are_priced_and_laid_out_as_in_real_mode():
    # Every convolution failed in timing-only mode: zion's own convolution kernels made CPU aliases of
    # storage-less tensors.
    code = """
        import json, torch, zion_emu
        import torch.nn.functional as F
        out = {}
        x = torch.empty(4, 4, 12, 12, device="zion").uniform_().requires_grad_()
        w = torch.empty(8, 2, 3, 3, device="zion").uniform_().requires_grad_()
        b = torch.empty(8, device="zion").uniform_().requires_grad_()
        wt = torch.empty(4, 3, 3, 3, device="zion").uniform_().requires_grad_()
        xl = torch.empty(4, 4, 12, 12, device="zion").uniform_().to(memory_format=torch.channels_last).requires_grad_()
        cases = {"grouped, strided, bias": lambda: F.conv2d(x, w, b, stride=2, padding=1, groups=2),
                 "channels_last": lambda: F.conv2d(xl, w, groups=2),
                 "transposed": lambda: F.conv_transpose2d(x, wt, stride=2),
                 "1d": lambda: F.conv1d(x[:, :, 0], w[:, :, 0], groups=2)}
        for name, conv in cases.items():
            y = conv()
            y.sum().backward()
            out[name] = [list(y.shape), list(y.stride())] + [[list(t.grad.shape), list(t.grad.stride())]
                                                             for t in (x, xl, w, b, wt) if t.grad is not None]
            x.grad = xl.grad = w.grad = b.grad = wt.grad = None
    """
    real, timing = _in_both_modes(code)
    assert timing == real


def test_composite_ops_with_bool_or_integer_results_over_floats_run_as_in_real_mode():
    # "resized a real argument from its Meta kernel": the op made an empty bool or int64 result (real in
    # timing-only mode), and its out= form's Meta kernel grew it.
    code = """
        import json, torch, zion_emu
        x = torch.empty(8, 6, device="zion").uniform_()
        results = [x.logical_not(), *x.median(1), *x.kthvalue(2, 1), torch.isnan(x).logical_not()]
        torch.zion.synchronize()
        print(json.dumps({"results": [[list(t.shape), str(t.dtype)] for t in results], "clock": zion_emu.clock(),
                          "peak": torch.zion.max_memory_allocated(0), "priced": zion_emu._C.device.priced_ops()}))
    """
    real = _last_json(_run(code, "real").stdout)
    timing = _last_json(_run(code, "timing").stdout)
    assert timing == real


def test_batch_norm_in_and_out_of_training_is_accounted_as_in_real_mode():
    # Out of training the Meta kernel gave a saved mean and inverse deviation per channel, the CPU none:
    # peak HBM and the op's bytes differed.
    code = """
        import json, torch, zion_emu
        out = {}
        for name, bn, x in [("1d", torch.nn.BatchNorm1d(256), torch.empty(32, 256)),
                            ("2d, channels_last", torch.nn.BatchNorm2d(16),
                             torch.empty(8, 16, 6, 6).to(memory_format=torch.channels_last))]:
            bn, x = bn.to("zion"), x.to("zion")
            for training in (True, False):
                bn.train(training)
                torch.zion.synchronize()
                torch.zion.reset_peak_memory_stats()
                start = torch.zion.memory_allocated()
                with torch.no_grad():
                    y = bn(x)
                    saved = torch.ops.aten.native_batch_norm(x, bn.weight, bn.bias, bn.running_mean, bn.running_var,
                                                             training, 0.1, 1e-5)
                out[f"{name} {training}"] = [list(y.stride()), [list(t.shape) for t in saved],
                                             torch.zion.max_memory_allocated() - start]
        torch.zion.synchronize()
        out["clock"] = zion_emu.clock()
        out["bytes"] = zion_emu.counters(0).bytes
        out["priced"] = zion_emu._C.device.priced_ops()
        print(json.dumps(out))
    """
    real = _last_json(_run(code, "real").stdout)
    timing = _last_json(_run(code, "timing").stdout)
    assert real["1d False"][1] == [[32, 256], [0], [0]]
    assert timing == real


def test_real_masks_and_selections_by_float_values_run_as_in_real_mode():
    # A real mask over storage-less floats (logits[labels != -100], masked_select) was refused, and so was
    # the backward of ops that select by float values (max pooling, topk, sort, max(dim), an embedding bag's
    # max mode): their indices
    # are computed from floats, yet only say where unknown gradients go.
    code = """
        import json, torch, zion_emu
        import torch.nn.functional as F
        out = {}
        logits = torch.empty(6, 5, device="zion").uniform_().requires_grad_()
        labels = torch.tensor([1, -100, 3, -100, 0, 2], device="zion")
        keep = labels != -100
        picked = logits[keep]
        F.cross_entropy(picked, labels[keep]).backward()
        both = logits[keep.cpu(), 1:3]
        selected = torch.masked_select(logits, keep[:, None])
        selected.sum().backward()
        x = torch.empty(2, 3, 8, 8, device="zion").uniform_().requires_grad_()
        v = torch.empty(7, 9, device="zion").uniform_().requires_grad_()
        (F.max_pool2d(x, 2).sum() + v.topk(3, dim=1).values.sum() + v.sort(0).values.sum()
         + v.max(1).values.sum()).backward()
        bag = torch.nn.EmbeddingBag(50, 8, mode="max").to("zion")
        bag(torch.tensor([1, 2, 7, 7, 30], device="zion"), torch.tensor([0, 2], device="zion")).sum().backward()
        out["shapes"] = [list(t.shape) for t in (picked, both, selected, logits.grad, x.grad, v.grad, bag.weight.grad)]
    """
    real, timing = _in_both_modes(code)
    assert real["shapes"] == [[4, 5], [4, 2], [20], [6, 5], [2, 3, 8, 8], [7, 9], [50, 8]]
    assert timing == real


def test_a_mask_computed_from_storage_less_floats_is_a_clear_error_naming_the_op():
    done = _run("""
        import torch, zion_emu
        x = torch.randn(10, device="zion")
        x[x > 0]
    """, "timing", check=False)
    assert done.returncode != 0
    assert "aten::index.Tensor uses a storage-less Bool tensor as its 'indices'" in done.stderr
    assert "which elements a mask selects needs real values" in done.stderr


def test_a_real_tensor_written_with_values_from_storage_less_ones_loses_its_stale_values():
    # `counts.add_(f.long())` kept the real tensor's old values: a silent wrong answer.
    done = _run("""
        import json, torch, zion_emu
        from zion_emu import _C
        f = torch.randn(4, device="zion")
        whole = torch.ones(4, dtype=torch.long, device="zion")
        whole.add_(f.long())
        flags = torch.ones(4, dtype=torch.bool, device="zion")
        torch.logical_and(flags, f > 0, out=flags)
        part = torch.ones(6, dtype=torch.long, device="zion")
        part[:3].add_(f[:3].long())
        print(json.dumps({"storage_less": [_C.device.is_storage_less(t) for t in (whole, flags, part)],
                          "part": part.tolist(),
                          "reads": [r["what"] for r in zion_emu.placeholder_reads()]}))
    """, "timing")
    result = _last_json(done.stdout)
    assert result["storage_less"] == [True, True, False]
    assert result["part"] == [0, 0, 0, 1, 1, 1]
    assert "an op writing into part of a real zion tensor" in result["reads"]


def test_an_op_without_a_cpu_kernel_is_refused_in_both_modes():
    # nn.LSTM ran in timing-only mode, priced by the default guess, where real mode refuses its fused cell.
    code = """
        import torch, zion_emu
        lstm = torch.nn.LSTM(8, 16, batch_first=True).to("zion")
        try:
            lstm(torch.randn(2, 5, 8, device="zion"))
        except NotImplementedError as e:
            print(e)
    """
    for mode in ("real", "timing"):
        assert ("zion: operator aten::_thnn_fused_lstm_cell is not supported on zion: zion runs each op through its "
                "CPU kernel, and this op has none") in _run(code, mode).stdout


def test_embedding_bag_offsets_give_the_real_integer_results():
    done = _run("""
        import torch, zion_emu
        w = torch.nn.Parameter(torch.empty(100, 32, device="zion"))
        idx = torch.tensor([3, 7, 7, 1, 9, 2], device="zion"); off = torch.tensor([0, 2, 2, 5], device="zion")
        out, offset2bag, bag_size, max_idx = torch.ops.aten._embedding_bag(w, idx, off, False, 0, False, None, False)
        ref = torch.ops.aten._embedding_bag(torch.zeros(100, 32), idx.cpu(), off.cpu(), False, 0, False, None, False)
        print(list(out.shape), offset2bag.tolist() == ref[1].tolist(), bag_size.tolist() == ref[2].tolist(),
              max_idx.tolist() == ref[3].tolist())
        same = []
        for mode in (0, 1):  # sum, mean; with and without a padding row
            for padding in (-1, 7):
                got = torch.ops.aten._embedding_bag(w, idx, off, False, mode, False, None, False, padding)
                want = torch.ops.aten._embedding_bag(torch.zeros(100, 32), idx.cpu(), off.cpu(), False, mode, False,
                                                     None, False, padding)
                same.append(all(g.tolist() == r.tolist() for g, r in zip(got[1:], want[1:])))
        print(same)
        messages = []
        for weight, indices in ((w, idx + 95), (torch.zeros(100, 32), idx.cpu() + 95)):
            try:
                torch.ops.aten._embedding_bag(weight, indices, off.to(indices.device), False, 0, False, None, False)
            except RuntimeError as e:
                messages.append(str(e).split(chr(10))[0])
        print("out of range:", len(messages) == 2 and messages[0] == messages[1])
        print(zion_emu._C.device.is_storage_less(out), zion_emu._C.device.is_storage_less(bag_size))
        out.sum().backward()
        g = w.grad
        print(list(g.shape), zion_emu._C.device.is_storage_less(g))
    """, "timing")
    lines = done.stdout.split("\n")
    assert lines[0] == "[4, 32] True True True"
    assert lines[1] == "[True, True, True, True]"
    assert lines[2] == "out of range: True"
    assert lines[3] == "True False"
    assert lines[4] == "[100, 32] True"


def test_sparse_gradients_have_real_indices_and_storage_less_values():
    done = _run("""
        import torch, zion_emu
        bag = torch.nn.EmbeddingBag(1000, 8, mode="sum", sparse=True, device="zion")
        bag(torch.tensor([5, 9, 5], device="zion"), torch.tensor([0, 1], device="zion")).sum().backward()
        g = bag.weight.grad.coalesce()
        print(g.is_sparse, g._indices().tolist(), zion_emu._C.device.is_storage_less(g._values()))
    """, "timing")
    assert done.stdout.split("\n")[0] == "True [[5, 9]] True"


FORWARD_CASES = """
import json, torch, zion_emu
dev = torch.device("zion:0")
results = []
def record(out):
    results.append([{"shape": list(t.shape), "dtype": str(t.dtype), "nbytes": t.untyped_storage().nbytes(),
                     "values": t.tolist() if not t.is_floating_point() else None} for t in out])
def case(weight, idx, off, **kw):
    try:
        record(torch.ops.aten._embedding_bag(weight, idx.to(dev), off.to(dev), False, kw.get("mode", 0), False,
                                             kw.get("psw"), kw.get("last", False), kw.get("padding", -1)))
        record(torch.ops.aten._embedding_bag_forward_only(weight, idx.to(dev), off.to(dev), False, 0, False,
                                                          kw.get("psw"), kw.get("last", False), -1))
    except RuntimeError as e:
        results.append(str(e).splitlines()[0])
    results.append(torch.zion.memory_allocated(0))
w = torch.empty(50, 8, device=dev)
idx = torch.tensor([3, 7, 7, 1, 9, 2]); off = torch.tensor([0, 2, 2, 5])
case(w, idx, off)
case(w, idx, off, last=True)
case(w, idx.int(), off.int())
case(w, idx, off.int())  # mixed index dtypes: promoted
case(w, idx, off, psw=torch.rand(6, device=dev))
case(w, torch.tensor([], dtype=torch.long), torch.tensor([0, 0]))
case(w.half(), idx, off)
case(w.double(), idx, off)  # no fast path for double: offset2bag is made
case(torch.empty(8, 50, device=dev).t(), idx, off)  # rows not contiguous: no fast path
case(w, idx, off, mode=1)
case(w, idx, off, padding=7)
case(w, idx + 45, off)  # out of range
case(w, idx, torch.tensor([1, 2, 2, 5]))  # offsets[0] != 0
case(w, idx, torch.tensor([0, 2, 2, 9]), last=True)  # past the end
case(w, torch.tensor([3, 7, -1, 1, 9, 2]), off)  # negative
case(w, idx.int() - 4, off.int())  # negative, int32
case(w, torch.tensor([49] * 6), off)  # the last row
case(w, torch.arange(10, 51), torch.tensor([0, 20]))  # out of range in the tail after groups of four
case(w, torch.arange(50).int(), torch.tensor([0, 25]).int())  # every row, int32
case(w, idx, torch.tensor([0, 3, 2, 5]))  # offsets that decrease (see the test below)
case(w, torch.arange(41).int(), torch.tensor(list(range(30)) + [28] + list(range(31, 41))).int())  # one descent, late
torch.zion.synchronize()
print(json.dumps({"results": results, "clock": zion_emu.clock(), "peak": torch.zion.max_memory_allocated(0),
                  "priced": zion_emu._C.device.priced_ops()}))
"""


def test_embedding_bag_forward_equals_real_modes_in_every_case():
    # Sum mode on the CPU kernel's fast path is answered without running the
    # kernel on stand-ins; every case, that one or not, must give real mode's
    # integer results, shapes, storage sizes, errors, memory and modeled time.
    real = _last_json(_run(FORWARD_CASES, "real").stdout)
    timing = _last_json(_run(FORWARD_CASES, "timing").stdout)
    assert len(real["results"]) == 21 + 15 * 2 + 6
    assert sum(isinstance(r, str) for r in real["results"]) == 6  # the six errors
    for r, t in zip(real["results"], timing["results"]):
        assert t == r
    assert timing == real



def _error_kind(result):
    # On two threads each of the kernel's threads checks its own bags, and the
    # first to raise names its bad index: which one is a race, in real mode as
    # in timing-only mode. The kind of error is not.
    return re.sub(r"-?\d+", "N", result) if isinstance(result, str) else result


def test_embedding_bag_forward_with_decreasing_offsets_equals_real_mode_on_two_threads():
    # The CPU kernel takes offsets that decrease on one thread and refuses
    # them on two; timing-only mode must do what real mode does on each.
    for threads, errors in (("1", 6), ("2", 8)):
        runs = [_last_json(run_python(FORWARD_CASES, env=child_env(ZION_MODE=mode, OMP_NUM_THREADS=threads)).stdout)
                for mode in ("real", "timing")]
        assert sum(isinstance(r, str) for r in runs[0]["results"]) == errors
        if threads == "2":
            for run in runs:
                run["results"] = [_error_kind(r) for r in run["results"]]
        assert runs[1] == runs[0]


def test_error_kind_masks_the_numbers_of_a_message_alone():
    message = "Index 1 of input takes value 52 which is not in the valid range [0, 50)"
    assert _error_kind(message) == _error_kind(message.replace("1 of", "2 of").replace("52", "-54"))
    assert _error_kind(message) != _error_kind("offsets[0] has to be 0")
    assert _error_kind([{"values": [1, 2]}]) == [{"values": [1, 2]}]


SPARSE_BACKWARD_CASES = """
import json, torch, zion_emu
dev = torch.device("zion:0")
grad_of = {}
results = []
def case(mode, padding, dtype, lengths, weights=False, d=8, last=False):
    torch.manual_seed(0)
    n = sum(lengths)
    idx = torch.randint(0, 20, (n,), dtype=dtype)
    if padding >= 0 and n:
        idx[::2] = padding  # every other lookup is the padding row
    off = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)[:-1].tolist()) + ([n] if last else []), dtype=dtype)
    w = torch.nn.Parameter(torch.randn(20, d, device=dev))
    psw = torch.rand(n, device=dev) if weights else None
    out = torch.nn.functional.embedding_bag(idx.to(dev), w, off.to(dev), mode=mode, sparse=True,
                                            per_sample_weights=psw, include_last_offset=last,
                                            padding_idx=padding if padding >= 0 else None)
    out.sum().backward()
    g = w.grad
    results.append({"indices": g._indices().tolist(), "dtype": str(g._indices().dtype),
                    "values": list(g._values().shape), "coalesced": g.is_coalesced(), "size": list(g.shape),
                    "nnz": g._nnz()})
for mode in ("sum", "mean"):
    for padding in (-1, 3):
        for dtype in (torch.int64, torch.int32):
            for lengths in ([], [1], [0, 2], [3, 0, 4, 1], [2, 2, 2, 2, 2]):
                case(mode, padding, dtype, lengths)
case("sum", -1, torch.int64, [3, 1, 2], weights=True)
case("sum", 3, torch.int64, [3, 1, 2], weights=True)
case("sum", -1, torch.int64, [2, 3], d=0)
case("mean", -1, torch.int64, [2, 3, 1], last=True)
case("sum", 3, torch.int64, [1])  # the one lookup is the padding row: an empty gradient
idx = torch.tensor([1, 2, 2], device=dev); off = torch.tensor([0, 1], device=dev)
w = torch.nn.Parameter(torch.randn(20, 4, device=dev))
try:
    torch.nn.functional.embedding_bag(idx, w, off, sparse=True, scale_grad_by_freq=True).sum().backward()
    results.append("no error")
except RuntimeError as e:
    results.append(str(e).splitlines()[0])
torch.zion.synchronize()
print(json.dumps({"results": results, "clock": zion_emu.clock(), "peak": torch.zion.max_memory_allocated(0),
                  "now": torch.zion.memory_allocated(0), "priced": zion_emu._C.device.priced_ops()}))
"""


def test_sparse_embedding_gradients_equal_real_modes_in_every_case():
    # Timing-only mode makes a sparse gradient's indices without running the
    # kernel on stand-ins: its indices, their dtype, the values' shape, the
    # coalesced flag, the modeled time and the memory must be real mode's.
    real = _last_json(_run(SPARSE_BACKWARD_CASES, "real").stdout)
    timing = _last_json(_run(SPARSE_BACKWARD_CASES, "timing").stdout)
    assert len(real["results"]) == 46
    assert real["results"][-1].startswith("embedding_backward: scale_grad_by_freq not supported")
    assert any(r["nnz"] == 0 for r in real["results"][:-1]) and any(r["coalesced"] for r in real["results"][:-1])
    for r, t in zip(real["results"], timing["results"]):
        assert t == r
    assert timing == real


def test_nonzero_and_unique_of_real_integers_are_real():
    done = _run("""
        import torch, zion_emu
        x = torch.tensor([0, 3, 0, 5, 3], device="zion")
        print(torch.nonzero(x).flatten().tolist(), torch.unique(x).tolist(), x[x > 0].tolist())
    """, "timing")
    assert done.stdout.split("\n")[0] == "[1, 3, 4] [0, 3, 5] [3, 5, 3]"


def test_nonzero_of_a_storage_less_value_is_a_clear_error_naming_the_op():
    done = _run("""
        import torch, zion_emu
        x = torch.randn(8, device="zion")
        torch.nonzero(x > 0)
    """, "timing", check=False)
    assert done.returncode != 0
    assert "aten::nonzero needs the values of a storage-less tensor" in done.stderr


def test_a_storage_less_value_used_as_an_index_is_a_clear_error_naming_the_op():
    done = _run("""
        import torch, zion_emu
        scores = torch.randn(10, device="zion")
        rows = torch.arange(100, device="zion")
        rows[scores.long()]
    """, "timing", check=False)
    assert done.returncode != 0
    assert "aten::index.Tensor uses a storage-less Long tensor as its 'indices'" in done.stderr


def test_reading_a_float_gives_a_placeholder_warned_once_per_call_site_and_counted():
    done = _run("""
        import warnings, json, torch, zion_emu
        warnings.simplefilter("always")
        loss = torch.randn(4, device="zion").mean()
        values = []
        for _ in range(3):
            values.append(loss.item())                  # one call site, read 3 times
        values.append(float(torch.isnan(loss).any()))  # a NaN check: a bool placeholder
        values.append(loss.cpu().tolist())
        print(json.dumps({"values": values, "reads": zion_emu.placeholder_reads()}))
    """, "timing")
    result = _last_json(done.stdout)
    assert result["values"] == [0.0, 0.0, 0.0, 0.0, 0.0]
    reads = {(r["site"].rsplit(":", 1)[1], r["what"]): r["count"] for r in result["reads"]}
    assert reads == {("7", "item()"): 3, ("8", "item()"): 1, ("9", "a copy to host memory (.cpu(), .tolist(), printing)"): 1}
    assert done.stderr.count("zion timing-only: item() read the value of a storage-less") == 2


def test_printing_a_storage_less_tensor_shows_placeholders_on_its_device():
    # print(loss) raised: torch's formatter masks the values (masked_select) to choose its number format.
    done = _run("""
        import json, torch, zion_emu
        loss = torch.randn(4, device="zion:1").square().mean()
        print(loss)
        print(torch.ones(2, 3, device="zion"))  # made by a fill: storage-less too
        print(repr(torch.arange(3, device="zion")))  # integers stay real
        print(json.dumps(zion_emu.placeholder_reads()))
    """, "timing")
    lines = done.stdout.strip().splitlines()
    assert lines[0] == "tensor(0., device='zion:1')"
    assert lines[1:3] == ["tensor([[0., 0., 0.],", "        [0., 0., 0.]], device='zion:0')"]
    assert lines[3] == "tensor([0, 1, 2], device='zion:0')"
    reads = {(r["site"].rsplit(":", 1)[1], r["what"]) for r in json.loads(lines[4])}
    assert reads == {("4", "a copy to host memory (.cpu(), .tolist(), printing)"),
                     ("5", "a copy to host memory (.cpu(), .tolist(), printing)")}


def test_storage_less_blocks_have_addresses_of_their_own_that_no_load_can_reach():
    done = _run("""
        import json, platform, torch, zion_emu
        torch.zion.memory._record_memory_history()
        x = torch.empty(1000, 1000, device="zion")
        y = torch.empty(10, device="zion")
        e = torch.empty(0, device="zion")
        gone = torch.empty(1000, 1000, device="zion")
        old = gone.data_ptr()
        del gone
        again = torch.empty(1000, 1000, device="zion")
        print(json.dumps({
            "x": x.data_ptr(), "y": y.data_ptr(), "e": e.untyped_storage().data_ptr(),
            "x_storage": x.untyped_storage().data_ptr(), "x_row_10": x[10:].data_ptr(),
            "reused": again.data_ptr() == old, "x86": platform.machine() in ("x86_64", "AMD64"),
            "history": sorted(seg["address"] for seg in torch.zion.memory._snapshot()["segments"]),
            "alive": sorted(t.untyped_storage().data_ptr() for t in (x, y, e, again)),
            "storage_less": [zion_emu._C.device.is_storage_less(t) for t in (x, y, e, again)]}))
    """, "timing")
    r = _last_json(done.stdout)
    assert r["storage_less"] == [True, True, True, True]
    # A storage's data pointer is its tensors' base, as on a device, and every block has a range of its own.
    assert r["x_storage"] == r["x"] and r["x_row_10"] == r["x"] + 10 * 1000 * 4
    starts = sorted([(r["x"], 4_000_000), (r["y"], 40), (r["e"], 0)])
    assert all(a + n <= b for (a, n), (b, _) in zip(starts, starts[1:])) and starts[0][0] != 0
    assert not r["reused"]
    # The memory history knows each block by the same address, as CUDA's does.
    assert r["history"] == r["alive"]
    assert all(a % 512 == 0 for a, _ in starts)
    if r["x86"]:
        assert all(a >= 1 << 57 for a, _ in starts)  # non-canonical: no mapping can ever be there
    # A load from one faults, as from the null pointer such blocks had before: never a silent read.
    read = _run("""
        import ctypes, torch, zion_emu
        x = torch.empty(1024, device="zion")
        print("address", x.data_ptr(), flush=True)
        ctypes.string_at(x.data_ptr(), 1)
        print("read it")
    """, "timing", check=False)
    assert "address" in read.stdout and "read it" not in read.stdout
    # (Under `make sanitize` AddressSanitizer catches the fault, reports it and exits 1.)
    faulted = read.returncode in (-signal.SIGSEGV, -signal.SIGBUS) or (
        read.returncode != 0 and "AddressSanitizer: SEGV" in read.stderr)
    assert faulted, (read.returncode, read.stderr[-2000:])


def test_torch_save_of_storage_less_tensors_writes_placeholders_and_names_the_call_site():
    # torch.save reads each storage's data pointer (to tell storages apart),
    # then copies it to the host: the copy reads placeholders, as .cpu() does.
    done = _run("""
        import io, json, torch, zion_emu
        lin = torch.nn.Linear(8, 4, device="zion")
        buf = io.BytesIO()
        torch.save({"model": lin.state_dict(), "same": lin.weight}, buf)
        buf.seek(0)
        back = torch.load(buf)
        print(json.dumps({"shapes": [list(back["model"]["weight"].shape), list(back["model"]["bias"].shape)],
                          "zeros": bool((back["model"]["weight"].cpu() == 0).all()),
                          "shared": back["same"].untyped_storage().data_ptr()
                                    == back["model"]["weight"].untyped_storage().data_ptr(),
                          "reads": zion_emu.placeholder_reads()}))
    """, "timing")
    r = _last_json(done.stdout)
    assert r["shapes"] == [[4, 8], [4]] and r["zeros"] and r["shared"]
    assert r["reads"] == [{"site": "<string>:5", "what": "a copy to host memory (.cpu(), .tolist(), printing)",
                           "dtype": "Byte", "count": 2}]


FSDP2_STEPS = """
import json, sys, torch, torch.distributed as dist, zion_emu
from torch.distributed.fsdp import fully_shard
dist.init_process_group("zion")
rank = dist.get_rank()
torch.zion.set_device(rank)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 8)).to("zion")
for layer in (model[0], model[2]):
    fully_shard(layer)
fully_shard(model)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    model(torch.randn(16, 64, device="zion")).square().mean().backward()
    opt.step()
    opt.zero_grad()
torch.zion.synchronize()
with open(f"{sys.argv[1]}/rank{rank}.json", "w") as out:
    json.dump({"rank": rank, "mode": zion_emu.mode(), "clock": zion_emu.clock(),
               "peak": torch.zion.max_memory_allocated(rank)}, out)
dist.destroy_process_group()
"""


def test_fsdp2_runs_in_timing_only_mode_with_real_modes_modeled_time_and_peak_hbm(tmp_path):
    # FSDP2 tells its shards apart by their storages' data pointers.
    script = tmp_path / "fsdp2.py"
    script.write_text(FSDP2_STEPS)
    runs = {}
    for mode in ("real", "timing"):
        flags = ["--timing-only"] if mode == "timing" else []
        out = tmp_path / mode
        out.mkdir()
        zion_emu_cli("run", "--nproc", "2", *flags, str(script), str(out), env=child_env(OMP_NUM_THREADS="1"))
        ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
        runs[mode] = [(r["rank"], r["mode"], r["clock"], r["peak"]) for r in ranks]
    assert [r[1] for r in runs["timing"]] == ["timing", "timing"]
    assert [r[0] for r in runs["real"]] == [0, 1]
    assert [(r[0], r[2], r[3]) for r in runs["timing"]] == [(r[0], r[2], r[3]) for r in runs["real"]]
    assert all(r[2] > 0 and r[3] > 0 for r in runs["real"])


def test_initializing_and_loading_storage_less_parameters_is_charged_not_computed():
    done = _run("""
        import io, json, torch, zion_emu
        lin = torch.nn.Linear(256, 128, device="zion")   # reset_parameters: kaiming_uniform_, uniform_
        before = zion_emu.clock()
        buf = io.BytesIO(); torch.save(torch.nn.Linear(256, 128).state_dict(), buf); buf.seek(0)
        lin.load_state_dict(torch.load(buf))
        torch.nn.init.normal_(lin.weight)
        torch.zion.synchronize()
        print(json.dumps({"storage_less": zion_emu._C.device.is_storage_less(lin.weight),
                          "charged": zion_emu.clock() > before, "reads": zion_emu.placeholder_reads()}))
    """, "timing")
    result = _last_json(done.stdout)
    assert result == {"storage_less": True, "charged": True, "reads": []}


def test_real_mode_refuses_what_the_host_cannot_back_naming_the_pool_and_timing_only():
    # A modeled pool larger than this host's memory, and a request between the two.
    done = run_python("""
        import torch, zion_emu
        available = int([l.split()[1] for l in open("/proc/meminfo") if l.startswith("MemAvailable:")][0]) * 1024
        request = available + (2 << 30)
        zion_emu.set_platform(zion_emu.load_platform("zion", overrides={"oam.hbm_bytes": 4 * request}))
        keep = torch.ones(4, device="zion")
        try:
            torch.empty(request // 4, device="zion")
        except RuntimeError as e:
            print("refused:", e)
        print("kept:", keep.sum().item(), torch.zion.memory_allocated(0))
    """, env=child_env(ZION_MODE=None))
    out = done.stdout
    assert "refused: zion: zion:0 cannot back an allocation of" in out
    assert "the modeled HBM pool has room" in out and "this host has" in out and "--timing-only" in out
    assert "kept: 4.0 16" in out


def test_timing_only_mode_allocates_what_the_host_could_not_back():
    done = _run("""
        import torch, zion_emu
        available = int([l.split()[1] for l in open("/proc/meminfo") if l.startswith("MemAvailable:")][0]) * 1024
        request = available + (2 << 30)
        zion_emu.set_platform(zion_emu.load_platform("zion", overrides={"oam.hbm_bytes": 4 * request}))
        t = torch.empty(request // 4, device="zion")
        t.uniform_()
        print("allocated:", torch.zion.memory_allocated(0) == (request // 4) * 4)
    """, "timing")
    assert "allocated: True" in done.stdout


def test_the_run_report_lists_the_mode_and_every_placeholder_read(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import torch, zion_emu
        lin = torch.nn.Linear(8, 1, device="zion")
        opt = torch.optim.SGD(lin.parameters(), lr=0.1)
        for step in range(3):
            loss = lin(torch.randn(4, 8, device="zion")).pow(2).mean()
            loss.backward(); opt.step(); opt.zero_grad()
            print("loss", loss.item())
    """))
    report = tmp_path / "report.json"
    done = zion_emu_cli("run", "--report", str(report), str(script), env=child_env(ZION_MODE="timing"))
    assert done.stdout.count("loss 0.0") == 3
    assert "timing-only mode: floating-point zion tensors had no host bytes" in done.stdout
    assert f"{script}:8  item()  Float  x3" in done.stdout
    data = json.loads(report.read_text())
    assert data["mode"] == "timing"
    assert data["placeholders"] == [{"site": f"{script}:8", "what": "item()", "dtype": "Float", "count": 3,
                                     "ranks": [0]}]


@pytest.mark.parametrize("mode", ["real", "timing"])
def test_a_socket_refuses_what_the_host_cannot_back_in_real_mode_only(mode):
    # In real mode a CPU tensor in a socket's DDR has host bytes; in timing-only
    # mode a floating-point one is a storage-less socket tensor (zion_emu.socket_tensor).
    done = run_python("""
        import torch, zion_emu
        available = int([l.split()[1] for l in open("/proc/meminfo") if l.startswith("MemAvailable:")][0]) * 1024
        request = available + (2 << 30)
        zion_emu.set_platform(zion_emu.load_platform("zion", overrides={"socket.ddr_bytes": 4 * request}))
        with zion_emu.socket(1):
            keep = torch.ones(4)
            try:
                big = torch.empty(request // 4)
                print("made:", zion_emu.sockets.memory(1).in_use - 16 == (request // 4) * 4)
                del big
            except RuntimeError as e:
                print("refused:", e)
        print("kept:", keep.sum().item(), zion_emu.sockets.memory(1).in_use)
    """, env=child_env(ZION_MODE=mode))
    out = done.stdout
    if mode == "real":
        assert "refused: zion: socket 1 cannot back an allocation of" in out
        assert "the modeled DDR pool has room" in out and "with --timing-only (ZION_MODE=timing)" in out
        assert "kept: 4.0 16" in out
    else:
        assert "made: True" in out
        assert "kept: 0.0 16" in out  # a placeholder: the socket tensor has no values
