"""``torch.zion.comm``: :mod:`torch.cuda.comm` for the zion devices of one
process, with its signatures and semantics. ``torch.nn.parallel`` (replicate,
scatter, gather, ``DataParallel``) reaches these through
``torch.nn.parallel.comm``, whose functions :func:`install` wraps: a call on
zion tensors comes here, any other goes to torch's own.

How the copies are timed (csrc/device/aten/copy.h):
- broadcast, broadcast_coalesced, scatter and the copies of reduce_add issue
  their device-to-device copies at once (``torch.ops.zion.copy_batch``): they
  share links by the link model's max-min fair share, each on its route;
- gather copies one tensor after another into the destination, as CUDA's
  does (each ``copy_`` waits for the destination's current stream);
- a copy from or to host memory is a single copy (``Tensor.to``).

Autograd: as with NCCL, the outputs of broadcast and broadcast_coalesced carry
no history (torch.nn.parallel's Broadcast function gives the gradients). When
autograd must record (grad mode on, an input requires grad), scatter and
reduce_add copy with ``Tensor.to``, which it records; gather always does.
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from types import ModuleType
from typing import Any, Callable, Iterable, Sequence

import torch
from torch._utils import (
    _flatten_dense_tensors,
    _get_device_index,
    _handle_complex,
    _reorder_tensors_as,
    _take_tensors,
    _unflatten_dense_tensors,
)

from zion_emu import _after_import

__all__ = ["broadcast", "broadcast_coalesced", "gather", "install", "reduce_add", "reduce_add_coalesced", "scatter"]

ZION = "zion"
_BUFFER_SIZE = 10485760  # torch.cuda.comm's default coalescing buffer, bytes
_COMM = ("broadcast", "broadcast_coalesced", "reduce_add", "reduce_add_coalesced", "scatter", "gather")


def _zion(index: int) -> torch.device:
    return torch.device(ZION, index)


def _is_zion(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.device.type == ZION


def _records_grad(tensors: Iterable[torch.Tensor]) -> bool:
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def _stream_id(stream: torch.Stream | None, device: int, i: int) -> int:
    """The id of a zion stream given for copy ``i`` to ``device``; -1 for none."""
    if stream is None:
        return -1
    if stream.device.type != ZION or stream.device_index != device:
        raise RuntimeError(f"Expected the device associated with the stream at index {i} (was {stream.device}) to "
                           f"match the device supplied at that index (expected zion:{device})")
    return int(stream.stream_id)


def _copy_batch(srcs: Sequence[torch.Tensor], dsts: Sequence[torch.Tensor], streams: Sequence[int] = ()) -> None:
    """srcs[i] -> dsts[i] (zion to zion), issued at once (fair share of links)."""
    if srcs:
        torch.ops.zion.copy_batch(list(srcs), list(dsts), list(streams))


def _break_the_graph_at_copies(dynamo: ModuleType) -> None:
    """torch.compile breaks the graph at the batched copies, as at
    torch.cuda.comm's C functions: they run eagerly between the compiled parts
    (traced, the op would reach the data pointers of fake tensors). Installed
    when torch._dynamo is imported, not by importing it: that costs seconds,
    which a process that never compiles should not pay."""
    global _copy_batch
    _copy_batch = dynamo.disable(_copy_batch)


_after_import.after_import("torch._dynamo", _break_the_graph_at_copies)


def _copy_into(src: torch.Tensor, dsts: Sequence[torch.Tensor], streams: Sequence[int] = ()) -> None:
    """``src`` into every tensor of ``dsts``: one batch from a zion tensor, single copies from host memory."""
    if _is_zion(src) and not src.is_sparse:
        _copy_batch([src] * len(dsts), dsts, streams)
        return
    for i, d in enumerate(dsts):
        with _on_stream(d.get_device(), streams[i] if streams else -1):
            d.copy_(src, non_blocking=True)


def _on_stream(device: int, stream_id: int) -> contextlib.AbstractContextManager[Any]:
    """Makes stream ``stream_id`` of zion device ``device`` current (-1: the
    current one), with torch.Stream's context, which restores the current
    device and stream after."""
    if stream_id < 0:
        return contextlib.nullcontext()
    current = torch.accelerator.current_stream(device)
    return torch.Stream(stream_id=stream_id, device_index=device, device_type=current.device_type)


def broadcast(tensor: torch.Tensor, devices: Iterable[Any] | None = None, *,
              out: Sequence[torch.Tensor] | None = None) -> tuple[torch.Tensor, ...]:
    """Copies of ``tensor`` on ``devices`` (the source's own device gets
    ``tensor`` itself), or into the tensors of ``out``; one batch of copies."""
    tensor = _handle_complex(tensor)
    if not ((devices is None) ^ (out is None)):
        raise RuntimeError(f"Exactly one of 'devices' and 'out' must be specified, but got devices={devices} and "
                           f"out={out}")
    with torch.no_grad():
        if out is not None:
            out = list(out)
            for i, o in enumerate(out):
                if not _is_zion(o):
                    raise RuntimeError(f"Expected all output tensors to be zion tensors, but output tensor at index "
                                       f"{i} has device '{o.device}'")
                if o.shape != tensor.shape:
                    raise RuntimeError(f"Expected all output tensors to have same shape as the source tensor "
                                       f"{list(tensor.shape)}, but output tensor at index {i} has shape {list(o.shape)}")
            _copy_into(tensor, out)
            return tuple(out)
        indices = [_get_device_index(d) for d in devices]
        source = tensor.get_device() if _is_zion(tensor) else -1
        if tensor.is_sparse:  # one single copy per device
            copies = [tensor.to(_zion(i)) for i in indices if i != source]
        else:
            copies = [torch.empty(tensor.shape, dtype=tensor.dtype, device=_zion(i)) for i in indices if i != source]
            _copy_into(tensor, copies)
    rest = iter(copies)
    return tuple(tensor if i == source else next(rest) for i in indices)


def broadcast_coalesced(tensors: Sequence[torch.Tensor], devices: Iterable[Any],
                        buffer_size: int = _BUFFER_SIZE) -> list[list[torch.Tensor]]:
    """``tensors`` (all on ``devices[0]``) on every device: ``devices[0]``
    gets the tensors themselves; the others, views of flat buffers of up to
    ``buffer_size`` bytes per dtype, each buffer broadcast as one batch."""
    indices = [_get_device_index(d) for d in devices]
    tensors = [_handle_complex(t) for t in tensors]
    if not indices:
        raise RuntimeError("broadcast_coalesced needs at least one device")
    for i, t in enumerate(tensors):
        if t.get_device() != indices[0]:
            raise RuntimeError(f"device of broadcasted tensors must appear as the first on devices list: tensor {i} "
                               f"is on {t.device}, devices[0] is {indices[0]}")
    outputs: list[list[torch.Tensor]] = [list(tensors)] + [[] for _ in indices[1:]]
    if not tensors or len(indices) == 1:
        return outputs
    with torch.no_grad():
        for chunk in _take_tensors(tensors, buffer_size):
            if chunk[0].is_sparse:
                for t in chunk:  # each sparse tensor on its own, as single copies
                    for out, copy in zip(outputs[1:], broadcast(t, indices[1:])):
                        out.append(copy)
                continue
            flat = _flatten_dense_tensors(chunk)
            for out, copy in zip(outputs[1:], broadcast(flat, indices[1:])):
                # Views of one buffer, each with a version counter of its own
                # (as torch.cuda.comm's, see NOTE [ Version Counter in comm.*_coalesced ]).
                out.extend(t.data for t in _unflatten_dense_tensors(copy, chunk))
    return [outputs[0]] + [list(_reorder_tensors_as(out, tensors)) for out in outputs[1:]]


def reduce_add(inputs: Sequence[torch.Tensor], destination: Any = None) -> torch.Tensor:
    """The sum of ``inputs`` on ``destination`` (the current device by
    default), which must hold one of them (the root). The others are copied
    there as one batch, then added in torch's order: ``root + others[0] +
    others[1] + ...``, i.e. ``inputs[0] + inputs[1] + ...`` when the root is
    ``inputs[0]``."""
    if not inputs:
        raise RuntimeError("reduce_add expects at least one input tensor, got none")
    destination = _get_device_index(destination, optional=True)
    input_size = inputs[0].size()
    root_index = None  # the last input already on the destination, as torch picks it
    for i, inp in enumerate(inputs):
        if inp.device.type == "cpu":
            raise AssertionError(f"reduce_add expects all inputs to be on zion devices, but input {i} is on CPU")
        if inp.get_device() == destination:
            root_index = i
        if inp.size() != input_size:
            got = "x".join(str(x) for x in inp.size())
            expected = "x".join(str(x) for x in input_size)
            raise ValueError(f"input {i} has invalid size: got {got}, but expected {expected}")
    if root_index is None:
        raise RuntimeError(f"reduce_add expects destination zion:{destination} to hold one of the inputs")
    if len(inputs) == 1:
        return inputs[0]
    root = inputs[root_index]
    others = [t for i, t in enumerate(inputs) if i != root_index]
    if _records_grad(inputs) or any(t.is_sparse for t in inputs):
        moved = [t.to(root.device, non_blocking=True) for t in others]
    else:
        away = [t for t in others if t.device != root.device]
        landed = [torch.empty(t.shape, dtype=t.dtype, device=root.device) for t in away]
        with torch.no_grad():
            _copy_batch(away, landed)
        rest = iter(landed)
        moved = [t if t.device == root.device else next(rest) for t in others]
    result = root + moved[0]
    for other in moved[1:]:
        result.add_(other)
    return result


def reduce_add_coalesced(inputs: Sequence[Sequence[torch.Tensor]], destination: Any = None,
                         buffer_size: int = _BUFFER_SIZE) -> tuple[torch.Tensor, ...]:
    """Sums of the tensors of several devices (``inputs[device][i]``) on
    ``destination``: dense tensors in flat buffers of up to ``buffer_size``
    bytes, each reduced by :func:`reduce_add`; sparse ones one by one."""
    dense: list[list[torch.Tensor]] = [[] for _ in inputs]
    output = []
    ref_order = []
    for tensor_at_devices in zip(*inputs, strict=True):
        if all(t.is_sparse for t in tensor_at_devices):
            output.append(reduce_add(tensor_at_devices, destination))
            ref_order.append(tensor_at_devices[0])
        else:
            for coll, t in zip(dense, tensor_at_devices, strict=True):
                coll.append(t.to_dense() if t.is_sparse else t)
            ref_order.append(dense[0][-1])
    for chunks in zip(*[_take_tensors(tensors, buffer_size) for tensors in dense], strict=True):
        flat = reduce_add([_flatten_dense_tensors(chunk) for chunk in chunks], destination)
        output.extend(t.data for t in _unflatten_dense_tensors(flat, chunks[0]))
    return tuple(_reorder_tensors_as(output, ref_order))


def scatter(tensor: torch.Tensor, devices: Iterable[Any] | None = None, chunk_sizes: Sequence[int] | None = None,
            dim: int = 0, streams: Sequence[torch.Stream | None] | None = None, *,
            out: Sequence[torch.Tensor] | None = None) -> tuple[torch.Tensor, ...]:
    """Chunks of ``tensor`` along ``dim`` on ``devices`` (equal chunks, or
    ``chunk_sizes``), or into ``out``; chunk i is copied on ``streams[i]``
    when given. A chunk already on its device is a view, as in torch."""
    tensor = _handle_complex(tensor)
    if out is None:
        if devices is None:
            raise RuntimeError("Exactly one of 'devices' and 'out' must be specified, but got neither")
        indices = [_get_device_index(d) for d in devices]
        if not indices:
            raise RuntimeError("Expected at least one device to scatter to")
        if chunk_sizes is not None and len(chunk_sizes) != len(indices):
            raise RuntimeError(f"Expected devices and chunk_sizes to be of same length, but got len(devices) = "
                               f"{len(indices)} and len(chunk_sizes) = {len(chunk_sizes)}")
        chunks = list(tensor.split(list(chunk_sizes), dim) if chunk_sizes is not None
                      else tensor.chunk(len(indices), dim))
        source = tensor.get_device() if _is_zion(tensor) else -1
        moving = [i for i in range(len(chunks)) if indices[i] != source]
        stream_ids = [_stream_id(streams[i] if streams is not None and i < len(streams) else None, indices[i], i)
                      for i in moving]
        if not _is_zion(tensor) or _records_grad([tensor]):
            for i, s in zip(moving, stream_ids):
                with _on_stream(indices[i], s):
                    chunks[i] = chunks[i].to(_zion(indices[i]), non_blocking=True)
            return tuple(chunks)
        landed = [torch.empty_like(chunks[i], device=_zion(indices[i])) for i in moving]
        with torch.no_grad():
            _copy_batch([chunks[i] for i in moving], landed, stream_ids)
        for i, t in zip(moving, landed):
            chunks[i] = t
        return tuple(chunks)
    if devices is not None:
        raise RuntimeError(f"'devices' must not be specified when 'out' is specified, but got devices={devices}")
    if chunk_sizes is not None:
        raise RuntimeError(f"'chunk_sizes' must not be specified when 'out' is specified, but got "
                           f"chunk_sizes={chunk_sizes}")
    out = list(out)
    if not out:
        raise RuntimeError("Expected at least one output tensor to scatter to")
    dim = dim % max(tensor.dim(), 1)
    for i, o in enumerate(out):
        if not _is_zion(o):
            raise RuntimeError(f"Expected all output tensors to be zion tensors, but output tensor at index {i} has "
                               f"device '{o.device}'")
        if o.dim() != tensor.dim() or any(o.size(k) != tensor.size(k) for k in range(tensor.dim()) if k != dim):
            raise RuntimeError(f"Output tensor at index {i} has incorrect shape: {list(o.shape)}. Expected same shape "
                               f"except for scatter dim {dim} as the source tensor: {list(tensor.shape)}.")
    total = sum(o.size(dim) for o in out)
    if total != tensor.size(dim):
        raise RuntimeError(f"Total size for output tensors along scatter dim ({total}) does not match the source "
                           f"tensor size along scatter dim ({tensor.size(dim)})")
    chunks = tensor.split([o.size(dim) for o in out], dim)
    stream_ids = [_stream_id(streams[i] if streams is not None and i < len(streams) else None, o.get_device(), i)
                  for i, o in enumerate(out)]
    if _is_zion(tensor) and not _records_grad([tensor]):
        with torch.no_grad():
            _copy_batch(chunks, out, stream_ids)
    else:
        for o, c, s in zip(out, chunks, stream_ids):
            with _on_stream(o.get_device(), s):
                o.copy_(c, non_blocking=True)
    return tuple(out)


def gather(tensors: Sequence[torch.Tensor], dim: int = 0, destination: Any = None, *,
           out: torch.Tensor | None = None) -> torch.Tensor:
    """``tensors`` concatenated along ``dim`` on ``destination`` (a zion
    device, ``"cpu"``, or the current device), or into ``out``. As CUDA's:
    one copy after another into slices of the result."""
    tensors = [_handle_complex(t) for t in tensors]
    if not tensors:
        raise RuntimeError("Expected at least one tensor to gather from")
    first = tensors[0]
    dim = dim % max(first.dim(), 1)
    for i, t in enumerate(tensors):
        if not _is_zion(t):
            raise RuntimeError(f"Expected all input tensors to be zion tensors, but tensor at index {i} has device "
                               f"'{t.device}'")
        if t.dim() != first.dim():
            raise RuntimeError(f"Expected all input tensors to have the same number of dimensions, but tensor at "
                               f"index {i} has {t.dim()} dimensions, (expected {first.dim()})")
        expected = [t.size(k) if k == dim else first.size(k) for k in range(first.dim())]
        if list(t.shape) != expected:
            raise RuntimeError(f"Input tensor at index {i} has invalid shape {list(t.shape)}, but expected {expected}")
    size = list(first.shape)
    size[dim] = sum(t.size(dim) for t in tensors)
    if out is None:
        if destination == -1:
            warnings.warn('Using -1 to represent CPU tensor is deprecated. Please use a device object or string '
                          'instead, e.g., "cpu".', FutureWarning, stacklevel=2)
        index = _get_device_index(destination, allow_cpu=True, optional=True)
        out = torch.empty(size, dtype=first.dtype, device="cpu" if index == -1 else _zion(index))
    else:
        if destination is not None:
            raise RuntimeError(f"'destination' must not be specified when 'out' is specified, but got "
                               f"destination={destination}")
        if list(out.shape) != size:
            raise RuntimeError(f"Expected out tensor to have shape {size}, but got {list(out.shape)}")
    for chunk, t in zip(out.split([t.size(dim) for t in tensors], dim), tensors):
        chunk.copy_(t, non_blocking=out.device.type == ZION)
    return out


# -- torch.nn.parallel.comm ------------------------------------------------------

def _holds_zion(obj: Any, depth: int = 2) -> bool:
    """Whether ``obj`` is a zion tensor or holds one (lists of lists, for reduce_add_coalesced)."""
    if isinstance(obj, torch.Tensor):
        return obj.device.type == ZION
    if depth > 0 and isinstance(obj, (list, tuple)):
        return any(_holds_zion(x, depth - 1) for x in obj)
    return False


def _to_accelerator(obj: Any) -> bool:
    """A call sending host tensors to device indices: in a build whose only
    accelerator is zion (torch's CPU build), the indices are zion's."""
    accelerator = torch.accelerator.current_accelerator()
    return accelerator is not None and accelerator.type == ZION and isinstance(obj, (torch.Tensor, list, tuple))


def _uses_zion(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    first = args[0] if args else kwargs.get("tensor", kwargs.get("tensors", kwargs.get("inputs")))
    if _holds_zion(first) or _holds_zion(kwargs.get("out")):
        return True
    sends = name in ("broadcast", "broadcast_coalesced", "scatter") and (len(args) > 1 or "devices" in kwargs)
    return sends and _to_accelerator(first)


def _dispatching(name: str, zion_fn: Callable[..., Any], original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def dispatch(*args: Any, **kwargs: Any) -> Any:
        fn = zion_fn if _uses_zion(name, args, kwargs) else original
        return fn(*args, **kwargs)

    dispatch._zion_original = original  # type: ignore[attr-defined]
    return dispatch


def install() -> None:
    """Makes ``torch.nn.parallel.comm``'s functions (which torch.nn.parallel
    calls by module attribute) send zion tensors here. Idempotent."""
    import torch.nn.parallel.comm as parallel_comm

    for name in _COMM:
        current = getattr(parallel_comm, name)
        if hasattr(current, "_zion_original"):
            continue
        setattr(parallel_comm, name, _dispatching(name, globals()[name], current))
