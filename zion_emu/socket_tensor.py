"""Timing-only tensors in a socket's DDR: storage-less CPU tensors.

In timing-only mode a floating-point CPU tensor made inside
``zion_emu.socket(i)`` is a :class:`SocketTensor`: a wrapper subclass (as
FakeTensor and DTensor are) on device ``cpu`` with no host bytes. Its bytes
are counted in socket i's DDR pool as real mode counts them (capacity, peak,
``OutOfMemoryError``); every op on it runs on meta tensors and is priced on
the socket's track by the same RecordFunction observer that prices real CPU
ops (``csrc/device/runtime/sockets.cpp``): the observer sees the op with its
shapes and dtypes, and the meta computation inside runs with RecordFunction
off, so nothing is charged twice. Integer tensors stay real: the
embedding-bag kernel runs on a one-row zero stand-in, so offset2bag and the
sparse gradient's indices are real mode's, and coalescing a sparse gradient
keeps its real unique indices (nnz is data-dependent).

Factories the script calls (``torch.empty``/``zeros``/``rand``, ``*_like``,
``new_*``, ``nn.utils.skip_init``'s ``to_empty``) reach
:class:`SocketFactoryMode`, a TorchFunctionMode the socket scope pushes in
timing-only mode. Copies to and from a zion device are priced as the real
socket -> UPI -> PCIe -> OAM copy (``_C.host_memory.price_copy``); the
gradient of such a copy comes back as a SocketTensor (:class:`_ToDevice`).
A value read by the host (``.item()``, ``.tolist()``, a copy into a real
tensor) is a placeholder, counted per call site like a storage-less zion
tensor's.

Where torch's CPU kernel only calls other ops (composite ops, the
embedding-bag backward, ``*_like``), it runs so here too, and the observer
prices each inner op as in real mode. Where it computes (``coalesce``,
``sparse_mask``, ``dense * sparse``), the handler allocates in the pool what
the kernel allocates and calls the ops it calls, so time and DDR peaks equal
real mode's (python_tests/test_timing_ddr.py).
"""

from __future__ import annotations

import contextlib
import functools
import threading
from typing import Any, Callable, Iterator

import torch
from torch.utils._pytree import tree_map

from zion_emu import _C

_native = _C.host_memory
aten = torch.ops.aten


class _Reservation:
    """Bytes of one socket pool held for a storage-less buffer (shared by its views)."""

    __slots__ = ("socket", "nbytes")

    def __init__(self, socket: int, nbytes: int) -> None:
        self.socket, self.nbytes = -1, 0
        try:
            _native.reserve(socket, nbytes)
        except RuntimeError as e:
            if "out of DDR" in str(e):  # real mode's allocator raises torch.OutOfMemoryError
                raise torch.OutOfMemoryError(str(e)) from None
            raise
        self.socket, self.nbytes = socket, nbytes

    def __del__(self) -> None:
        if self.socket >= 0:
            _native.unreserve(self.socket, self.nbytes)


def _reserve(nbytes: int) -> _Reservation | None:
    """A reservation on this thread's socket scope, or None outside one (real
    mode's memory outside the pools: the autograd device thread's copies)."""
    socket = _native.scoped_socket()
    return _Reservation(socket, nbytes) if socket >= 0 else None


class SocketTensor(torch.Tensor):
    """A storage-less CPU tensor in a socket's DDR (timing-only mode). Dense:
    ``_meta`` holds its shape, strides and dtype. Sparse COO: ``_indices_real``
    (real) and ``_values_st`` (a SocketTensor)."""

    _meta: torch.Tensor | None
    _reservation: _Reservation | None
    _indices_real: torch.Tensor | None
    _values_st: "SocketTensor | None"
    _coalesced: bool

    @staticmethod
    def __new__(cls, meta: torch.Tensor, reservation: _Reservation | None) -> "SocketTensor":
        r = torch.Tensor._make_wrapper_subclass(cls, meta.size(), strides=meta.stride(),
                                                storage_offset=meta.storage_offset(), dtype=meta.dtype,
                                                device="cpu", requires_grad=False)
        r._meta, r._reservation = meta, reservation
        r._indices_real, r._values_st, r._coalesced = None, None, False
        return r

    @staticmethod
    def sparse(indices: torch.Tensor, values: "SocketTensor", size: list[int], coalesced: bool) -> "SocketTensor":
        r = torch.Tensor._make_wrapper_subclass(SocketTensor, size, dtype=values.dtype, layout=torch.sparse_coo,
                                                device="cpu", requires_grad=False)
        r._meta, r._reservation = None, None
        r._indices_real, r._values_st, r._coalesced = indices, values, coalesced
        return r

    @property
    def socket(self) -> int:
        """The socket whose pool counts its bytes, or -1 (memory outside the pools)."""
        holder = self._values_st if self._values_st is not None else self
        return holder._reservation.socket if holder._reservation is not None else -1

    def __repr__(self, *, tensor_contents: Any = None) -> str:  # type: ignore[override]
        layout = ", layout=torch.sparse_coo" if self.is_sparse else ""
        return (f"SocketTensor(size={tuple(self.shape)}, dtype={self.dtype}{layout}, socket={self.socket}, "
                f"storage-less: timing-only mode)")

    @classmethod
    def __torch_function__(cls, func: Callable, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func is torch.Tensor.to and isinstance(args[0], SocketTensor) and not args[0].is_sparse:
            target = _target_device(args, kwargs)
            if target is not None and target.type not in ("cpu", "meta"):
                return _ToDevice.apply(args[0], target, bool(kwargs.get("non_blocking", False)))
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **kwargs)

    @classmethod
    def __torch_dispatch__(cls, func: torch._ops.OpOverload, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func in _CPU_STRUCTURAL or func in _LIKE_OPS:
            # The CPU kernel only checks its arguments and calls other ops: run it as real mode does.
            return func.redispatch(_CPU_KEYS, *args, **kwargs)
        if _is_composite(func):
            # As on a CPU tensor: the composite's own kernel, its ops dispatched
            # (and observed, and priced) one by one.
            return func.decompose(*args, **kwargs)
        with _inside_handler():
            return _run(func, args, kwargs)


# CPU kernels that touch no bytes: they check their arguments and call other ops
# (and the *_like factories: empty_like, then a fill).
_CPU_STRUCTURAL = frozenset({aten._embedding_bag_backward.default})
_CPU_KEYS = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)


@functools.lru_cache(maxsize=None)
def _is_composite(func: torch._ops.OpOverload) -> bool:
    return func not in _SPECIAL and torch._C._dispatch_has_kernel_for_dispatch_key(func.name(),
                                                                                   "CompositeImplicitAutograd")


def _target_device(args: tuple, kwargs: dict) -> torch.device | None:
    """The device of ``Tensor.to(...)``'s arguments, or None (a dtype only)."""
    for a in (*args[1:], kwargs.get("device"), kwargs.get("other")):
        if isinstance(a, (str, torch.device)):
            return torch.device(a)
        if isinstance(a, torch.Tensor):
            return a.device
    return None


_state = threading.local()  # .inside: this thread runs a SocketTensor op (its own real stand-ins stay real)


@contextlib.contextmanager
def _inside_handler() -> Iterator[None]:
    """RecordFunction off (the observer priced the op from its outer frame) and
    the factory mode passing real stand-ins through."""
    was = _native.set_record_function_enabled(False)
    outer = getattr(_state, "inside", False)
    _state.inside = True
    try:
        yield
    finally:
        _state.inside = outer
        _native.set_record_function_enabled(was)


def _meta_like(t: torch.Tensor) -> torch.Tensor:
    """The meta counterpart of an argument: a SocketTensor's own, a real tensor's shape."""
    if isinstance(t, SocketTensor):
        if t.is_sparse:
            values = t._values_st._meta
            indices = torch.empty(t._indices_real.shape, dtype=t._indices_real.dtype, device="meta")
            return torch.sparse_coo_tensor(indices, values, t.shape, is_coalesced=t._coalesced)
        return t._meta
    if t.device.type == "meta":
        return t
    if t.is_sparse:
        raise NotImplementedError("zion timing-only: a real sparse tensor meets a socket tensor; not supported")
    # (torch.empty_strided on meta loops through torch's Python meta kernel in timing-only mode: see _timing.py)
    elements = t.untyped_storage().nbytes() // max(t.element_size(), 1)
    return torch.empty((elements,), dtype=t.dtype, device="meta").as_strided(t.size(), t.stride(), t.storage_offset())


def _meta_arguments(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    def convert(a: Any) -> Any:
        if isinstance(a, torch.Tensor):
            return _meta_like(a)
        if isinstance(a, torch.device) and a.type == "cpu":
            return torch.device("meta")
        if isinstance(a, torch.Generator):
            return None  # init is charged, not computed: nothing is drawn
        return a

    margs = tree_map(convert, args)
    mkwargs = {k: convert(v) for k, v in kwargs.items()}
    if "device" in kwargs and kwargs["device"] is not None:
        mkwargs["device"] = torch.device("meta")
    return margs, mkwargs


def _aliased_argument(func: torch._ops.OpOverload, ret: int, args: tuple, kwargs: dict) -> Any:
    """The argument a result aliases (a view's base, an in-place op's self), or None."""
    info = func._schema.returns[ret].alias_info
    if info is None:
        return None
    for k, a in enumerate(func._schema.arguments):
        if a.alias_info is not None and a.alias_info.before_set == info.before_set:
            if a.kwarg_only or k >= len(args):
                return kwargs.get(a.name)
            return args[k]
    return None


def _wrap(meta: torch.Tensor, base: Any, is_write: bool) -> Any:
    """An op's result: the argument itself (in place), a view sharing its base's bytes, or new bytes."""
    if is_write and base is not None:
        return base
    if base is not None:
        if isinstance(base, SocketTensor) and not base.is_sparse:
            return SocketTensor(meta, base._reservation)
        raise NotImplementedError("zion timing-only: a view of a real tensor made by an op on a socket tensor")
    return SocketTensor(meta, _reserve(meta.untyped_storage().nbytes()))


def _generic(func: torch._ops.OpOverload, args: tuple, kwargs: dict) -> Any:
    margs, mkwargs = _meta_arguments(args, kwargs)
    out = func(*margs, **mkwargs)
    results = out if isinstance(out, (tuple, list)) else (out,)
    wrapped = []
    for k, r in enumerate(results):
        if not isinstance(r, torch.Tensor):
            wrapped.append(r)
            continue
        if r.is_sparse:
            raise NotImplementedError(f"zion timing-only: {func} makes a sparse result from a socket tensor; "
                                      "supported sparse ops: coalesce, sparse_mask, _values, _indices, add_")
        info = func._schema.returns[k].alias_info if k < len(func._schema.returns) else None
        wrapped.append(_wrap(r, _aliased_argument(func, k, args, kwargs), bool(info and info.is_write)))
    if isinstance(out, tuple):
        return tuple(wrapped)
    if isinstance(out, list):
        return wrapped
    return wrapped[0]


def _placeholder(t: SocketTensor, what: str) -> None:
    like = t._values_st._meta if t.is_sparse else t._meta
    _native.record_placeholder_read(like, what)


def _local_scalar(func: torch._ops.OpOverload, args: tuple, kwargs: dict) -> Any:
    t = args[0]
    _placeholder(t, "item()")
    if t.dtype.is_floating_point:
        return 0.0
    if t.dtype.is_complex:
        return 0j
    return False if t.dtype == torch.bool else 0


def _embedding_bag(func: torch._ops.OpOverload, args: tuple, kwargs: dict) -> Any:
    """The CPU kernel on a one-row zero stand-in (indices remapped onto it), so
    its integer results are real mode's; the pooled rows come back storage-less.
    Arguments as _embedding_bag's schema: (weight, indices, offsets,
    scale_grad_by_freq, mode, sparse, per_sample_weights, include_last_offset, padding_idx)."""
    names = [a.name for a in func._schema.arguments]
    values = dict(zip(names, args))
    values.update(kwargs)
    weight, indices = values["weight"], values["indices"]
    if isinstance(indices, SocketTensor) or isinstance(values.get("offsets"), SocketTensor):
        raise RuntimeError(f"zion timing-only: {func} needs the values of its indices and offsets; they are "
                           "storage-less here (made from storage-less floats) and must be real")
    rows, dim = weight.shape
    if indices.numel() and (int(indices.min()) < 0 or int(indices.max()) >= rows):
        raise IndexError(f"zion: {func}: an index is out of range for a table of {rows} rows")
    padding = values.get("padding_idx")
    padding = -1 if padding is None else padding
    stand_in = dict(values)
    if 0 <= padding < rows:
        stand_in["indices"] = indices.eq(padding).to(indices.dtype)
        stand_in["padding_idx"] = 1
        stand_in["weight"] = torch.zeros(2, 1, dtype=weight.dtype)
    else:
        stand_in["indices"] = torch.zeros_like(indices)
        stand_in["weight"] = torch.zeros(1, 1, dtype=weight.dtype)
    psw = values.get("per_sample_weights")
    if isinstance(psw, SocketTensor):
        stand_in["per_sample_weights"] = torch.zeros(1, dtype=psw.dtype).expand(psw.shape)
    out = list(func(*[stand_in[n] for n in names if n in stand_in]))
    del stand_in
    margs, mkwargs = _meta_arguments(args, kwargs)
    meta = func(*margs, **mkwargs)
    bags = out[0].shape[0]
    out[0] = None  # the stand-in's pooled rows: given back before the real ones are counted
    out[0] = SocketTensor(meta[0], _reserve(meta[0].untyped_storage().nbytes()))
    mode = values.get("mode", 0)
    if mode == 2:  # max mode: max_indices [bags, D] point at the (unknown) maxima
        out[3] = SocketTensor(meta[3], _reserve(meta[3].untyped_storage().nbytes()))
    assert out[0].shape[0] == bags
    return tuple(out)


def _to_copy(func: torch._ops.OpOverload, args: tuple, kwargs: dict) -> Any:
    src = args[0]
    device = kwargs.get("device")
    if device is not None and torch.device(device).type not in ("cpu", "meta"):
        return _copy_to_device(src, torch.device(device), kwargs.get("dtype"), bool(kwargs.get("non_blocking")))
    if src.is_sparse or kwargs.get("layout") not in (None, torch.strided):
        raise NotImplementedError("zion timing-only: a sparse socket tensor converted with .to(); not modeled")
    return _fresh_like(src._meta, kwargs.get("dtype") or src.dtype, kwargs.get("memory_format"))


def _copy_to_device(src: SocketTensor, device: torch.device, dtype: torch.dtype | None,
                    non_blocking: bool) -> torch.Tensor:
    """H2D as real mode's copy_: a storage-less zion tensor, priced from the socket's DDR."""
    if device.type != "zion":
        raise NotImplementedError(f"zion timing-only: a socket tensor copied to {device}; only zion devices model it")
    index = device.index if device.index is not None else torch.zion.current_device()
    # As _to_copy allocates: empty for a contiguous source, else its strides kept when dense.
    zion = torch.device("zion", index)
    dst = torch.empty(src.shape, dtype=dtype or src.dtype, device=zion) if src.is_contiguous() else \
        torch.empty_strided(src.shape, _contiguous_strides(src.shape), dtype=dtype or src.dtype, device=zion)
    socket = src.socket if src.socket >= 0 else _native.home_socket(index)
    _native.price_copy(index, socket, False, float(dst.numel() * dst.element_size()), True, non_blocking)
    return dst


def _contiguous_strides(shape: torch.Size) -> list[int]:
    strides, step = [], 1
    for extent in reversed(shape):
        strides.append(step)
        step *= max(extent, 1)
    return strides[::-1]


def from_device(src: torch.Tensor, non_blocking: bool = False) -> SocketTensor:
    """D2H into a new socket tensor (this thread's socket pool, or outside the
    pools with no scope, as real mode's memory is), priced as real mode's copy."""
    meta = torch.empty(src.shape, dtype=src.dtype, device="meta")
    reservation = _reserve(meta.untyped_storage().nbytes())
    socket = reservation.socket if reservation is not None else _native.home_socket(src.device.index)
    _native.price_copy(src.device.index, socket, False, float(src.numel() * src.element_size()), False, non_blocking)
    return SocketTensor(meta, reservation)


class _ToDevice(torch.autograd.Function):
    """``socket_tensor.to(zion)``: its gradient (a zion tensor on the autograd
    device thread, outside any socket scope) comes back as a socket tensor
    outside the pools, as real mode's ToCopyBackward makes an ordinary CPU tensor."""

    @staticmethod
    def forward(ctx: Any, src: SocketTensor, device: torch.device, non_blocking: bool) -> torch.Tensor:
        ctx.non_blocking = non_blocking
        with _inside_handler():
            return _copy_to_device(src, device, None, non_blocking)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        with _inside_handler():
            return from_device(grad, ctx.non_blocking), None, None


def _copy_(func: torch._ops.OpOverload, args: tuple, kwargs: dict) -> Any:
    dst, src = args[0], args[1]
    non_blocking = bool(args[2]) if len(args) > 2 else bool(kwargs.get("non_blocking", False))
    if isinstance(dst, SocketTensor):
        if src.device.type == "zion":
            index = src.device.index
            socket = dst.socket if dst.socket >= 0 else _native.home_socket(index)
            _native.price_copy(index, socket, False, float(dst.numel() * dst.element_size()), False, non_blocking)
        return dst  # no values: nothing to write
    # dst is real, src a socket tensor
    if dst.device.type == "zion":
        index = dst.device.index
        socket = src.socket if src.socket >= 0 else _native.home_socket(index)
        _native.price_copy(index, socket, False, float(dst.numel() * dst.element_size()), True, non_blocking)
        _native.record_placeholder_read(src._meta, "a copy into part of a real zion tensor")
        return dst
    _placeholder(src, "a copy to host memory (.cpu(), .tolist(), printing)")
    with torch._C._DisablePythonDispatcher():
        dst.zero_()
    return dst


# --- sparse COO: real indices, storage-less values --------------------------

def _sparse_new(func: torch._ops.OpOverload, args: tuple, kwargs: dict) -> Any:
    # (sparse_dim, dense_dim, size, indices, values, *, dtype, layout, device, pin_memory, is_coalesced)
    sparse_dim, dense_dim, size, indices, values = args[:5]
    if isinstance(indices, SocketTensor):
        raise RuntimeError("zion timing-only: a sparse tensor's indices must be real; these are storage-less")
    if not isinstance(values, SocketTensor):
        raise NotImplementedError("zion timing-only: a socket tensor as sparse metadata")
    if sparse_dim != 1 or dense_dim != values.dim() - 1:
        raise NotImplementedError(f"zion timing-only: sparse socket tensors have one sparse dimension; got {sparse_dim}")
    with _observed():
        aten.alias.default(_FREE_CHILD)  # the CPU kernel's own calls are free (views, resize_): it is not a leaf
    return SocketTensor.sparse(indices, values, list(size), bool(kwargs.get("is_coalesced") or False))


def _coalesce(func: torch._ops.OpOverload, args: tuple, kwargs: dict) -> Any:
    """As torch's CPU kernel (_coalesce_sparse_cpu): new indices [1, nnz] and
    values [nnz, D], narrowed to the unique count; a sort of the flat indices
    meanwhile. The unique indices are real."""
    t = args[0]
    indices = t._indices_real
    nnz = indices.shape[1]
    unique = torch.unique(indices.reshape(-1), sorted=True)
    new_indices = torch.empty((1, nnz), dtype=indices.dtype)
    new_indices[0, :unique.numel()] = unique
    meta = torch.empty((nnz, *t._values_st.shape[1:]), dtype=t.dtype, device="meta")
    values = SocketTensor(meta, _reserve(meta.untyped_storage().nbytes()))
    # The kernel's sort (three [nnz] int64 buffers, measured against real mode's pool), while the
    # unique indices above are still held: those bytes less.
    scratch = _reserve(max(3 * nnz * indices.element_size() - unique.numel() * unique.element_size(), 0))
    del scratch
    u = unique.numel()
    del unique
    narrowed = SocketTensor(meta[:u], values._reservation)
    return SocketTensor.sparse(new_indices[:, :u], narrowed, list(t.shape), True)


@contextlib.contextmanager
def _observed() -> Iterator[None]:
    """Ops called here are observed and priced one by one, as the CPU kernel's are in real mode."""
    was = _native.set_record_function_enabled(True)
    try:
        yield
    finally:
        _native.set_record_function_enabled(was)


def _sparse_mask(func: torch._ops.OpOverload, args: tuple, kwargs: dict) -> Any:
    """``dense.sparse_mask(mask)`` as torch's CPU kernel computes it (and so priced
    as in real mode): a sparse template of ones on the mask's indices, and
    ``dense.mul(template)``."""
    dense, mask = args[0], args[1]
    if dense.is_sparse or not mask.is_sparse:
        raise NotImplementedError("zion timing-only: sparse_mask of a dense socket tensor by a sparse one only")
    with _observed():
        mask._nnz()
        ones = torch.ones(1, dtype=mask.dtype).expand(mask._values_st.shape)
        template = torch.sparse_coo_tensor(mask._indices(), ones, mask.shape, check_invariants=False)
        template._coalesced_(mask.is_coalesced())
        return dense.mul(template)


_FREE_CHILD = torch.empty(0)


def _empty_like(func: torch._ops.OpOverload, args: tuple, kwargs: dict) -> Any:
    """empty_like of a socket tensor; its CPU kernel calls empty_strided (free), so it is not a leaf."""
    with _observed():
        aten.alias.default(_FREE_CHILD)
    return _generic(func, args, kwargs)


def _mul(func: torch._ops.OpOverload, args: tuple, kwargs: dict) -> Any:
    """dense * sparse: a sparse result on the sparse one's indices, new values."""
    a, b = args[0], args[1]
    sparse = b if isinstance(b, torch.Tensor) and b.is_sparse else a if a.is_sparse else None
    if sparse is None:
        return _generic(func, args, kwargs)
    dense = a if sparse is b else b
    if not isinstance(dense, torch.Tensor) or dense.is_sparse:
        raise NotImplementedError("zion timing-only: mul of two sparse tensors (or by a scalar) is not modeled")
    indices = sparse._indices_real if isinstance(sparse, SocketTensor) else sparse._indices()
    nnz = indices.shape[1]
    meta = torch.empty((nnz, *dense.shape[1:]), dtype=torch.promote_types(a.dtype, b.dtype), device="meta")
    # As the CPU kernel's bytes (measured against real mode's pool): the dense
    # rows gathered at the indices (given back), new values and a copy of the indices.
    gathered = _reserve(meta.untyped_storage().nbytes())
    values = SocketTensor(meta, _reserve(meta.untyped_storage().nbytes()))
    indices = indices.clone()
    del gathered
    return SocketTensor.sparse(indices, values, list(dense.shape), sparse.is_coalesced())


def _fresh_like(meta: torch.Tensor, dtype: torch.dtype, memory_format: Any) -> SocketTensor:
    """clone and _to_copy: new bytes of the same layout (strides kept for a dense
    tensor under preserve_format, else contiguous), as the CPU kernel allocates them,
    and reserved in the socket's DDR pool."""
    from torch._prims_common import is_non_overlapping_and_dense_or_false as is_non_overlapping_and_dense

    keep = memory_format in (None, torch.preserve_format) and is_non_overlapping_and_dense(meta)
    out = torch.empty((meta.numel(),), dtype=dtype, device="meta")
    out = out.as_strided(meta.shape, meta.stride()) if keep else out.view(meta.shape)
    return SocketTensor(out, _reserve(out.untyped_storage().nbytes()))


def _sparse_clone(func: torch._ops.OpOverload, args: tuple, kwargs: dict) -> Any:
    t = args[0]
    if not t.is_sparse:
        return _fresh_like(t._meta, t.dtype, kwargs.get("memory_format"))
    node = torch._C._current_autograd_node()
    if node is not None and type(node).__name__ == "AccumulateGrad":
        # Real mode steals a fresh sparse gradient (its indices' and values' use
        # counts are 1); here this wrapper holds references of its own, so the
        # check fails and AccumulateGrad clones. Sharing keeps real mode's bytes.
        return SocketTensor.sparse(t._indices_real, t._values_st, list(t.shape), t._coalesced)
    values = _fresh_like(t._values_st._meta, t.dtype, None)
    return SocketTensor.sparse(t._indices_real.clone(), values, list(t.shape), t._coalesced)


def _sparse_detach(func: torch._ops.OpOverload, args: tuple, kwargs: dict) -> Any:
    t = args[0]
    if not t.is_sparse:
        return _generic(func, args, kwargs)
    return SocketTensor.sparse(t._indices_real, t._values_st, list(t.shape), t._coalesced)


def _in_place(func: torch._ops.OpOverload, args: tuple, kwargs: dict) -> Any:
    """An in-place op whose self keeps its shape (dense += sparse): no values to compute."""
    if any(isinstance(a, SocketTensor) and a.is_sparse for a in args):
        return args[0]
    return _generic(func, args, kwargs)


def _sparse_attribute(func: torch._ops.OpOverload, args: tuple, kwargs: dict) -> Any:
    t = args[0]
    if not t.is_sparse:
        return _generic(func, args, kwargs)
    if func in (aten._indices.default, aten.indices.default):
        return t._indices_real
    if func in (aten._values.default, aten.values.default):
        return t._values_st
    if func is aten._nnz.default:
        return t._indices_real.shape[1]
    if func is aten.is_coalesced.default:
        return t._coalesced
    if func is aten.sparse_dim.default:
        return 1
    if func is aten.dense_dim.default:
        return t.dim() - 1
    if func is aten._coalesced_.default:
        t._coalesced = bool(args[1])
        return t
    raise AssertionError(func)


_SPECIAL: dict[Any, Callable[[torch._ops.OpOverload, tuple, dict], Any]] = {
    aten._local_scalar_dense.default: _local_scalar,
    aten._embedding_bag.default: _embedding_bag,
    aten._embedding_bag_forward_only.default: _embedding_bag,
    aten._to_copy.default: _to_copy,
    aten.copy_.default: _copy_,
    aten._sparse_coo_tensor_with_dims_and_tensors.default: _sparse_new,
    aten.mul.Tensor: _mul,
    aten.empty_like.default: _empty_like,
    aten._coalesce.default: _coalesce,
    aten.sparse_mask.default: _sparse_mask,
    aten.clone.default: _sparse_clone,
    aten.detach.default: _sparse_detach,
    aten.alias.default: _sparse_detach,
    aten.add_.Tensor: _in_place,
    aten.sub_.Tensor: _in_place,
}
for _op in (aten._indices.default, aten.indices.default, aten._values.default, aten.values.default,
            aten._nnz.default, aten.is_coalesced.default, aten.sparse_dim.default, aten.dense_dim.default,
            aten._coalesced_.default):
    _SPECIAL[_op] = _sparse_attribute


# As zion's timing-only mode (csrc/device/aten/timing.cpp): arguments that need
# real values, and ops whose result's shape depends on their input's values.
_INDEX_ARGUMENTS = frozenset({"index", "indices", "offsets", "lengths", "repeats"})
_DATA_DEPENDENT = frozenset({
    "aten::nonzero", "aten::argwhere", "aten::masked_select", "aten::unique_consecutive", "aten::unique_dim",
    "aten::_unique", "aten::_unique2", "aten::unique_dim_consecutive", "aten::repeat_interleave",
    "aten::bincount", "aten::nonzero_numpy"})


def _check_values_not_needed(func: torch._ops.OpOverload, args: tuple, kwargs: dict) -> None:
    """A clear error where an op needs the values a socket tensor does not keep."""
    if func._schema.name in _DATA_DEPENDENT:
        raise RuntimeError(f"zion timing-only: {func._schema.name} needs the values of a storage-less socket tensor "
                           "(the shape of its result depends on them), which timing-only mode does not keep. Integer "
                           "and bool tensors made from real data (indices, offsets, lengths, masks) stay real; this "
                           "one was computed from storage-less floats")
    for i, arg in enumerate(func._schema.arguments):
        if arg.name not in _INDEX_ARGUMENTS:
            continue
        value = kwargs.get(arg.name) if i >= len(args) else args[i]
        for t in value if isinstance(value, (list, tuple)) else (value,):
            if isinstance(t, SocketTensor) and not (t.dtype.is_floating_point or t.dtype.is_complex):
                raise RuntimeError(f"zion timing-only: {func._schema.name} uses a storage-less {t.dtype} socket "
                                   f"tensor as its '{arg.name}'; its values were computed from storage-less floats, "
                                   "so they are not known in timing-only mode, and an index needs real values. "
                                   "Compute indices from integer tensors (which stay real), or run in real mode")


def _run(func: torch._ops.OpOverload, args: tuple, kwargs: dict) -> Any:
    _check_values_not_needed(func, args, kwargs)
    handler = _SPECIAL.get(func)
    if handler is not None:
        return handler(func, args, kwargs)
    if any(isinstance(a, SocketTensor) and a.is_sparse for a in (*args, *kwargs.values())):
        raise NotImplementedError(f"zion timing-only: {func} on a sparse socket tensor is not modeled; "
                                  "supported: coalesce, sparse_mask, _values, _indices, clone, add_ into a dense one")
    return _generic(func, args, kwargs)


# --- factories inside a socket scope ---------------------------------------
#
# A TorchFunctionMode, not a TorchDispatchMode: a dispatch mode sees every op
# of the scope, the zion ops and the autograd engine's too, and its Python
# frames hold references that change the use-count checks by which C++ code
# decides to work in place (measured: the DLRM step's modeled time and peak
# HBM moved). A function mode sees the script's own calls only.

# Python-level factories: (torch function, what it is like: None or the index of its "like" argument).
_EMPTY_FACTORIES = {torch.empty: None, torch.empty_strided: None, torch.empty_like: 0,
                    torch.Tensor.new_empty: 0, torch.Tensor.new_empty_strided: 0}
# Factories that fill what they allocate: made as ``*_like`` of a template, so the
# allocation is counted once and the fill priced on the socket as in real mode.
_FILLED_FACTORIES = {torch.zeros: torch.zeros_like, torch.ones: torch.ones_like, torch.full: torch.full_like,
                     torch.rand: torch.rand_like, torch.randn: torch.randn_like,
                     torch.zeros_like: torch.zeros_like, torch.ones_like: torch.ones_like,
                     torch.full_like: torch.full_like, torch.rand_like: torch.rand_like,
                     torch.randn_like: torch.randn_like, torch.Tensor.new_zeros: torch.zeros_like,
                     torch.Tensor.new_ones: torch.ones_like, torch.Tensor.new_full: torch.full_like}
# On a socket tensor these CPU kernels call empty_like (a socket tensor again) and fill it.
_LIKE_OPS = frozenset({aten.zeros_like.default, aten.ones_like.default, aten.full_like.default,
                       aten.rand_like.default, aten.randn_like.default})


def _factory_shape(func: Callable, args: tuple, kwargs: dict) -> tuple[list[int] | None, torch.Tensor | None, tuple]:
    """(size, the like tensor, the remaining positional arguments) of a factory call."""
    like = None
    rest = args
    if func in (torch.empty_like, torch.zeros_like, torch.ones_like, torch.full_like, torch.rand_like,
                torch.randn_like):
        like, rest = args[0], args[1:]
        return list(like.shape), like, rest
    if func in (torch.Tensor.new_empty, torch.Tensor.new_zeros, torch.Tensor.new_ones, torch.Tensor.new_full,
                torch.Tensor.new_empty_strided):
        like, args = args[0], args[1:]
    size = kwargs.get("size")
    if size is None:
        if not args:
            return [], like, ()
        if isinstance(args[0], (list, tuple, torch.Size)):
            size, rest = list(args[0]), args[1:]
        else:
            n = 0
            while n < len(args) and isinstance(args[n], int) and not isinstance(args[n], bool):
                n += 1
            size, rest = list(args[:n]), args[n:]
    return list(size), like, rest


def _socket_factory(func: Callable, args: tuple, kwargs: dict) -> "SocketTensor | None":
    """A floating-point CPU factory as a socket tensor, or None (another device, an integer dtype, a layout)."""
    size, like, rest = _factory_shape(func, args, kwargs)
    device = kwargs.get("device")
    if device is None:
        device = like.device if like is not None else torch.get_default_device()
    dtype = kwargs.get("dtype") or (like.dtype if like is not None else torch.get_default_dtype())
    if torch.device(device).type != "cpu" or not dtype.is_floating_point or kwargs.get("out") is not None or \
            kwargs.get("layout", torch.strided) != torch.strided or kwargs.get("pin_memory"):
        return None
    if func in _EMPTY_FACTORIES:
        if func in (torch.empty_strided, torch.Tensor.new_empty_strided):
            stride = list(rest[0] if rest else kwargs["stride"])
            elements = 0 if any(n == 0 for n in size) else 1 + sum((n - 1) * st for n, st in zip(size, stride))
            meta = torch.empty((elements,), dtype=dtype, device="meta").as_strided(size, stride)
        elif like is not None and func is torch.empty_like and kwargs.get("memory_format") in (
                None, torch.preserve_format):
            meta = torch.empty_like(_meta_like(like) if like.device.type != "meta" else like, dtype=dtype,
                                    device="meta")
        else:
            meta = torch.empty(size, dtype=dtype, device="meta")
        return SocketTensor(meta, _reserve(meta.untyped_storage().nbytes()))
    template = SocketTensor(torch.empty(size, dtype=dtype, device="meta"), None)  # no bytes: only its shape
    fill_args = rest
    fill_kwargs = {k: v for k, v in kwargs.items() if k not in ("device", "dtype", "size", "requires_grad")}
    made = _FILLED_FACTORIES[func](template, *fill_args, **fill_kwargs)
    if kwargs.get("requires_grad"):
        made.requires_grad_(True)
    return made


class SocketFactoryMode(torch.overrides.TorchFunctionMode):
    """Pushed by ``zion_emu.socket(i)`` in timing-only mode: a floating-point
    CPU tensor the script makes on a thread inside a socket scope is a
    storage-less :class:`SocketTensor` counted in that socket's pool."""

    def __torch_function__(self, func: Callable, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if (func in _EMPTY_FACTORIES or func in _FILLED_FACTORIES) and not getattr(_state, "inside", False) and \
                _native.scoped_socket() >= 0:
            made = _socket_factory(func, args, kwargs)
            if made is not None:
                return made
        return func(*args, **kwargs)
