"""rotary's contract (opgym/ops/contract.py): Qwen2.5-VL-3B's captured rotary calls - the text path (16 q heads,
2 kv heads, head dim 128, HF's transposed projection views) at decode and prefill, MRoPE's three sections
(16, 24, 24), the vision tower's fp32 tables over 1024 patches (16 heads, head dim 80) - and edge cases, against
transformers' own rotary functions."""
from __future__ import annotations

import torch

from ..contract import BIG, Huge, Misuse, Sample, around_2_31, causal_lm, rand, tiled

OPS = torch.ops.opgym
LIFE = causal_lm("qwen2")  # a patched module's life (tests/test_module_life.py)


def _hf():
    from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl as hf
    return hf


def text(q, k, cos, sin, *_args, **_kw):
    return _hf().apply_rotary_pos_emb(q, k, cos, sin)


def vision(q, k, cos, sin, *_args, **_kw):
    return _hf().apply_rotary_pos_emb_vision(q, k, cos, sin)


def mrope(q, k, cos, sin, unsqueeze_dim=1, mode="hf", section=(16, 24, 24), *_args, **_kw):
    """Qwen2-VL's apply_multimodal_rotary_pos_emb: each third of the table from its own position row."""
    hf = _hf()
    sec = list(section) * 2
    cos = torch.cat([m[i % 3] for i, m in enumerate(cos.split(sec, dim=-1))], dim=-1).unsqueeze(unsqueeze_dim)
    sin = torch.cat([m[i % 3] for i, m in enumerate(sin.split(sec, dim=-1))], dim=-1).unsqueeze(unsqueeze_dim)
    return q * cos + hf.rotate_half(q) * sin, k * cos + hf.rotate_half(k) * sin


def _text_qk(S, dtype, seed, H=16, KV=2, D=128):
    """HF's q_proj(x).view(B, S, H, D).transpose(1, 2): strided heads."""
    q = rand((1, S, H, D), dtype, seed).transpose(1, 2)
    k = rand((1, S, KV, D), dtype, seed + 1).transpose(1, 2)
    return q, k


def samples(dtype: torch.dtype) -> list[Sample]:
    out = []
    for name, S in (("decode S=1", 1), ("prefill S=282", 282), ("empty S=0", 0)):
        q, k = _text_qk(S, dtype, 10 + S)
        cos, sin = rand((1, S, 128), dtype, 20 + S), rand((1, S, 128), dtype, 30 + S)
        out.append(Sample(f"text {name}", OPS.rotary.default, (q, k, cos, sin), text))
    q, k = _text_qk(31, dtype, 40)
    cos, sin = rand((3, 1, 31, 128), dtype, 41), rand((3, 1, 31, 128), dtype, 42)
    out.append(Sample("MRoPE sections (16, 24, 24)", OPS.rotary.default, (q, k, cos, sin, 1, "hf", [16, 24, 24]), mrope))
    qkv = rand((1024, 3, 16, 80), dtype, 50)
    vq, vk, _ = qkv.permute(1, 0, 2, 3).unbind(0)  # HF's vision attention: strided views of one projection
    vcos, vsin = rand((1024, 80), torch.float32, 51), rand((1024, 80), torch.float32, 52)
    out.append(Sample("vision fp32 tables, 1024 patches", OPS.rotary.default, (vq, vk, vcos, vsin, -2, "fp32"), vision))
    q, k = (t.contiguous() for t in _text_qk(5, dtype, 60, H=4))
    cos, sin = rand((1, 5, 128), dtype, 61), rand((1, 5, 128), dtype, 62)
    out.append(Sample("in place", OPS.rotary_.default, (q, k, cos, sin), text))
    return out


def _hf_model(name: str):
    import importlib

    return importlib.import_module(f"transformers.models.{name}.modeling_{name}")


def interleaved(q, k, cos, sin, *_args, **_kw):
    """Cohere's apply_rotary_pos_emb: q and k upcast to fp32, adjacent elements paired, cast back."""
    return _hf_model("cohere").apply_rotary_pos_emb(q, k, cos, sin)


def pair_table(q, k, cos, sin, *_args, **_kw):
    """GPT-OSS's apply_rotary_pos_emb: the halves paired, one table value per pair (cos of width D / 2)."""
    return _hf_model("gpt_oss").apply_rotary_pos_emb(q, k, cos, sin)


def drawn(draw, dtype: torch.dtype) -> Sample:
    """HF's text rotary (batch 1..2, 0..20 positions, 1..4 q heads and 1..4 kv heads, even head dims 2..128, q and
    k as HF's transposed projection views or contiguous, per-batch or shared tables, out of place or in place),
    MRoPE's three sections (any split of half the head dim), Cohere's adjacent pairs in fp32 (tables of q's dtype
    or fp32), GPT-OSS's one table value per pair, or the vision rotary (fp32 tables over 0..40 patches)."""
    form = draw.choice(("text", "mrope", "vision", "interleaved", "pair_table"))
    D = 2 * draw.integer(3 if form == "mrope" else 1, 64)
    H, KV = draw.integer(1, 4), draw.integer(1, 4)
    if form == "vision":
        P = draw.integer(0, 40)
        q, k = draw.tensor((P, H, D), dtype), draw.tensor((P, KV, D), dtype)
        cos, sin = rand((P, D), torch.float32, draw.seed()), rand((P, D), torch.float32, draw.seed())
        return Sample(f"vision P={P} H={H} KV={KV} D={D}", OPS.rotary.default, (q, k, cos, sin, -2, "fp32"), vision)
    B, S = draw.integer(1, 2), draw.integer(0, 20)
    call = draw.choice(("rotary", "rotary_"))
    if call == "rotary_" or draw.boolean():
        q, k = rand((B, H, S, D), dtype, draw.seed()), rand((B, KV, S, D), dtype, draw.seed())
    else:
        q, k = (rand((B, S, n, D), dtype, draw.seed()).transpose(1, 2) for n in (H, KV))
    tb = draw.choice((1, B))
    op = getattr(OPS, call).default
    what = f"{call} {form} B={B} S={S} H={H} KV={KV} D={D}"
    if form in ("text", "interleaved", "pair_table"):
        tdt = draw.choice((dtype, torch.float32)) if form == "interleaved" else dtype
        W = D // 2 if form == "pair_table" else D
        cos, sin = rand((tb, S, W), tdt, draw.seed()), rand((tb, S, W), tdt, draw.seed())
        if form == "text":
            return Sample(what, op, (q, k, cos, sin), text)
        if form == "interleaved":
            return Sample(f"{what} tables {tdt}", op, (q, k, cos, sin, 1, "fp32", None, "interleaved"), interleaved)
        return Sample(what, op, (q, k, cos, sin, 1, "hf", None, "half", True), pair_table)
    a = draw.integer(1, D // 2 - 2)
    b = draw.integer(1, D // 2 - 1 - a)
    section = [a, b, D // 2 - a - b]
    cos, sin = rand((3, tb, S, D), dtype, draw.seed()), rand((3, tb, S, D), dtype, draw.seed())
    return Sample(f"{what} sections {section}", op, (q, k, cos, sin, 1, "hf", section), mrope)


def huge() -> list[Huge]:
    """rotary_ in place on HF's transposed q [1, 16, S, 128] past 2^31 elements (4.3 GB) and k [1, 2, S, 128]."""
    S = BIG // (16 * 128) + 1

    def make():
        q = tiled((1, S, 16, 128), torch.bfloat16, 5).transpose(1, 2)
        k = tiled((1, S, 2, 128), torch.bfloat16, 6).transpose(1, 2)
        return q, k, tiled((1, S, 128), torch.bfloat16, 7), tiled((1, S, 128), torch.bfloat16, 8)
    return [Huge(f"rotary_ text S={S} bf16", OPS.rotary_.default, make, S, around_2_31(S, 16 * 128), text)]


def misuses() -> list[Misuse]:
    q, k = _text_qk(3, torch.bfloat16, 0, H=4, KV=2, D=8)
    cos, sin = rand((1, 3, 8), torch.bfloat16, 1), rand((1, 3, 8), torch.bfloat16, 2)
    qc, kc = q.contiguous(), k.contiguous()
    return [
        Misuse("an odd head dim", lambda: OPS.rotary(q[..., :7], k[..., :7], cos[..., :7], sin[..., :7]), ValueError,
               "must be even", (q, k)),
        Misuse("fp32 tables in mode hf", lambda: OPS.rotary(q, k, cos.float(), sin.float()), ValueError,
               "mode hf computes in q's dtype", (q, k)),
        Misuse("tables that do not broadcast", lambda: OPS.rotary(q, k, cos[:, :2], sin[:, :2]), ValueError,
               "does not broadcast", (q, k)),
        Misuse("k of another dtype", lambda: OPS.rotary(q, k.float(), cos, sin), ValueError, "k must have q's dtype",
               (q, k)),
        Misuse("MRoPE sections that do not sum to half the dim",
               lambda: OPS.rotary(q, k, rand((3, 1, 3, 8), torch.bfloat16, 3), rand((3, 1, 3, 8), torch.bfloat16, 4),
                                  1, "hf", [1, 1, 1]), ValueError, "sum to half the rotary dim", (q, k)),
        Misuse("in place with q and k one tensor", lambda: OPS.rotary_(qc, qc, cos[:, :, :8], sin), ValueError,
               "overlaps", (qc,)),
    ]
