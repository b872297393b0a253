"""Autograd kernels on zion for fbgemm's table-batched embedding (TBE) lookups.

fbgemm registers its TBE lookup ops (``fbgemm::split_embedding_codegen_lookup_
<optimizer>_function_pt2`` and friends) for CUDA, Meta and Autograd only, and
the Autograd kernel takes its host path only for weights that are CPU (or
MTIA) tensors. Other fbgemm ops have an AutogradCPU kernel and no autograd
for any other device (``permute_pooled_embs_auto_grad_split``, which
column-wise sharding calls, and the batched index selects). On zion the AutogradPrivateUse1 kernel registered here runs
that same autograd kernel, fbgemm's own glue, on zero-copy CPU aliases of the
zion tensors, while a dispatch mode sends every op the glue calls on those
aliases (the ``*_pt2_wrapper`` forward and backward kernels, the real work)
back to zion. There they go through the fallback like any op: the CPU kernel
runs on the same bytes and the op is priced under its own name. The fused
optimizer's update lands in zion memory because the aliases are zion memory.

``fbgemm::dense_embedding_codegen_lookup_function`` (the DENSE kernel of
data-parallel tables) has only a CPU kernel, with its autograd inside; its
zion kernel is an autograd function of the two ops fbgemm's CPU autograd
calls: the lookup (run below autograd) and
``fbgemm::split_embedding_backward_codegen_dense_cpu``.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.utils._pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from zion_emu import _C

ZION = "zion"


def _cpu_alias(t: torch.Tensor) -> torch.Tensor:
    # The glue reads metadata only, and every op it calls on an alias runs on
    # zion: a storage-less tensor (timing-only mode) gets an alias too.
    return _C.device.cpu_alias(t, storage_less_ok=True)

_zion_tensor_of_alias = _C.device.zion_tensor_of_alias

# The library object keeps the registrations alive.
_library: torch.library.Library | None = None
_bridged: set[str] = set()  # full names of the ops whose zion autograd kernel is here


def _is_zion(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.device.type == ZION


def _zion_device(tree: Any) -> torch.device:
    for t in pytree.tree_leaves(tree):
        if _is_zion(t):
            return t.device
    return torch.device(ZION, torch.zion.current_device())


def _to_zion(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """The zion tensor a CPU alias stands for; a CPU tensor the glue made
    itself (an empty placeholder, a small index tensor) is copied to zion."""
    z = _zion_tensor_of_alias(t)
    return z if z is not None else t.to(device)


class _GlueOpsOnZion(TorchDispatchMode):
    """While fbgemm's glue runs on CPU aliases: every op that it calls on an
    alias runs on the zion tensors instead (through the fallback, so it is
    priced), and hands the glue CPU aliases of its results."""

    def __init__(self, device: torch.device) -> None:
        super().__init__()
        self.device = device

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        tensors = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        if func.name() in _bridged or not any(_zion_tensor_of_alias(t) is not None for t in tensors):
            return func(*args, **kwargs)  # CPU-side bookkeeping the glue does on its own tensors
        zargs, zkwargs = pytree.tree_map_only(torch.Tensor, lambda t: _to_zion(t, self.device), (args, kwargs))
        out = func(*zargs, **zkwargs)
        return pytree.tree_map_only(torch.Tensor, lambda t: _cpu_alias(t) if _is_zion(t) else t, out)


class _HostGlue(torch.autograd.Function):
    """One call of a TBE lookup op through fbgemm's autograd kernel on CPU aliases."""

    @staticmethod
    def forward(ctx: Any, op: Any, spec: Any, *flat: Any) -> Any:
        args, kwargs = pytree.tree_unflatten(list(flat), spec)
        device = _zion_device((args, kwargs))

        def to_cpu(t: torch.Tensor) -> torch.Tensor:
            if not _is_zion(t):
                return t
            a = _cpu_alias(t)
            if t.requires_grad:
                a.requires_grad_(True)  # a leaf of the CPU graph, whose .grad becomes this input's gradient
            return a

        cargs, ckwargs = pytree.tree_map_only(torch.Tensor, to_cpu, (args, kwargs))
        with torch.enable_grad(), _GlueOpsOnZion(device):
            out = op(*cargs, **ckwargs)
        ctx.device = device
        ctx.cpu_out = out
        ctx.cpu_inputs = pytree.tree_leaves((cargs, ckwargs))
        outs = out if isinstance(out, (tuple, list)) else (out,)
        result = tuple(_to_zion(o.detach(), device) for o in outs)
        return result if isinstance(out, (tuple, list)) else result[0]

    @staticmethod
    def backward(ctx: Any, *grads: Any) -> Any:
        outs = ctx.cpu_out if isinstance(ctx.cpu_out, (tuple, list)) else (ctx.cpu_out,)
        pairs = [(o, _cpu_alias(g.contiguous()) if _is_zion(g) else g)
                 for o, g in zip(outs, grads) if g is not None and o.requires_grad]
        if pairs:
            with _GlueOpsOnZion(ctx.device):
                torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
        input_grads = [
            _to_zion(a.grad, ctx.device) if isinstance(a, torch.Tensor) and a.is_leaf and a.grad is not None else None
            for a in ctx.cpu_inputs
        ]
        del ctx.cpu_out, ctx.cpu_inputs
        return (None, None, *input_grads)


def _host_glue_kernel(op: Any) -> Callable[..., Any]:
    def kernel(*args: Any, **kwargs: Any) -> Any:
        flat, spec = pytree.tree_flatten((args, kwargs))
        return _HostGlue.apply(op, spec, *flat)

    return kernel


class _DenseLookup(torch.autograd.Function):
    """fbgemm::dense_embedding_codegen_lookup_function on zion, with the
    backward fbgemm's CPU kernel computes (its SplitLookupFunction_Dense_Op):
    ``split_embedding_backward_codegen_dense_cpu`` for the weights,
    ``split_embedding_codegen_grad_indice_weights_cpu`` for per-sample weights."""

    @staticmethod
    def forward(ctx: Any, bound: dict[str, Any], weights: torch.Tensor,
                indice_weights: torch.Tensor | None) -> torch.Tensor:
        with torch._C._AutoDispatchBelowAutograd():
            out = _dense_op()(**bound)
        ctx.int_args = (int(bound["max_D"]), int(bound["total_hash_size_bits"]), int(bound["pooling_mode"]))
        feature_requires_grad = bound.get("feature_requires_grad")
        # None stays None: fbgemm tells an unweighted lookup by an undefined indice_weights.
        ctx.save_for_backward(weights, bound["weights_offsets"], bound["D_offsets"], bound["hash_size_cumsum"],
                              bound["indices"], bound["offsets"], indice_weights, feature_requires_grad)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        (weights, weights_offsets, D_offsets, hash_size_cumsum, indices, offsets, indice_weights,
         feature_requires_grad) = ctx.saved_tensors
        max_D, total_hash_size_bits, pooling_mode = ctx.int_args
        grad_weights = grad_indice_weights = None
        if ctx.needs_input_grad[1]:
            grad_weights = torch.ops.fbgemm.split_embedding_backward_codegen_dense_cpu(
                grad, weights, weights_offsets, D_offsets, max_D, hash_size_cumsum, total_hash_size_bits, indices,
                offsets, pooling_mode, indice_weights, 0.0)
        if ctx.needs_input_grad[2]:
            grad_indice_weights = torch.ops.fbgemm.split_embedding_codegen_grad_indice_weights_cpu(
                grad, weights, weights_offsets, D_offsets, indices, offsets, feature_requires_grad)
        return None, grad_weights, grad_indice_weights


def _dense_op() -> Any:
    return torch.ops.fbgemm.dense_embedding_codegen_lookup_function.default


def _dense_kernel(*args: Any, **kwargs: Any) -> torch.Tensor:
    names = [a.name for a in _dense_op()._schema.arguments]
    bound = dict(zip(names, args), **kwargs)
    if bound.get("B_offsets") is not None:
        raise NotImplementedError(
            "zion: fbgemm::dense_embedding_codegen_lookup_function with a batch size per feature and rank "
            "(B_offsets, variable batch embeddings) has no zion autograd kernel; give every feature one batch size")
    return _DenseLookup.apply(bound, bound["dev_weights"], bound.get("indice_weights"))


def _has_host_glue(name: str) -> bool:
    """An op whose autograd is fbgemm's host glue: a TBE lookup's
    device-checking Autograd kernel, or an AutogradCPU kernel with no
    Autograd kernel for other devices (the permutes of pooled embeddings
    that column-wise sharding calls, the batched index selects). Without a
    zion kernel the latter ran on zion below autograd, and their inputs'
    gradients were silently lost."""
    def has(key: str) -> bool:
        return torch._C._dispatch_has_kernel_for_dispatch_key(name, key)

    base = name.split("::", 1)[1].split(".")[0]
    if base.startswith(("split_embedding_codegen_lookup_", "ssd_embedding_codegen_lookup_")):
        return has("Autograd") or has("AutogradCPU")
    return has("AutogradCPU") and not has("Autograd") and not has("AutogradPrivateUse1")


def install() -> list[str]:
    """Registers the zion autograd kernels of fbgemm's lookup ops (once; fbgemm_gpu
    must be imported). Returns the ops bridged."""
    global _library
    if _library is not None:
        return sorted(_bridged)
    library = torch.library.Library("fbgemm", "IMPL")
    for name in torch._C._dispatch_get_all_op_names():
        if not name.startswith("fbgemm::") or not _has_host_glue(name):
            continue
        base = name.split("::", 1)[1]
        packet = getattr(torch.ops.fbgemm, base.split(".")[0])
        overload = base.split(".")[1] if "." in base else "default"
        library.impl(base, _host_glue_kernel(getattr(packet, overload)), "AutogradPrivateUse1")
        _bridged.add(name)
    dense = "fbgemm::dense_embedding_codegen_lookup_function"
    if torch._C._dispatch_has_kernel_for_dispatch_key(dense, "CPU"):
        library.impl("dense_embedding_codegen_lookup_function", _dense_kernel, "AutogradPrivateUse1")
        _bridged.add(dense)
    _library = library
    return sorted(_bridged)
