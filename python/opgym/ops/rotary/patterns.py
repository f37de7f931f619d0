"""Rotary in a captured graph (the exact graph path, opgym/graph): HF's text form `t * cos + rotate_half(t) * sin`
with rotate_half `cat((-t[..., h:], t[..., :h]), -1)` (h half the last dim) and cos, sin a table unsqueezed at
one dim - found by those calls and their arguments, whatever function holds them. q's and k's regions that
share the tables become one opgym::rotary call (both in one pass); a region with no partner gets one call of
its own. Admitted by bits: the region, cut out of the graph, against opgym::rotary in mode "hf" on random
rows of the call's head dim, dtype and layout; replaced only when they agree.

The upcast form (mode "fp32"; HF's `apply_rotary_pos_emb_vision`, Qwen2/2.5-VL's vision towers): the same
statements on `t.float()` with tables `table.unsqueeze(d).float()` (or `table.float().unsqueeze(d)`, or a
float32 table unsqueezed), the sum's only user a cast back to t's own dtype - products and sum in float32, one
rounding at the end. Found by those casts and their places: a cast after a product, a sum with no cast back
or one to another dtype is no such region. Any rank from 2 (the vision path's `[S, H, D]` with the tables
unsqueezed at -2). Admitted by bits the same way: the group, cut out of the graph, against the served call
(opgym::rotary, mode "fp32") on random rows of the call's rank, head dim, dtypes and stride order, with
float32 tables whose products round (so a rounding in another place shows).
Other forms (interleaved pairs, partial rotary dims) stay as captured, for now."""
from __future__ import annotations

import operator

import torch
import torch.fx as fx

from ...admission import Verdicts
from ...graph import regions
from ...graph.regions import cast_target, extract, is_call, only_user, same_bits, val

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


def _fp32_of(node):
    """x when node casts x, a floating tensor, to float32 (`.float()`, `.to(torch.float32)`), else None."""
    if cast_target(node) != torch.float32 or not isinstance(node.args[0], fx.Node):
        return None
    xv = val(node.args[0])
    return node.args[0] if isinstance(xv, torch.Tensor) and xv.is_floating_point() else None


def _upcast_table(node):
    """(table, dim, nodes) when node is table.unsqueeze(dim).float(), table.float().unsqueeze(dim), or a
    float32 table unsqueezed (nothing to cast); else None. `nodes`: the casts and the unsqueeze."""
    x = _fp32_of(node)
    if x is not None and (u := _unsqueezed(x)) is not None:
        return u[0], u[1], [x, node]
    if (u := _unsqueezed(node)) is not None:
        x = _fp32_of(u[0])
        if x is not None:
            return x, u[1], [u[0], node]
        tv = val(u[0])
        if isinstance(tv, torch.Tensor) and tv.dtype == torch.float32:
            return u[0], u[1], [node]
    return None


def _upcast(r: dict):
    """The single region r in its upcast form - r's t is t0.float(), its tables upcast (_upcast_table) and
    r's sum read only by a cast back to t0's dtype - as {t0, cast, tables, dim, nodes}; else None."""
    t0 = _fp32_of(r["t"])
    out = only_user(r["output"])
    if t0 is None or out is None or out.args[0] is not r["output"]:
        return None
    t0v = val(t0)
    if cast_target(out) != t0v.dtype:
        return None
    c, s = _upcast_table(r["C"]), _upcast_table(r["S"])
    if c is None or s is None or c[1] != s[1]:
        return None
    cv, sv, ov = val(r["C"]), val(r["S"]), val(out)
    if not all(isinstance(v, torch.Tensor) for v in (cv, sv, ov)) or not (2 <= t0v.dim() <= 8):
        return None
    if cv.dim() != t0v.dim() or sv.dim() != t0v.dim() or val(c[0]).dtype != val(s[0]).dtype:
        return None
    try:
        D = int(t0v.shape[-1])
        if int(cv.shape[-1]) != D or int(sv.shape[-1]) != D:  # every element rotated: no partial rotary
            return None
    except (TypeError, ValueError):
        return None
    dim = c[1] if c[1] >= 0 else c[1] + t0v.dim()
    if not 0 <= dim < t0v.dim() - 1:
        return None
    return {"t0": t0, "cast": out, "tables": (c[0], s[0]), "dim": c[1], "at": dim,
            "nodes": [r["t"], *c[2], *s[2], *r["nodes"], out]}


def _stride_order(v) -> tuple:
    """The dims of v from the largest stride to the smallest (its layout, as the probe rebuilds it); row-major
    when a stride is symbolic (no int() on it: that would specialize the captured shape)."""
    st = v.stride()
    if not all(isinstance(x, int) for x in st):
        return tuple(range(v.dim()))
    return tuple(sorted(range(v.dim()), key=lambda d: -st[d]))


def _find_upcast(singles: list, order: dict) -> tuple[list, set]:
    """The upcast form's regions (q and k paired when they read the same tables), and the singles they took."""
    out, used = [], set()
    ups = {i: u for i, r in enumerate(singles) if (u := _upcast(r)) is not None}
    for i, a in ups.items():
        if i in used:
            continue
        av = val(a["t0"])
        partner = next((j for j, b in ups.items() if j > i and j not in used and b["tables"] == a["tables"]
                        and singles[j]["C"] is singles[i]["C"] and singles[j]["S"] is singles[i]["S"]
                        and val(b["t0"]).dtype == av.dtype and val(b["t0"]).dim() == av.dim()
                        and b["at"] == a["at"]), None)
        group = [a] + ([ups[partner]] if partner is not None else [])
        ins = [u["t0"] for u in group] + list(a["tables"])
        first = min((u["cast"] for u in group), key=order.__getitem__)
        if partner is not None and any(order[n] > order[first] for n in ins):
            group, partner = [a], None
            ins = [a["t0"], *a["tables"]]
        used.add(i)
        if partner is not None:
            used.add(partner)
        nodes = sorted({n for u in group for n in u["nodes"]}, key=order.__getitem__)
        tv = val(a["tables"][0])
        out.append({"form": "upcast", "group": group, "inputs": ins, "dim": a["dim"], "tables": a["tables"],
                    "nodes": nodes, "output": [u["cast"] for u in group],
                    "signature": ("upcast", av.dtype, tv.dtype, int(av.shape[-1]), a["at"], av.dim(), len(group),
                                  tuple(_stride_order(val(u["t0"])) for u in group))})
    return out, used


def find(graph: fx.Graph) -> list[dict]:
    singles = [r for n in graph.nodes if (r := _one(n)) is not None]
    order = {n: i for i, n in enumerate(graph.nodes)}
    out, used = _find_upcast(singles, order)
    for i, a in enumerate(singles):
        if i in used:
            continue
        ca, sa = _unsqueezed(a["C"]), _unsqueezed(a["S"])
        tv, cv = val(a["t"]), val(a["C"])
        if ca is None or sa is None or ca[1] != sa[1] or not isinstance(tv, torch.Tensor) or not isinstance(cv, torch.Tensor):
            continue
        # the unsqueezed table of q's rank: opgym::rotary takes tables of q's rank minus one; one that broadcasts
        # over a missing leading dim (Pixtral's [S, D] unsqueezed at 0 against [B, H, S, D]) is no operand of it
        # (admitted, every call raised and fell back)
        if tv.dtype != cv.dtype or tv.dim() != 4 or cv.dim() != 4:
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
        out.append({"form": "hf", "group": group, "inputs": ins, "dim": ca[1], "tables": (ca[0], sa[0]), "nodes": nodes,
                    "output": [r["output"] for r in group],
                    "signature": (tv.dtype, D, ca[1], len(group), tuple(int(s) for s in tv.stride()[-1:]))})
    return out


def _probe_upcast(region: dict):
    """The upcast group against the served call (replacement) on random rows of its rank and stride order: for
    S in 1, 7, 33 positions, the heads on the tables' unsqueezed dim, float32-wide tables (products round)."""
    _, dtype, tdtype, D, at, rank, n, orders = region["signature"]
    fn = extract(region["inputs"], region["output"], region["nodes"])
    target, consts = replacement(region, True)
    g = torch.Generator().manual_seed(5)
    seq = max(d for d in range(rank - 1) if d != at) if rank > 2 else None
    for S in (1, 7, 33):
        def shaped(heads, stride_order):
            shape = [1] * rank
            shape[-1], shape[at] = D, heads
            if seq is not None:
                shape[seq] = S
            stored = torch.randn([shape[d] for d in stride_order], generator=g, device="cpu") * 4
            return stored.permute([stride_order.index(d) for d in range(rank)]).to(dtype)
        ts = [shaped(4, orders[i]) for i in range(n)]
        tshape = [1] * rank
        tshape[-1] = D
        if seq is not None:
            tshape[seq] = S
        del tshape[at]
        cos, sin = (torch.empty(tshape).uniform_(-1, 1, generator=g).to(tdtype) for _ in range(2))
        ok, why = same_bits(fn, lambda *a: tuple(target(*a, *consts)), [(*ts, cos, sin)])
        if not ok:
            return None, f"opgym::rotary (mode fp32) does not give the region's bits ({why})"
    return True, None


def _probe(region: dict):
    if region["form"] == "upcast":
        return _probe_upcast(region)
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
    order = {n: i for i, n in enumerate(graph.nodes)}
    first = min(region["output"], key=order.__getitem__)
    with graph.inserting_before(first):
        new = graph.call_function(call, tuple(region["inputs"]))
        outs = [graph.call_function(operator.getitem, (new, i)) for i in range(len(region["output"]))]
    for old, o in zip(region["output"], outs):
        o.meta.update(old.meta)
        old.replace_all_uses_with(o)


def replacement(region: dict, _verdict) -> tuple:
    mode = "fp32" if region["form"] == "upcast" else "hf"
    if len(region["group"]) == 2:
        return _pair, (region["dim"], mode)
    return _single, (region["dim"], mode)


def _pair(q, k, cos, sin, dim, mode="hf"):
    return OP(q, k, cos, sin, dim, mode)


def _single(t, cos, sin, dim, mode="hf"):
    return OP(t, t, cos, sin, dim, mode)[:1]
