"""The gated activation in a captured graph (the exact graph path, opgym/graph): `act(gate) * up` with act
torch's SiLU or tanh-GELU (F.silu, F.gelu(approximate="tanh"), however the model's act_fn module spells it once
Dynamo has inlined it), gate and up of one shape and dtype. Admitted by bits: the region, cut out of the graph,
against opgym::swiglu on random rows of the call's width (and on its strides: chunk views of one projection
stay views), and replaced only when they agree.

Where the gate and up come from two Linears of the compiled model, graph_merge.py's regions (found first) run them
as one merged GEMM where its probes allow; the activation region then reads the merged output's halves
(`act_on_halves`), and stays this op's region (counted as before)."""
from __future__ import annotations

import torch
import torch.fx as fx

from ...admission import Verdicts
from ...graph import regions
from ...graph.regions import extract, is_call, same_bits, val
from . import graph_merge

OP = torch.ops.opgym.swiglu.default
_VERDICTS = Verdicts("swiglu graph region")


def _activation(node) -> str | None:
    if not isinstance(node, fx.Node) or len(node.args) != 1:
        return None
    if is_call(node, "silu") and not node.kwargs.get("inplace", False):
        return "silu"
    if is_call(node, "gelu") and node.kwargs.get("approximate") == "tanh" and set(node.kwargs) == {"approximate"}:
        return "gelu_tanh"
    return None


def find(graph: fx.Graph) -> list[dict]:
    act = _find_act(graph)
    return graph_merge.find(graph, act) + act  # the merged GEMMs first: their activation regions read them


def _find_act(graph: fx.Graph) -> list[dict]:
    out = []
    for m in graph.nodes:
        if not is_call(m, "mul") or len(m.args) != 2 or m.kwargs:
            continue
        for i in (0, 1):
            act, up = m.args[i], m.args[1 - i]
            kind = _activation(act)
            if kind is None or not isinstance(up, fx.Node):
                continue
            gate = act.args[0]
            gv, uv = val(gate), val(up)
            if not (isinstance(gv, torch.Tensor) and isinstance(uv, torch.Tensor)):
                continue
            if gv.shape != uv.shape or gv.dtype != uv.dtype or gv.dim() < 1:
                continue
            try:
                width = int(gv.shape[-1])
                strides = (int(gv.stride(-1)), int(uv.stride(-1)))
            except (TypeError, ValueError):
                continue
            out.append({"inputs": [gate, up], "nodes": [act, m], "output": m, "activation": kind, "order": i,
                        "signature": (kind, i, gv.dtype, width, strides)})
            break
    return out


def _probe(region: dict):
    kind, order, dtype, width, strides = region["signature"]
    if strides != (1, 1):  # Mamba's gate under transformers 4.57.6 is a transposed [B, I, T] view
        return None, (f"gate or up is not contiguous in its last dim (strides {strides}): opgym::swiglu reads "
                      "rows")
    fn = extract(region["inputs"], region["output"], region["nodes"])
    g = torch.Generator().manual_seed(7)
    probes = []
    for rows in (1, 5, 67):
        gate = (torch.randn(rows, width, generator=g, device="cpu") * 4).to(dtype)
        up = torch.randn(rows, width, generator=g, device="cpu").to(dtype)
        probes.append((gate, up))
    ok, why = same_bits(fn, lambda a, b: OP(a, b, kind), probes)
    return (kind, None) if ok else (None, f"opgym::swiglu ({kind}) does not give the region's bits ({why})")


def admit(region: dict):
    """(verdict, None) or (None, why not): the probe, once per signature (graph/regions.admit); a merged region's
    admission is graph_merge's."""
    if region.get("kind") == graph_merge.FORM:
        return graph_merge.admit(region, admit)
    return regions.admit(_VERDICTS, region, _probe)


def replacement(region: dict, verdict) -> tuple:
    if region.get("kind") == graph_merge.FORM:
        return graph_merge.replacement(region, verdict)
    if graph_merge.on_halves(region["inputs"]):  # a merged GEMM before it was admitted (rewrite maps the inputs)
        captured = extract(region["inputs"], region["output"], region["nodes"])
        return graph_merge.act_on_halves(verdict, captured), ()
    return OP, (verdict,)


def splice_region(graph: fx.Graph, region: dict, call) -> dict:
    """A merged region has two outputs (graph_merge.splice); an activation region, one."""
    if region.get("kind") == graph_merge.FORM:
        return graph_merge.splice(graph, region, call)
    return {region["output"]: regions.splice(graph, region["output"], call, tuple(region["inputs"]))}
