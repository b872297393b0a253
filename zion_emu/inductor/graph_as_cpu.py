"""A dynamo graph of zion tensors, seen as a graph of CPU tensors.

Inductor branches on ``device.type == "cpu"`` in many places (decompositions,
lowerings, fusion, vectorization); a graph whose devices and fake tensors all
say CPU gets exactly the choices a CPU compile makes, and so CPU's numerics.
:class:`CpuView` rewrites the graph in place and can undo it.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch.utils import _pytree as pytree


# Copies as dynamo's graph and aot_autograd's name them.
_COPIES = (torch.Tensor.to, torch.Tensor.copy_, torch.ops.aten._to_copy.default, torch.ops.aten.copy_.default,
           torch.ops.prims.device_put.default)


class Refusal(Exception):
    """The graph cannot be lowered as CPU for zion; the message says why."""


def _is_zion(d: Any) -> bool:
    if isinstance(d, torch.device):
        return d.type == "zion"
    return isinstance(d, str) and (d == "zion" or d.startswith("zion:"))


def _is_cpu(d: Any) -> bool:
    if isinstance(d, torch.device):
        return d.type == "cpu"
    return isinstance(d, str) and (d == "cpu" or d.startswith("cpu:"))


def _all_nodes(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    """The graph's nodes and those of the higher-order ops' bodies it holds."""
    nodes = []
    for node in gm.graph.nodes:
        nodes.append(node)
        sub = getattr(gm, str(node.target), None) if node.op == "get_attr" else None
        if isinstance(sub, torch.fx.GraphModule):
            nodes.extend(_all_nodes(sub))
    return nodes


def _metas(gm: torch.fx.GraphModule) -> list[Any]:
    return [node.meta[key] for node in _all_nodes(gm) for key in ("val", "example_value") if key in node.meta]


def zion_device_index(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> int | None:
    """The zion device the graph runs on; None for a graph with no zion tensor."""
    indices = set()
    for x in pytree.tree_leaves([list(example_inputs), _metas(gm)]):
        if isinstance(x, torch.Tensor) and x.device.type == "zion":
            indices.add(x.device.index or 0)
    if len(indices) > 1:
        raise Refusal(f"the graph uses several zion devices {sorted(indices)}")
    return indices.pop() if indices else None


class CpuView:
    """Rewrites a dynamo graph in place to CPU devices and CPU fake tensors."""

    def __init__(self, gm: torch.fx.GraphModule, fake_mode: Any) -> None:
        self.gm = gm
        self.fake_mode = fake_mode
        self.undo: list[tuple[Any, str, Any]] = []
        self.bases: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.rewritten: list[torch.fx.GraphModule] = []

    def apply(self, example_inputs: Sequence[Any]) -> list[Any]:
        """Rewrites the graph; returns CPU stand-ins for the example inputs."""
        self._check_autocast()
        self._check_copies()
        self._check_outputs()
        self._rewrite(self.gm)
        return [self._input(x) if isinstance(x, torch.Tensor) else x for x in example_inputs]

    def _rewrite(self, gm: torch.fx.GraphModule) -> None:
        for node in gm.graph.nodes:
            if node.op == "get_attr":
                sub = getattr(gm, str(node.target), None)
                if isinstance(sub, torch.fx.GraphModule):
                    # The body of a higher-order op (torch.utils.checkpoint's
                    # wrap_body, torch.cond's branches): seen as CPU likewise.
                    self._rewrite(sub)
                    continue
                raise Refusal(f"the graph holds a tensor attribute ({node.target})")
            for key in ("val", "example_value"):
                if key in node.meta:
                    self.undo.append((node.meta, key, node.meta[key]))
                    node.meta[key] = pytree.tree_map_only(torch.Tensor, self._tensor, node.meta[key])
            if node.op in ("call_function", "call_method", "call_module"):
                self.undo.append((node, "args", node.args))
                self.undo.append((node, "kwargs", node.kwargs))
                node.args = self._value(node.args)
                node.kwargs = self._value(node.kwargs)
        gm.recompile()
        self.rewritten.append(gm)

    def restore(self) -> None:
        for obj, key, old in reversed(self.undo):
            if isinstance(obj, dict):
                obj[key] = old
            else:
                setattr(obj, key, old)
        self.undo.clear()
        for gm in self.rewritten:
            gm.recompile()
        self.rewritten.clear()

    def _check_autocast(self) -> None:
        # zion's autocast follows CUDA's op lists (exp and sum run in float32
        # under float16). Traced as CPU, the graph would take the CPU's lists
        # from a region inside it, and no casts at all from one around the
        # call (CPU autocast is off there): results of other dtypes and values.
        if torch.is_autocast_enabled("zion"):
            raise Refusal("zion's autocast is on around the call: lowered as CPU it would follow the CPU's autocast "
                          "op lists, not zion's (CUDA's)")
        # The CPU's autocast leaves zion tensors alone, as it leaves CUDA's;
        # lowered as CPU, the graph's ops would take its casts (bfloat16
        # results where eager zion gives float32).
        if torch.is_autocast_enabled("cpu"):
            raise Refusal("the CPU's autocast is on around the call: lowered as CPU its casts would apply to the "
                          "graph's zion tensors, which it leaves alone in eager mode")
        enter = torch.amp.autocast_mode._enter_autocast
        for node in _all_nodes(self.gm):
            if node.op == "call_function" and node.target is enter and node.args and _is_zion(node.args[0]):
                raise Refusal("the graph opens a zion autocast region: lowered as CPU it would follow the CPU's "
                              "autocast op lists, not zion's (CUDA's)")
            if node.op == "call_function" and node.target is enter and node.args and _is_cpu(node.args[0]):
                raise Refusal("the graph opens a CPU autocast region: lowered as CPU its casts would apply to the "
                              "graph's zion tensors, which it leaves alone in eager mode")

    def _check_copies(self) -> None:
        # A copy between zion and the CPU names no CPU device where it is
        # x.cpu(), or x.to(y.device) of a tensor the graph made on the CPU:
        # lowered as CPU it would be a no-op, and its copy's time would be
        # lost. Such a graph runs op by op (priced as in eager mode).
        for node in _all_nodes(self.gm):
            if node.op == "call_method" and node.target in ("cpu", "zion", "cuda"):
                raise Refusal(f"the graph calls .{node.target}() (a copy between zion and the CPU, or to zion)")
            if node.op not in ("call_method", "call_function") or not node.args:
                continue
            source = node.args[0]
            out = node.meta.get("example_value", node.meta.get("val"))
            src = getattr(source, "meta", {}).get("example_value", getattr(source, "meta", {}).get("val"))
            if isinstance(out, torch.Tensor) and isinstance(src, torch.Tensor) and \
                    {out.device.type, src.device.type} == {"cpu", "zion"} and \
                    (node.target in ("to", "copy_", "new_tensor") or node.target in _COPIES):
                raise Refusal(f"the graph copies a tensor between zion and the CPU ({node.name})")

    def _check_outputs(self) -> None:
        # Lowered as CPU, every buffer the wrapper allocates is on zion: a CPU
        # tensor the graph makes (torch.arange with no device) would come back
        # on zion. Inside the graph that is harmless; as an output it is not.
        output = next(n for n in reversed(self.gm.graph.nodes) if n.op == "output")
        for arg in pytree.tree_leaves(output.args):
            meta = getattr(arg, "meta", {}).get("example_value", getattr(arg, "meta", {}).get("val"))
            if isinstance(meta, torch.Tensor) and meta.device.type == "cpu":
                raise Refusal(f"the graph returns a CPU tensor ({arg.name}), which would come back on zion")

    def _tensor(self, t: torch.Tensor, is_input: bool = False) -> torch.Tensor:
        if t.device.type == "cpu":
            # zion ops take CPU scalars; a CPU tensor made inside the graph
            # (torch.tril_indices) stays CPU, as in a CPU compile
            if is_input and t.dim() > 0:
                raise Refusal("a CPU tensor of dim > 0 is an input of a zion graph")
            return t
        if t.device.type != "zion":
            raise Refusal(f"a tensor on {t.device} in a zion graph")
        # Inputs that share a storage must still share it (aot_autograd reads
        # their aliasing); the graph's other metas get plain stand-ins.
        key = t.untyped_storage()._cdata if is_input else None
        base = self.bases.get(key) if is_input else None
        with self.fake_mode:
            if base is None:
                # first tensor of its storage: a plain stand-in (set_ on a
                # symbolic storage would add shape guards)
                out = torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device="cpu")
                if is_input and t.storage_offset() == 0:
                    self.bases[key] = (out, t)  # t held: its storage id stays unique
            else:
                out = torch.empty(0, dtype=t.dtype, device="cpu")
                out.set_(base[0].untyped_storage(), t.storage_offset(), t.size(), t.stride())
        if t.requires_grad:
            out.requires_grad_(True)
        if isinstance(t, torch.nn.Parameter):
            out = torch.nn.Parameter(out, requires_grad=t.requires_grad)
        return out

    def _input(self, x: torch.Tensor) -> torch.Tensor:
        # Dynamo hands real tensors; its fake mode memoizes their (maybe
        # symbolic) fakes, whose sizes the CPU stand-ins must keep.
        if not isinstance(x, torch._subclasses.FakeTensor):
            fake = self.fake_mode.from_tensor(x)
            if x.requires_grad and not fake.requires_grad:
                fake.requires_grad_(True)
            if isinstance(x, torch.nn.Parameter) and not isinstance(fake, torch.nn.Parameter):
                fake = torch.nn.Parameter(fake, requires_grad=x.requires_grad)
            x = fake
        return self._tensor(x, is_input=True)

    def _value(self, v: Any) -> Any:
        if isinstance(v, torch.Tensor):
            return self._tensor(v)
        if isinstance(v, (torch.device, str)):
            if _is_zion(v):
                return torch.device("cpu") if isinstance(v, torch.device) else "cpu"
            if _is_cpu(v):
                raise Refusal("the graph names the CPU device (a copy between zion and the CPU)")
            return v
        if isinstance(v, (list, tuple)):
            return type(v)(self._value(e) for e in v)
        if isinstance(v, dict):
            return {k: self._value(e) for k, e in v.items()}
        return v
