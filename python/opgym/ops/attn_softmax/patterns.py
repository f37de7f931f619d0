"""The attention core in a captured graph (the exact graph path, opgym/graph): HF eager attention's statements
between its two matmuls - `w = scores * scaling`, `w = w + mask` (optional), `softmax(w, dim=-1,
dtype=torch.float32)`, `.to(scores' dtype)` - found by those calls and their arguments (scaling a number, the
softmax over the last dim in float32, the cast back to the scores' dtype), whatever function or class they sit
in. Admitted by bits: the region, cut out of the graph, against opgym::attn_softmax on random scores of the
call's rank and dtype at row lengths 1 to 300 (torch's softmax sums in lanes: every tail shape), with a mask of
the call's broadcast shape holding 0 and finfo.min; replaced only when they agree."""
from __future__ import annotations

import torch
import torch.fx as fx

from ...admission import Verdicts
from ...graph import regions
from ...graph.regions import cast_target, extract, float_const, is_call, only_user, same_bits, val

OP = torch.ops.opgym.attn_softmax.default
_VERDICTS = Verdicts("attn_softmax graph region")
ROW_LENGTHS = (1, 7, 8, 9, 16, 17, 33, 64, 100, 300)


def _softmax_last_fp32(node) -> bool:
    if not is_call(node, "softmax") or len(node.args) < 1:
        return False
    x = node.args[0]
    rank = val(x).dim() if isinstance(val(x), torch.Tensor) else None
    dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    dtype = node.args[3] if len(node.args) > 3 else node.kwargs.get("dtype")
    extra = set(node.kwargs) - {"dim", "dtype", "_stacklevel"}
    return not extra and rank is not None and dim in (-1, rank - 1) and dtype == torch.float32


def find(graph: fx.Graph) -> list[dict]:
    out = []
    for sm in graph.nodes:
        if not _softmax_last_fp32(sm):
            continue
        cast = only_user(sm)
        w = sm.args[0]
        wv = val(w)
        if cast is None or not isinstance(wv, torch.Tensor) or cast_target(cast) != wv.dtype:
            continue
        mask, nodes = None, [sm, cast]
        if is_call(w, "add") and len(w.args) == 2 and not w.kwargs and isinstance(w.args[1], fx.Node):
            mask, nodes = w.args[1], [w] + nodes
            w = w.args[0]
            mv = val(mask)
            if not isinstance(mv, torch.Tensor) or mv.dtype != wv.dtype or mv.dim() != wv.dim():
                continue
        if not (is_call(w, "mul") and len(w.args) == 2 and not w.kwargs and isinstance(w.args[0], fx.Node)
                and float_const(w.args[1]) is not None):
            continue
        scores, scale = w.args[0], float_const(w.args[1])
        sv = val(scores)
        if not isinstance(sv, torch.Tensor) or sv.dtype != wv.dtype:
            continue
        nodes = [w] + nodes
        mshape = None
        if mask is not None:
            try:
                mshape = tuple(int(d) == 1 for d in val(mask).shape[:-2])  # which leading dims broadcast
            except (TypeError, ValueError):
                continue
        inputs = [scores] + ([mask] if mask is not None else [])
        out.append({"inputs": inputs, "nodes": nodes, "output": cast, "scale": scale,
                    "signature": (sv.dtype, sv.dim(), scale, mshape)})
    return out


def _probe(region: dict):
    dtype, rank, scale, mshape = region["signature"]
    fn = extract(region["inputs"], region["output"], region["nodes"])
    g = torch.Generator().manual_seed(11)
    lead = (1, 2, 3)[:max(0, rank - 2)]
    probes = []
    for T in ROW_LENGTHS:
        S = 3
        shape = lead + (S, T)
        s = (torch.randn(shape, generator=g, device="cpu") * 30).to(dtype)
        if mshape is None:
            probes.append((s,))
            continue
        mlead = tuple(1 if b else n for b, n in zip(mshape, lead))
        keep = torch.rand(mlead + (S, T), generator=g, device="cpu") > 0.3
        keep[..., 0] = True
        m = torch.zeros(mlead + (S, T), dtype=dtype, device="cpu").masked_fill(~keep, torch.finfo(dtype).min)
        probes.append((s, m))

    def ours(s, m=None):
        return OP(s, scale, m)
    ok, why = same_bits(fn, ours, probes)
    return (True, None) if ok else (None, f"opgym::attn_softmax does not give the region's bits ({why})")


def admit(region: dict):
    """(verdict, None) or (None, why not): the probe, once per signature (graph/regions.admit)."""
    return regions.admit(_VERDICTS, region, _probe)


def replacement(region: dict, _verdict) -> tuple:
    if len(region["inputs"]) == 1:
        return OP, (region["scale"],)
    return _with_mask, (region["scale"],)


def _with_mask(scores, mask, scale):
    return OP(scores, scale, mask)
