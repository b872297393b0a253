"""torch.compile's default backend (inductor) on zion: lower as CPU, run on zion.

Inductor compiles a zion graph as if it were a CPU graph, so it makes exactly
the CPU's choices (decompositions, fusions, the same C++ kernels) and the
results equal a CPU compile's. The generated wrapper allocates its buffers on
zion; extern kernels (``mm``, ``addmm``, ``bmm``, ``convolution``,
``embedding_bag``, ...) then run through zion's fallback, priced op by op as
in eager mode, and each generated C++ kernel is charged as one fused kernel
from the bytes it reads and writes and its FLOPs. A graph that cannot go this
way runs op by op on zion instead (torch.compile's ``eager`` backend), with a warning.

:func:`install_on_import` (run when zion registers) wraps
``torch._inductor.compile_fx.compile_fx`` when that module is first imported,
so a process that never compiles never imports inductor. CPU graphs are
compiled exactly as before.
"""

from __future__ import annotations

import functools
import sys
from types import ModuleType
from typing import Any

from zion_emu import _after_import

__all__ = ["fallbacks", "install_on_import"]

_COMPILE_FX = "torch._inductor.compile_fx"


def fallbacks() -> list[str]:
    """Why each zion graph that ran op by op instead did, oldest first."""
    if _COMPILE_FX not in sys.modules:
        return []
    from zion_emu.inductor.compile_fx import fallback_reasons

    return list(fallback_reasons)


def _wrap(module: ModuleType) -> None:
    original = module.compile_fx
    if getattr(original, "_zion_wrapped", False):
        return

    @functools.wraps(original)
    def compile_fx(model_: Any, example_inputs_: Any, *args: Any, **kwargs: Any) -> Any:
        from zion_emu.inductor import compile_fx as zion  # imports inductor's code generators: on first use

        return zion.compile_fx(original, model_, example_inputs_, *args, **kwargs)

    compile_fx._zion_wrapped = True  # type: ignore[attr-defined]
    module.compile_fx = compile_fx


def install_on_import() -> None:
    """Wraps inductor's compile_fx now if it is imported, else when it is."""
    _after_import.after_import(_COMPILE_FX, _wrap)

