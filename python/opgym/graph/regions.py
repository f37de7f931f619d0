"""Helpers for an op's graph patterns (ops/<op>/patterns.py): reading the nodes Dynamo captured (their example
values: dtype, shape), cutting a region out as a function of its inputs, probing it against opgym's operator
by bits, and splicing the operator in. A leaf module: torch and opgym.admission only."""
from __future__ import annotations

import operator
from typing import Callable

import torch
import torch.fx as fx

from ..admission import Failed, Verdicts, bits_equal


def val(node):
    """The example value Dynamo recorded for a node (a FakeTensor for tensors), or the constant itself."""
    if isinstance(node, fx.Node):
        return node.meta.get("example_value", node.meta.get("val"))
    return node


def is_tensor(node) -> bool:
    return isinstance(val(node), torch.Tensor)


def target_name(node: fx.Node) -> str:
    """'call_function:mul', 'call_method:to', ...: what a node calls, whatever object spells it."""
    t = node.target
    if node.op == "call_function":
        name = getattr(t, "__name__", str(t))
        if t in (operator.mul, torch.mul, torch.Tensor.mul):
            name = "mul"
        elif t in (operator.add, torch.add, torch.Tensor.add):
            name = "add"
        return f"call_function:{name}"
    return f"{node.op}:{t}"


def is_call(node, *names: str) -> bool:
    if not isinstance(node, fx.Node) or node.op not in ("call_function", "call_method"):
        return False
    n = target_name(node).split(":", 1)[1]
    return n in names


def only_user(node: fx.Node) -> fx.Node | None:
    users = list(node.users)
    return users[0] if len(users) == 1 else None


def float_const(v) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v)


def cast_target(node: fx.Node):
    """The dtype a `.to(dtype)` / `.float()` / `.type_as(t)` / `.to(device, dtype)` node casts to, or None
    when the node is no pure dtype cast (a device move, a copy flag, memory formats: not a cast)."""
    if not isinstance(node, fx.Node) or node.op != "call_method":
        return None
    if node.target == "float" and len(node.args) == 1 and not node.kwargs:
        return torch.float32
    if node.target == "type_as" and len(node.args) == 2 and not node.kwargs:
        v = val(node.args[1])
        return v.dtype if isinstance(v, torch.Tensor) else None
    if node.target == "to":
        kw = dict(node.kwargs)
        if set(kw) - {"dtype", "device"}:
            return None
        dtypes = [a for a in node.args[1:] if isinstance(a, torch.dtype)] + ([kw["dtype"]] if "dtype" in kw else [])
        others = [a for a in node.args[1:] if not isinstance(a, torch.dtype)]
        src = val(node.args[0])
        dev = kw.get("device", others[0] if others else None)
        if len(dtypes) != 1 or len(others) > 1:
            return None
        if dev is not None and isinstance(src, torch.Tensor) and torch.device(dev) != src.device:
            return None
        return dtypes[0]
    return None


def extract(inputs: list[fx.Node], output, nodes: list[fx.Node]) -> fx.GraphModule:
    """The region `nodes` (in graph order) as a GraphModule of `inputs` returning `output` (a node, or a list
    of nodes: a tuple): every argument a region node reads must be an input, a region node or a constant."""
    g = fx.Graph()
    env = {}
    for i, n in enumerate(inputs):
        env[n] = g.placeholder(f"in{i}")
    inside = set(nodes)
    for n in nodes:
        for a in n.all_input_nodes:
            if a not in env and a not in inside:
                raise ValueError(f"region reads {a.name}, which is neither an input nor inside")
        env[n] = g.node_copy(n, lambda a: env[a])
    g.output(tuple(env[o] for o in output) if isinstance(output, (list, tuple)) else env[output])
    return fx.GraphModule(torch.nn.Module(), g)


def same_bits(fn_a: Callable, fn_b: Callable, inputs_list) -> tuple[bool, str]:
    """Whether fn_a and fn_b give the same bits on every input tuple (bits_equal; tuples compared item by item)."""
    for k, args in enumerate(inputs_list):
        with torch.no_grad():
            a, b = fn_a(*args), fn_b(*args)
        a = a if isinstance(a, tuple) else (a,)
        b = b if isinstance(b, tuple) else (b,)
        if len(a) != len(b) or not all(bits_equal(x, y) for x, y in zip(a, b)):
            return False, f"probe input {k} differs"
    return True, ""


def admit(verdicts: Verdicts, region: dict, probe: Callable[[dict], tuple]) -> tuple:
    """(verdict, None) or (None, why not) for a region: `probe(region)` (which returns that pair) run once per
    region["signature"] and environment in the op's verdict cache; a probe that raised refuses, uncached."""
    got = verdicts.decide(region["signature"], lambda: probe(region), device="cpu", in_backend=True)
    if isinstance(got, Failed):
        return None, got.reason
    return got


def splice(graph: fx.Graph, output: fx.Node, target, args: tuple, kwargs: dict | None = None) -> fx.Node:
    """A call_function `target(*args, **kwargs)` placed right before `output`, taking over its uses; the
    region's nodes left without users are removed."""
    with graph.inserting_before(output):
        new = graph.call_function(target, args, kwargs or {})
    new.meta.update(output.meta)
    output.replace_all_uses_with(new)
    return new


def prune(graph: fx.Graph, nodes: list[fx.Node]) -> set:
    """Removes the replaced region's own nodes that no longer have users, last first; returns them. Only those:
    FX's eliminate_dead_code would also drop a captured in-place call whose result is unused (an MoE's
    `out.index_add_(...)`), changing the model (it did: DeepSeek-V2/V3/V4 in the Liger list)."""
    gone = set()
    for n in reversed(nodes):
        if n.graph is graph and not n.users and n.op in ("call_function", "call_method"):
            graph.erase_node(n)
            gone.add(n)
    return gone
