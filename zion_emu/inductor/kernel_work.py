"""The work of one C++ kernel inductor generated: the bytes it moves and its
FLOPs, read from the kernel's arguments and loop bodies while it is generated.

A fused kernel keeps its intermediates in registers, so its memory traffic is
its argument buffers: each input read once, each output written once, each
buffer it updates in place read and written (inductor's ``KernelArgs``). Its
FLOPs are the arithmetic ops of each loop body (``LoopBody.op_counts``, one
FLOP per op, as zion's eager formulas count one per element for ``relu`` or
``sigmoid``) times the points of its loop nest. With dynamic shapes both are
sympy expressions in the graph's size symbols.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

import sympy
import torch

# Ops of a loop body that move or index data, or convert it: no FLOP.
_NO_FLOPS = frozenset({
    "load", "store", "store_reduction", "load_seed", "index_expr", "indirect_indexing", "check_bounds", "masked",
    "constant", "to_dtype", "to_dtype_bitcast", "bucketize", "output", "placeholder", "get_index", "halide_clamp",
    "device_assert_async",
})

# The cost model's dtype names (csrc/sim/dtype.h); float64 has no preset
# peak and is priced at fp32, as the eager op pricing does.
_MODEL_DTYPES = {torch.bfloat16: "bf16", torch.float16: "fp16"}


@dataclass(frozen=True)
class KernelWork:
    """Bytes and FLOPs of one generated kernel (ints, or sympy expressions
    in the graph's size symbols), the roofline class, and the dtype whose
    peak prices the FLOPs."""

    bytes: Any
    flops: Any
    op_class: str  # "elementwise" or "reduction"
    dtype: str


def _numel(sizes: Iterable[Any]) -> Any:
    n: Any = sympy.Integer(1)
    for s in sizes:
        n = n * s
    return n


def _model_dtype(dtypes: list[torch.dtype]) -> str:
    """The first floating dtype (as the eager op pricing picks it), else int8
    for one-byte integers and fp32 for wider ones."""
    for d in dtypes:
        if d.is_floating_point:
            return _MODEL_DTYPES.get(d, "fp32")
    return "int8" if dtypes and dtypes[0].itemsize == 1 else "fp32"


def kernel_work(args: Any, nodes: Iterable[Any]) -> KernelWork:
    """Work of the kernel whose arguments are ``args`` (a ``KernelArgs``) and
    whose scheduler nodes are ``nodes``; call while its graph is lowering."""
    from torch._inductor.codegen.common import RemovedArg
    from torch._inductor.utils import unique
    from torch._inductor.virtualized import V

    def buffer_bytes(name: str) -> Any:
        buf = V.graph.get_buffer(name)
        dtypes.append(buf.get_dtype())
        return _numel(buf.get_size()) * buf.get_dtype().itemsize

    dtypes: list[torch.dtype] = []
    nbytes: Any = sympy.Integer(0)
    for inplaced in unique(args.inplace_buffers.values()):
        if not isinstance(inplaced, RemovedArg):
            nbytes += 2 * buffer_bytes(inplaced.other_names[-1])  # read, then written in place
    for outer in args.input_buffers:
        if outer not in args.inplace_buffers:
            nbytes += buffer_bytes(outer)
    for outer, inner in args.output_buffers.items():
        if outer not in args.inplace_buffers and not isinstance(inner, RemovedArg):
            nbytes += buffer_bytes(outer)

    flops: Any = sympy.Integer(0)
    reduction = False
    for node in nodes:
        body = node._body
        ops = sum(n for name, n in body.op_counts.items() if name not in _NO_FLOPS)
        flops += ops * _numel(size for part in node._sizes for size in part)
        reduction = reduction or node.is_reduction()
    simplify = V.graph.sizevars.simplify
    return KernelWork(bytes=simplify(nbytes), flops=simplify(flops),
                      op_class="reduction" if reduction else "elementwise", dtype=_model_dtype(dtypes))
