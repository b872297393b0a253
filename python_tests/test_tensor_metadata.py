"""The kernels zion implements itself, for a tensor's storage and shape
(empty, resize_, set_), check their arguments and behave as the CPU's do:
the same values, sizes, strides and storage sizes, and the same refusals."""

import pytest
import torch

import zion_emu  # noqa: F401  (registers the device)


def _both(make):
    """``make(device)`` on the CPU and on zion."""
    return make("cpu"), make("zion")


def _same(cpu: torch.Tensor, zion: torch.Tensor) -> None:
    assert zion.device.type == "zion"
    assert (zion.shape, zion.stride(), zion.storage_offset()) == (cpu.shape, cpu.stride(), cpu.storage_offset())
    assert zion.untyped_storage().nbytes() == cpu.untyped_storage().nbytes()


def test_resize_to_its_own_shape_leaves_a_non_contiguous_tensor_as_it_is():
    # It used to make the transpose contiguous over the same bytes: its values changed.
    cpu, zion = _both(lambda d: torch.arange(6.0, device=d).reshape(2, 3).t())
    cpu.resize_(3, 2)
    zion.resize_(3, 2)
    _same(cpu, zion)
    assert torch.equal(zion.cpu(), cpu) and zion.tolist() == [[0.0, 3.0], [1.0, 4.0], [2.0, 5.0]]


def test_resize_grows_from_the_storage_offset_and_keeps_the_values():
    cpu, zion = _both(lambda d: torch.arange(8.0, device=d)[2:4])
    cpu.resize_(3, 4)
    zion.resize_(3, 4)
    _same(cpu, zion)
    assert zion.untyped_storage().nbytes() == (2 + 12) * 4
    assert zion[0, :2].tolist() == [2.0, 3.0]


def test_set_with_a_view_larger_than_the_storage_grows_it_as_the_cpu_does():
    cpu, zion = _both(lambda d: torch.empty(0, device=d))
    for t in (cpu, zion):
        t.set_(torch.zeros(4, device=t.device).untyped_storage(), 1, (1 << 16,), (1,))
        t.fill_(1.0)  # wrote past the 16 bytes before: a segfault
    _same(cpu, zion)
    assert zion.untyped_storage().nbytes() == ((1 << 16) + 1) * 4 and bool(zion.eq(1).all())


@pytest.mark.parametrize("call, message", [
    (lambda s: torch.empty(0, device="zion").set_(s, -2, (2,), (1,)), "Tensor: invalid storage offset -2"),
    (lambda s: torch.empty(0, device="zion").set_(s, 0, (2, 2), (1,)), "unequal size length (2) and stride length (1)"),
    (lambda s: torch.empty(0, device="zion:0").set_(torch.ones(8, device="zion:1")), "the devices must match"),
    (lambda s: torch.empty(0).set_(torch.ones(3, device="zion")), "the devices must match"),
], ids=["negative-offset", "stride-length", "other-zion-device", "cpu-tensor"])
def test_set_refuses_what_the_cpu_refuses(call, message):
    storage = torch.zeros(4, device="zion").untyped_storage()
    with pytest.raises(RuntimeError, match=message.replace("(", r"\(").replace(")", r"\)")):
        call(storage)


@pytest.mark.parametrize("call, error, message", [
    (lambda: torch.empty(-2, device="zion"), RuntimeError, "Trying to create tensor with negative dimension -2"),
    (lambda: torch.empty_strided((2, -1), (1, 1), device="zion"), RuntimeError, "negative dimension -1"),
    (lambda: torch.randn(-1, 3, device="zion"), RuntimeError, "negative dimension -1"),
    (lambda: torch.empty(2, device="zion").resize_(-1), RuntimeError, "negative dimension -1"),
    (lambda: torch.empty(2, device="zion").resize_(3, memory_format=torch.preserve_format), RuntimeError,
     "Unsupported memory format"),
    (lambda: torch.empty(3, device="zion", pin_memory=True), RuntimeError, "zion: only CPU tensors can be pinned"),
    (lambda: torch.zeros(3, device="zion", pin_memory=True), RuntimeError, "zion: only CPU tensors can be pinned"),
    (lambda: torch.Generator(device="zion:9"), IndexError, "zion: device index 9 is out of range"),
    (lambda: torch.accelerator.synchronize(8), IndexError, "zion: device index 8 is out of range"),
], ids=["empty", "empty_strided", "randn", "resize", "resize-preserve", "pinned-empty", "pinned-zeros", "generator",
        "synchronize-socket-track"])
def test_bad_sizes_devices_and_pinning_are_refused_naming_them(call, error, message):
    with pytest.raises(error, match=message):
        call()
