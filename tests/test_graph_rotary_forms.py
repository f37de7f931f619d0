"""The rotary forms of the exact graph path beyond HF's text form and the vision upcast (issue 31; the matcher:
python/opgym/ops/rotary/patterns.py): interleaved pairs, per-pair tables, partial rotary dims, upcasts by
promotion, tables of lower rank than q, GPT-OSS's halves, DeepSeek-V3's deinterleaving pairs, DeepSeek-V4's
upcast rope slice, Gemma 4's [B, S, H, D] layout, GPT-J's spelling - each a small module written the way HF
writes it, compiled with opgym.compile: its outputs are the module's eager bits (values, dtype, strides) with
rotary replaced and served. Each has a near miss the matcher must not take (the module's bits, the structure
left as captured), and what a wrong admission would serve - opgym::rotary with the arguments the form would
have been given - differs from the near miss's output, so the check would catch a matcher that took it."""
from __future__ import annotations

import importlib

import pytest
import torch
from torch import nn

import opgym
from opgym.admission import Verdicts, bits_equal

_backend = importlib.import_module("opgym.graph.backend")  # the module (opgym.graph's `backend` is its function)

OP = torch.ops.opgym.rotary
D, R, S, W = 32, 16, 9, 32  # head dim, partial rotary dim, positions, table width


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def rotate_interleaved(x):  # GLM's, Cohere's, DeepSeek-V4's rotate_half
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((-x2, x1), dim=-1).flatten(-2)


def _tables(width, dtype, batch=True):
    """HF-style cos and sin ([1, S, width], or [S, width]): cat(freqs, freqs) of positions times inverse frequencies."""
    inv = 1.0 / (10000 ** (torch.arange(0, width, 2, dtype=torch.float32) / width))
    f = torch.arange(S, dtype=torch.float32)[:, None] * inv
    f = torch.cat([f, f], -1)
    cos, sin = f.cos().to(dtype), f.sin().to(dtype)
    return (cos[None], sin[None]) if batch else (cos, sin)


def _qk(dtype, heads_first=True, q_heads=4, k_heads=2, seq=S):
    """q and k as HF's attention has them: [B, S, H, D] projections viewed [B, H, S, D] (transposed)."""
    g = torch.Generator().manual_seed(3)
    q, k = ((torch.randn(1, seq, h, D, generator=g) * 3).to(dtype) for h in (q_heads, k_heads))
    return (q.transpose(1, 2), k.transpose(1, 2)) if heads_first else (q, k)


class _Form(nn.Module):
    """rot(q, k, cos, sin) -> (q, k): the rotary statements of one HF form."""

    def forward(self, q, k, cos, sin):
        return self.rot(q, k, cos, sin)


def _compile_and_run(m, *args, keep=None):
    """(eager outputs, compiled outputs, handle); `keep` (a list) receives the rewritten graphs."""
    with torch.no_grad():
        want = m(*args)
    h = opgym.compile(m)
    real = _backend.rewrite

    def rewrite(gm, handle, ops=None):
        out = real(gm, handle, ops)
        keep.append(out)
        return out
    if keep is not None:
        _backend.rewrite = rewrite
    try:
        with torch.no_grad():
            got = m(*args)
    finally:
        _backend.rewrite = real
    return want, got, h


def _same(got, want):
    got, want = (got if isinstance(got, tuple) else (got,)), (want if isinstance(want, tuple) else (want,))
    return len(got) == len(want) and all(
        bits_equal(a, b) and a.dtype == b.dtype and a.stride() == b.stride() for a, b in zip(got, want))


def _cats_left(gms) -> int:
    """torch.cat calls left in the graphs with a part x[..., n:] (a partial rotary's pass-through dims)."""
    n = 0
    for gm in gms:
        for node in gm.graph.nodes:
            if node.op == "call_function" and node.target is torch.cat:
                parts = node.args[0]
                n += any(isinstance(p, torch.fx.Node) and p.op == "call_function" and "getitem" in str(p.target)
                         and isinstance(p.args[1], tuple) and isinstance(p.args[1][-1], slice)
                         and p.args[1][-1].start is not None and p.args[1][-1].stop is None for p in parts)
    return n


# ---- the served forms --------------------------------------------------------------------------------

class Interleaved(_Form):
    """Interleaved pairs over the whole head, one value per element (Cohere's rotate_half, in q's dtype)."""

    def rot(self, q, k, cos, sin):
        c, s = cos.unsqueeze(1), sin.unsqueeze(1)
        return q * c + rotate_interleaved(q) * s, k * c + rotate_interleaved(k) * s


class GlmPartialPairTable(_Form):
    """GLM-4's apply_rotary_pos_emb: cos[..., :W // 2].repeat_interleave(2, -1) (one value per pair), the rotary
    dim below the head dim (q[..., :R] rotated, q[..., R:] concatenated back), interleaved pairs."""

    def rot(self, q, k, cos, sin):
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        cos = cos[..., : cos.shape[-1] // 2].repeat_interleave(2, dim=-1)
        sin = sin[..., : sin.shape[-1] // 2].repeat_interleave(2, dim=-1)
        rd = cos.shape[-1]
        q_rot, q_pass = q[..., :rd], q[..., rd:]
        k_rot, k_pass = k[..., :rd], k[..., rd:]
        q_embed = (q_rot * cos) + (rotate_interleaved(q_rot) * sin)
        k_embed = (k_rot * cos) + (rotate_interleaved(k_rot) * sin)
        return torch.cat([q_embed, q_pass], dim=-1), torch.cat([k_embed, k_pass], dim=-1)


class Partial(_Form):
    """GPT-NeoX's / Phi-3's partial rotary: rotate_half over q[..., :R], q[..., R:] concatenated back."""

    def rot(self, q, k, cos, sin):
        c, s = cos.unsqueeze(1), sin.unsqueeze(1)
        rd = c.shape[-1]
        out = []
        for t in (q, k):
            t_rot, t_pass = t[..., :rd], t[..., rd:]
            out.append(torch.cat([(t_rot * c) + (rotate_half(t_rot) * s), t_pass], dim=-1))
        return tuple(out)


class Promotion(_Form):
    """OLMo-2/3: float32 tables against a bf16 q with no cast - the products and the sum float32 by promotion -
    then `.to(q_type)`."""

    def rot(self, q, k, cos, sin):
        c, s = cos.unsqueeze(1), sin.unsqueeze(1)
        q_embed = (q * c) + (rotate_half(q) * s)
        k_embed = (k * c) + (rotate_half(k) * s)
        return q_embed.to(q.dtype), k_embed.to(k.dtype)


class TwoCasts(_Form):
    """ModernBERT-decoder: q cast to float32 twice, once for the product and once for rotate_half's input."""

    def rot(self, q, k, cos, sin):
        c, s = cos.unsqueeze(1), sin.unsqueeze(1)
        q_embed = (q.float() * c) + (rotate_half(q.float()) * s)
        k_embed = (k.float() * c) + (rotate_half(k.float()) * s)
        return q_embed.to(q.dtype), k_embed.to(k.dtype)


class LowerRank(_Form):
    """Pixtral's call: tables [S, D] unsqueezed at 0, read against [B, H, S, D] by broadcasting."""

    def rot(self, q, k, cos, sin):
        c, s = cos.unsqueeze(0), sin.unsqueeze(0)
        return q * c + rotate_half(q) * s, k * c + rotate_half(k) * s


class Halves(_Form):
    """GPT-OSS's _apply_rotary_emb: chunk halves and a half-width table (one value per pair)."""

    def rot(self, q, k, cos, sin):
        c, s = cos.unsqueeze(1), sin.unsqueeze(1)
        out = []
        for t in (q, k):
            first, second = torch.chunk(t, 2, dim=-1)
            out.append(torch.cat((first * c - second * s, second * c + first * s), dim=-1))
        return tuple(out)


class Deinterleave(_Form):
    """DeepSeek-V3's apply_rotary_pos_emb_interleave: adjacent pairs in, halves out, the table's first half."""

    def rot(self, q, k, cos, sin):
        c = cos[..., : cos.shape[-1] // 2].unsqueeze(1)
        s = sin[..., : sin.shape[-1] // 2].unsqueeze(1)
        q1, q2 = q[..., 0::2], q[..., 1::2]
        k1, k2 = k[..., 0::2], k[..., 1::2]
        return (torch.cat([q1 * c - q2 * s, q2 * c + q1 * s], dim=-1),
                torch.cat([k1 * c - k2 * s, k2 * c + k1 * s], dim=-1))


class TrailingRopeUpcast(_Form):
    """DeepSeek-V4's apply_rotary_pos_emb on one tensor: a per-pair table repeat_interleave'd, the trailing rope
    slice rotated in float32 (`rope.float()` beside `rotate_half(rope).float()`), cast back, after the nope part.
    The rotation is served; the cat (rope last: not a prefix) stays as captured."""

    def rot(self, q, k, cos, sin):
        c = cos[..., : cos.shape[-1] // 2].repeat_interleave(2, dim=-1).unsqueeze(1)
        s = sin[..., : sin.shape[-1] // 2].repeat_interleave(2, dim=-1).unsqueeze(1)
        rd = c.shape[-1]
        out = []
        for t in (q, k):
            nope, rope = t[..., :-rd], t[..., -rd:]
            rotated = ((rope.float() * c) + (rotate_interleaved(rope).float() * s)).to(t.dtype)
            out.append(torch.cat([nope, rotated], dim=-1))
        return tuple(out)


class HeadsSecond(_Form):
    """Gemma 4's text call: one tensor at a time, [B, S, H, D] (before the transpose), tables unsqueezed at 2."""

    def rot(self, q, k, cos, sin):
        c, s = cos.unsqueeze(2), sin.unsqueeze(2)
        q = q * c + rotate_half(q) * s
        k = k * c + rotate_half(k) * s
        return q.transpose(1, 2), k.transpose(1, 2)


class HalvesWithPairTable(_Form):
    """rotate_half's halves with a repeat_interleave'd table: no pair table for opgym (pair j reads two entries),
    so the call takes the repeated table as per-element (the repeat_interleave stays as captured)."""

    def rot(self, q, k, cos, sin):
        c = cos[..., : cos.shape[-1] // 2].repeat_interleave(2, dim=-1).unsqueeze(1)
        s = sin[..., : sin.shape[-1] // 2].repeat_interleave(2, dim=-1).unsqueeze(1)
        return q * c + rotate_half(q) * s, k * c + rotate_half(k) * s


def rotate_every_two(x):  # GPT-J's
    x1 = x[:, :, :, ::2]
    x2 = x[:, :, :, 1::2]
    x = torch.stack((-x2, x1), dim=-1)
    return x.flatten(-2)


class GptJ(_Form):
    """GPT-J's spelling: full slices instead of an Ellipsis, `torch.repeat_interleave(t[:, :, None, :], 2, 3)`
    (one value per pair), the [B, S, H, D] layout, one tensor per call (k first), partial rotary."""

    def rot(self, q, k, cos, sin):
        def apply(t, sin, cos):
            sin = torch.repeat_interleave(sin[:, :, None, :], 2, 3)
            cos = torch.repeat_interleave(cos[:, :, None, :], 2, 3)
            return (t * cos) + (rotate_every_two(t) * sin)
        k_rot, k_pass = k[:, :, :, :R], k[:, :, :, R:]
        q_rot, q_pass = q[:, :, :, :R], q[:, :, :, R:]
        k_rot = apply(k_rot, sin, cos)
        q_rot = apply(q_rot, sin, cos)
        return torch.cat([q_rot, q_pass], dim=-1), torch.cat([k_rot, k_pass], dim=-1)


SERVED = {
    # name: (module, dtype of q/k, table width, table dtype, tables batched, q/k heads-first, fused calls)
    "interleaved": (Interleaved, torch.bfloat16, D, torch.bfloat16, True, True, 1),
    "glm-partial-pair-table": (GlmPartialPairTable, torch.bfloat16, R, torch.bfloat16, True, True, 1),
    "partial": (Partial, torch.float16, R, torch.float16, True, True, 1),
    "promotion": (Promotion, torch.bfloat16, D, torch.float32, True, True, 1),
    "two-casts": (TwoCasts, torch.bfloat16, D, torch.bfloat16, True, True, 1),
    "lower-rank-tables": (LowerRank, torch.bfloat16, D, torch.bfloat16, False, True, 1),
    "halves-pair-table": (Halves, torch.bfloat16, D // 2, torch.bfloat16, True, True, 1),
    "deinterleave": (Deinterleave, torch.bfloat16, D, torch.bfloat16, True, True, 1),
    "trailing-rope-upcast": (TrailingRopeUpcast, torch.bfloat16, R, torch.bfloat16, True, True, 2),
    "heads-second": (HeadsSecond, torch.bfloat16, D, torch.bfloat16, True, False, 1),
    "halves-repeated-table": (HalvesWithPairTable, torch.bfloat16, D, torch.bfloat16, True, True, 1),
    "gptj-spelling": (GptJ, torch.bfloat16, R // 2, torch.bfloat16, True, False, 2),
}


@pytest.mark.parametrize("name", list(SERVED))
def test_form_is_served_with_the_module_bits(name):
    cls, dtype, width, tdtype, batched, heads_first, calls = SERVED[name]
    q, k = _qk(dtype, heads_first)
    cos, sin = _tables(width, tdtype, batched)
    want, got, h = _compile_and_run(cls(), q, k, cos, sin)
    assert _same(got, want)
    assert h.replaced["rotary"] == calls and not h.skipped.get("rotary"), h
    assert h.stats()["ops"]["rotary"] == {"fused": calls, "fallback": 0, "reasons": {}}
    # and the module does rotate: q's output is not q
    assert not torch.equal(want[0].float(), (q if heads_first else q.transpose(1, 2)).float())


def test_partial_forms_take_the_pass_through_cat():
    """GLM's, GPT-NeoX's and GPT-J's partial rotary: the cat of the pass-through dims is part of the call (one
    contiguous output written by opgym::rotary), not left as a torch.cat after it."""
    for cls, width, heads_first, regions in ((GlmPartialPairTable, R, True, 1), (Partial, R, True, 1),
                                             (GptJ, R // 2, False, 2)):
        torch._dynamo.reset()
        gms = []
        q, k = _qk(torch.bfloat16, heads_first)
        want, got, h = _compile_and_run(cls(), q, k, *_tables(width, torch.bfloat16), keep=gms)
        assert _same(got, want) and h.replaced["rotary"] == regions, h
        assert gms and _cats_left(gms) == 0


def test_served_in_decode_shapes_too():
    """One position (decode) after a prefill, GQA heads: the same regions, q and k still one call per graph."""
    m = GlmPartialPairTable()
    h = opgym.compile(m)
    for seq in (S, 1, 5):
        q, k = _qk(torch.bfloat16, seq=seq)
        cos, sin = (t[:, :seq] for t in _tables(R, torch.bfloat16))
        with torch.no_grad():
            assert _same(m(q, k, cos, sin), m.rot(q, k, cos, sin))
    st = h.stats()["ops"]["rotary"]
    assert st["fused"] == 3 and st["fallback"] == 0, st
    assert h.replaced["rotary"] == h.graphs, h


# ---- the near misses -----------------------------------------------------------------------------------

class InterleavedWrongSign(_Form):
    """stack((x1, -x2)): the negation on the other element of each pair - another rotation (by -angle)."""

    def rot(self, q, k, cos, sin):
        c, s = cos.unsqueeze(1), sin.unsqueeze(1)

        def rot(x):
            return torch.stack((x[..., 0::2], -x[..., 1::2]), dim=-1).flatten(-2)
        return q * c + rot(q) * s, k * c + rot(k) * s


class PartialPassOfAnother(_Form):
    """The pass-through dims taken from another tensor (k's for q, q's for k): a cat that is no partial rotary of
    q. The rotated part is a region of its own; the cat stays."""

    def rot(self, q, k, cos, sin):
        c, s = cos.unsqueeze(1), sin.unsqueeze(1)
        k = k.repeat_interleave(2, dim=1)  # k with q's heads
        out = []
        for a, b in ((q, k), (k, q)):
            a_rot, b_pass = a[..., :R], b[..., R:]
            out.append(torch.cat([(a_rot * c) + (rotate_half(a_rot) * s), b_pass], dim=-1))
        return tuple(out)


class PartialPassFirst(_Form):
    """The pass-through dims first, the rotated ones after (DeepSeek's [nope | rope] order) on q[..., :R]: the
    cat stays as captured (opgym::rotary rotates a prefix and keeps the rest in place)."""

    def rot(self, q, k, cos, sin):
        c, s = cos.unsqueeze(1), sin.unsqueeze(1)
        out = []
        for t in (q, k):
            t_rot, t_pass = t[..., :R], t[..., R:]
            out.append(torch.cat([t_pass, (t_rot * c) + (rotate_half(t_rot) * s)], dim=-1))
        return tuple(out)


class PartialWrongSplit(_Form):
    """q[..., :R] rotated, then q[..., R - 2:] concatenated back (two dims twice): no partial rotary."""

    def rot(self, q, k, cos, sin):
        c, s = cos.unsqueeze(1), sin.unsqueeze(1)
        out = []
        for t in (q, k):
            t_rot, t_pass = t[..., :R], t[..., R - 2:]
            out.append(torch.cat([(t_rot * c) + (rotate_half(t_rot) * s), t_pass], dim=-1))
        return tuple(out)


class ProductsRounded(_Form):
    """Float32 tables, each product rounded to q's dtype before the sum (the table's cast after the product):
    two roundings more than OLMo's promotion."""

    def rot(self, q, k, cos, sin):
        c, s = cos.unsqueeze(1), sin.unsqueeze(1)
        return tuple(((t * c).to(t.dtype) + (rotate_half(t) * s).to(t.dtype)) for t in (q, k))


class PromotionNoCastBack(_Form):
    """OLMo's promotion without the cast back: float32 outputs for a bf16 q (opgym::rotary writes q's dtype)."""

    def rot(self, q, k, cos, sin):
        c, s = cos.unsqueeze(1), sin.unsqueeze(1)
        return (q * c) + (rotate_half(q) * s), (k * c) + (rotate_half(k) * s)


class TwoCastsOfAnother(_Form):
    """TwoCasts with rotate_half reading a cast of another tensor (t * 2): no rotation of t."""

    def rot(self, q, k, cos, sin):
        c, s = cos.unsqueeze(1), sin.unsqueeze(1)
        q_embed = (q.float() * c) + (rotate_half((q * 2).float()) * s)
        k_embed = (k.float() * c) + (rotate_half((k * 2).float()) * s)
        return q_embed.to(q.dtype), k_embed.to(k.dtype)


class HalvesWrongOrder(_Form):
    """GPT-OSS's halves concatenated in the other order (second part first)."""

    def rot(self, q, k, cos, sin):
        c, s = cos.unsqueeze(1), sin.unsqueeze(1)
        out = []
        for t in (q, k):
            first, second = torch.chunk(t, 2, dim=-1)
            out.append(torch.cat((second * c + first * s, first * c - second * s), dim=-1))
        return tuple(out)


class DeinterleaveSwapped(_Form):
    """DeepSeek-V3's statements with the odd elements as the first of each pair."""

    def rot(self, q, k, cos, sin):
        c = cos[..., : cos.shape[-1] // 2].unsqueeze(1)
        s = sin[..., : sin.shape[-1] // 2].unsqueeze(1)
        out = []
        for t in (q, k):
            t1, t2 = t[..., 1::2], t[..., 0::2]
            out.append(torch.cat([t1 * c - t2 * s, t2 * c + t1 * s], dim=-1))
        return tuple(out)


class TablesBroadcastQ(_Form):
    """Pixtral's lower-rank tables against a q of one position: the tables' S positions broadcast q up (the
    output has more rows than q; opgym::rotary writes q's shape)."""

    def rot(self, q, k, cos, sin):
        c, s = cos.unsqueeze(0), sin.unsqueeze(0)
        return q * c + rotate_half(q) * s, k * c + rotate_half(k) * s


def _wrong_interleaved(q, k, cos, sin):
    return OP(q, k, cos, sin, 1, "hf", None, "interleaved")


def _wrong_partial(q, k, cos, sin):
    return OP(q, k, cos, sin, 1, "hf", None, "half", False, True)


def _wrong_promotion(q, k, cos, sin):
    return OP(q, k, cos, sin, 1, "fp32")


def _wrong_halves(q, k, cos, sin):
    return OP(q, k, cos, sin, 1, "hf", None, "half", True, True)


def _wrong_deinterleave(q, k, cos, sin):
    return OP(q, k, cos[..., : W // 2], sin[..., : W // 2], 1, "hf", None, "deinterleave", True, True)


def _wrong_lower_rank(q, k, cos, sin):
    return OP(q, k, cos[None], sin[None], 1, "hf")


NEAR = {
    # name: (module, q/k dtype, table width, table dtype, batched, q positions, rotary regions served, wrong call)
    "interleaved-wrong-sign": (InterleavedWrongSign, torch.bfloat16, D, torch.bfloat16, True, S, 0, _wrong_interleaved),
    "partial-pass-of-another": (PartialPassOfAnother, torch.bfloat16, R, torch.bfloat16, True, S, 2, _wrong_partial),
    "partial-pass-first": (PartialPassFirst, torch.bfloat16, R, torch.bfloat16, True, S, 2, _wrong_partial),
    "partial-wrong-split": (PartialWrongSplit, torch.bfloat16, R, torch.bfloat16, True, S, 2, _wrong_partial),
    "products-rounded": (ProductsRounded, torch.bfloat16, D, torch.float32, True, S, 0, _wrong_promotion),
    "promotion-no-cast-back": (PromotionNoCastBack, torch.bfloat16, D, torch.float32, True, S, 0, _wrong_promotion),
    "two-casts-of-another": (TwoCastsOfAnother, torch.bfloat16, D, torch.bfloat16, True, S, 0, _wrong_promotion),
    "halves-wrong-order": (HalvesWrongOrder, torch.bfloat16, D // 2, torch.bfloat16, True, S, 0, _wrong_halves),
    "deinterleave-swapped": (DeinterleaveSwapped, torch.bfloat16, W, torch.bfloat16, True, S, 0, _wrong_deinterleave),
    "tables-broadcast-q": (TablesBroadcastQ, torch.bfloat16, D, torch.bfloat16, False, 1, 0, _wrong_lower_rank),
}


@pytest.mark.parametrize("name", list(NEAR))
def test_near_miss_is_left_as_captured(name):
    """The module's bits; the form's structure not taken (no region, or - where the rotated part alone is a
    region - the pass-through cat left in the graph); nothing refused by a probe (a near miss is no candidate);
    and the call a wrong match would make gives other values than the module."""
    cls, dtype, width, tdtype, batched, seq, regions, wrong = NEAR[name]
    q, k = _qk(dtype, seq=seq)
    cos, sin = _tables(width, tdtype, batched)
    gms = []
    want, got, h = _compile_and_run(cls(), q, k, cos, sin, keep=gms)
    assert _same(got, want)
    assert h.replaced["rotary"] == regions and not h.skipped.get("rotary"), h
    if name.startswith("partial"):  # the rotated parts served, q's and k's cat after them left as captured
        assert _cats_left(gms) == 2, [gm.graph for gm in gms]
    assert _wrong_differs(wrong, (q, k, cos, sin), want)


def _wrong_differs(wrong, args, want) -> bool:
    """Whether the call a wrong match would make gives other outputs than `want` (or cannot be made at all:
    opgym::rotary refuses the inputs - then a wrongly admitted region would fall back on every call)."""
    try:
        with torch.no_grad():
            bad = wrong(*args)
    except (RuntimeError, ValueError):
        return True
    return not all(a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b) for a, b in zip(bad, want))


# ---- the probe refuses a call that is not the region's ----------------------------------------------------

def test_probe_refuses_another_rounding_and_another_layout(monkeypatch):
    """The promotion served in mode "hf" with the tables rounded to q's dtype (one rounding more per product), and
    the partial form without `contiguous` (the values right, the layout q's instead of the cat's): each refused
    by the probe with its reason, the module's bits kept."""
    from opgym.ops.rotary import patterns

    real = patterns.replacement

    def tampered(region, verdict):
        target, consts = real(region, verdict)
        views, r, ud, mode, pairs, pair_table, contiguous = consts
        if mode == "fp32":  # the promotion: mode hf, tables rounded to q's dtype
            def hf(q, k, cos, sin, *c):
                return target(q, k, cos.to(q.dtype), sin.to(q.dtype), views, r, ud, "hf", pairs, pair_table, False)
            return hf, consts
        return target, (views, r, ud, mode, pairs, pair_table, False)

    monkeypatch.setattr(patterns, "replacement", tampered)
    monkeypatch.setattr(patterns, "_VERDICTS", Verdicts("rotary graph region"))
    for cls, width, tdtype, why in ((Promotion, D, torch.float32, "mode fp32) does not give the region's bits"),
                                    (Partial, R, torch.bfloat16, "gives the region's bits in another layout")):
        torch._dynamo.reset()
        q, k = _qk(torch.bfloat16)
        want, got, h = _compile_and_run(cls(), q, k, *_tables(width, tdtype))
        assert _same(got, want)
        assert h.replaced["rotary"] == 0 and any(why in w for w in h.skipped["rotary"]), h


def test_switch_off_runs_the_captured_code(monkeypatch):
    m = GlmPartialPairTable()
    q, k = _qk(torch.bfloat16)
    cos, sin = _tables(R, torch.bfloat16)
    h = opgym.compile(m)
    monkeypatch.setenv("OPGYM_ROTARY", "0")
    with torch.no_grad():
        assert _same(m(q, k, cos, sin), m.rot(q, k, cos, sin))
    st = h.stats()["ops"]["rotary"]
    assert st["fused"] == 0 and st["fallback"] == 1, st
    assert st["reasons"] == {"OPGYM_ROTARY=0": 1}, st


def test_tables_whose_last_dim_is_not_dense():
    """GPT-OSS under transformers 4.57.6: freqs computed as a transposed matmul, and the cos, the scaling and the
    cast keep that layout - the tables' last dim has a stride of S. Served (the call copies them to rows), the bits
    the module's."""
    q, k = _qk(torch.bfloat16)
    cos, sin = _tables(D // 2, torch.bfloat16)
    cos, sin = (t.transpose(-1, -2).contiguous().transpose(-1, -2) for t in (cos, sin))
    assert cos.stride(-1) != 1
    want, got, h = _compile_and_run(Halves(), q, k, cos, sin)
    assert _same(got, want)
    assert h.replaced["rotary"] == 1 and not h.skipped.get("rotary"), h
