"""Inductor's CPU code generators, with what a graph lowered for zion adds.

While a zion graph compiles (:data:`compiling` is set), the CPU scheduling
prices every C++ kernel it generates: the wrapper calls ``charge_kernel``
after each kernel call with the kernel's bytes and FLOPs
(:mod:`zion_emu.inductor.kernel_work`); and the CPU wrapper's header makes
its buffers zion tensors (:mod:`zion_emu.inductor.runtime`). The C++ kernels
are CPU's, byte for byte: they read and write a zion tensor's host memory
through its data pointer. For every other graph both generators are
inductor's own.
"""

from __future__ import annotations

import contextvars
import dataclasses
from dataclasses import dataclass, field
from typing import Any

from torch._inductor.codegen import common
from torch._inductor.codegen.cpp import CppScheduling, KernelGroup
from torch._inductor.codegen.wrapper import PythonWrapperCodegen, SubgraphPythonWrapperCodegen

from zion_emu.inductor.kernel_work import kernel_work


class UnpricedKernel(RuntimeError):
    """Inductor generated a kernel that zion cannot price."""


@dataclass
class ZionGraph:
    """The zion graph being compiled: its device and the kernels generated."""

    index: int
    defined: set[str] = field(default_factory=set)
    priced: set[str] = field(default_factory=set)

    def check_priced(self) -> None:
        unpriced = sorted(self.defined - self.priced)
        if unpriced:
            raise UnpricedKernel(f"zion: inductor generated kernels with no pricing: {', '.join(unpriced)}")


compiling: contextvars.ContextVar[ZionGraph | None] = contextvars.ContextVar("zion_inductor_graph", default=None)


class PricedKernelGroup(KernelGroup):
    """A C++ kernel's group whose call is followed by its charge."""

    def call_kernel(self, wrapper: PythonWrapperCodegen, kernel_name: str) -> None:
        super().call_kernel(wrapper, kernel_name)
        graph = compiling.get()
        assert graph is not None  # the scheduling makes these groups only then
        work = kernel_work(self.args, self.scheduled_nodes)
        flops, nbytes = (wrapper.codegen_python_sizevar(x) for x in (work.flops, work.bytes))
        wrapper.writeline(f"zion_charge_kernel({graph.index}, {'inductor::' + kernel_name!r}, {flops}, {nbytes}, "
                          f"{work.op_class!r}, {work.dtype!r})")
        graph.priced.add(kernel_name)


class ZionCppScheduling(CppScheduling):
    """CPU's C++ scheduling, pricing each kernel it calls."""

    def reset_kernel_group(self) -> None:
        self.kernel_group = PricedKernelGroup()

    def define_kernel(self, src_code: str, nodes: Any, kernel_args: Any = None) -> str:
        name = super().define_kernel(src_code, nodes, kernel_args)
        graph = compiling.get()
        assert graph is not None
        graph.defined.add(name)
        return name

    def codegen_template(self, *args: Any, **kwargs: Any) -> None:
        raise UnpricedKernel("zion: inductor chose a C++ template kernel (max-autotune GEMM), which zion does not price")


class ZionWrapperCodegen(PythonWrapperCodegen):
    """CPU's Python wrapper; for a zion graph, its buffers are on zion and it
    can charge kernels."""

    @staticmethod
    def create(is_subgraph: bool, subgraph_name: str | None, parent_wrapper: PythonWrapperCodegen | None,
               partition_signatures: Any = None) -> PythonWrapperCodegen:
        if is_subgraph:
            return SubgraphPythonWrapperCodegen(subgraph_name, parent_wrapper, partition_signatures)
        return ZionWrapperCodegen()

    def write_header(self) -> None:
        super().write_header()
        graph = compiling.get()
        if graph is not None:
            self.header.splice(
                f"""
                # zion: lowered as CPU, runs on zion:{graph.index}
                from zion_emu.inductor import runtime as zion_runtime
                zion_charge_kernel = zion_runtime.charge_kernel
                empty_strided_cpu = zion_runtime.empty_strided({graph.index})
                empty_strided_cpu_pinned = empty_strided_cpu
                device = zion_runtime.device({graph.index})
                """,
                strip=True,
            )


def install() -> None:
    """Puts the zion-aware generators in CPU's place (they are CPU's own
    for graphs not compiled from zion)."""
    common.init_backend_registration()
    cpu = common.device_codegens["cpu"]
    if cpu.wrapper_codegen is ZionWrapperCodegen:
        return
    if cpu.wrapper_codegen is not PythonWrapperCodegen:
        raise RuntimeError(f"zion: inductor's CPU wrapper is {cpu.wrapper_codegen.__name__}, not PythonWrapperCodegen "
                           "(another extension replaced it); zion cannot compile graphs with inductor")
    cpu_scheduling = cpu.scheduling

    def scheduling(scheduler: Any) -> Any:
        if compiling.get() is not None:
            return ZionCppScheduling(scheduler)
        return cpu_scheduling(scheduler)

    common.device_codegens["cpu"] = dataclasses.replace(cpu, scheduling=scheduling, wrapper_codegen=ZionWrapperCodegen)
