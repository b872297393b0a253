"""torch.compile on zion. With the default backend (inductor) a zion graph is
lowered as CPU: the same kernels, so results equal a CPU compile's bit for
bit; each generated kernel is priced as one fused kernel, extern kernels (mm,
bmm, embedding_bag) op by op as in eager mode. A graph inductor cannot take
for zion runs op by op (the eager backend), after a warning. backend="aot_eager" runs the
graph op by op on zion, with eager's numerics and modeled time.

Inductor's caches live in a directory of this test session, so every run
compiles as on a fresh machine (the first CPU compile builds the C++ kernels;
the zion compile of the same graph reuses them: the kernels are CPU's)."""

from __future__ import annotations

import copy
import os
import warnings

import pytest
import torch
from torch import nn

import zion_emu
from zion_emu.timeline import counters


@pytest.fixture(scope="module", autouse=True)
def fresh_inductor_cache(tmp_path_factory: pytest.TempPathFactory):
    old = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(tmp_path_factory.mktemp("inductor_cache"))
    yield
    if old is None:
        del os.environ["TORCHINDUCTOR_CACHE_DIR"]
    else:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = old


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


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


# -- inductor ------------------------------------------------------------------


class DLRM(nn.Module):
    """DLRM's shape (Naumov et al. 2019): embedding bags and a bottom MLP,
    pairwise dot-product interaction, a top MLP; plus a pointwise tail."""

    def __init__(self, tables: int = 3, rows: int = 1000, dim: int = 16, dense_in: int = 13) -> None:
        super().__init__()
        self.emb = nn.ModuleList(nn.EmbeddingBag(rows, dim, mode="sum") for _ in range(tables))
        self.bottom = nn.Sequential(nn.Linear(dense_in, 64), nn.ReLU(), nn.Linear(64, dim), nn.ReLU())
        n = tables + 1
        self.top = nn.Sequential(nn.Linear(dim + n * (n - 1) // 2, 64), nn.ReLU(), nn.Linear(64, 1))

    def forward(self, dense, indices, offsets):
        x = self.bottom(dense)
        z = torch.stack([x] + [e(i, o) for e, i, o in zip(self.emb, indices, offsets)], dim=1)
        inter = torch.bmm(z, z.transpose(1, 2))
        li, lj = torch.tril_indices(z.shape[1], z.shape[1], offset=-1)  # a CPU tensor inside a zion graph
        h = torch.cat([x, inter[:, li, lj]], dim=1)
        y = h
        for _ in range(3):
            y = y * torch.sigmoid(y) + h * 0.5
        y = y / 3.0 + (h - h.mean(dim=1, keepdim=True)) ** 2
        return torch.sigmoid(self.top(y)).squeeze(1)


def dlrm_batch(batch: int = 32):
    g = torch.Generator().manual_seed(0)
    dense = torch.randn(batch, 13, generator=g)
    indices = [torch.randint(0, 1000, (batch * 4,), generator=g) for _ in range(3)]
    offsets = [torch.arange(0, batch * 4, 4) for _ in range(3)]
    return dense, indices, offsets, torch.rand(batch, generator=g)


def train_step(model, dense, indices, offsets, target):
    out = model(dense, indices, offsets)
    loss = nn.functional.binary_cross_entropy(out, target)
    loss.backward()
    return out, loss


def on(device, batch):
    dense, indices, offsets, target = batch
    return dense.to(device), [i.to(device) for i in indices], [o.to(device) for o in offsets], target.to(device)


@pytest.mark.slow
def test_dlrm_compiled_on_zion_equals_compiled_on_cpu_forward_and_backward():
    torch.manual_seed(0)
    cpu_model = DLRM()
    zion_model = copy.deepcopy(cpu_model).to("zion")
    batch = dlrm_batch()

    cpu_out, cpu_loss = train_step(torch.compile(cpu_model), *on("cpu", batch))
    torch._dynamo.reset()
    before = counters()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback
        zion_out, zion_loss = train_step(torch.compile(zion_model), *on("zion", batch))
    after = counters()

    assert zion_out.is_zion and zion_emu.inductor.fallbacks() == []
    assert torch.equal(zion_out.cpu(), cpu_out) and torch.equal(zion_loss.cpu(), cpu_loss)
    grads = {name: p.grad for name, p in cpu_model.named_parameters()}
    assert len(grads) == 11
    for name, p in zion_model.named_parameters():
        assert torch.equal(p.grad.cpu(), grads[name]), name
    assert after.compiled_kernels > before.compiled_kernels  # the fused pointwise kernels
    assert after.ops - before.ops > after.compiled_kernels - before.compiled_kernels  # and mm, bmm, embedding_bag
    assert after.guessed_ops == before.guessed_ops


def test_a_cpu_compile_after_a_zion_compile_stays_on_the_cpu():
    torch.manual_seed(0)
    cpu_model = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 1))
    zion_model = copy.deepcopy(cpu_model).to("zion")
    x = torch.randn(8, 32)

    zion_out = torch.compile(zion_model)(x.to("zion"))
    torch._dynamo.reset()
    before = counters()
    cpu_out = torch.compile(cpu_model)(x)  # same graph: inductor's caches must not hand it zion's wrapper

    assert cpu_out.device.type == "cpu" and counters().ops == before.ops
    assert torch.equal(zion_out.cpu(), cpu_out)


def test_attention_compiled_on_zion_equals_a_cpu_compile():
    # zion's attention asks the CPU which kernel to use; under tracing it is
    # asked with fake tensors, whose bytes it must not touch.
    def attend(q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 16, 8, generator=g) for _ in range(3))
    cpu = torch.compile(attend)(q, k, v)
    torch._dynamo.reset()
    zion = torch.compile(attend)(q.to("zion"), k.to("zion"), v.to("zion"))
    assert torch.equal(zion.cpu(), cpu)


def test_random_ops_compiled_on_zion_draw_what_a_cpu_compile_draws():
    def noisy(x):
        return nn.functional.dropout(x * 2, p=0.5, training=True) + torch.rand_like(x)

    x = torch.randn(1000)
    torch.manual_seed(3)  # seeds the CPU generator and zion's, which holds a CPU generator's state
    on_cpu = torch.compile(noisy)(x)
    torch._dynamo.reset()
    torch.manual_seed(3)
    on_zion = torch.compile(noisy)(x.to("zion"))

    assert torch.equal(on_zion.cpu(), on_cpu)


def pointwise_block(x):
    y = x * torch.sigmoid(x)
    z = y * 0.5 + x
    return z.relu()


def modeled(fn, x):
    """Modeled seconds from an idle device to the end of fn(x), and the
    counters it added."""
    torch.zion.synchronize()
    start, before = zion_emu.clock(), counters()
    out = fn(x)
    torch.zion.synchronize()
    after = counters()
    return out, zion_emu.clock() - start, after, before


def test_a_compiled_pointwise_block_is_one_kernel_reading_x_and_writing_out_once():
    p = zion_emu.current_platform()
    stream_bytes_per_s = p.get("oam.hbm_bandwidth_gb_per_s") * 1e9 * p.get("oam.efficiency.elementwise")
    launch_s = p.get("oam.launch_overhead_ns") * 1e-9
    n = 1 << 22  # fp32 elements: 16 MiB
    x = torch.randn(n, device="zion")
    compiled = torch.compile(pointwise_block)
    compiled(x)  # compiles

    eager_out, eager_s, e1, e0 = modeled(pointwise_block, x)
    compiled_out, compiled_s, c1, c0 = modeled(compiled, x)

    # Eager: five kernels, each reading its inputs and writing its output:
    # sigmoid x->s (2n), mul x,s->y (3n), mul y->t (2n), add t,x->z (3n), relu z->out (2n).
    eager_bytes = 4 * n * (2 + 3 + 2 + 3 + 2)
    # Compiled: one fused kernel reading x and writing out.
    compiled_bytes = 4 * n * 2
    assert e1.ops - e0.ops == 5 and e1.bytes - e0.bytes == eager_bytes and e1.compiled_kernels == e0.compiled_kernels
    assert c1.ops - c0.ops == 1 and c1.compiled_kernels - c0.compiled_kernels == 1
    assert c1.bytes - c0.bytes == compiled_bytes
    # Memory-bound: its FLOPs (one per op per element) take far less than its bytes.
    compute_s = (c1.flops - c0.flops) / (p.get("oam.peak_flops.fp32") * p.get("oam.efficiency.elementwise"))
    assert c1.flops - c0.flops == 5 * n and compute_s < compiled_bytes / stream_bytes_per_s
    # Each kernel outlasts a launch, so the stream runs them back to back
    # after the first launch: launch + bytes / (HBM bandwidth x efficiency).
    assert eager_s == pytest.approx(launch_s + eager_bytes / stream_bytes_per_s, rel=1e-9)
    assert compiled_s == pytest.approx(launch_s + compiled_bytes / stream_bytes_per_s, rel=1e-9)
    assert c1.compiled_busy_s - c0.compiled_busy_s == pytest.approx(compiled_bytes / stream_bytes_per_s, rel=1e-9)
    assert compiled_s < eager_s / 5
    # CPU's vectorized kernel against ATen's: sigmoid may differ by an ulp.
    torch.testing.assert_close(compiled_out.cpu(), eager_out.cpu(), rtol=1.3e-6, atol=1e-5)


def compiled_bytes(fn, *args):
    """Kernels and bytes one call of ``torch.compile(fn)`` adds, after the
    compiling call; and its result beside eager CPU's."""
    compiled = torch.compile(fn)
    compiled(*args)
    torch.zion.synchronize()
    before = counters()
    out = compiled(*args)
    torch.zion.synchronize()
    after = counters()
    torch.testing.assert_close(out.cpu(), fn(*(a.cpu() for a in args)))
    return after.compiled_kernels - before.compiled_kernels, after.bytes - before.bytes


def test_a_compiled_kernel_is_charged_the_elements_it_touches_not_its_whole_arguments():
    # A slice: 4096 rows x 8 of a 4096 x 4096 float tensor read, as many written.
    x = torch.randn(4096, 4096, device="zion")
    assert compiled_bytes(lambda t: t[:, :8] * 2 + 1, x) == (1, 4096 * 8 * 4 * 2)
    # A gather: 256 rows of 64 floats from a table of 2^20 rows, the 256
    # int64 indices, and the 256 x 64 output.
    table = torch.randn(1 << 20, 64, device="zion")
    idx = torch.randint(0, 1 << 20, (256,), device="zion")
    lookup = 256 * 64 * 4 + 256 * 8
    assert compiled_bytes(lambda w, i: torch.nn.functional.embedding(i, w) * 2, table, idx) == (1, lookup + 256 * 64 * 4)
    # Gathered and summed in the kernel: the output is 256 floats.
    assert compiled_bytes(lambda w, i: w[i].sum(dim=1), table, idx) == (1, lookup + 256 * 4)
    # A row broadcast along a dimension is read once: 1024 x 1024 plus 1024, written 1024 x 1024.
    a, row = torch.randn(1024, 1024, device="zion"), torch.randn(1024, device="zion")
    assert compiled_bytes(lambda t, r: t * r + 1, a, row) == (1, (2 * 1024 * 1024 + 1024) * 4)
    # x + x.T reads x in two orders: still each element once, at most the whole buffer.
    sq = torch.randn(2048, 2048, device="zion")
    assert compiled_bytes(lambda t: t + t.t(), sq) == (1, 2 * 2048 * 2048 * 4)
    # A write into a slice of an input, in place: the kernel writes the 8 columns under the name of the node that
    # mutates the input, and reads nothing.
    def fill(t):
        t[:, :8] = 1.0

    compiled_fill = torch.compile(fill)
    cpu = x.cpu()
    fill(cpu)
    compiled_fill(x)
    torch.zion.synchronize()
    before = counters()
    compiled_fill(x)
    torch.zion.synchronize()
    after = counters()
    assert (after.compiled_kernels - before.compiled_kernels, after.bytes - before.bytes) == (1, 4096 * 8 * 4)
    assert torch.equal(x.cpu(), cpu)


def test_with_dynamic_shapes_a_gather_is_charged_at_most_its_whole_table():
    compiled = torch.compile(lambda w, i: w[i] * 2, dynamic=True)
    for rows, lookups in ((100, 50), (20, 50), (30, 400)):
        table = torch.randn(rows, 16, device="zion")
        idx = torch.randint(0, rows, (lookups,), device="zion")
        compiled(table, idx)
        torch.zion.synchronize()
        before = counters()
        compiled(table, idx)
        torch.zion.synchronize()
        after = counters()
        # min(rows looked up, rows in the table) read, the indices, the output
        expected = min(lookups, rows) * 16 * 4 + lookups * 8 + lookups * 16 * 4
        assert after.compiled_kernels - before.compiled_kernels == 1 and after.bytes - before.bytes == expected


def test_a_compile_after_zions_pricing_changed_does_not_reuse_the_cached_wrapper(monkeypatch):
    from zion_emu.inductor.compile_fx import CacheSalt

    cache = torch._dynamo.utils.counters["inductor"]
    x = torch.randn(64, device="zion")
    torch.compile(pointwise_block)(x)
    torch._dynamo.reset()
    hits = cache["fxgraph_cache_hit"]
    torch.compile(pointwise_block)(x)  # the same pricing: inductor's FX graph cache has it
    assert cache["fxgraph_cache_hit"] == hits + 1
    torch._dynamo.reset()
    monkeypatch.setattr(CacheSalt, "pricing", CacheSalt.pricing + " changed")
    hits, misses = cache["fxgraph_cache_hit"], cache["fxgraph_cache_miss"]
    torch.compile(pointwise_block)(x)
    assert cache["fxgraph_cache_hit"] == hits and cache["fxgraph_cache_miss"] == misses + 1


def test_with_dynamic_shapes_a_kernel_is_priced_from_the_sizes_it_runs_at():
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    compiled = torch.compile(pointwise_block, dynamic=True)
    for n in (1000, 1500, 4096):  # one graph: its byte count is 8 * s0
        x = torch.randn(n, device="zion")
        before = counters()
        out = compiled(x)
        after = counters()
        assert after.compiled_kernels - before.compiled_kernels == 1
        assert after.bytes - before.bytes == 4 * n * 2 and after.flops - before.flops == 5 * n
        torch.testing.assert_close(out.cpu(), pointwise_block(x.cpu()), rtol=1.3e-6, atol=1e-5)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] - graphs == 1


def test_a_graph_inductor_cannot_take_for_zion_runs_op_by_op_after_one_warning():
    def returns_a_cpu_tensor(t):
        return t.relu() * 2, torch.arange(4)  # made with no device: a CPU tensor out of a zion graph

    x = torch.randn(16, device="zion")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out, positions = torch.compile(returns_a_cpu_tensor)(x)
    zion_warnings = [w for w in caught if str(w.message).startswith("zion:")]

    assert len(zion_warnings) == 1
    assert "returns a CPU tensor" in str(zion_warnings[0].message) and "runs op by op" in str(zion_warnings[0].message)
    assert out.is_zion and torch.equal(out.cpu(), x.cpu().relu() * 2)
    assert positions.device.type == "cpu" and torch.equal(positions, torch.arange(4))


def test_autocast_around_or_inside_a_compiled_zion_graph_casts_as_eager_zion_does():
    # Lowered as CPU, an autocast around the call cast nothing (float32 out, values off by 0.03 from eager's
    # bfloat16), and one inside took the CPU's op lists (exp in float16, where zion's, CUDA's, runs it in
    # float32). Such graphs now run op by op, which casts through zion's autocast, with a warning.
    torch.manual_seed(0)
    x, w = torch.randn(4, 8, device="zion", requires_grad=True), torch.randn(8, 8, device="zion")

    def around(a, b):
        y = a @ b
        return y, y.exp().sum(0)

    def inside(a, b):
        with torch.autocast("zion", dtype=torch.float16):
            return around(a, b)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.autocast("zion", dtype=torch.bfloat16):
            compiled, eager = torch.compile(around)(x, w), around(x, w)
        compiled_inside, eager_inside = torch.compile(inside)(x, w), inside(x, w)
    reasons = [str(m.message) for m in caught if str(m.message).startswith("zion:")]
    assert len(reasons) == 2 and "autocast is on around the call" in reasons[0]
    assert "opens a zion autocast region" in reasons[1]
    for got, want in ((compiled, eager), (compiled_inside, eager_inside)):
        assert [t.dtype for t in got] == [t.dtype for t in want]
        assert all(torch.equal(g.detach().cpu(), e.detach().cpu()) for g, e in zip(got, want))
    assert [t.dtype for t in eager] == [torch.bfloat16, torch.float32]  # zion's lists: exp and sum in float32
    assert [t.dtype for t in eager_inside] == [torch.float16, torch.float32]
    compiled_inside[1].sum().backward()
    grad = x.grad.clone()
    x.grad = None
    eager_inside[1].sum().backward()
    assert torch.equal(grad.cpu(), x.grad.cpu())


def test_cpp_wrapper_runs_op_by_op_after_one_warning():
    x = torch.randn(16, device="zion", requires_grad=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = torch.compile(lambda t: (t * torch.sigmoid(t)).sum(), options={"cpp_wrapper": True})(x)
        out.backward()
    zion_warnings = [str(w.message) for w in caught if str(w.message).startswith("zion:")]

    assert len(zion_warnings) == 1 and "cpp_wrapper is set" in zion_warnings[0]
    s = torch.sigmoid(x.detach().cpu())
    torch.testing.assert_close(x.grad.cpu(), s * (1 + x.detach().cpu() * (1 - s)), rtol=0, atol=1e-6)


def test_the_report_counts_compiled_kernels_per_device():
    from zion_emu import report, report_text

    x = torch.randn(1 << 16, device="zion")
    compiled = torch.compile(pointwise_block)
    compiled(x)
    zion_emu.reset_clock()
    for _ in range(3):
        compiled(x)
    run = report.merge([report.snapshot(keep_spans=False)])

    (device,) = [d for d in run.devices if d.device == 0]  # other tests may have used other devices
    c = counters(0)
    assert device.compiled_kernels == c.compiled_kernels == 3 and device.compiled_busy_s == c.compiled_busy_s > 0
    assert report.RunReport.from_json(run.to_json()).devices[0].compiled_kernels == 3
    text = report_text.format_text(run)
    assert "torch.compile kernels" in text
    (row,) = [line for line in text.splitlines() if line.strip().startswith("zion:0") and " 3 " in line
              and "100.0 %" in line]
    assert row


def test_a_compiled_model_under_zion_emu_run_is_one_graph_of_compiled_kernels(tmp_path):
    # run tracks inference forwards with global module hooks; inside a graph
    # Dynamo traces they must do nothing (a lock there broke the graph at
    # every submodule, so the model ran eagerly: 0 compiled kernels).
    from processes import child_env, zion_emu_cli

    script = tmp_path / "compiled.py"
    script.write_text(
        "import torch, zion_emu\n"
        "from torch._dynamo.utils import counters\n"
        "m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)).to('zion')\n"
        "x = torch.randn(8, 16, device='zion')\n"
        "compiled = torch.compile(m)\n"
        "for _ in range(2):\n"
        "    compiled(x).sum().backward()\n"
        "with torch.no_grad():\n"
        "    compiled.eval()(x).cpu()\n"
        "print('graphs', counters['stats']['unique_graphs'], 'breaks', sum(counters['graph_break'].values()),\n"
        "      'kernels', zion_emu.counters(0).compiled_kernels)\n")
    done = zion_emu_cli("run", "--quiet-report", str(script), timeout_s=300,
                        env=child_env(TORCHINDUCTOR_CACHE_DIR=os.environ["TORCHINDUCTOR_CACHE_DIR"]))
    (line,) = [line.split() for line in done.stdout.splitlines() if line.startswith("graphs ")]
    assert line[:4] == ["graphs", "2", "breaks", "0"] and int(line[5]) > 0, done.stdout


def test_the_cpus_autocast_and_copies_to_the_cpu_in_a_zion_graph_behave_as_in_eager_mode():
    # Lowered as CPU, a graph under the CPU's autocast took its casts (bfloat16 where eager zion, like CUDA,
    # gives float32), and x.cpu() inside a graph was a no-op: its copies' modeled time and bytes were lost.
    torch.manual_seed(0)
    x, w = torch.randn(8, 16, device="zion"), torch.randn(16, 16, device="zion")

    def mm_relu(a, b):
        return torch.mm(a, b).relu()

    def mm_relu_inside(a, b):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return torch.mm(a, b).relu()

    def round_trip(a):
        return (a.cpu() * 2).to(a.device) + 1

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.autocast("cpu", dtype=torch.bfloat16):
            around = torch.compile(mm_relu)(x, w)
        inside = torch.compile(mm_relu_inside)(x, w)
        compiled_round_trip = torch.compile(round_trip)
        compiled_round_trip(x)
        made_on_zion = torch.compile(lambda: torch.ones(4).zion() * 2)()
    reasons = [str(m.message) for m in caught if str(m.message).startswith("zion:")]
    assert "the CPU's autocast is on around the call" in reasons[0]
    assert "the graph opens a CPU autocast region" in reasons[1]
    assert "the graph calls .cpu()" in reasons[2] and "the graph calls .zion()" in reasons[3]
    want = mm_relu(x, w)
    assert around.dtype == inside.dtype == torch.float32
    assert torch.equal(around.cpu(), want.cpu()) and torch.equal(inside.cpu(), want.cpu())
    assert made_on_zion.is_zion and made_on_zion.tolist() == [2.0] * 4

    def modeled(fn):
        torch.zion.synchronize()
        start, copied = zion_emu.clock(), zion_emu.counters(0).copy_bytes
        out = fn(x)
        torch.zion.synchronize()
        return out, zion_emu.clock() - start, zion_emu.counters(0).copy_bytes - copied

    eager_out, eager_time, eager_bytes = modeled(round_trip)
    out, time, copied = modeled(compiled_round_trip)
    assert torch.equal(out.cpu(), eager_out.cpu())
    assert copied == eager_bytes == 2 * x.numel() * 4 and time == pytest.approx(eager_time)


def test_in_timing_only_mode_a_zion_graph_runs_op_by_op_and_says_why():
    # Inductor's kernels would run on tensors without bytes (it crashed the
    # process); op by op, zion prices them without bytes.
    from processes import child_env, run_python

    done = run_python("""
        import warnings
        import torch, zion_emu
        m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)).to("zion")
        x = torch.randn(8, 16, device="zion")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.compile(m)(x).sum().backward()
        assert zion_emu.mode() == "timing" and m[0].weight.grad is not None
        print(zion_emu.inductor.fallbacks()[0])
        print(any("runs op by op on zion instead" in str(w.message) for w in caught), zion_emu.clock() > 0)
    """, timeout_s=300, env=child_env(ZION_MODE="timing", TORCHINDUCTOR_CACHE_DIR=os.environ["TORCHINDUCTOR_CACHE_DIR"]))
    assert done.stdout.splitlines() == ["timing-only mode: compiled kernels would run on tensors that hold no bytes",
                                        "True True"], done.stdout + done.stderr


def test_torch_zion_comm_and_data_parallel_under_compile_break_the_graph_at_the_copies():
    # The batched copy (torch.ops.zion.copy_batch) was traced into the graph and reached a fake tensor's
    # data pointer; as at torch.cuda.comm's C functions, the graph now breaks there.
    x = torch.arange(4.0, device="zion")
    copies = torch.compile(lambda t: torch.zion.comm.broadcast(t, [0, 1])[1] * 2)(x)
    assert copies.device == torch.device("zion:1") and copies.tolist() == [0.0, 2.0, 4.0, 6.0]
    torch.manual_seed(0)
    model = nn.Linear(4, 3).to("zion")
    batch = torch.randn(8, 4, device="zion")
    replicated = torch.compile(nn.DataParallel(model, device_ids=[0, 1]))(batch)
    assert torch.equal(replicated.detach().cpu(), model(batch).detach().cpu())


def test_checkpointed_and_conditional_bodies_compile_for_zion_as_for_the_cpu():
    # A higher-order op's body (torch.utils.checkpoint's wrap_body, torch.cond's branches) was taken for a tensor
    # attribute: the whole graph ran op by op, no fused kernel, and gradients differed from a CPU compile.
    from torch.utils.checkpoint import checkpoint

    def checkpointed(m, x):
        return checkpoint(m, x, use_reentrant=False).sum()

    def conditional(m, x):
        return torch.cond(x.sum() > 0, lambda t: t.sin(), lambda t: t.cos(), (m(x),)).sum()

    torch.manual_seed(0)
    cpu_model = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 32))
    x = torch.randn(16, 32)
    fallbacks = len(zion_emu.inductor.fallbacks())
    for fn in (checkpointed, conditional):
        grads = []
        for device in ("cpu", "zion"):
            torch._dynamo.reset()
            model = copy.deepcopy(cpu_model).to(device)
            xd = x.clone().to(device).requires_grad_()
            kernels = zion_emu.counters(0).compiled_kernels
            loss = torch.compile(fn)(model, xd)
            loss.backward()
            grads.append((loss.detach().cpu(), xd.grad.cpu(), model[0].weight.grad.cpu()))
        assert zion_emu.counters(0).compiled_kernels > kernels, fn.__name__
        assert all(torch.equal(c, z) for c, z in zip(*grads)), fn.__name__
    assert len(zion_emu.inductor.fallbacks()) == fallbacks


def test_a_compiled_optimizer_step_runs_op_by_op_as_its_eager_step_and_costs_the_same():
    # It went to aot_eager, whose functionalized graph copied every parameter and momentum buffer back:
    # a compiled SGD step modeled 100 us against the eager step's 60.
    def train(compiled: bool) -> tuple[list[torch.Tensor], list[float]]:
        torch._dynamo.reset()
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1)).to("zion")
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        step = torch.compile(opt.step) if compiled else opt.step
        x = torch.randn(8, 16, device="zion")
        times = []
        for _ in range(3):
            opt.zero_grad()
            model(x).sum().backward()
            torch.zion.synchronize()
            start = zion_emu.clock()
            step()
            torch.zion.synchronize()
            times.append(zion_emu.clock() - start)
        return [p.detach().cpu() for p in model.parameters()], times

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compiled_params, compiled_times = train(True)
    eager_params, eager_times = train(False)
    assert all(torch.equal(c, e) for c, e in zip(compiled_params, eager_params))
    assert compiled_times == pytest.approx(eager_times)
    assert "tensor attribute" in zion_emu.inductor.fallbacks()[-1]


def test_importing_zion_emu_leaves_dynamo_unimported_and_importing_dynamo_installs_the_graph_break():
    # torch._dynamo costs seconds to import (about 3 s of each rank's start on 2 cores); zion_emu marks its
    # batched copies for dynamo only once something imports it. Unmarked, this compile fails on fake tensors.
    from processes import run_python

    done = run_python("""
        import sys, torch, zion_emu
        print("torch._dynamo" in sys.modules)
        x = torch.arange(4.0, device="zion")
        y = torch.compile(lambda t: torch.zion.comm.broadcast(t, [0, 1])[1] * 2, backend="eager")(x)
        print(y.device, y.tolist())
    """, timeout_s=300)
    assert done.stdout.splitlines() == ["False", "zion:1 [0.0, 2.0, 4.0, 6.0]"], done.stdout + done.stderr
