"""Timing-only mode: ``ZION_MODE=timing`` (or ``zion-emu run --timing-only``).

Floating-point zion tensors have no host bytes; their shapes come from meta
kernels and every op is priced as in real mode (see ``csrc/device/aten/timing.h``
and the README's "Timing-only mode"). The mode is read once, when the first
zion tensor is made, and cannot change afterwards.

torch registers Python meta kernels (``torch._meta_registrations``) in front
of the C++ Meta kernels of several hundred ops. Called from zion's C++
fallback a Python meta kernel costs 20-250 us per op, a C++ one about 1 us,
so in timing-only mode the C++ kernel is put back in front wherever one
exists: the Python registrations are dropped and made again only for the ops
that have no C++ Meta kernel of their own. Meta tensors elsewhere in the
process (FakeTensor, torch.compile) then use the same C++ kernels that
ATen's structured ops share with CPU.
"""

from __future__ import annotations

import os

import torch

_preferred = False

# Ops that torch itself never gives a Python Meta kernel (torch/_meta_registrations.py,
# activate_meta): their Python decompositions reach back into the op through
# torch._prims (empty_strided's ref builds its result with torch.empty_strided),
# so as Meta kernels they recurse without end, or differ from the C++ ones.
_CPP_META_ONLY = frozenset({
    "aten::empty_strided", "aten::clone", "aten::_to_copy", "aten::copy_", "aten::constant_pad_nd", "aten::rot90",
    "aten::as_strided_scatter",
})


def requested() -> bool:
    """Whether the environment asks for timing-only mode (``ZION_MODE``)."""
    return os.environ.get("ZION_MODE", "") == "timing"


def mode() -> str:
    """``"timing"`` (timing-only mode) or ``"real"``: the mode of this process's zion tensors."""
    from zion_emu import _C

    return _C.device.mode()


def placeholder_reads() -> list[dict]:
    """Every read of a storage-less value so far (timing-only mode): one entry per
    call site (``site``, the script's ``file:line``) and kind of read (``what``),
    with the tensor's ``dtype`` and the ``count`` of reads."""
    from zion_emu import _C

    return _C.device.placeholder_reads()


def prefer_cpp_meta() -> int:
    """Puts C++ Meta kernels in front of torch's Python ones (once); returns how
    many Python registrations were dropped."""
    global _preferred
    if _preferred:
        return 0
    _preferred = True
    import torch._decomp
    import torch._meta_registrations as registrations

    python_meta: dict = {}
    for kind in ("meta", "post_autograd", "pre_autograd"):
        for op, fn in torch._decomp.global_decomposition_table[kind].items():
            if isinstance(op, torch._ops.OpOverload) and op not in python_meta:
                python_meta[op] = fn
    registered = [op for op in python_meta if torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "Meta")]
    registrations._meta_lib_dont_use_me_use_register_meta._destroy()
    again = torch.library.Library("aten", "IMPL", "Meta")  # noqa: TOR901
    restored = 0
    for op in registered:
        name = op.name()
        if not name.startswith("aten::") or op.is_view:
            continue
        has_own = torch._C._dispatch_has_kernel_for_dispatch_key(name, "Meta") or \
            torch._C._dispatch_has_kernel_for_dispatch_key(name, "CompositeImplicitAutograd")
        if not has_own and name not in _CPP_META_ONLY:
            again.impl(op, python_meta[op])
            restored += 1
    registrations._meta_lib_dont_use_me_use_register_meta = again
    return len(registered) - restored


def install_placeholder_printing() -> None:
    """Printing a storage-less zion tensor (``print(loss)``) shows placeholders, as
    reading it does: torch's formatter picks its number format with
    ``masked_select`` over the values, whose result's shape needs them."""
    import torch._tensor_str as tensor_str

    from zion_emu import _C

    original = tensor_str._tensor_str
    if getattr(original, "_zion_placeholders", False):
        return

    def _tensor_str(self: torch.Tensor, indent: int) -> str:
        if self.device.type == "zion" and _C.device.is_storage_less(self):
            self = self.cpu()  # zeros; the read is counted and warned per call site
        return original(self, indent)

    _tensor_str._zion_placeholders = True  # type: ignore[attr-defined]
    tensor_str._tensor_str = _tensor_str

