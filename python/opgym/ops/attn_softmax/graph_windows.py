"""Windowed attention in a captured graph (the exact graph path, opgym/graph): one opgym::attn_windows call for
the attention of every window of a block.

Qwen2.5-VL's vision attention (eager) splits q, k and v into windows along the patch dim (`torch.split(t,
lengths.tolist(), dim=2)`), runs HF's eager attention core on each window and concatenates the outputs along the
patch dim. `.tolist()` breaks the graph: the split runs before the next graph, whose inputs are the pieces
(torch 2.13: placeholders that Dynamo recorded as views of one tensor each; a capture that keeps the split in the
graph gives getitems of it, which are the same views). The region found here, by the graph's ops and their
arguments alone:

    cat([contiguous(transpose(matmul(dropout?(to(softmax(matmul(q_i, k_i.transpose(2, 3)) * s, -1, float32),
         dtype)), v_i), 1, 2)) for each window i], dim=1)

with n >= 2 windows, one scale s, each step read only by the next, q_i/k_i [1, H, L_i, D] and v_i [1, H, L_i, Dv]
of one dtype, and - from the example values Dynamo recorded - the pieces of each of q, k, v consecutive windows
of one tensor along dim 2 (one storage, equal strides, each piece starting where the previous one ends; a graph
Dynamo recompiled with the lengths symbolic - a second page size - gives each offset a symbol of its own, so
there only the storage is checked here, the rest per call). It is replaced by attn_windows(q, k, v, s,
cu_seqlens) over the whole tensors (views of the pieces' memory, no copy; cu_seqlens from the call's lengths,
one tensor per set of lengths), where:

- admitted by bits: the region cut out of the graph against that call, on random q, k, v laid out as the call's
  (strides and storage offsets), split into the call's windows; once per signature (dtype, lengths, heads, head
  dims, scale, layout) and environment (threads, CPU capability: torch's GEMM blocking), re-decided at each
  call (new lengths in a symbolic graph, or a thread count set after compiling, probe again);
- per call: the pieces must be those windows in memory (data pointers and strides; Dynamo's guards check shapes
  and strides, not that inputs alias), else the region's captured code runs (counted, with the reason).

Counted as a form of attn_softmax ("attn_softmax windows": GraphHandle.form_regions, forms()), like the
grouped-query form: the region holds the per-window cores that attn_softmax's own regions would serve, and those
are found by the same `find` after this form's regions, so a form that is not admitted leaves them to be served
one window at a time (backend.rewrite skips a region whose nodes an earlier region took)."""
from __future__ import annotations

import torch
import torch.fx as fx

from ...admission import Failed, Verdicts
from ...graph import regions
from ...graph.regions import cast_target, extract, float_const, is_call, only_user, same_bits, val

OP = torch.ops.opgym.attn_windows.default
FORM = "windows"
_VERDICTS = Verdicts("attn_softmax graph windows")
_K_T = ((2, 3), (-2, -1), (3, 2), (-1, -2))


def _identity_dropout(node) -> bool:
    """F.dropout that gives its input back: training False, or p == 0."""
    if len(node.args) < 1 or set(node.kwargs) - {"p", "training", "inplace"}:
        return False
    p = node.args[1] if len(node.args) > 1 else node.kwargs.get("p", 0.5)
    training = node.args[2] if len(node.args) > 2 else node.kwargs.get("training", True)
    inplace = node.args[3] if len(node.args) > 3 else node.kwargs.get("inplace", False)
    return inplace is False and (training is False or (float_const(p) == 0.0))


def _window(node, softmax_ok):
    """(q, k, v, scale, nodes) when `node` is one window's attention as the module docstring spells it."""
    c = node
    if not (is_call(c, "contiguous") and c.op == "call_method" and len(c.args) == 1 and not c.kwargs):
        return None
    t = c.args[0]
    if not (is_call(t, "transpose") and len(t.args) == 3 and tuple(t.args[1:]) in ((1, 2), (2, 1))
            and only_user(t) is c):
        return None
    mo = t.args[0]
    if not (is_call(mo, "matmul") and len(mo.args) == 2 and not mo.kwargs and only_user(mo) is t):
        return None
    w, v = mo.args
    tail = []
    if is_call(w, "dropout"):
        if not (_identity_dropout(w) and only_user(w) is mo):
            return None
        tail, w = [w], w.args[0]
    cast = w
    if not (isinstance(cast, fx.Node) and only_user(cast) is (tail[0] if tail else mo) and cast.args):
        return None
    sm = cast.args[0]
    if not (softmax_ok(sm) and only_user(sm) is cast and cast_target(cast) == getattr(val(sm.args[0]), "dtype", 0)):
        return None
    mul = sm.args[0]
    if not (is_call(mul, "mul") and len(mul.args) == 2 and not mul.kwargs and float_const(mul.args[1]) is not None
            and only_user(mul) is sm):
        return None
    ms = mul.args[0]
    if not (is_call(ms, "matmul") and len(ms.args) == 2 and not ms.kwargs and only_user(ms) is mul):
        return None
    q, kt = ms.args
    if not (is_call(kt, "transpose") and len(kt.args) == 3 and tuple(kt.args[1:]) in _K_T and only_user(kt) is ms):
        return None
    return q, kt.args[0], v, float_const(mul.args[1]), [kt, ms, mul, sm, cast, *tail, mo, t, c]


def _hint(x):
    """An int size or stride as is; a symbolic one (a graph Dynamo made dynamic) as the value it was captured at,
    or None."""
    if type(x) is int:
        return x
    hint = getattr(getattr(x, "node", None), "hint", None)
    return hint if type(hint) is int else None


def _hinted(v) -> bool:
    return isinstance(v, torch.Tensor) and all(_hint(d) is not None for d in (*v.shape, *v.stride(), v.storage_offset()))


def _consecutive(pieces: list) -> bool:
    """The example values are windows of one tensor: one storage, equal strides, and - where the sizes are ints -
    each piece's storage offset where the previous one ends (with symbolic sizes each offset is a symbol of its
    own, so only the call can tell: the per-call check)."""
    first = pieces[0]
    try:
        store = first.untyped_storage()._cdata
        static = all(type(d) is int for p in pieces for d in (*p.shape, *p.stride(), p.storage_offset()))
        off = first.storage_offset()
        for p in pieces:
            if p.untyped_storage()._cdata != store or (static and (p.stride() != first.stride() or
                                                                   p.storage_offset() != off)):
                return False
            off = off + p.shape[2] * p.stride(2) if static else off
    except Exception:  # noqa: BLE001 - a value without a storage: not the pattern
        return False
    return True


def _signature(dtype, lengths, H, D, Dv, scale, layout) -> tuple:
    return (FORM, dtype, "cpu", tuple(lengths), H, D, Dv, scale, layout)


def find(graph: fx.Graph, softmax_ok) -> list[dict]:
    """The windows regions of `graph` (module docstring); `softmax_ok`: attn_softmax's softmax test (patterns.py)."""
    order = {n: i for i, n in enumerate(graph.nodes)}
    out = []
    for cat in graph.nodes:
        if not (is_call(cat, "cat") and cat.op == "call_function" and cat.args and isinstance(cat.args[0], (list, tuple))):
            continue
        parts = list(cat.args[0])
        dim = cat.args[1] if len(cat.args) > 1 else cat.kwargs.get("dim", 0)
        if len(parts) < 2 or len(set(parts)) != len(parts) or set(cat.kwargs) - {"dim"} or len(cat.args) > 2:
            continue
        wins = [_window(p, softmax_ok) if isinstance(p, fx.Node) and only_user(p) is cat else None for p in parts]
        if any(w is None for w in wins) or len({w[3] for w in wins}) != 1:
            continue
        qs, ks, vs = ([val(w[j]) for w in wins] for j in range(3))
        if not all(_hinted(x) for x in (*qs, *ks, *vs)) or dim not in (1, -3):
            continue
        q0, v0 = qs[0], vs[0]
        H, D, Dv = (_hint(q0.shape[1]), _hint(q0.shape[3]), _hint(v0.shape[3])) if q0.dim() == v0.dim() == 4 else [0] * 3
        if not (H and D and Dv and q0.is_floating_point() and q0.device.type == "cpu"  # attn_windows: CPU only
                and all(x.dim() == 4 and _hint(x.shape[0]) == 1 and x.dtype == q0.dtype and x.device == q0.device
                        for x in (*qs, *ks, *vs))
                and all([_hint(d) for d in q.shape] == [_hint(d) for d in k.shape] == [1, H, _hint(q.shape[2]), D]
                        and [_hint(d) for d in v.shape] == [1, H, _hint(q.shape[2]), Dv] and _hint(q.shape[2]) > 0
                        for q, k, v in zip(qs, ks, vs))
                and all(_consecutive(p) for p in (qs, ks, vs))):
            continue
        nodes = sorted([n for w in wins for n in w[4]] + [cat], key=order.__getitem__)
        layout = tuple((tuple(map(_hint, x.stride())), _hint(x.storage_offset())) for x in (q0, ks[0], v0))
        out.append({"kind": FORM, "counted_as": FORM, "inputs": [n for w in wins for n in w[:3]], "nodes": nodes,
                    "output": cat, "scale": wins[0][3],
                    "signature": _signature(q0.dtype, [_hint(q.shape[2]) for q in qs], H, D, Dv, wins[0][3], layout)})
    return out


# ---- admission: the region against the call, on the call's layout ----------------------------------------------

def _laid_out(shape, stride, offset, gen, dtype, spread):
    """A random tensor of `shape` with `stride` at storage `offset` (the gaps between its elements zeros)."""
    size = offset + 1 + sum((n - 1) * s for n, s in zip(shape, stride))
    t = torch.zeros(size, dtype=dtype).as_strided(shape, stride, offset)
    t.copy_(torch.randn(shape, generator=gen) * spread)
    return t


def _pieces(sig, gen, spread) -> list:
    """[q_0, k_0, v_0, q_1, ...]: random windows laid out as the signature's."""
    _, dtype, _dev, lengths, H, D, Dv, _scale, layout = sig
    P = sum(lengths)
    full = [_laid_out((1, H, P, d), st, off, gen, dtype, spread) for (st, off), d in zip(layout, (D, D, Dv))]
    split = [torch.split(t, list(lengths), dim=2) for t in full]
    return [t for win in zip(*split) for t in win]


def _probe(sig, fn, target) -> tuple:
    gen = torch.Generator().manual_seed(13)
    probes = [_pieces(sig, gen, spread) for spread in (1.0, 4.0)]
    ok, why = same_bits(fn, target, probes)
    return (True, None) if ok else (None, f"opgym::attn_windows does not give the windows' bits ({why})")


def _target(scale: float):
    """attn_windows over the pieces' whole tensors (views of their memory from the first piece of each), with
    cu_seqlens from the pieces' lengths (one tensor per set of lengths)."""
    scale, cus = float(scale), {}

    def whole(p, P):
        return p.as_strided((p.shape[0], p.shape[1], P, p.shape[3]), p.stride(), p.storage_offset())

    def windows(*qkv):
        lengths = tuple(p.shape[2] for p in qkv[0::3])
        cu = cus.get(lengths)
        if cu is None:
            cu = cus[lengths] = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int64)
            if len(cus) > 64:
                cus.clear()
        P = sum(lengths)
        return OP(whole(qkv[0], P), whole(qkv[1], P), whole(qkv[2], P), scale, cu)
    return windows


def admit(region: dict):
    fn = extract(region["inputs"], region["output"], region["nodes"])
    return regions.admit(_VERDICTS, region, lambda r: _probe(r["signature"], fn, _target(r["scale"])))


def replacement(region: dict, _verdict) -> tuple:
    """(target, (), per-call check): the check says why a call runs the region's captured code instead."""
    scale = region["scale"]
    target = _target(scale)
    fn = extract(region["inputs"], region["output"], region["nodes"])

    def check(*qkv):
        q0, k0, v0 = qkv[:3]
        if q0.device.type != "cpu":
            return "not on the CPU (the probe ran there)"
        lengths = [p.shape[2] for p in qkv[0::3]]
        H, D, Dv = q0.shape[1], q0.shape[3], v0.shape[3]
        for j, d in enumerate((D, D, Dv)):
            pieces = qkv[j::3]
            first = pieces[0]
            step, at = first.stride(2) * first.element_size(), first.data_ptr()
            for p, n in zip(pieces, lengths):
                if p.shape != (1, H, n, d):
                    return "the windows' q, k and v shapes differ"
                if p.stride() != first.stride() or p.data_ptr() != at or p.dtype != q0.dtype:
                    return "the windows are not consecutive pieces of one tensor along the patch dim"
                at += n * step
        layout = tuple((x.stride(), x.storage_offset()) for x in (q0, k0, v0))
        sig = _signature(q0.dtype, lengths, H, D, Dv, scale, layout)
        got = _VERDICTS.decide(sig, lambda: _probe(sig, fn, target), device="cpu", in_backend=True)
        if isinstance(got, Failed):
            return f"the windows probe raised ({got.reason})"
        return None if got[0] else got[1]
    return target, (), check
