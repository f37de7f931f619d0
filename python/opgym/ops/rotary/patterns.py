"""Rotary in a captured graph (the exact graph path, opgym/graph): HF's text form `t * cos + rotate_half(t) * sin`
with rotate_half `cat((-t[..., h:], t[..., :h]), -1)` (h half the last dim) and cos, sin a table unsqueezed at
one dim - found by those calls and their arguments, whatever function holds them. q's and k's regions that
share the tables become one opgym::rotary call (both in one pass); a region with no partner gets one call of
its own. Admitted by bits: the region, cut out of the graph, against opgym::rotary in mode "hf" on random
rows of the call's head dim, dtype and layout; replaced only when they agree. Other forms (fp32 upcasts,
interleaved pairs, partial rotary dims) stay as captured, for now."""
from __future__ import annotations

import operator

import torch
import torch.fx as fx

from ...admission import Verdicts
from ...graph import regions
from ...graph.regions import extract, is_call, same_bits, val

OP = torch.ops.opgym.rotary.default
_VERDICTS = Verdicts("rotary graph region")


def _half(node, t, first: bool):
    """Whether node is t[..., :h] (first) or t[..., h:] with h half of t's last dim."""
    if not (isinstance(node, fx.Node) and node.op == "call_function" and node.target is operator.getitem
            and node.args[0] is t):
        return False
    idx = node.args[1]
    if not (isinstance(idx, tuple) and len(idx) == 2 and idx[0] is Ellipsis and isinstance(idx[1], slice)):
        return False
    tv = val(t)
    try:
        h = int(tv.shape[-1]) // 2
    except (TypeError, ValueError, AttributeError):
        return False
    sl = idx[1]
    if sl.step not in (None, 1):
        return False
    return (sl.start in (None, 0) and sl.stop == h) if first else (sl.start == h and sl.stop is None)


def _rotate_half_of(node):
    """t when node is cat((-t[..., h:], t[..., :h]), dim=-1), else None."""
    if not is_call(node, "cat"):
        return None
    parts = node.args[0] if node.args else node.kwargs.get("tensors")
    dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
    if not isinstance(parts, (list, tuple)) or len(parts) != 2 or dim != -1:
        return None
    neg, x1 = parts
    if not (isinstance(neg, fx.Node) and neg.op == "call_function" and neg.target in (operator.neg, torch.neg)):
        return None
    x2 = neg.args[0]
    t = x1.args[0] if isinstance(x1, fx.Node) and x1.args else None
    if t is None or not _half(x1, t, True) or not _half(x2, t, False):
        return None
    return t


def _unsqueezed(node):
    """(table, dim) when node is table.unsqueeze(dim), else None."""
    if is_call(node, "unsqueeze") and len(node.args) == 2 and isinstance(node.args[1], int):
        return node.args[0], node.args[1]
    return None


def _one(add: fx.Node):
    """{t, C, S, nodes, output} when `add` is t * C + rotate_half(t) * S."""
    if not is_call(add, "add") or len(add.args) != 2 or add.kwargs:
        return None
    for a, b in (add.args, add.args[::-1]):
        if not (is_call(a, "mul") and is_call(b, "mul") and len(a.args) == 2 and len(b.args) == 2):
            continue
        for t, c in (a.args, a.args[::-1]):
            for r, s in (b.args, b.args[::-1]):
                rt = _rotate_half_of(r) if isinstance(r, fx.Node) else None
                if rt is not None and rt is t and isinstance(c, fx.Node) and isinstance(s, fx.Node):
                    x1 = r.args[0][1]
                    neg = r.args[0][0]
                    nodes = [a, x1, neg.args[0], neg, r, b, add]
                    return {"t": t, "C": c, "S": s, "nodes": nodes, "output": add}
    return None


def find(graph: fx.Graph) -> list[dict]:
    singles = [r for n in graph.nodes if (r := _one(n)) is not None]
    out, used = [], set()
    order = {n: i for i, n in enumerate(graph.nodes)}
    for i, a in enumerate(singles):
        if i in used:
            continue
        ca, sa = _unsqueezed(a["C"]), _unsqueezed(a["S"])
        tv, cv = val(a["t"]), val(a["C"])
        if ca is None or sa is None or ca[1] != sa[1] or not isinstance(tv, torch.Tensor) or not isinstance(cv, torch.Tensor):
            continue
        if tv.dtype != cv.dtype or tv.dim() != 4:
            continue
        partner = None
        for j in range(i + 1, len(singles)):
            b = singles[j]
            bv = val(b["t"])
            if j not in used and b["C"] is a["C"] and b["S"] is a["S"] and isinstance(bv, torch.Tensor) \
                    and bv.dtype == tv.dtype and bv.dim() == 4:
                partner = j
                break
        first = a if partner is None else min(a, singles[partner], key=lambda r: order[r["output"]])
        ins = [a["t"]] + ([singles[partner]["t"]] if partner is not None else []) + [ca[0], sa[0]]
        if any(order[n] > order[first["output"]] for n in ins):  # an input defined after the first output
            partner = None
            ins = [a["t"], ca[0], sa[0]]
        used.add(i)
        if partner is not None:
            used.add(partner)
        group = [a] + ([singles[partner]] if partner is not None else [])
        try:
            D = int(tv.shape[-1])
        except (TypeError, ValueError):
            continue
        nodes = sorted({a["C"], a["S"], *(n for r in group for n in r["nodes"])}, key=order.__getitem__)
        out.append({"group": group, "inputs": ins, "dim": ca[1], "tables": (ca[0], sa[0]), "nodes": nodes,
                    "output": [r["output"] for r in group],
                    "signature": (tv.dtype, D, ca[1], len(group), tuple(int(s) for s in tv.stride()[-1:]))})
    return out


def _probe(region: dict):
    dtype, D, dim, n, _ = region["signature"]
    g = torch.Generator().manual_seed(5)
    fns = [extract([r["t"], r["C"], r["S"]], r["output"], r["nodes"]) for r in region["group"]]
    for S in (1, 7, 33):
        q = torch.randn(1, S, 4, D, generator=g, device="cpu").to(dtype).transpose(1, 2)  # HF's strided heads
        k = torch.randn(1, S, 2, D, generator=g, device="cpu").to(dtype).transpose(1, 2)
        cos, sin = (torch.randn(1, S, D, generator=g, device="cpu").to(dtype) for _ in range(2))
        C, Sn = cos.unsqueeze(dim), sin.unsqueeze(dim)
        got = OP(q, k, cos, sin, dim)
        for t, fn, o in zip((q, k), fns, got):
            ok, why = same_bits(fn, lambda *_a, o=o: o, [(t, C, Sn)])
            if not ok:
                return None, f"opgym::rotary (mode hf) does not give the region's bits ({why})"
    return True, None


def admit(region: dict):
    """(verdict, None) or (None, why not): the probe, once per signature (graph/regions.admit)."""
    return regions.admit(_VERDICTS, region, _probe)


def splice_region(graph: fx.Graph, region: dict, call) -> None:
    """One call for the group (q and k, or one tensor), its outputs taking over each region's output."""
    first = min((r["output"] for r in region["group"]), key=lambda n: list(graph.nodes).index(n))
    with graph.inserting_before(first):
        new = graph.call_function(call, tuple(region["inputs"]))
        outs = [graph.call_function(operator.getitem, (new, i)) for i in range(len(region["group"]))]
    for r, o in zip(region["group"], outs):
        o.meta.update(r["output"].meta)
        r["output"].replace_all_uses_with(o)


def replacement(region: dict, _verdict) -> tuple:
    if len(region["group"]) == 2:
        return _pair, (region["dim"],)
    return _single, (region["dim"],)


def _pair(q, k, cos, sin, dim):
    return OP(q, k, cos, sin, dim)


def _single(t, cos, sin, dim):
    return OP(t, t, cos, sin, dim)[:1]
