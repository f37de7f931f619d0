"""The flagship through the exact graph path (issue 31: "the flagship under 5.24: all six ops fused, logits and
greedy tokens identical to HF eager"), and the rotary pattern it needed: the vision tower's upcast form
(HF's apply_rotary_pos_emb_vision: q, k and the tables cast to float32, one rounding back at the end), served
by opgym::rotary's fp32 mode, with the near misses the matcher must not take. The same tests run under the
pinned transformers and under `.venv-tf-next` (PYTHONPATH=python .venv-tf-next/bin/python -m pytest ...)."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from opgym import graph

transformers = pytest.importorskip("transformers")
from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import apply_rotary_pos_emb_vision, rotate_half  # noqa: E402

OPS = ("rms_norm", "add_rms_norm", "rotary", "swiglu", "attn_softmax", "patch_embed")


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _tables(S, D, dtype=torch.float32):
    """Vision-style tables: float32 cos and sin of positions times inverse frequencies, [S, D]."""
    inv = 1.0 / (10000 ** (torch.arange(0, D // 2, 2, dtype=torch.float32) / (D // 2)))
    f = torch.arange(S, dtype=torch.float32)[:, None] * inv
    f = torch.cat([f, f + 0.5], -1)  # two position streams (h, w), as the vision tower recomposes them
    f = torch.cat([f, f], -1)
    return f.cos().to(dtype), f.sin().to(dtype)


class _VisionRotary(nn.Module):
    """Qwen2.5-VL's vision attention up to the rotary: one qkv projection viewed [S, 3, H, D] and unbound (q and
    k strided views of it), then `rotate` - here HF's own apply_rotary_pos_emb_vision."""

    def __init__(self, heads=4, D=32):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(heads * D, 3 * heads * D)

    def qk(self, x):
        q, k, _ = self.qkv(x).reshape(x.shape[0], 3, self.heads, -1).permute(1, 0, 2, 3).unbind(0)
        return q, k

    def rotate(self, q, k, cos, sin):
        return apply_rotary_pos_emb_vision(q, k, cos, sin)

    def forward(self, x, cos, sin):
        q, k = self.qk(x)
        return self.rotate(q, k, cos, sin)


class _SingleCastFirst(_VisionRotary):
    """One tensor only, the tables cast before their unsqueeze: the same arithmetic (served, one call)."""

    def rotate(self, q, k, cos, sin):
        t = q.float()
        c, s = cos.float().unsqueeze(-2), sin.float().unsqueeze(-2)
        return ((t * c) + (rotate_half(t) * s)).to(q.dtype), k


class _CastAfterMul(_VisionRotary):
    """The products taken in q's dtype with the tables rounded to it, the cast to float32 after each product:
    two more roundings than the upcast form. No upcast region (the sum adds two casts, not two products)."""

    def rotate(self, q, k, cos, sin):
        c, s = cos.unsqueeze(-2).to(q.dtype), sin.unsqueeze(-2).to(q.dtype)
        out = [((t * c).float() + (rotate_half(t) * s).float()).to(t.dtype) for t in (q, k)]
        return tuple(out)


class _NoCastBack(_VisionRotary):
    """The upcast form without the cast back: the float32 sums are the outputs (opgym's call rounds them)."""

    def rotate(self, q, k, cos, sin):
        c, s = cos.unsqueeze(-2).float(), sin.unsqueeze(-2).float()
        q, k = q.float(), k.float()
        return (q * c) + (rotate_half(q) * s), (k * c) + (rotate_half(k) * s)


class _OtherDtypeBack(_VisionRotary):
    """The upcast form cast back to float16 where q is bfloat16: another rounding than opgym's (to q's dtype)."""

    def rotate(self, q, k, cos, sin):
        c, s = cos.unsqueeze(-2).float(), sin.unsqueeze(-2).float()
        q, k = q.float(), k.float()
        return ((q * c) + (rotate_half(q) * s)).to(torch.float16), ((k * c) + (rotate_half(k) * s)).to(torch.float16)


def _rotate_heads(x):
    """rotate_half over the heads dim (-2) instead of the head's own dim: another rotation."""
    h = x.shape[-2] // 2
    return torch.cat((-x[:, h:], x[:, :h]), dim=-2)


class _OtherDim(_VisionRotary):
    """The upcast form with its halves taken over the heads dim, not the last: no rotate_half, no region."""

    def rotate(self, q, k, cos, sin):
        c, s = cos.unsqueeze(-2).float(), sin.unsqueeze(-2).float()
        qf, kf = q.float(), k.float()
        return ((qf * c) + (_rotate_heads(qf) * s)).to(q.dtype), ((kf * c) + (_rotate_heads(kf) * s)).to(k.dtype)


def _run(cls, dtype, S=33):
    torch.manual_seed(0)
    m = cls().to(dtype).eval()
    g = torch.Generator().manual_seed(9)
    x = (torch.randn(S, m.qkv.in_features, generator=g) * 2).to(dtype)
    cos, sin = _tables(S, m.qkv.in_features // m.heads)
    with torch.no_grad():
        want = m(x, cos, sin)
        h = graph.compile(m)
        got = m(x, cos, sin)
        q, k = m.qk(x)
    return m, h, got, want, (q, k, cos, sin)


@pytest.mark.parametrize("cls,dtype,calls", [(_VisionRotary, torch.bfloat16, 1), (_VisionRotary, torch.float16, 1),
                                             (_VisionRotary, torch.float32, 1), (_SingleCastFirst, torch.bfloat16, 1)],
                         ids=["hf-bf16", "hf-fp16", "hf-fp32", "single-cast-first-bf16"])
def test_vision_rotary_upcast_is_served(cls, dtype, calls):
    """HF's apply_rotary_pos_emb_vision on strided q, k views: one opgym::rotary call (mode fp32) for q and k,
    outputs HF's bits (values, dtype and strides)."""
    _, h, got, want, _ = _run(cls, dtype)
    assert all(torch.equal(a, b) and a.dtype == b.dtype and a.stride() == b.stride() for a, b in zip(got, want))
    assert h.replaced["rotary"] == 1, h
    assert h.stats()["ops"]["rotary"] == {"fused": calls, "fallback": 0, "reasons": {}}


@pytest.mark.parametrize("cls", [_CastAfterMul, _NoCastBack, _OtherDtypeBack, _OtherDim])
def test_vision_rotary_near_misses_are_not_matched(cls):
    """Each near miss is no candidate at all (nothing replaced, nothing probed: no skip reason), and what a
    wrong admission would serve - opgym::rotary in mode fp32 on the same q, k and tables - gives other bits
    than the module: were the matcher to take it, the output check (or the probe) would show it."""
    _, h, got, want, (q, k, cos, sin) = _run(cls, torch.bfloat16)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert h.replaced["rotary"] == 0 and not h.skipped.get("rotary"), h
    wrong = torch.ops.opgym.rotary(q, k, cos, sin, -2, "fp32")
    assert not all(torch.equal(a.to(b.dtype), b) for a, b in zip(wrong, want))


def test_vision_rotary_probe_refuses_a_call_that_rounds_differently(monkeypatch):
    """The probe's inputs tell roundings apart: served with its tables rounded to q's dtype first (one rounding
    more than HF's float32 tables), the region is refused by bits, with the reason, and runs as captured."""
    from opgym.ops.rotary import patterns

    real = patterns.replacement

    def rounded_tables(region, verdict):
        target, consts = real(region, verdict)
        if region["form"] != "upcast":
            return target, consts

        def wrong(q, k, cos, sin, *c):
            return target(q, k, cos.to(q.dtype), sin.to(q.dtype), *c)
        return wrong, consts

    from opgym.admission import Verdicts

    monkeypatch.setattr(patterns, "replacement", rounded_tables)
    monkeypatch.setattr(patterns, "_VERDICTS", Verdicts("rotary graph region"))  # no verdict cached by another test
    _, h, got, want, _ = _run(_VisionRotary, torch.bfloat16)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert h.replaced["rotary"] == 0, h
    assert any("mode fp32) does not give the region's bits" in why for why in h.skipped["rotary"]), h


# The tiny flagship: 2 text layers, 2 vision blocks (one windowed, one full), a 56x56 page. Per forward, regions
# (graphs are per code: the two vision blocks share theirs) and calls: RMSNorm 3 regions (vision norm1, the
# merger's ln_q, text layer 0's input norm; 4 calls), add + RMSNorm 5 (vision norm2; text: 4; 6 calls), rotary 3
# (the vision q+k upcast pair, one text q+k pair per layer; 4 calls), gated activation 3 (4 calls), attention core
# 3 (4 calls), patch embedding 1 where its probe finds the conv's bits (conftest.ONEDNN; test_graph).
FORWARD_REGIONS = {"rms_norm": 3, "add_rms_norm": 5, "rotary": 3, "swiglu": 3, "attn_softmax": 3}
FORWARD_CALLS = {"rms_norm": 4, "add_rms_norm": 6, "rotary": 4, "swiglu": 4, "attn_softmax": 4}


@pytest.mark.full
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_flagship_every_op_served_logits_and_tokens_hf(dtype):
    """The tiny Qwen2.5-VL through opgym.compile, forward on image + text and 4 greedy tokens: logits and tokens
    HF eager's bits, each of the six ops served (patch_embed where the CPU runs the conv through oneDNN; on an
    AVX2-only CPU its probe refuses bf16, with the reason), no fallback - in the generate too, whose image
    encoding calls the vision tower outside the model's forward (~70 s)."""
    from conftest import tiny_qwen25vl
    from test_graph import _pe_served_here

    (m, inputs), (ref, _) = tiny_qwen25vl(), tiny_qwen25vl()
    m, ref = m.to(dtype), ref.to(dtype)
    inputs = {k: (v.to(dtype) if v.is_floating_point() else v) for k, v in inputs.items()}
    pe = 1 if _pe_served_here(dtype) else 0
    h = graph.compile(m)
    with torch.no_grad():
        assert torch.equal(m(**inputs).logits, ref(**inputs).logits)
        assert dict(h.replaced) == {**FORWARD_REGIONS, **({"patch_embed": 1} if pe else {})}, h
        st = h.stats()
        assert {op: st["ops"][op]["fused"] for op in FORWARD_CALLS} == FORWARD_CALLS, st
        assert st["ops"]["patch_embed"]["fused"] == pe and st["fallback"] == 0, st
        if not pe:
            assert any("no single form of opgym::patch_embed" in w for w in h.skipped["patch_embed"]), h
        h.reset_stats()
        kw = dict(max_new_tokens=4, min_new_tokens=4, do_sample=False)
        assert torch.equal(m.generate(**inputs, **kw), ref.generate(**inputs, **kw))
    st = h.stats()
    # the image once (the vision tower's calls, as in the forward), then 4 text forwards (prefill, 3 decodes)
    assert st["ops"]["rotary"]["fused"] == 2 + 2 * 4 and st["ops"]["patch_embed"]["fused"] == pe, st
    assert st["ops"]["rms_norm"]["fused"] == 3 + 1 * 4 and st["ops"]["add_rms_norm"]["fused"] == 2 + 4 * 4, st
    assert st["ops"]["swiglu"]["fused"] == 2 + 2 * 4 and st["ops"]["attn_softmax"]["fused"] == 2 + 2 * 4, st
    assert st["fallback"] == 0, st


def test_nested_models_are_compiled_served_when_called_directly_and_undone():
    """opgym.compile compiles the models nested in the model (graph.backend.towers: Qwen2's base model here; the
    vision tower in Qwen2.5-VL, which generate calls directly to encode the image): a direct call of one runs
    served; undo() gives every module its own call back (HF's bits, nothing counted), redo() the compiled ones
    (no new graph), and so does the model's compiled call restored alone."""
    from test_graph import _qwen2

    m, ref = _qwen2(torch.bfloat16), _qwen2(torch.bfloat16)
    h = graph.compile(m)
    assert [t() for t in h._towers] == [m.model] and m.model._compiled_call_impl is not None
    ids = torch.randint(3, 99, (1, 7), generator=torch.Generator().manual_seed(12))
    with torch.no_grad():
        want = ref.model(ids).last_hidden_state
        assert torch.equal(m.model(ids).last_hidden_state, want)  # the base model called on its own: served
        st = h.stats()
        assert st["ops"]["rms_norm"]["fused"] == 1 and st["ops"]["add_rms_norm"]["fused"] == 4, st
        assert torch.equal(m(ids).logits, ref(ids).logits)
        n = h.graphs
        h.undo()
        assert m._compiled_call_impl is None and m.model._compiled_call_impl is None
        h.reset_stats()
        assert torch.equal(m.model(ids).last_hidden_state, want) and h.stats()["fused"] == 0
        h.redo()
        assert torch.equal(m.model(ids).last_hidden_state, want) and torch.equal(m(ids).logits, ref(ids).logits)
        assert h.stats()["ops"]["add_rms_norm"]["fused"] == 8 and h.graphs == n, h
        # a caller that restores only the model's own compiled call (opgym run's graph side): its first call
        # puts the towers' back, so the base model is not compiled again in the model's region
        impl = m._compiled_call_impl
        h.undo()
        m._compiled_call_impl = impl
        assert torch.equal(m(ids).logits, ref(ids).logits) and m.model._compiled_call_impl is not None
        assert torch.equal(m.model(ids).last_hidden_state, want) and h.graphs == n, h


class _TableOfLowerRank(nn.Module):
    """HF's text form (apply_rotary_pos_emb) with Pixtral's call: tables [S, D] unsqueezed at 0, read against q
    and k of [B, H, S, D] by broadcasting. The region pads the tables on the left as broadcasting does (they were
    once admitted unpadded, and every call raised and fell back): one call, served, HF's bits."""

    def forward(self, q, k, cos, sin):
        from transformers.models.pixtral.modeling_pixtral import apply_rotary_pos_emb

        return apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=0)


def test_text_rotary_table_of_lower_rank_is_served():
    g = torch.Generator().manual_seed(13)
    q, k = (torch.randn(1, h, 9, 32, generator=g).to(torch.bfloat16) for h in (4, 2))
    cos, sin = (t.to(torch.bfloat16) for t in _tables(9, 32))
    m = _TableOfLowerRank()
    with torch.no_grad():
        want = m(q, k, cos, sin)
        h = graph.compile(m)
        got = m(q, k, cos, sin)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert h.replaced["rotary"] == 1 and h.stats()["ops"]["rotary"] == {"fused": 1, "fallback": 0, "reasons": {}}, h
