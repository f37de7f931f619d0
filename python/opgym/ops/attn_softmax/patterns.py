"""The attention core in a captured graph (the exact graph path, opgym/graph): HF eager attention's statements
between its two matmuls - `w = scores * scaling` (or `scores / c` with c a power of two: below), `w = w + mask`
(optional), `softmax(w, dim=-1, dtype=torch.float32)`, `.to(scores' dtype)` - found by those calls and their arguments (scaling a number, the
softmax over the last dim in float32, the cast back to the scores' dtype), whatever function or class they sit
in. Admitted by bits: the region, cut out of the graph, against opgym::attn_softmax on random scores of the
call's rank and dtype at row lengths 1 to 300 (torch's softmax sums in lanes: every tail shape), with a mask of
the call's broadcast shape holding 0 and finfo.min; replaced only when they agree.

With grouped-query attention, the two matmuls around it read repeat_kv's copies of K and V; each is also a region
(below, "grouped-query attention"), served without the copies where opgym's GQA probe allows, call by call.

Windowed attention (a vision tower's per-window cores concatenated along the patch dim) is one region for all
windows, opgym::attn_windows (graph_windows.py); find() lists those regions before the cores, which stay to be
served one by one where the windows region is not admitted."""
from __future__ import annotations

import math

import torch
import torch.fx as fx

from ...admission import Verdicts
from ...graph import regions
from ...graph.regions import cast_target, extract, float_const, is_call, only_user, same_bits, val
from . import graph_windows, text

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


# The scores divided by a number c instead of multiplied by a scaling: opgym::attn_softmax multiplies by 1/c,
# which rounds as the division does for every input exactly when c is a power of two (x / 2^k and x * 2^-k are
# the same real number, both rounded once); any other c is left as captured, with the reason. (A probe alone
# could not decide it: x / c and x * (1/c) differ in float32 for some x, and the cast to bf16 hides most of
# those, so random scores could agree where a model's would not.)
_DIVIDES = ("truediv", "div", "true_divide")


def _exact_reciprocal(c: float) -> bool:
    m, _ = math.frexp(c)
    return math.isfinite(c) and abs(m) == 0.5


def find(graph: fx.Graph) -> list[dict]:
    # the windows regions first: each holds its windows' cores (backend.rewrite skips a core it took)
    return graph_windows.find(graph, _softmax_last_fp32) + _find_core(graph) + _find_grouped(graph)


def _find_core(graph: fx.Graph) -> list[dict]:
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
        # the mask added out of place, or in place onto the scaled scores that nothing else reads (StableLM 4.x's
        # `attn_weights += causal_mask`: the same rounding, into the same fresh tensor)
        if (len(w.args) == 2 and not w.kwargs and isinstance(w.args[1], fx.Node)
                and (is_call(w, "add") or (is_call(w, "iadd", "add_") and isinstance(w.args[0], fx.Node)
                                           and only_user(w.args[0]) is w))):
            mask, nodes = w.args[1], [w] + nodes
            w = w.args[0]
            mv = val(mask)
            if not isinstance(mv, torch.Tensor) or mv.dtype != wv.dtype or mv.dim() != wv.dim():
                continue
        if not (len(w.args) == 2 and not w.kwargs and isinstance(w.args[0], fx.Node)
                and float_const(w.args[1]) is not None):
            continue
        if is_call(w, "mul"):
            scores, scale, divisor = w.args[0], float_const(w.args[1]), None
        elif is_call(w, *_DIVIDES) and float_const(w.args[1]) != 0:  # transformers 4.x: `matmul(q, k.T) / math.sqrt(head_dim)`
            scores, divisor = w.args[0], float_const(w.args[1])
            scale = 1.0 / divisor
        else:
            continue
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
        out.append({"inputs": inputs, "nodes": nodes, "output": cast, "scale": scale, "divisor": divisor,
                    "signature": (sv.dtype, sv.dim(), scale, mshape)})
    return out


# ---- grouped-query attention: the matmuls over repeat_kv's copies --------------------------------------------
# HF's `repeat_kv(x, G)` as Dynamo captures it: x[:, :, None, :, :].expand(B, KV, G, T, D).reshape(B, KV * G, T, D),
# read by `matmul(q, _.transpose(2, 3))` (the scores) or `matmul(w, _)` (the output). Such a region is served by
# the same matmul over the shared K/V with q (or w) viewed as [B, KV, G * S, _] (no copies), call by call where
# opgym's GQA probe found that form gives HF's bits for the call's signature (dtype, phase, threads, sizes:
# text.why_not_grouped, the probe opgym.patch uses) and it measured faster; any other call runs the captured code.
_NEW_AXIS = (slice(None), slice(None), None, slice(None), slice(None))


def _known(a, b) -> bool:
    """a == b for sizes that may be symbolic, decided without adding a guard to the captured shapes."""
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    try:
        return bool(statically_known_true(a == b))
    except Exception:  # noqa: BLE001 - undecidable here: not the pattern
        return False


def _repeat_kv_of(rs):
    """(x, G, nodes, sizes) when `rs` is x[:, :, None, :, :].expand(B, KV, G, T, D).reshape(B, KV * G, T, D) of a
    4-D x, each step read only by the next; `sizes`: the size nodes expand/reshape read (region inputs)."""
    if not (is_call(rs, "reshape") and rs.op == "call_method"):
        return None
    ex = rs.args[0]
    if not (is_call(ex, "expand") and ex.op == "call_method" and only_user(ex) is rs):
        return None
    gi = ex.args[0]
    if not (is_call(gi, "getitem") and only_user(gi) is ex and len(gi.args) == 2 and gi.args[1] == _NEW_AXIS):
        return None
    x = gi.args[0]
    xv, ev, rv = val(x), val(ex), val(rs)
    if not all(isinstance(v, torch.Tensor) for v in (xv, ev, rv)) or xv.dim() != 4 or ev.dim() != 5 or rv.dim() != 4:
        return None
    G = ev.shape[2]
    if not isinstance(G, int) or G < 2:
        return None
    B, KV, T, D = xv.shape
    if not (all(_known(a, b) for a, b in zip(ev.shape, (B, KV, G, T, D)))
            and all(_known(a, b) for a, b in zip(rv.shape, (B, KV * G, T, D)))):
        return None
    sizes = [a for a in (*ex.args[1:], *rs.args[1:]) if isinstance(a, fx.Node)]
    return x, G, [gi, ex, rs], sizes


def _find_grouped(graph: fx.Graph) -> list[dict]:
    out = []
    for mm in graph.nodes:
        if not (is_call(mm, "matmul") and len(mm.args) == 2 and not mm.kwargs):
            continue
        a, b = mm.args
        kind, rs, extra = "output", b, []
        if is_call(b, "transpose") and len(b.args) == 3 and tuple(b.args[1:]) in ((2, 3), (-2, -1), (3, 2), (-1, -2)):
            kind, rs, extra = "scores", b.args[0], [b]
            if only_user(rs) is not b:
                continue
        elif only_user(b) is not mm:
            continue
        got = _repeat_kv_of(rs)
        if got is None or not isinstance(a, fx.Node):
            continue
        x, G, nodes, sizes = got
        av, xv = val(a), val(x)
        if not (isinstance(av, torch.Tensor) and av.dim() == 4 and av.dtype == xv.dtype and av.is_floating_point()
                and _known(av.shape[1], xv.shape[1] * G) and _known(av.shape[0], xv.shape[0])):
            continue
        out.append({"kind": kind, "counted_as": "gqa grouped", "inputs": [a, x, *sizes],
                    "nodes": nodes + extra + [mm], "output": mm, "signature": ("grouped", kind, av.dtype, G)})
    return out


def _scores_grouped(q, k, *_sizes):
    """matmul(q, repeat_kv(k, G).transpose(2, 3)) over the shared keys: q seen as [B, KV, G * S, D]."""
    B, H, S, D = q.shape
    KV, T = k.shape[1], k.shape[2]
    return torch.matmul(q.reshape(B, KV, (H // KV) * S, D), k.transpose(2, 3)).view(B, H, S, T)


def _output_grouped(w, v, *_sizes):
    """matmul(w, repeat_kv(v, G)) over the shared values: w seen as [B, KV, G * S, T]."""
    B, H, S, T = w.shape
    KV, Dv = v.shape[1], v.shape[3]
    return torch.matmul(w.reshape(B, KV, (H // KV) * S, T), v).view(B, H, S, Dv)


def _repeat_kv(x, G: int):
    """HF's repeat_kv, for the probe (the same calls as the captured region)."""
    B, KV, T, D = x.shape
    return x[:, :, None, :, :].expand(B, KV, G, T, D).reshape(B, KV * G, T, D)


def _why_not(kind: str):
    def check(a, x, *_sizes):
        if a.dim() != 4 or x.dim() != 4 or a.dtype != x.dtype or a.device != x.device or x.shape[1] == 0:
            return "not the grouped form's operands"
        B, H, S = a.shape[0], a.shape[1], a.shape[2]
        KV = x.shape[1]
        if H % KV:
            return "head counts do not divide"
        T, D = (x.shape[2], a.shape[3]) if kind == "scores" else (a.shape[3], x.shape[3])
        # the probe's signature takes the head dims of both matmuls; a region holds one of them
        return text.why_not_grouped(a.dtype, a.device, B, KV, H // KV, S, T, D, D, _repeat_kv)
    return check


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
    """(verdict, None) or (None, why not): the probe, once per signature (graph/regions.admit). A grouped region
    is admitted as a form: which calls it serves, the GQA probe decides per call signature (_why_not)."""
    if region.get("kind") in ("scores", "output"):
        return True, None
    if region.get("kind") == graph_windows.FORM:
        return graph_windows.admit(region)
    c = region.get("divisor")
    if c is not None and not _exact_reciprocal(c):
        return None, (f"the scores are divided by {c:g}, not a power of two: opgym::attn_softmax multiplies by a "
                      "scale, and x / c is not x * (1/c) for every x")
    return regions.admit(_VERDICTS, region, _probe)


def replacement(region: dict, verdict) -> tuple:
    if region.get("kind") == graph_windows.FORM:
        return graph_windows.replacement(region, verdict)
    if region.get("kind") == "scores":
        return _scores_grouped, (), _why_not("scores")
    if region.get("kind") == "output":
        return _output_grouped, (), _why_not("output")
    if len(region["inputs"]) == 1:
        return OP, (region["scale"],)
    return _with_mask, (region["scale"],)


def _with_mask(scores, mask, scale):
    return OP(scores, scale, mask)
