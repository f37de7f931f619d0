"""Rotary in a captured graph (the exact graph path, opgym/graph): regions found by the ops they compute and the
arguments of those ops, never by function or class names, each mapped onto one opgym::rotary call whose
arguments give the same roundings, and admitted by bits (below). q's and k's regions that read the same tables
and whose inputs all exist before the first output become one call (both in one pass); any other region gets a
call of its own (k empty along the broadcast dim).

What is served (t: the tensor rotated; C, S: what it is multiplied by, HF's unsqueezed cos and sin):

- The rotate form, `t * C + rot(t) * S` (either operand order in each product and in the sum), with `rot` HF's
  `rotate_half`, `cat((-t[..., h:], t[..., :h]), -1)` with h half of t's last dim (pairs "half"), or the
  interleaved `stack((-t[..., 1::2], t[..., 0::2]), -1).flatten(-2)` (pairs "interleaved": GLM, GLM-4V text,
  Cohere, Ernie 4.5, Helium, GPT-J, DeepSeek-V4). Upcasts: t may be `t0.float()` (rot reading that cast, or
  `rot(t0).float()` beside `t0.float()`: DeepSeek-V4), the tables cast to float32. A slice of the last dim is
  read whether spelled `x[..., a:b:c]` or with a full slice for every other dim (GPT-J's `x[:, :, :, ::2]`).
- The two-part form, `cat([a * C - b * S, b * C + a * S], -1)`: (a, b) the halves of t (`chunk(t, 2, -1)` or
  `t[..., :h]`, `t[..., h:]`: GPT-OSS, pairs "half") or its even and odd elements (`t[..., 0::2]`,
  `t[..., 1::2]`: DeepSeek-V3's apply_rotary_pos_emb_interleave, pairs "deinterleave"); C and S are then one
  value per pair (pair_table), and the output is the cat's (contiguous).
- The tables: C and S are one chain of calls on two tables of one shape and dtype: unsqueezes, the first-half
  slice of the last dim (`[..., :W // 2]`), casts to float32 and, with interleaved pairs, one
  `repeat_interleave(2, -1)` (GLM's `cos[..., :W // 2].repeat_interleave(2, -1)`, DeepSeek-V4's and GPT-J's
  per-pair tables: the call reads the table before it, pair_table). The call's table input is what the chain's
  first value-changing call (a cast, the repeat_interleave) reads: the views before it stay in the graph, the
  views after it are replayed on the call's inputs. Tables of fewer dims than t (Pixtral's `[S, D]` unsqueezed
  at 0 against `[B, H, S, D]`; MuseGlimmer's vision `[S, 1, D]` against `[1, S, H, D]`) are left-padded as
  broadcasting does; the call's unsqueeze_dim is the table's last size-1 dim before the head dim (any such dim
  gives the same bits; this one depends on the table alone, so q and k agree on it). With rotate_half's halves
  a repeat_interleave'd table is no pair table (pair j reads two entries): the walk stops before the
  repeat_interleave, whose output is then the call's per-element table.
- The rounding, from the dtypes the graph recorded: "hf" when t, the tables, every product and the sum have
  one dtype and nothing is cast (HF's text form: each op rounds to that dtype); "fp32" when every product (and
  the two-part form's differences and sums) is float32 of operands that are exact in float32 (bf16, fp16,
  fp32, or upcasts of them) - by explicit casts (apply_rotary_pos_emb_vision, Cohere, DeepSeek-V4) or by
  promotion without a cast (OLMo-2/3: a bf16 q times float32 tables) - and one rounding at the end: the sum
  itself when t is float32, else the sum's only user must be a cast back to t's dtype.
- Partial rotary: when t is `x[..., :R]` and the result's only user is `cat([result, x[..., R:]], -1)` (GPT-NeoX,
  GPT-J, Phi-3, Nemotron, GLM, GLM-4V text, Qwen3-Next, Qwen3.5), the region takes x and the cat: the call
  rotates x's first R dims and copies the rest, contiguous as the cat's output. Any other cat (the pass-through
  first, a slice at another point, another tensor's dims) stays as captured after the rotated part, which is a
  region of its own: DeepSeek-V3/V4 put the rope dims last (`cat([nope, rope])`), and Gemma 4's vision
  (apply_multidimensional_rope) rotates each position axis' piece of the head and concatenates the pieces - each
  piece's rotation is served, the cats stay.

Admitted by bits, once per signature (the form and its arguments, dtypes, ranks, last dims, broadcast dims,
stride orders): the region, cut out of the graph, against the call it would become, on random inputs of that
signature with the dims shared with the tables at 1, 7 and 33, t's values N(0, 16) and the tables uniform in
(-1, 1) in their own dtype (float32 tables whose products round, so that a rounding in another place shows).
The outputs' strides over dims of more than one element must be the region's too (a view downstream must not
meet another layout). Replaced only when every output is identical; a refused region stays as captured, counted
with its reason.

Not served, and why:
- A sum left in float32 for a narrower t (CodeGen: its float32 sum is concatenated with the bf16 pass-through,
  the cat promoting): opgym::rotary writes t's dtype. A cast back to another dtype than t's, a product rounded
  before the sum, a cast after a product: other roundings than the op's.
- The complex-number forms (Llama 4's apply_rotary_emb, DeepSeek-V2's: torch.view_as_complex): opgym has no
  complex product.
- MRoPE sections recomposed in the region (the op's mrope_section): no attention in transformers 5.23 does it
  (the rotary embedding modules recompose, outside the region, and the text rotary is the plain form).
- A rotary sum that another op's region takes first: Hunyuan-V1 normalizes q and k right after the rotary, and
  add + RMSNorm - whose patterns run before rotary's (opgym/graph/backend.py's order) - takes each sum as its
  residual add (exact: the region is add + RMSNorm's), leaving no rotary region.
"""
from __future__ import annotations

import operator

import torch
import torch.fx as fx

from ...admission import Verdicts, bits_equal
from ...graph import regions
from ...graph.regions import cast_target, extract, is_call, only_user
from .pattern_nodes import (  # the node readers the patterns are written with
    _arg, _binary, _is_last_dim, _last, _prefix, _same_shape, _same_size, _static, _strided, _suffix, _tensor, _upcast_of)

OP = torch.ops.opgym.rotary.default
# Rotary's regions are taken before add_rms_norm's: Hunyuan-V1 normalizes q and k right after the rotary, and
# add_rms_norm would take the rotary sum as its residual add (exact, but then no rotary region is left).
BEFORE = ("add_rms_norm",)
_VERDICTS = Verdicts("rotary graph region")
_SERVED = (torch.bfloat16, torch.float16, torch.float32)  # dtypes opgym::rotary takes


# ---- the rotation and the tables -------------------------------------------------------------------

def _rotation(node):
    """(t, pairs, nodes) when node is HF's rotation of t: rotate_half's cat((-t[..., h:], t[..., :h]), -1) or the
    interleaved stack((-t[..., 1::2], t[..., 0::2]), -1).flatten(-2); else None."""
    if is_call(node, "cat"):
        parts, dim = _arg(node, 0, "tensors"), _arg(node, 1, "dim", 0)
        if not isinstance(parts, (list, tuple)) or len(parts) != 2:
            return None
        neg, x1 = parts
        if not (is_call(neg, "neg") and len(neg.args) == 1 and not neg.kwargs):
            return None
        lo, hi = _prefix(x1), _suffix(neg.args[0])
        if lo is None or hi is None or lo[0] is not hi[0]:
            return None
        t = lo[0]
        D, tv = _last(t), _tensor(t)
        if D is None or D % 2 or lo[1] != D // 2 or hi[1] != D // 2 or not _is_last_dim(dim, tv.dim()):
            return None
        return t, "half", [x1, neg.args[0], neg, node]
    if is_call(node, "flatten") and node.op == "call_method":
        st = node.args[0] if node.args else None
        start, end = _arg(node, 1, "start_dim", 0), _arg(node, 2, "end_dim", -1)
        if not is_call(st, "stack") or only_user(st) is not node:
            return None
        sv = _tensor(st)
        if sv is None or start not in (-2, sv.dim() - 2) or end not in (-1, sv.dim() - 1):
            return None
        parts, dim = _arg(st, 0, "tensors"), _arg(st, 1, "dim", 0)
        if not isinstance(parts, (list, tuple)) or len(parts) != 2 or dim not in (-1, sv.dim() - 1):
            return None
        neg, x1 = parts
        if not (is_call(neg, "neg") and len(neg.args) == 1 and not neg.kwargs):
            return None
        t = _strided(x1, 0)
        if t is None or _strided(neg.args[0], 1) is not t:
            return None
        D = _last(t)
        if D is None or D % 2:
            return None
        return t, "interleaved", [x1, neg.args[0], neg, st, node]
    return None


def _repeat2(node) -> bool:
    """node is x.repeat_interleave(2, dim=-1), or torch.repeat_interleave(x, 2, last dim) (HF's per-pair table made
    per element)."""
    if not (is_call(node, "repeat_interleave") and node.args and isinstance(node.args[0], fx.Node)):
        return False
    reps, dim = _arg(node, 1, "repeats"), _arg(node, 2, "dim")
    xv = _tensor(node.args[0])
    if set(node.kwargs) - {"repeats", "dim"} or xv is None or isinstance(reps, bool) or reps != 2:
        return False
    return _is_last_dim(dim, xv.dim())


def _chain(node, allow_repeat: bool):
    """The table behind C (or S): {base, views, casts, repeat, nodes}. Walks back from node through casts to
    float32, unsqueezes, the first-half slice of the last dim and (allow_repeat) one repeat_interleave(2, -1),
    keeping the walk up to the earliest value-changing call (a cast, the repeat): `base` is what that call reads
    (the call's table input), `views` the views applied after it, in order, to replay on the base."""
    steps, cur = [], node
    while isinstance(cur, fx.Node):
        if (x := _upcast_of(cur)) is not None:
            steps.append(("cast", cur))
            cur = x
            continue
        if allow_repeat and _repeat2(cur) and not any(s[0] in ("repeat", "slice") for s in steps):
            steps.append(("repeat", cur))
            cur = cur.args[0]
            continue
        if is_call(cur, "unsqueeze") and len(cur.args) == 2 and not cur.kwargs and _static(cur.args[1]) is not None:
            ov = _tensor(cur)
            if ov is not None and not _is_last_dim(cur.args[1], ov.dim()):
                steps.append(("unsqueeze", cur))
                cur = cur.args[0]
                continue
        p = _prefix(cur)
        if p is not None and _last(p[0]) is not None and p[1] == _last(p[0]) // 2 and p[1] > 0:
            steps.append(("slice", cur))
            cur = p[0]
            continue
        break
    value = [i for i, s in enumerate(steps) if s[0] in ("cast", "repeat")]
    steps = steps[: value[-1] + 1] if value else []
    base = steps[-1][1].args[0] if steps else node
    views = tuple(("unsqueeze", n.args[1]) if k == "unsqueeze" else ("slice", _prefix(n)[1])
                  for k, n in reversed(steps) if k in ("unsqueeze", "slice"))
    return {"base": base, "views": views, "casts": sum(k == "cast" for k, _ in steps),
            "repeat": any(k == "repeat" for k, _ in steps), "nodes": [n for _, n in steps]}


def _dims_after_views(base_v, views):
    """The base's dims after the views: a list of base dim indices (None for an inserted dim) and the last
    dim's width (None when not static)."""
    dims, width = list(range(base_v.dim())), _static(base_v.shape[-1]) if base_v.dim() else None
    for kind, a in views:
        if kind == "unsqueeze":
            n = len(dims) + 1
            dims.insert(a if a >= 0 else a + n, None)
        else:
            width = a
    return dims, width


# ---- the two core forms ------------------------------------------------------------------------------

def _rotate_core(add: fx.Node):
    """The rotate form t * C + rot(t) * S at `add`, as {t0, pairs, C, S, products, tnodes, upcast, final}."""
    pair = _binary(add, "add")
    if pair is None:
        return None
    for m1, m2 in (pair, pair[::-1]):
        a1, a2 = _binary(m1, "mul"), _binary(m2, "mul")
        if a1 is None or a2 is None:
            continue
        for X, C in (a1, a1[::-1]):
            for Y, S in (a2, a2[::-1]):
                got = _rotated(X, Y)
                if got is not None:
                    t0, pairs, tnodes, upcast = got
                    return {"kind": "rotate", "t0": t0, "pairs": pairs, "C": C, "S": S, "products": (m1, m2),
                            "tnodes": tnodes + [m1, m2, add], "upcast": upcast, "final": add}
    return None


def _rotated(X, Y):
    """(t0, pairs, nodes, upcast) when Y is the rotation of X (X being t0 or t0.float()), or Y is rot(t0).float()
    beside X = t0.float(); else None."""
    r = _rotation(Y)
    if r is not None and r[0] is X:
        t0 = _upcast_of(X)
        if t0 is not None:
            return t0, r[1], [X, *r[2]], "t"
        return X, r[1], r[2], ""
    if r is not None and (t0 := _upcast_of(X)) is not None and _upcast_of(r[0]) is t0:
        # X and the rotation's input are two casts of one t0 to float32 (ModernBERT-decoder writes q.float() twice)
        return t0, r[1], [X, r[0], *r[2]], "t"
    inner = _upcast_of(Y)
    t0 = _upcast_of(X)
    if inner is not None and t0 is not None and (r := _rotation(inner)) is not None and r[0] is t0:
        return t0, r[1], [X, *r[2], Y], "each"
    return None


def _halves(a, b):
    """(t, pairs, nodes) when (a, b) are t's halves (chunk(t, 2, -1), or t[..., :h] and t[..., h:]: "half") or its
    even and odd elements (t[..., 0::2], t[..., 1::2]: "deinterleave"); else None."""
    if all(isinstance(n, fx.Node) and n.op == "call_function" and n.target is operator.getitem for n in (a, b)):
        ch = a.args[0]
        if ch is b.args[0] and is_call(ch, "chunk") and a.args[1] == 0 and b.args[1] == 1:
            t, n, dim = ch.args[0], _arg(ch, 1, "chunks"), _arg(ch, 2, "dim", 0)
            tv, D = _tensor(t), _last(t)
            if isinstance(t, fx.Node) and tv is not None and n == 2 and D is not None and D % 2 == 0 \
                    and _is_last_dim(dim, tv.dim()) and len(ch.users) == 2:
                return t, "half", [ch, a, b]
            return None
    lo, hi = _prefix(a), _suffix(b)
    if lo is not None and hi is not None and lo[0] is hi[0]:
        D = _last(lo[0])
        if D is not None and D % 2 == 0 and lo[1] == D // 2 == hi[1]:
            return lo[0], "half", [a, b]
        return None
    t = _strided(a, 0)
    if t is not None and _strided(b, 1) is t and _last(t) is not None and _last(t) % 2 == 0:
        return t, "deinterleave", [a, b]
    return None


def _twopart_core(cat: fx.Node):
    """The two-part form cat([a * C - b * S, b * C + a * S], -1) at `cat`."""
    if not is_call(cat, "cat"):
        return None
    parts, dim = _arg(cat, 0, "tensors"), _arg(cat, 1, "dim", 0)
    cv = _tensor(cat)
    if cv is None or not isinstance(parts, (list, tuple)) or len(parts) != 2 or not _is_last_dim(dim, cv.dim()):
        return None
    first, second = _binary(parts[0], "sub"), _binary(parts[1], "add")
    if first is None or second is None:
        return None
    m1, m2 = first
    f1, f2 = _binary(m1, "mul"), _binary(m2, "mul")
    if f1 is None or f2 is None:
        return None
    for m3, m4 in (second, second[::-1]):
        f3, f4 = _binary(m3, "mul"), _binary(m4, "mul")
        if f3 is None or f4 is None:
            continue
        for a, C in (f1, f1[::-1]):
            for b, S in (f2, f2[::-1]):
                if {id(x) for x in f3} != {id(b), id(C)} or {id(x) for x in f4} != {id(a), id(S)} or a is b or C is S:
                    continue
                got = _twopart_source(a, b)
                if got is None:
                    continue
                t0, pairs, tnodes, upcast = got
                return {"kind": "twopart", "t0": t0, "pairs": pairs, "C": C, "S": S, "products": (m1, m2, m3, m4),
                        "tnodes": tnodes + [m1, m2, parts[0], m3, m4, parts[1], cat], "upcast": upcast,
                        "final": cat, "sums": (parts[0], parts[1])}
    return None


def _twopart_source(a, b):
    """(t0, pairs, nodes, upcast): a and b split t0, or t0.float(), or are each an upcast of t0's split."""
    ua, ub = _upcast_of(a), _upcast_of(b)
    if ua is not None and ub is not None:
        h = _halves(ua, ub)
        return None if h is None else (h[0], h[1], [*h[2], a, b], "each")
    h = _halves(a, b)
    if h is None:
        return None
    t0 = _upcast_of(h[0])
    if t0 is not None:
        return t0, h[1], [h[0], *h[2]], "t"
    return h[0], h[1], h[2], ""


# ---- one member: the core's rounding, output, partial rotary and tables --------------------------------

def _member(core: dict):
    """The region of one rotated tensor, or None (and then nothing is replaced)."""
    t0 = core["t0"]
    tv = _tensor(t0)
    if tv is None or tv.dtype not in _SERVED or not 2 <= tv.dim() <= 8 or _static(tv.stride()[-1]) != 1:
        return None
    r = tv.dim()
    width = _last(t0)
    if width is None:
        return None
    twopart = core["kind"] == "twopart"
    cc = _chain(core["C"], allow_repeat=not twopart and core["pairs"] == "interleaved")
    sc = _chain(core["S"], allow_repeat=not twopart and core["pairs"] == "interleaved")
    if (cc["views"], cc["casts"], cc["repeat"]) != (sc["views"], sc["casts"], sc["repeat"]):
        return None
    cb, sb = _tensor(cc["base"]), _tensor(sc["base"])
    if cb is None or sb is None or cb.dtype != sb.dtype or cb.dtype not in _SERVED or not _same_shape(cb, sb):
        return None
    if cb.dim() < 1:
        return None
    pair_table = twopart or cc["repeat"]
    # the rounding
    final = core["final"]
    fv = _tensor(final)
    inner = [core["C"], core["S"], *core["products"], *core.get("sums", ())]
    ivs = [_tensor(n) for n in inner]
    if fv is None or any(v is None for v in ivs):
        return None
    if not core["upcast"] and cc["casts"] == 0 and cb.dtype == tv.dtype and fv.dtype == tv.dtype \
            and all(v.dtype == tv.dtype for v in ivs):
        mode = "hf"
    elif fv.dtype == torch.float32 and all(_tensor(p).dtype == torch.float32 for p in core["products"]) \
            and all(_tensor(s).dtype == torch.float32 for s in core.get("sums", ())):
        mode = "fp32"  # every operand of the products is exact in float32 (bf16/fp16/fp32 inputs, upcasts)
    else:
        return None
    nodes = list(core["tnodes"])  # the member's own nodes (the tables' chains may be shared: added below)
    out = final
    if fv.dtype != tv.dtype:
        back = only_user(final)
        if back is None or back.args[0] is not final or cast_target(back) != tv.dtype:
            return None
        out = back
        nodes.append(back)
    # the rotary dim and the table's width
    R = width
    dims, tw = _dims_after_views(cb, cc["views"])
    if tw is None or (2 * tw if pair_table else tw) != R or len(dims) > r:
        return None
    # partial rotary: t0 = x[..., :R] and the result's only user cat([result, x[..., R:]], -1)
    x, contiguous = t0, twopart
    p = _prefix(t0)
    cat = only_user(out)
    if p is not None and p[1] == R and is_call(cat, "cat"):
        parts, dim = _arg(cat, 0, "tensors"), _arg(cat, 1, "dim", 0)
        if isinstance(parts, (list, tuple)) and len(parts) == 2 and parts[0] is out \
                and _suffix(parts[1], p[0]) == (p[0], R) and _is_last_dim(dim, r):
            x, contiguous = p[0], True
            nodes += [t0, parts[1], cat]
            out = cat
    xv = _tensor(x)
    ov = _tensor(out)
    if xv is None or ov is None or not _same_shape(xv, ov) or ov.dtype != xv.dtype or _static(xv.stride()[-1]) != 1:
        return None
    # the tables as broadcast against t: left-padded to t's rank; the call's unsqueeze_dim is a size-1 dim there
    pad = r - len(dims)
    tr = [None] * pad + dims  # base dim per dim of the broadcast table (None: size 1)
    one = []
    for j in range(r - 1):
        b = tr[j]
        if b is None or _static(cb.shape[b]) == 1:
            one.append(j)
        elif not _same_size(cb.shape[b], xv.shape[j]):
            return None
    if not one:
        return None
    ud = one[-1]  # any size-1 dim of the table gives the same bits; this one depends on the table alone (q, k agree)
    return {"x": x, "tables": (cc["base"], sc["base"]), "views": cc["views"], "r": r, "ud": ud, "mode": mode,
            "pairs": core["pairs"], "pair_table": pair_table, "contiguous": contiguous, "own": nodes,
            "nodes": nodes + cc["nodes"] + sc["nodes"],
            "output": out, "tr": tuple(tr), "key": (core["kind"], core["pairs"], core["upcast"], mode, pair_table,
                                                      contiguous, cc["views"], cc["casts"], out is not final)}


def _stride_order(v) -> tuple:
    """The dims of v from the largest stride to the smallest (its layout, as the probe rebuilds it); row-major
    when a stride is symbolic (no int() on it: that would specialize the captured shape)."""
    st = v.stride()
    if not all(isinstance(x, int) for x in st):
        return tuple(range(v.dim()))
    return tuple(sorted(range(v.dim()), key=lambda d: -st[d]))


def _describe(n) -> tuple:
    v = _tensor(n)
    return (v.dtype, v.dim(), _static(v.shape[-1]), tuple(_static(s) == 1 for s in v.shape), _stride_order(v))


def find(graph: fx.Graph) -> list[dict]:
    order = {n: i for i, n in enumerate(graph.nodes)}
    members, taken = [], set()
    for n in graph.nodes:
        core = _rotate_core(n) if is_call(n, "add") else _twopart_core(n) if is_call(n, "cat") else None
        m = _member(core) if core is not None else None
        if m is None or taken.intersection(m["own"]):
            continue
        taken.update(m["own"])
        members.append(m)
    out, used = [], set()
    for i, a in enumerate(members):
        if i in used:
            continue
        used.add(i)
        av = _tensor(a["x"])
        partner = next((j for j in range(i + 1, len(members)) if j not in used
                        and members[j]["tables"] == a["tables"] and members[j]["key"] == a["key"]
                        and members[j]["views"] == a["views"] and members[j]["tr"] == a["tr"]
                        and members[j]["ud"] == a["ud"] and _tensor(members[j]["x"]).dtype == av.dtype
                        and _tensor(members[j]["x"]).dim() == av.dim()
                        and _last(members[j]["x"]) == _last(a["x"])), None)
        group = [a] if partner is None else [a, members[partner]]
        ins = [m["x"] for m in group] + list(a["tables"])
        first = min((m["output"] for m in group), key=order.__getitem__)
        if partner is not None and any(order[x] > order[first] for x in ins):
            group, partner = [a], None  # an input defined after the first output: no call can take both
            ins = [a["x"], *a["tables"]]
        if partner is not None:
            used.add(partner)
        nodes = sorted({x for m in group for x in m["nodes"]}, key=order.__getitem__)
        out.append({"form": "hf" if a["mode"] == "hf" else "upcast", "group": group, "inputs": ins,
                    "nodes": nodes, "output": [m["output"] for m in group], "consts": _consts(a),
                    "signature": (a["key"], a["tr"], a["ud"], a["r"], tuple(_describe(m["x"]) for m in group),
                                  _describe(a["tables"][0]))})
    return out


def _consts(m: dict) -> tuple:
    return (m["views"], m["r"], m["ud"], m["mode"], m["pairs"], m["pair_table"], m["contiguous"])


# ---- admission ----------------------------------------------------------------------------------------

def _probe_inputs(region: dict, shared: int, g: torch.Generator) -> list:
    """Random inputs shaped like the region's: t's broadcast dims as captured (heads), the dims the tables share
    with t at `shared`, every last dim as captured, each in its captured stride order."""
    a = region["group"][0]
    tr, r = a["tr"], a["r"]
    base = _tensor(a["tables"][0])
    made = []
    for i, m in enumerate(region["group"]):
        xv = _tensor(m["x"])
        shape = []
        for j in range(r - 1):
            b = tr[j]
            if b is None or _static(base.shape[b]) == 1:
                shape.append(1 if _static(xv.shape[j]) == 1 else 3 + i)
            else:
                shape.append(shared)
        shape.append(_last(m["x"]))
        made.append(_random(shape, _stride_order(xv), xv.dtype, g, scale=4.0))
    bshape = []
    for d in range(base.dim()):
        if d == base.dim() - 1:
            bshape.append(_last(a["tables"][0]))
        elif _static(base.shape[d]) == 1:
            bshape.append(1)
        else:
            bshape.append(shared)
    for _ in range(2):
        made.append(_random(bshape, _stride_order(base), base.dtype, g, scale=None))
    return made


def _random(shape, stride_order, dtype, g, scale):
    stored = [shape[d] for d in stride_order]
    t = torch.randn(stored, generator=g) * scale if scale else torch.empty(stored).uniform_(-1, 1, generator=g)
    return t.permute([stride_order.index(d) for d in range(len(shape))]).to(dtype)


def _probe(region: dict):
    mode = region["group"][0]["mode"]
    fn = extract(region["inputs"], region["output"], region["nodes"])
    target, consts = replacement(region, True)
    g = torch.Generator().manual_seed(5)
    for shared in (1, 7, 33):
        args = _probe_inputs(region, shared, g)
        with torch.no_grad():
            want, got = fn(*args), tuple(target(*args, *consts))
        want = want if isinstance(want, tuple) else (want,)
        if len(want) != len(got) or not all(bits_equal(w, o) for w, o in zip(want, got)):
            return None, f"opgym::rotary (mode {mode}) does not give the region's bits (shared dims {shared})"
        if not all(_layout(w) == _layout(o) for w, o in zip(want, got)):
            return None, f"opgym::rotary (mode {mode}) gives the region's bits in another layout (shared dims {shared})"
    return True, None


def _layout(t: torch.Tensor) -> tuple:
    """t's strides over its dims of more than one element (a size-1 dim's stride is arbitrary: no view reads it)."""
    return tuple((d, t.stride(d)) for d in range(t.dim()) if t.shape[d] > 1)


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
    return (_pair if len(region["group"]) == 2 else _single), region["consts"]


def _table(t, views, r: int, ud: int):
    """The call's cos (or sin) from the region's table input: the views after the chain's casts replayed, left-padded
    to t's rank as broadcasting does, the size-1 dim `ud` dropped (the call's unsqueeze_dim)."""
    for kind, a in views:
        t = t.unsqueeze(a) if kind == "unsqueeze" else t[..., :a]
    if t.dim() < r:
        t = t[(None,) * (r - t.dim())]
    t = t.squeeze(ud)
    # a table whose last dim is not dense (GPT-OSS under 4.57.6 computes freqs as a transposed matmul, and the
    # cos, the scaling and the cast keep that layout): the op reads rows, so the values are copied to rows
    return t if t.stride(-1) == 1 or t.shape[-1] == 1 else t.contiguous()


def _pair(q, k, cos, sin, views, r, ud, mode, pairs, pair_table, contiguous):
    return OP(q, k, _table(cos, views, r, ud), _table(sin, views, r, ud), ud, mode, None, pairs, pair_table, contiguous)


def _single(t, cos, sin, views, r, ud, mode, pairs, pair_table, contiguous):
    """One tensor: k empty along the broadcast dim (no second pass over t)."""
    return OP(t, t.narrow(ud, 0, 0), _table(cos, views, r, ud), _table(sin, views, r, ud), ud, mode, None, pairs,
              pair_table, contiguous)[:1]
