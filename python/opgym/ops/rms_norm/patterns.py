"""RMSNorm in a captured graph (the exact graph path, opgym/graph): found by what it computes, not by a class
name or source text, and admitted by bits.

The anchor is `rsqrt(mean(h * h, -1, keepdim=True) + eps)` (h**2 spelt .pow(2); the rsqrt spelt pow(_, -0.5) too,
as Gemma 4 does) with eps a number; h is x or
x cast to float32. The region then runs forward from `y * rsqrt(..)` (y: h or x) through single-use dtype
casts and one multiplication by a weight (a 1-D tensor of the row's width, possibly cast and offset by a
number: Gemma's `1.0 + weight.float()`). Whatever such a region computes - Llama's two roundings, one fp32
rounding, 1 + weight, a cast before or after the weight - is then run against each of opgym's RMSNorm
variants on the admission probe's inputs (rms_norm/admission.py: rows scaled far up and down, a zero row, an
outlier; three weights), and replaced only when exactly one variant gives its bits on all of them. A near
miss (the weight multiplied before the cast where opgym's variant casts first, a mean over another dim, an
eps that is a tensor) stays as captured."""
from __future__ import annotations

import torch
import torch.fx as fx

from ...admission import Verdicts
from ...graph import regions
from ...graph.regions import cast_target, extract, float_const, is_call, only_user, same_bits, val
from .admission import VARIANTS, _inputs

OP = torch.ops.opgym.rms_norm.default
_VERDICTS = Verdicts("rms_norm graph region")


def _mean_last(node) -> bool:
    if not is_call(node, "mean"):
        return False
    dims = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    keep = node.args[2] if len(node.args) > 2 else node.kwargs.get("keepdim", False)
    rank = val(node.args[0]).dim() if isinstance(val(node.args[0]), torch.Tensor) else None
    if isinstance(dims, (list, tuple)) and len(dims) == 1:
        dims = dims[0]
    return keep is True and isinstance(dims, int) and rank is not None and dims in (-1, rank - 1)


def _square_of(node):
    """h when node is h.pow(2) / h ** 2 / h * h, else None."""
    if is_call(node, "pow") and len(node.args) == 2 and float_const(node.args[1]) == 2.0:
        return node.args[0]
    if is_call(node, "mul") and len(node.args) == 2 and node.args[0] is node.args[1]:
        return node.args[0]
    return None


def _stays(node) -> bool:
    """`t.to(device)` onto the device t is on already, which returns t itself (FalconMamba under transformers 4.57.6:
    `self.weight.to(hidden_states.device) * ...`); a move to another device is not."""
    if not (isinstance(node, fx.Node) and node.op == "call_method" and node.target == "to"):
        return False
    args = list(node.args[1:]) + ([node.kwargs["device"]] if set(node.kwargs) == {"device"} else [])
    src = val(node.args[0])
    if len(args) != 1 or (node.kwargs and set(node.kwargs) != {"device"}) or not isinstance(src, torch.Tensor):
        return False
    try:
        return isinstance(args[0], (torch.device, str)) and torch.device(args[0]) == src.device
    except (RuntimeError, TypeError):
        return False


def _weight_side(node, dim: int):
    """(weight node, the nodes between it and the multiplication) when `node` is a 1-D tensor of `dim`
    elements, possibly cast and offset by a number; else None."""
    chain = []
    cur = node
    for _ in range(4):
        v = val(cur)
        if not isinstance(v, torch.Tensor):
            return None
        if cast_target(cur) is not None or _stays(cur):
            chain.append(cur)
            cur = cur.args[0]
            continue
        if is_call(cur, "add") and len(cur.args) == 2:
            a, b = cur.args
            if float_const(a) is not None and isinstance(b, fx.Node):
                chain.append(cur)
                cur = b
                continue
            if float_const(b) is not None and isinstance(a, fx.Node):
                chain.append(cur)
                cur = a
                continue
        break
    v = val(cur)
    if not isinstance(v, torch.Tensor) or v.dim() != 1 or v.shape[0] != dim or cur.op not in ("placeholder", "get_attr"):
        return None
    return cur, chain[::-1]


def _inverse_sqrt_of(r):
    """a when r is rsqrt(a) or pow(a, -0.5) (Gemma 4 spells it so), else None; which bits either gives is the
    probe's business."""
    if is_call(r, "rsqrt") and len(r.args) == 1 and not r.kwargs:
        return r.args[0]
    if is_call(r, "pow") and len(r.args) == 2 and not r.kwargs and float_const(r.args[1]) == -0.5 \
            and isinstance(r.args[0], fx.Node):
        return r.args[0]
    return None


def find(graph: fx.Graph) -> list[dict]:
    """Every candidate region: {x, weight, eps, nodes, output, signature}."""
    out = []
    for r in graph.nodes:
        a = _inverse_sqrt_of(r)
        if a is None:
            continue
        if not is_call(a, "add") or len(a.args) != 2 or float_const(a.args[1]) is None or not _mean_last(a.args[0]):
            continue
        eps = float_const(a.args[1])
        h = _square_of(a.args[0].args[0])
        if h is None:
            continue
        x = h.args[0] if cast_target(h) == torch.float32 else h
        xv = val(x)
        if not isinstance(xv, torch.Tensor) or xv.dim() < 1:
            continue
        try:
            dim = int(xv.shape[-1])
        except (TypeError, ValueError):
            continue
        m = next((u for u in r.users if is_call(u, "mul") and len(u.args) == 2
                  and ({u.args[0], u.args[1]} - {r}) & {h, x}), None)
        if m is None:
            continue
        nodes = ([h] if h is not x else []) + [a.args[0].args[0], a.args[0], a, r, m]
        cur, weight, wnodes = m, None, []
        while True:
            nxt = only_user(cur)
            if nxt is None:
                break
            if cast_target(nxt) is not None and nxt.args[0] is cur:
                nodes.append(nxt)
                cur = nxt
                continue
            if weight is None and is_call(nxt, "mul") and len(nxt.args) == 2 and cur in nxt.args:
                other = nxt.args[1] if nxt.args[0] is cur else nxt.args[0]
                ws = _weight_side(other, dim) if isinstance(other, fx.Node) else None
                if ws is None:
                    break
                weight, wnodes = ws
                nodes += wnodes + [nxt]
                cur = nxt
                continue
            break
        if weight is None:
            continue
        order = {n: i for i, n in enumerate(graph.nodes)}
        nodes = sorted(set(nodes), key=order.__getitem__)
        sig = tuple(f"{n.op}:{n.target}:{[a for a in n.args if not isinstance(a, fx.Node)]}:{sorted(n.kwargs.items(), key=str)}"
                    for n in nodes)
        ov = val(cur)
        if not isinstance(ov, torch.Tensor):
            continue
        out.append({"x": x, "weight": weight, "inputs": [x, weight], "eps": eps, "nodes": nodes, "output": cur, "dim": dim,
                    "out_dtype": ov.dtype, "signature": (sig, xv.dtype, val(weight).dtype, ov.dtype)})
    return out


def _probe(region: dict):
    fn = extract([region["x"], region["weight"]], region["output"], region["nodes"])
    xd, wd = val(region["x"]).dtype, val(region["weight"]).dtype
    dim, eps = region["dim"], region["eps"]
    x = _inputs(dim, xd)
    g = torch.Generator().manual_seed(4321)
    weights = [(1.0 + 0.5 * torch.randn(dim, generator=g, device="cpu")).to(wd),
               (0.5 * torch.randn(dim, generator=g, device="cpu")).to(wd)]
    matching = []
    for v in VARIANTS:
        def ours(x_, w_, v=v):
            return _norm(x_, w_, eps, v.mode, v.weight_offset, region["out_dtype"])
        ok, _ = same_bits(fn, ours, [(x, w) for w in weights])
        if ok:
            matching.append(v)
    if xd == torch.float32:  # one computation in both modes: keep the first
        matching = [v for v in matching if v.mode == "hf"] or matching
    if len(matching) != 1:
        return None, ("no RMSNorm variant of opgym gives the region's bits" if not matching else
                      f"the probe cannot tell {[str(v) for v in matching]} apart")
    return matching[0], None


def admit(region: dict):
    """(verdict, None) or (None, why not): the probe, once per signature (graph/regions.admit)."""
    return regions.admit(_VERDICTS, region, _probe)


def replacement(region: dict, variant) -> tuple:
    """(target, constants): the region becomes target(x, weight, *constants)."""
    if region["out_dtype"] == torch.promote_types(val(region["x"]).dtype, val(region["weight"]).dtype):  # the op's
        return OP, (region["eps"], variant.mode, variant.weight_offset)
    return _norm, (region["eps"], variant.mode, variant.weight_offset, region["out_dtype"])


def _norm(x, w, eps, mode, offset, out_dtype):
    """The op, its output cast to the region's where the region ends in a cast to another dtype than the op writes:
    DeepSeek-V4 (transformers 5.24) keeps the weight in float32 on a bf16 stream and casts once at the end,
    `(weight * h).to(input_dtype)` - the op's float32 output is that product, the cast the region's own."""
    y = OP(x, w, eps, mode, offset)
    return y if y.dtype == out_dtype else y.to(out_dtype)
