"""The zion device's Python API: torch.accelerator, torch.zion in the shape of
torch.cuda, random numbers, device properties, the platform, the virtual clock
and counters, and pricing ops from Python.

Numbers are the zion preset's: 8 OAMs, 32 GiB HBM each at 1000 GB/s, fp32
peak 15 TFLOP/s, bf16 120 TFLOP/s, matmul efficiency 0.6, launch 5 us."""

import textwrap

import pytest
import torch

import zion_emu  # noqa: F401  (registers the device)
from zion_emu import cost
from zion_emu.timeline import clock, counters, reset_clock
from processes import PYTHON, child_env, run, run_python

GIB = 1 << 30


@pytest.fixture
def on_device_0():
    """Tests that change the current device leave device 0 current."""
    yield
    torch.zion.set_device(0)


# torch.accelerator
def test_torch_accelerator_is_zion():
    assert torch.accelerator.is_available()
    assert torch.accelerator.current_accelerator() == torch.device("zion")
    assert torch.accelerator.device_count() == torch.zion.device_count() == 8


def test_current_device_is_one_setting_for_torch_accelerator_and_torch_zion(on_device_0):
    torch.accelerator.set_device_index(3)
    assert torch.zion.current_device() == 3 and torch.accelerator.current_device_index() == 3
    assert torch.empty(1, device="zion").device == torch.device("zion", 3)
    torch.zion.set_device("zion:1")
    assert torch.accelerator.current_device_index() == 1
    with torch.accelerator.device_index(5):
        assert torch.zion.current_device() == 5
    with torch.zion.device(2):
        assert torch.accelerator.current_device_index() == 2
    assert torch.zion.current_device() == 1


def test_synchronize_brings_the_host_clock_to_the_device():
    a = torch.randn(1024, 1024, device="zion")
    torch.accelerator.synchronize()
    before = clock()
    a @ a  # 2*1024^3 / (15e12 * 0.6) = 238.6 us on the device; the host only pays the 5 us launch
    assert clock() == pytest.approx(before + 5e-6, abs=1e-12)
    torch.accelerator.synchronize()
    assert clock() == pytest.approx(before + 5e-6 + 2 * 1024**3 / 9e12, rel=1e-9)


def test_torch_accelerator_memory_functions_read_the_hbm_pool():
    index = 4
    torch.accelerator.reset_peak_memory_stats(index)
    base = torch.accelerator.memory_allocated(index)
    assert base == torch.zion.memory_allocated(index)
    x = torch.empty(1024, device=f"zion:{index}")  # 4 KiB
    assert torch.accelerator.memory_allocated(index) == torch.zion.memory_allocated(index) == base + 4096
    assert torch.accelerator.memory_reserved(index) == torch.zion.memory_reserved(index)
    del x
    assert torch.accelerator.max_memory_allocated(index) == torch.zion.max_memory_allocated(index) == base + 4096
    stats = torch.zion.memory_stats(index)
    assert stats["allocated_bytes.all.current"] == base
    assert stats["allocated_bytes.all.peak"] == base + 4096
    assert stats["capacity_bytes"] == 32 * GIB
    torch.zion.reset_peak_memory_stats(index)
    assert torch.zion.max_memory_allocated(index) == base
    free, total = torch.accelerator.get_memory_info(index)
    assert (free, total) == torch.zion.mem_get_info(index) == (32 * GIB - base, 32 * GIB)


def test_torch_accelerators_memory_calls_work_as_a_processs_first_zion_call():
    # As torch.cuda's initialize CUDA, they start the device; before, the pools did not exist yet.
    out = run_python("""
import torch, zion_emu
torch.accelerator.reset_peak_memory_stats(4)
print(torch.accelerator.memory_allocated(4), torch.accelerator.max_memory_allocated(4))
print(torch.accelerator.get_memory_info(4)[1] == torch.zion.get_device_properties(4).total_memory)
""").stdout.split()
    assert out == ["0", "0", "True"]


def test_memory_summary_is_torch_cudas_table_for_the_device():
    summary = torch.zion.memory_summary("zion:6")
    assert "PyTorch zion memory summary, device ID 6" in summary and "| Allocated memory      |" in summary
    assert summary == torch.zion.memory_summary(torch.device("zion", 6))  # test_memory_summary.py: the figures


# Streams and events
def test_current_stream_and_stream_context():
    default = torch.zion.current_stream()
    assert default.stream_id == 0 and default.device == torch.device("zion", 0)
    s = torch.zion.Stream()
    with torch.zion.stream(s):
        assert torch.zion.current_stream() == s
        assert torch.accelerator.current_stream() == s
    assert torch.zion.current_stream() == default
    # A stream of another device makes that device current inside, as
    # torch.cuda.stream does, and both come back after.
    other = torch.zion.Stream(6)
    with torch.zion.stream(other):
        assert torch.zion.current_device() == 6 and torch.zion.current_stream() == other
    assert torch.zion.current_device() == 0 and torch.zion.current_stream(6).stream_id == 0


def test_torch_cudas_other_stream_and_memory_names_are_on_torch_zion_too():
    # They existed only under --cuda-compat, as torch.cuda's.
    s = torch.zion.Stream(5)
    with torch.zion.StreamContext(s):
        assert torch.zion.current_device() == 5 and torch.zion.current_stream() == s
        assert torch.zion.default_stream().stream_id == 0 and torch.zion.default_stream().device_index == 5
    assert torch.zion.current_device() == 0 and torch.zion.current_stream(5).stream_id == 0
    with torch.zion.StreamContext(None):
        assert torch.zion.current_stream().stream_id == 0
    torch.zion.set_stream(s)  # as torch.cuda.set_stream, its device becomes current too
    try:
        assert torch.zion.current_stream(5) == s and torch.zion.current_device() == 5
    finally:
        torch.zion.set_stream(torch.zion.default_stream(5))
        torch.zion.set_device(0)
    assert torch.zion.current_stream(5).stream_id == 0
    assert torch.zion.is_current_stream_capturing() is False
    x = torch.ones(3, device="zion:2")
    with torch.zion.device_of(x):
        assert torch.zion.current_device() == 2
    with torch.zion.device_of(torch.ones(3)):
        assert torch.zion.current_device() == 0
    nested = torch.zion.memory_stats_as_nested_dict(2)
    assert nested["allocated_bytes"]["all"]["current"] == torch.zion.memory_stats(2)["allocated_bytes.all.current"]
    torch.zion.reset_max_memory_allocated(2)
    assert torch.zion.max_memory_allocated(2) == torch.zion.memory_allocated(2)
    assert torch.zion.is_bf16_supported() == ("bf16" in torch.zion.get_device_properties().peak_flops)
    assert isinstance(torch.zion.memory_snapshot(), list)


def test_streams_and_events_are_classes_for_isinstance_and_device_minus_one_does_nothing():
    s, e = torch.zion.Stream(), torch.zion.Event(enable_timing=True)
    assert isinstance(s, torch.zion.Stream) and isinstance(s, torch.Stream) and isinstance(e, torch.zion.Event)
    assert isinstance(torch.zion.current_stream(3), torch.zion.Stream)
    assert not isinstance(torch.Stream(device="cpu"), torch.zion.Stream) and not isinstance(s, torch.zion.Event)
    with torch.zion.device(-1), torch.zion.device(None):  # torch.cuda.device's "no change"
        assert torch.zion.current_device() == 0
    with pytest.raises(ValueError, match="interprocess events are not supported"):
        torch.zion.Event(interprocess=True)  # it was made, and ignored the flag
    props = torch.zion.get_device_properties(0)
    assert getattr(props, "major", None) is None  # a CUDA capability check reads no number
    with pytest.raises(AttributeError, match="an OAM has no CUDA compute capability"):
        props.minor


def test_host_memory_peaks_are_reset_as_torch_cudas_are():
    from zion_emu import sockets
    socket = sockets.current_socket()
    pinned = torch.empty(1 << 20).pin_memory()  # 4 MiB in the current socket's DDR
    assert torch.zion.host_memory_stats()[f"ddr.socket_{socket}.in_use_bytes"] >= 4 << 20
    del pinned
    torch.zion.reset_peak_memory_stats()  # the device's HBM, not the DDR
    assert torch.zion.memory_stats()[f"ddr.socket_{socket}.peak_bytes"] >= 4 << 20
    torch.zion.reset_peak_host_memory_stats()
    stats = torch.zion.memory_stats()
    assert stats[f"ddr.socket_{socket}.peak_bytes"] == stats[f"ddr.socket_{socket}.in_use_bytes"]
    assert stats["num_device_alloc"] == stats["segment.all.allocated"]  # each allocation is its own segment
    assert stats["num_device_free"] == stats["segment.all.freed"]
    x = torch.empty(16, device="zion")
    assert torch.zion.memory_stats()["num_device_alloc"] == stats["num_device_alloc"] + 1
    torch.zion.reset_accumulated_memory_stats()
    assert torch.zion.memory_stats()["allocation.all.allocated"] == 0
    del x


def test_a_stream_that_does_not_exist_is_refused_and_the_current_one_stays():
    zion_type = torch.zion.current_stream().device_type  # torch.Stream's number for the zion backend
    made = torch.zion.Stream(1)
    for stream_id in (made.stream_id + 1, 1000, -3):
        bogus = torch.Stream(stream_id=stream_id, device_index=1, device_type=zion_type)
        with pytest.raises(RuntimeError, match=f"zion: stream {stream_id} does not exist on zion:1"):
            torch.accelerator.set_stream(bogus)  # makes zion:1 current first, as torch documents
        assert torch.zion.current_stream(1).stream_id == 0
        torch.zion.set_device(0)
    # A stream made there is taken, and the default stream (0), which every device has, again.
    for stream in (made, torch.Stream(stream_id=0, device_index=1, device_type=zion_type)):
        torch.accelerator.set_stream(stream)
        assert torch.zion.current_device() == 1 and torch.zion.current_stream() == stream
    torch.zion.set_device(0)


def test_event_elapsed_time_is_modeled_milliseconds():
    a = torch.randn(512, 512, device="zion")
    torch.zion.synchronize()
    start, end = torch.zion.Event(enable_timing=True), torch.zion.Event(enable_timing=True)
    start.record()
    a @ a
    end.record()
    end.synchronize()
    assert start.elapsed_time(end) == pytest.approx((2 * 512**3 / 9e12 + 5e-6) * 1e3, rel=1e-9)


def test_elapsed_time_between_two_devices_events_is_refused_as_cuda_refuses_it():
    start, end = torch.zion.Event(enable_timing=True), torch.zion.Event(enable_timing=True)
    start.record(torch.zion.current_stream(0))
    end.record(torch.zion.current_stream(1))
    torch.zion.synchronize(0), torch.zion.synchronize(1)
    with pytest.raises(RuntimeError, match="elapsed_time takes two events of one device, as CUDA's does; these were "
                                           "recorded on zion:0 and zion:1"):
        start.elapsed_time(end)


# Random numbers
def test_a_seed_draws_the_same_numbers_twice_and_the_same_as_on_cpu():
    torch.zion.manual_seed(7)
    first = torch.randn(5, device="zion")
    torch.zion.manual_seed(7)
    second = torch.randn(5, device="zion")
    torch.manual_seed(7)  # seeds the CPU and every zion device
    on_cpu = torch.randn(5)
    third = torch.randn(5, device="zion")
    assert torch.equal(first.cpu(), second.cpu())
    assert torch.equal(first.cpu(), on_cpu) and torch.equal(third.cpu(), on_cpu)
    assert torch.zion.initial_seed() == 7


def test_rng_state_round_trips(on_device_0):
    torch.zion.set_device(2)
    torch.zion.manual_seed(11)
    state = torch.zion.get_rng_state()
    assert torch.equal(state, torch.zion.get_rng_state("zion:2"))
    first = torch.rand(4, device="zion")
    torch.zion.set_rng_state(state)
    assert torch.equal(torch.rand(4, device="zion").cpu(), first.cpu())

    states = torch.zion.get_rng_state_all()
    assert len(states) == 8
    draws = [torch.rand(3, device=f"zion:{i}").cpu() for i in range(8)]
    torch.zion.set_rng_state_all(states)
    assert all(torch.equal(torch.rand(3, device=f"zion:{i}").cpu(), draws[i]) for i in range(8))


def test_default_generators_are_the_ones_random_ops_use():
    g = torch.zion.default_generators[3]
    assert g.device == torch.device("zion", 3)
    g.manual_seed(5)
    drawn = torch.randn(4, device="zion:3")
    assert torch.equal(drawn.cpu(), torch.randn(4, generator=torch.Generator().manual_seed(5)))
    torch.zion.seed()  # a fresh non-deterministic seed on the current device
    assert torch.zion.initial_seed() == torch.zion.default_generators[0].initial_seed()


def test_a_new_generator_is_independent_of_the_default():
    g = torch.Generator(device="zion").manual_seed(3)
    torch.zion.manual_seed(3)
    a = torch.randn(4, device="zion", generator=g)
    b = torch.randn(4, device="zion")
    assert torch.equal(a.cpu(), b.cpu())


def test_a_generator_copies_pickles_and_saves_with_its_state_and_has_no_offset(tmp_path):
    # deepcopy, pickle and torch.save raised SystemError ("CPU Generator does not use offset"): torch pickles a
    # non-CPU generator with its offset. A zion generator's offset is 0; its state is the CPU generator's.
    import copy
    import pickle

    g = torch.Generator(device="zion").manual_seed(3)
    torch.randn(5, device="zion", generator=g)  # moved on from the seed
    assert g.get_offset() == 0
    torch.save(g, tmp_path / "g.pt")
    cpu = torch.Generator().manual_seed(3)
    torch.randn(5, generator=cpu)
    next_draw = torch.randn(4, generator=cpu)  # where g stands: 5 numbers past the seed
    for twin in (copy.deepcopy(g), pickle.loads(pickle.dumps(g)), torch.load(tmp_path / "g.pt", weights_only=False)):
        assert twin.device == torch.device("zion", 0) and twin.initial_seed() == 3
        assert torch.equal(torch.randn(4, device="zion", generator=twin).cpu(), next_draw)
    g.set_offset(0)
    with pytest.raises(NotImplementedError, match=r"zion generator set_offset\(4\): .* no Philox offset .* "
                                                  r"get_state\(\) / set_state\(\)"):
        g.set_offset(4)


@pytest.mark.parametrize("draw", [
    lambda g: torch.randn(3, device="zion", generator=g),
    lambda g: torch.empty(3, device="zion").normal_(generator=g),
    lambda g: torch.empty(3, device="zion").bernoulli_(0.5, generator=g),
    lambda g: torch.randperm(5, device="zion", generator=g),
], ids=["randn", "normal_", "bernoulli_", "randperm"])
def test_a_cpu_generator_is_refused_for_a_zion_op_as_cuda_refuses_it(draw):
    # The script would fail on the device it is written for.
    cpu = torch.Generator().manual_seed(1)
    with pytest.raises(RuntimeError, match="Expected a 'zion' device type for generator but found 'cpu'"):
        draw(cpu)
    assert torch.equal(cpu.get_state(), torch.Generator().manual_seed(1).get_state())  # nothing drawn from it
    zion = torch.Generator(device="zion").manual_seed(1)
    assert torch.equal(draw(zion).cpu(), draw(torch.Generator(device="zion").manual_seed(1)).cpu())


# Device properties and the platform
def test_device_properties_are_the_platform_preset():
    p = torch.zion.get_device_properties("zion:1")
    assert p.name == torch.zion.get_device_name(1) == "zion OAM"
    assert p.index == 1 and p.platform == "zion"
    assert p.total_memory == 32 * GIB
    assert p.hbm_bandwidth_bytes_per_s == 1000e9
    assert p.peak_flops == {"fp32": 15e12, "tf32": 15e12, "bf16": 120e12, "fp16": 120e12, "int8": 240e12}
    assert p.peak_flops_for(torch.bfloat16) == 120e12
    assert p.launch_overhead_s == 5e-6
    assert p.multi_processor_count == 1
    assert torch.zion.get_amp_supported_dtype() == [torch.bfloat16, torch.float16]
    assert zion_emu.current_platform().get("oam.hbm_bytes") == 32 * GIB


def test_set_platform_before_first_use_and_refused_after():
    out = run_python("""
        import torch, zion_emu
        from zion_emu import cost
        from zion_emu.platform import set_platform
        cost.register("aten::erfinv", {"flops": 1, "bytes": 2})
        set_platform("zion", overrides={"oam.hbm_bytes": 1 << 30})
        print(torch.zion.get_device_properties().total_memory)
        set_platform("hgx-h100")
        print(torch.zion.get_device_name(), cost.has_formula("aten::erfinv"))
        x = torch.ones(3, device="zion")
        try:
            set_platform("zion")
        except RuntimeError as e:
            print(e)
    """).stdout
    lines = out.splitlines()
    assert lines[0] == str(1 << 30)
    assert lines[1] == "hgx-h100 OAM True"  # formulas registered from Python carry over
    assert lines[2] == ("zion: set_platform must come before any zion tensor is made; 12 bytes are allocated on "
                        "the current platform 'hgx-h100'")


def test_set_platform_makes_zion_0_and_its_default_stream_current_again():
    """A device or stream made current under the old platform may not exist on
    the new one (zion:7 of 4 devices aborted the process at the next op)."""
    out = run_python("""
        import threading
        import torch, zion_emu
        torch.zion.set_device(7)
        four = {"oam.count": 4, "pcie.switches.2.oams": [], "pcie.switches.3.oams": [],
                "fabric.topology": "fully_connected"}
        seen = []
        def other_thread():
            torch.zion.set_device(5)
            torch.accelerator.set_stream(torch.zion.Stream(device=5))
            done.set(); go.wait()
            seen.append((torch.zion.current_device(), torch.accelerator.current_stream().stream_id))
        done, go = threading.Event(), threading.Event()
        t = threading.Thread(target=other_thread); t.start(); done.wait()
        zion_emu.set_platform("zion", overrides=four)
        print(torch.zion.current_device(), torch.empty(1, device="zion").device)
        torch.accelerator.set_stream(torch.zion.Stream(device=0))
        print(torch.accelerator.current_stream().stream_id)
        go.set(); t.join()
        print(seen)
        zion_emu.set_platform("hgx-h100")
        print(torch.accelerator.current_stream().stream_id, torch.ones(2, device="zion").add_(1).tolist())
    """).stdout
    assert out.splitlines() == ["0 zion:0", "1", "[(0, 0)]", "0 [2.0, 2.0]"]


def test_the_platform_is_chosen_through_zion_emu_and_torch_zion_has_no_say():
    # torch.cuda has no set_platform; torch.zion keeps torch.cuda's shape.
    assert not hasattr(torch.zion, "set_platform") and not hasattr(torch.zion, "current_platform")
    assert zion_emu.set_platform is zion_emu.platform.set_platform
    assert zion_emu.current_platform is zion_emu.platform.current_platform


def test_device_count_does_not_initialize_and_a_negative_device_is_not_set():
    # As torch.cuda: device_count() leaves the device uninitialized (a script checks is_initialized before it
    # forks), and set_device with a negative index does nothing. device_count() started the runtime, and
    # set_device(-1) raised IndexError.
    out = run_python("""
import torch, zion_emu
print(torch.zion.device_count(), torch.zion.is_initialized())
torch.zion.set_device(-1)
print(torch.zion.is_initialized(), torch.zion.current_device())
torch.zion.set_device(2)
torch.zion.set_device(-1)
print(torch.zion.is_initialized(), torch.zion.current_device(), torch.zion.device_count())
""", env=child_env(ZION_PLATFORM="hgx-a100")).stdout.split()
    assert out == ["8", "False", "False", "0", "True", "2", "8"]


def test_a_zion_tensor_sent_through_torch_multiprocessing_is_refused_by_name():
    # torch's reducer took it for a CPU tensor: "_share_fd_: only available on CPU".
    import warnings
    from multiprocessing.reduction import ForkingPickler

    t = torch.arange(4.0, device="zion:1")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # TypedStorage's deprecation
        typed = t.storage()
    for obj, what in ((t, "tensor"), (torch.nn.Parameter(t), "tensor"), (t.untyped_storage(), "storage"),
                      (typed, "storage")):
        with pytest.raises(RuntimeError, match=f"a zion {what} cannot be sent to another process through "
                                               r"torch.multiprocessing: .* Send .*\.cpu\(\)"):
            ForkingPickler.dumps(obj)
    cpu = torch.ones(3)
    assert torch.equal(ForkingPickler.loads(ForkingPickler.dumps(cpu)), cpu)  # CPU tensors still go


@pytest.mark.parametrize("start", ["fork", "spawn"])
def test_a_dataloader_worker_returning_a_zion_tensor_raises_in_the_training_process(start, tmp_path):
    # The worker's Queue pickles on its feeder thread, which printed the refusal and dropped the batch:
    # the loader waited forever. Now the batch arrives as the refusal itself.
    script = tmp_path / "loader.py"  # a file: a spawned worker imports the script's Dataset from it
    script.write_text(textwrap.dedent(f"""
        import torch, zion_emu
        from torch.utils.data import DataLoader, Dataset
        class Made(Dataset):
            def __len__(self): return 4
            def __getitem__(self, i): return torch.ones(2, device="zion")
        if __name__ == "__main__":
            try:
                for batch in DataLoader(Made(), num_workers=1, batch_size=2, multiprocessing_context="{start}"):
                    print("got a batch")
            except RuntimeError as e:
                print("refused:", e)
        """))
    out = run([PYTHON, str(script)], timeout_s=120, env=child_env()).stdout
    assert "got a batch" not in out
    assert "refused: a zion tensor cannot be sent to another process through torch.multiprocessing" in out
    assert "Send tensor.cpu()" in out


def test_zion_platform_environment_variable_chooses_the_preset():
    out = run_python("import torch; print(torch.zion.get_device_properties().total_memory)",
                     env=child_env(ZION_PLATFORM="hgx-a100")).stdout
    assert out.split() == [str(80 * GIB)]


# The virtual clock and counters
def test_an_op_costs_the_host_its_launch_and_counts_on_its_device():
    x = torch.ones(1000, device="zion:5")
    torch.zion.synchronize(5)
    reset_clock()
    assert clock() == 0 and counters(5).ops == 0
    x + 1
    assert clock() == 5e-6  # the launch; the add runs on the device's clock
    c = counters("zion:5")
    assert (c.ops, c.flops, c.guessed_ops) == (1, 1000, 0)
    assert c.busy_s == pytest.approx(c.bytes / (1000e9 * 0.8))  # streamed at elementwise efficiency 0.8
    assert counters(4).ops == 0


# Pricing ops from Python, on an op of this test's own so that no other test sees its formula.
_lib = torch.library.Library("zion_test_cost", "DEF")
_lib.define("scale(Tensor x, float k) -> Tensor")
_lib.impl("scale", lambda x, k: x * k, "CPU")


def test_an_op_without_formula_is_counted_as_guessed_until_one_is_registered():
    x = torch.ones(4, 8, device="zion")
    before = counters()
    torch.ops.zion_test_cost.scale(x, 2.0)
    after = counters()
    assert (after.ops - before.ops, after.guessed_ops - before.guessed_ops) == (1, 1)

    calls = []

    def formula(call):
        calls.append(call)
        return {"flops": 9e9, "bytes": 0, "op_class": "matmul"}

    cost.register(torch.ops.zion_test_cost.scale, formula)
    assert cost.has_formula("zion_test_cost::scale") and "zion_test_cost::scale" in cost.formula_names()
    torch.zion.synchronize()
    start, end = torch.zion.Event(enable_timing=True), torch.zion.Event(enable_timing=True)
    before = counters()
    start.record()
    y = torch.ops.zion_test_cost.scale(x, 2.0)
    end.record()
    end.synchronize()
    after = counters()
    assert y.cpu().eq(2).all()
    assert (after.flops - before.flops, after.guessed_ops - before.guessed_ops) == (9e9, 0)
    assert start.elapsed_time(end) == pytest.approx((9e9 / (15e12 * 0.6) + 5e-6) * 1e3)  # 1 ms + launch
    (call,) = calls
    assert call.name == "zion_test_cost::scale"
    assert [(t.sizes, t.dtype) for t in call.inputs] == [([4, 8], "fp32")]
    assert [(t.sizes, t.dtype) for t in call.outputs] == [([4, 8], "fp32")]


def test_a_formula_may_return_flops_and_bytes():
    cost.register("zion_test_cost::scale", lambda call: (2 * call.outputs[0].numel(), call.outputs[0].bytes()))
    x = torch.ones(10, device="zion")
    before = counters()
    torch.ops.zion_test_cost.scale(x, 3.0)
    after = counters()
    assert (after.flops - before.flops, after.bytes - before.bytes) == (20, 40)


def test_a_negative_count_is_an_error_naming_the_op():
    x = torch.ones(2, device="zion")
    cost.register("zion_test_cost::scale", lambda call: {"flops": -1.0, "bytes": 0})
    with pytest.raises(ValueError, match=r"op cost formula for zion_test_cost::scale returned negative flops"):
        torch.ops.zion_test_cost.scale(x, 2.0)
    with pytest.raises(ValueError, match=r"zion_test_cost::scale: bytes must be a finite count >= 0"):
        cost.register("zion_test_cost::scale", {"flops": 1, "bytes": -5})


def test_op_names_are_checked_when_registered():
    assert cost.op_name("aten::mm.default") == cost.op_name(torch.ops.aten.mm.default) == "aten::mm"
    assert cost.op_name(torch.ops.aten.add.Tensor) == "aten::add.Tensor"
    with pytest.raises(ValueError, match="'mm' is not an ATen schema name"):
        cost.register("mm", {"flops": 1, "bytes": 1})
    with pytest.raises(ValueError, match="no operator 'aten::matmull' is registered"):
        cost.register("aten::matmull", {"flops": 1, "bytes": 1})


def test_guessed_ops_are_reported_by_name():
    import zion_emu

    zion_emu.reset_clock()
    x = torch.ones(4, device="zion")
    y = torch.special.i1e(x)  # no formula in the table: priced by the default guess
    assert y.is_zion
    guessed = zion_emu.cost.guessed_ops(0)
    assert any("i1e" in name for name in guessed), guessed
    assert zion_emu.counters(0).guessed_ops >= 1


def test_device_capability_is_answered():
    assert isinstance(torch.accelerator.get_device_capability(), dict)


# What the API list asks for and no test above shows
def test_manual_seed_all_and_seed_all_reach_every_device():
    torch.zion.manual_seed_all(21)
    draws = [torch.rand(3, device=f"zion:{i}").cpu() for i in range(8)]
    expected = torch.rand(3, generator=torch.Generator().manual_seed(21))
    assert all(torch.equal(d, expected) for d in draws)
    assert all(g.initial_seed() == 21 for g in torch.zion.default_generators)
    torch.zion.seed_all()  # fresh seeds: no device keeps 21
    assert all(g.initial_seed() != 21 for g in torch.zion.default_generators)


def test_synchronize_device_event_and_stream_all_bring_the_host_clock_forward():
    a = torch.randn(512, 512, device="zion:3")
    torch.zion.synchronize(3)
    on_device = 2 * 512**3 / 9e12  # the matmul, after its 5 us launch
    for wait in (lambda e, s: torch.zion.synchronize("zion:3"), lambda e, s: e.synchronize(),
                 lambda e, s: s.synchronize()):
        with torch.zion.device(3):
            start = clock()
            s = torch.zion.current_stream()
            a @ a
            e = torch.zion.Event()
            e.record()
            assert not e.query()  # the host is only past the launch
            wait(e, s)
            assert e.query()
            assert clock() == pytest.approx(start + 5e-6 + on_device, rel=1e-9)
