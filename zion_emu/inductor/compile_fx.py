"""``compile_fx`` for zion graphs: lower as CPU, run on zion; else op by op.

A graph with zion tensors is handed to inductor as a CPU graph
(:mod:`zion_emu.inductor.graph_as_cpu`), its forward and backward compiled
now (so a failure can still fall back), under a cache salt, while
:data:`zion_emu.inductor.codegen.compiling` names its device. Where that
cannot work (a C++ wrapper, another CPU backend, an out-of-process compile,
a graph mixing devices) or inductor raises, the graph runs as dynamo
captured it (the ``eager`` backend), op by op on zion, priced as in eager
mode, and a warning says why.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable, Sequence

import torch
import torch._inductor.compile_fx as inductor_compile_fx
from torch._inductor import config as inductor_config
from torch._inductor.custom_graph_pass import CustomGraphPass

from zion_emu import _timing
from zion_emu.inductor import codegen
from zion_emu.inductor.graph_as_cpu import CpuView, Refusal, zion_device_index

# Why each graph ran op by op instead, in order (zion_emu.inductor.fallbacks()).
fallback_reasons: list[str] = []


class CacheSalt(CustomGraphPass):
    """A post-grad pass that runs the user's one, if any; its uuid keeps a
    zion graph's artifacts apart from CPU's in inductor's FX-graph and
    AOT-autograd caches (the generated wrapper differs, the kernels do not)."""

    def __init__(self, index: int, inner: CustomGraphPass | Callable[..., Any] | None) -> None:
        self.index = index
        self.inner = inner

    def __call__(self, graph: torch.fx.Graph) -> None:
        if self.inner is not None:
            self.inner(graph)

    def uuid(self) -> Any:
        inner = self.inner.uuid() if isinstance(self.inner, CustomGraphPass) else self.inner
        return ("zion-emu: lowered as CPU, runs on zion", 1, self.index, inner)


def _unsupported(config_patches: dict[str, Any] | None) -> str | None:
    """Why inductor's current settings cannot compile for zion, if they cannot."""
    patches = config_patches or {}

    def setting(name: str) -> Any:
        return patches.get(name, getattr(inductor_config, name))

    if setting("cpp_wrapper"):
        # a C++ wrapper calls ATen's CPU kernels through the AOTI shim, past zion's fallback
        return "cpp_wrapper is set"
    if setting("fx_wrapper"):
        return "fx_wrapper is set"
    if setting("cpu_backend") != "cpp":
        return f"cpu_backend is {setting('cpu_backend')!r}; zion prices inductor's C++ kernels only"
    if inductor_compile_fx.fx_compile_mode != inductor_compile_fx.FxCompileMode.NORMAL or \
            inductor_compile_fx.fx_compile_async:
        return "inductor compiles out of process (TORCHINDUCTOR_FX_COMPILE_MODE), where zion's code generators are not"
    return None


def fall_back(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], why: str) -> Any:
    """Runs the graph as dynamo captured it (the ``eager`` backend), op by op
    on zion under the usual autograd, with a warning (Python's filters show a
    repeated one once). So it is priced, and its results are, as in eager
    mode; aot_eager's functionalized graph would add copies of the mutated
    inputs (a compiled optimizer step cost 1.7x its eager step)."""
    from torch._dynamo.backends.debugging import eager

    reason = why.strip().splitlines()[0][:300] if why.strip() else "unknown"
    fallback_reasons.append(reason)
    warnings.warn(f"zion: inductor cannot compile this graph for zion ({reason}); it runs op by op on zion "
                  "instead (torch.compile's eager backend), priced as in eager mode", stacklevel=2)
    return eager(gm, example_inputs)


def compile_fx(original: Callable[..., Any], model_: Any, example_inputs_: Sequence[Any], *args: Any,
               **kwargs: Any) -> Any:
    """``original`` (inductor's compile_fx) for CPU graphs and for the calls
    it makes itself; the zion way for a graph of zion tensors."""
    if codegen.compiling.get() is not None or not isinstance(model_, torch.fx.GraphModule):
        return original(model_, example_inputs_, *args, **kwargs)
    try:
        index = zion_device_index(model_, example_inputs_)
    except Refusal as why:
        return fall_back(model_, example_inputs_, str(why))
    if index is None:
        return original(model_, example_inputs_, *args, **kwargs)
    from torch._inductor.virtualized import V

    if V.aot_compilation:
        raise NotImplementedError("zion: AOTInductor (torch._inductor.aoti_compile_and_package, aot_compile) "
                                  f"cannot compile a graph on zion:{index}; export it on the CPU")
    why = _unsupported(kwargs.get("config_patches"))
    if why is None and _timing.mode() == "timing":
        # Inductor's kernels would read and write the bytes that a timing-only
        # tensor does not have; op by op, zion prices them without bytes.
        why = "timing-only mode: compiled kernels would run on tensors that hold no bytes"
    if why is not None:
        return fall_back(model_, example_inputs_, why)

    fake_mode = torch._guards.detect_fake_mode(example_inputs_) or torch._subclasses.FakeTensorMode()
    view = CpuView(model_, fake_mode)
    inner = kwargs.get("inner_compile", inductor_compile_fx.compile_fx_inner)

    def inner_compile(*a: Any, **kw: Any) -> Any:
        # One graph (forward or backward); a lazily compiled backward gets here too.
        graph = codegen.ZionGraph(index)
        token = codegen.compiling.set(graph)
        try:
            with inductor_config.patch(post_grad_custom_post_pass=salt):
                compiled = inner(*a, **kw)
            graph.check_priced()
            return compiled
        finally:
            codegen.compiling.reset(token)

    try:
        codegen.install()
        salt = CacheSalt(index, inductor_config.post_grad_custom_post_pass)
        cpu_inputs = view.apply(example_inputs_)
        kwargs["inner_compile"] = inner_compile
        token = codegen.compiling.set(codegen.ZionGraph(index))
        try:
            # backward compiled now, not at the first backward: a failure can still fall back
            with inductor_config.patch(post_grad_custom_post_pass=salt), \
                    torch._functorch.config.patch(force_non_lazy_backward_lowering=True):
                return original(model_, cpu_inputs, *args, **kwargs)
        finally:
            codegen.compiling.reset(token)
    except Exception as why:  # noqa: BLE001  (any failure: the graph still runs, op by op, priced as eager)
        view.restore()
        return fall_back(model_, example_inputs_, f"{type(why).__name__}: {why}")
