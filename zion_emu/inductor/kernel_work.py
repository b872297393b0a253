"""The work of one C++ kernel inductor generated: the bytes it moves and its
FLOPs, read from the kernel's arguments and loop bodies while it is generated.

A fused kernel keeps its intermediates in registers, so its memory traffic is
its argument buffers (inductor's ``KernelArgs``): the elements of each input
it reads, once, the elements of each output it writes, once, and both for each
buffer it updates in place. Which elements those are comes from its loop
bodies' memory dependencies, as inductor's scheduler counts a kernel's bytes
(``get_read_write_buffer_accesses``): a load indexed by some of the loop
variables touches the points of those variables (a slice of a buffer, a row
broadcast along a dimension), a load through an index read from memory (a
gather, an embedding lookup) touches at most one element per point of its loop
nest, and never more than the whole buffer. Its
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

    nodes = list(nodes)
    reads, writes = _deps_by_buffer(nodes)

    def buffer_bytes(names: list[str], *tables: dict[str, set[Any]]) -> Any:
        """Bytes of the buffer ``names`` name, for the accesses in ``tables``
        (reads, writes or both): each table's touched elements, or, where no
        table has an access to it (an opaque call), the whole buffer once each."""
        buf = V.graph.get_buffer(names[-1])
        dtypes.append(buf.get_dtype())
        found = [set().union(*(table.get(name, set()) for name in names)) for table in tables]
        if not any(found):
            return len(tables) * _numel(buf.get_size()) * buf.get_dtype().itemsize
        return sum(_elements_touched(buf, deps) for deps in found if deps) * buf.get_dtype().itemsize

    dtypes: list[torch.dtype] = []
    nbytes: Any = sympy.Integer(0)
    for inplaced in unique(args.inplace_buffers.values()):
        if not isinstance(inplaced, RemovedArg):  # read, then written in place
            nbytes += buffer_bytes(inplaced.other_names, reads, writes)
    for outer in args.input_buffers:
        if outer not in args.inplace_buffers:
            nbytes += buffer_bytes([outer], reads)
    for outer, inner in args.output_buffers.items():
        if outer not in args.inplace_buffers and not isinstance(inner, RemovedArg):
            nbytes += buffer_bytes([outer], writes)

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


def _deps_by_buffer(nodes: list[Any]) -> tuple[dict[str, set[Any]], dict[str, set[Any]]]:
    """The memory dependencies of a kernel's scheduler nodes, reads and
    writes, by the name the kernel's arguments give their buffer: a node that
    mutates a buffer writes under its own name, and the kernel's argument is
    the mutated buffer's (the scheduler's ``mutation_real_name``, as
    ``KernelArgs`` maps it). Deps of fused nodes are normalized alike, so a
    load two nodes share counts once."""
    from torch._inductor.virtualized import V

    real = V.graph.scheduler.mutation_real_name if V.graph.scheduler else {}
    reads: dict[str, set[Any]] = {}
    writes: dict[str, set[Any]] = {}
    for node in nodes:
        for deps, by_name in ((node.read_writes.reads, reads), (node.read_writes.writes, writes)):
            for dep in deps:
                by_name.setdefault(real.get(dep.name, dep.name), set()).add(dep)
    return reads, writes


def _elements_touched(buf: Any, deps: set[Any]) -> Any:
    """How many of ``buf``'s elements its dependencies in one kernel touch:
    the sum over distinct accesses, at most the whole buffer; the whole
    buffer where a dependency does not say which (a StarDep: an access
    through an opaque call)."""
    from torch._inductor.dependencies import MemoryDep, StarDep, WeakDep

    whole = _numel(buf.get_size())
    touched: Any = sympy.Integer(0)
    for dep in deps:
        if isinstance(dep, WeakDep):  # orders two kernels; moves nothing
            continue
        if isinstance(dep, StarDep) or not isinstance(dep, MemoryDep):
            return whole
        # A load through an index read from memory: one element per point.
        touched += _numel(dep.size) if dep.is_indirect() else dep.get_numel()
    return sympy.Min(touched, whole)
