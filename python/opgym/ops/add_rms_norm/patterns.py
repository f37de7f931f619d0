"""Residual add + RMSNorm in a captured graph (the exact graph path, opgym/graph): `s = a + b` of two tensors of
one shape and dtype, followed by an RMSNorm of `s` - whatever decoder layer, vision block or layer boundary
they sit in (in HF's Llama-style body the sum is also the next residual: `s` may have other users, and the
fused call's second output, the sum, takes them over).

The norm is found by RMSNorm's own matcher (rms_norm/patterns.py: by what it computes, never by names), so
this op's patterns run before rms_norm's (CONTAINS); a norm whose input is not such an add is left to
rms_norm. The add must be the plain binary `+` (no alpha, not in place, no broadcast, no dtype promotion:
opgym::add_rms_norm rounds the sum to x's dtype, HF's own rounding of a same-dtype add). Admitted by bits:
the norm's variant is the one RMSNorm's probe finds for the norm part, then the whole region (add and norm),
cut out of the graph, is run against opgym::add_rms_norm with that variant on sums built from RMSNorm's
probe rows (rows scaled far up and down, a zero row, an outlier) split into two addends of different
scales, with two weights; replaced only when both outputs - the normed sum and the sum - give the region's
bits. A near miss (an add in another dtype, a norm reading something other than the sum) stays as captured.
"""
from __future__ import annotations

import operator

import torch
import torch.fx as fx

from ...admission import Verdicts
from ...graph import regions
from ...graph.regions import extract, is_call, same_bits, val
from ..rms_norm import patterns as _norms
from ..rms_norm.admission import _inputs

OP = torch.ops.opgym.add_rms_norm.default
CONTAINS = ("rms_norm",)  # the norm part is rms_norm's pattern: this op's regions are taken first
_VERDICTS = Verdicts("add_rms_norm graph region")


def _plain_add(node) -> tuple | None:
    """(a, b) when node is `a + b` of two tensors of one shape, dtype and device, nothing else; else None."""
    if not (isinstance(node, fx.Node) and node.op == "call_function" and node.target in (operator.add, torch.add)):
        return None
    if len(node.args) != 2 or node.kwargs:
        return None
    a, b = node.args
    av, bv, sv = val(a), val(b), val(node)
    if not all(isinstance(t, torch.Tensor) for t in (av, bv, sv)) or not all(isinstance(n, fx.Node) for n in (a, b)):
        return None
    if av.dtype != bv.dtype or sv.dtype != av.dtype or av.device != bv.device:
        return None
    if tuple(av.shape) != tuple(bv.shape) or tuple(sv.shape) != tuple(av.shape):
        return None
    return a, b


def find(graph: fx.Graph) -> list[dict]:
    """Every candidate: an RMSNorm region (rms_norm's matcher) whose input is a plain add."""
    out = []
    order = {n: i for i, n in enumerate(graph.nodes)}
    taken = set()
    for norm in _norms.find(graph):
        s = norm["x"]
        ab = _plain_add(s)
        if ab is None or s in taken:  # a sum normed twice: the first norm takes the add, the other is RMSNorm's
            continue
        taken.add(s)
        if s in norm["nodes"]:  # (cannot happen with rms_norm's matcher; a region never contains its input)
            continue
        residual, x = ab
        strides = tuple(tuple(int(d) for d in val(t).stride()[-1:]) for t in (x, residual))
        nodes = sorted([s, *norm["nodes"]], key=order.__getitem__)
        out.append({"norm": norm, "sum": s, "inputs": [x, residual, norm["weight"]], "nodes": nodes,
                    "output": [norm["output"], s], "eps": norm["eps"], "dim": norm["dim"],
                    "signature": (norm["signature"], strides)})
    return out


def _probe(region: dict):
    norm = region["norm"]
    variant, why = _norms.admit(norm)  # the norm part's variant, by RMSNorm's own probe (cached)
    if variant is None:
        return None, f"the norm of the sum: {why}"
    fn = extract(region["inputs"], region["output"], region["nodes"])
    xd, rd, wd = (val(n).dtype for n in region["inputs"])  # each input built in its own dtype
    dim, eps = region["dim"], region["eps"]
    s = _inputs(dim, xd).float()  # RMSNorm's probe rows, split into two addends
    g = torch.Generator().manual_seed(2718)
    part = s * torch.rand(s.shape[0], 1, generator=g, device="cpu") + 0.01 * torch.randn(s.shape, generator=g, device="cpu")
    x, residual = (s - part).to(xd), part.to(rd)
    weights = [(1.0 + 0.5 * torch.randn(dim, generator=g, device="cpu")).to(wd),
               (0.5 * torch.randn(dim, generator=g, device="cpu")).to(wd)]

    def ours(x_, r_, w_):
        return OP(x_, r_, w_, eps, variant.mode, variant.weight_offset)
    ok, why = same_bits(fn, ours, [(x, residual, w) for w in weights] + [(residual.to(xd), x.to(rd), weights[0])])
    if not ok:
        return None, f"opgym::add_rms_norm ({variant}) does not give the region's bits ({why})"
    return variant, None


def admit(region: dict):
    """(verdict, None) or (None, why not): the probe, once per signature (graph/regions.admit)."""
    return regions.admit(_VERDICTS, region, _probe)


def replacement(region: dict, variant) -> tuple:
    """(target, constants): the region becomes target(x, residual, weight, *constants) -> (normed, sum)."""
    return OP, (region["eps"], variant.mode, variant.weight_offset)


def splice_region(graph: fx.Graph, region: dict, call) -> dict:
    """One call placed where the add was (so every user of the sum, wherever it sits, comes after it); its
    outputs take over the norm's output and the sum's other users. Returns {old node: new node}."""
    s = region["sum"]
    with graph.inserting_before(s):
        new = graph.call_function(call, tuple(region["inputs"]))
        outs = [graph.call_function(operator.getitem, (new, i)) for i in range(2)]
    moved = {}
    for old, o in zip(region["output"], outs):
        o.meta.update(old.meta)
        old.replace_all_uses_with(o)
        moved[old] = o
    return moved
