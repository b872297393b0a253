"""Pricing ops on the zion device. Every op a zion tensor runs is priced by the
device's op cost model from a table of work formulas keyed by ATen name; an op
with no formula is priced by a default guess and counted in
``counters(device).guessed_ops``. :func:`register` adds or replaces a formula.

A formula receives a :class:`zion_emu.sim.OpCall`: ``name``, and ``inputs`` /
``outputs`` as :class:`zion_emu.sim.TensorDesc` (``sizes``, ``dtype`` such as
``"fp32"`` or ``"bf16"``, ``element_size``, ``numel()``, ``bytes()``). It
returns the work: a ``(flops, bytes)`` pair, a dict with keys ``flops``,
``bytes`` and optionally ``op_class`` (``"matmul"``, ``"convolution"``,
``"elementwise"``, ``"reduction"``, ``"embedding_bag"``, ``"other"``: which
efficiency of the preset applies) and ``gathered_bytes``, or a
:class:`zion_emu.sim.OpWork`. The device turns it into time with the
platform's roofline. A negative count raises an error naming the op when the
op runs.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Union

import torch

from zion_emu import _C
from zion_emu._C.sim import OpCall, OpWork, TensorDesc

__all__ = ["OpCall", "OpWork", "TensorDesc", "formula_names", "guessed_ops", "has_formula", "op_name", "register"]

Work = Union[OpWork, Mapping[str, Any], "tuple[float, float]"]
Formula = Union[Callable[[OpCall], Work], Mapping[str, Any]]

_native = _C.device
# Formulas registered from Python, handed again to the cost model of a new
# platform (set_platform replaces the model).
_registered: dict[str, Formula] = {}


def op_name(op: str | torch._ops.OpOverload | torch._ops.OpOverloadPacket) -> str:
    """The name the cost model knows an op by: ``"aten::mm"``, ``"aten::add.Tensor"``.
    Accepts that name, ``"aten::mm.default"`` or ``torch.ops.aten.mm(.default)``.
    Raises ValueError if no such operator is registered with torch."""
    if isinstance(op, torch._ops.OpOverload):
        schema = op._schema
        return schema.name + (f".{schema.overload_name}" if schema.overload_name else "")
    if isinstance(op, torch._ops.OpOverloadPacket):
        return op._qualified_op_name
    if not isinstance(op, str):
        raise TypeError(f"zion: an op is named by a str such as 'aten::mm' or by torch.ops.aten.mm, got {op!r}")
    namespace, sep, rest = op.partition("::")
    base, _, overload = rest.partition(".")
    if not sep or not namespace or not base:
        raise ValueError(f"zion: op name {op!r} is not an ATen schema name such as 'aten::mm' or 'aten::add.Tensor'")
    try:
        packet = getattr(getattr(torch.ops, namespace), base)
        if overload:
            getattr(packet, overload)
    except (AttributeError, RuntimeError):
        raise ValueError(f"zion: no operator {op!r} is registered with torch "
                         "(names are ATen schema names such as 'aten::mm' or 'aten::add.Tensor')") from None
    return f"{namespace}::{base}" if overload in ("", "default") else f"{namespace}::{base}.{overload}"


def _accepting_pairs(formula: Callable[[OpCall], Work]) -> Callable[[OpCall], OpWork | Mapping[str, Any]]:
    def work(call: OpCall) -> OpWork | Mapping[str, Any]:
        result = formula(call)
        if isinstance(result, tuple) and len(result) == 2:
            return {"flops": result[0], "bytes": result[1]}
        return result

    return work


def register(op: str | torch._ops.OpOverload | torch._ops.OpOverloadPacket, formula: Formula) -> None:
    """Prices ``op`` on every zion device with ``formula``: a callable
    ``f(call) -> (flops, bytes) | dict | OpWork``, or a constant dict. A name
    without overload (``"aten::add"``) covers every overload that has no
    formula of its own; an in-place op (``aten::add_``) falls back to its
    functional form's formula."""
    name = op_name(op)
    if callable(formula):
        formula = _accepting_pairs(formula)
    else:
        for key in ("flops", "bytes", "gathered_bytes"):
            value = formula.get(key, 0) if isinstance(formula, Mapping) else 0
            if isinstance(value, (int, float)) and not 0 <= value < float("inf"):
                raise ValueError(f"op cost formula for {name}: {key} must be a finite count >= 0, got {value}")
    _native.register_formula(name, formula)  # checks a constant dict now
    _registered[name] = formula


def has_formula(op: str | torch._ops.OpOverload | torch._ops.OpOverloadPacket) -> bool:
    """Whether the cost model knows ``op`` (else it is priced by the default guess)."""
    return _native.has_formula(op_name(op))


def formula_names() -> list[str]:
    """Every op name with a formula, built-in or registered (sorted)."""
    return _native.formula_names()


def _register_all() -> None:
    for name, formula in _registered.items():
        _native.register_formula(name, formula)


def guessed_ops(device: int | str | torch.device | None = None) -> dict[str, int]:
    """The ops priced by the default guess on a device since the last
    ``reset_clock()``, with how often each ran: candidates for :func:`register`."""
    from zion_emu.device import _index

    return dict(_native.guessed_ops(_index(device)))
