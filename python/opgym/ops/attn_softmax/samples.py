"""attn_softmax's contract (opgym/ops/contract.py): what HF eager attention computes between its two matmuls, on
Qwen2.5-VL-3B's captured attention shapes (text: 16 heads, prefill 282 x 282 with HF's causal mask, decode 1 x 300
with a left-padded batch's mask; vision: 64-patch windows of a 1024-patch page, packed; a full-attention block),
and the whole eager_attention_forward as one operator (repeat_kv as HF, 16 q heads on 2 kv heads), each against
transformers' own eager_attention_forward or its statements."""
from __future__ import annotations

import types

import torch
import torch.nn.functional as F

from ..contract import BIG, Huge, Misuse, Sample, around_2_31, causal_lm, rand, tiled

OPS = torch.ops.opgym
LIFE = causal_lm("mistral")  # a patched module's life (tests/test_module_life.py): 2 heads on 1 kv head
REFUSALS = ("bits differ from HF's per-window ones (probe)",)  # the vision one-pass probe's (tests/conftest.py)
TEXT_SCALING = 128 ** -0.5
VISION_SCALING = 80 ** -0.5


def hf_softmax(scores, scale, mask=None):
    """eager_attention_forward's statements: `* scaling`, `+ attention_mask`, softmax in fp32, `.to(dtype)`."""
    w = scores * scale
    if mask is not None:
        w = w + mask
    return F.softmax(w, dim=-1, dtype=torch.float32).to(scores.dtype)


def segments(scores, scale, cu_seqlens, block_diagonal=False):
    """Each window's own softmax (HF's loop over windows), packed at column 0 (or at the window's own columns)."""
    out = torch.zeros_like(scores)
    cu = cu_seqlens.tolist()
    for s, e in zip(cu[:-1], cu[1:]):
        c0 = s if block_diagonal else 0
        out[..., s:e, c0:c0 + e - s] = hf_softmax(scores[..., s:e, c0:c0 + e - s], scale)
    return out


def eager(q, k, v, scale, mask=None, groups=1, grouped=False):
    from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl as hf

    module = types.SimpleNamespace(num_key_value_groups=groups, training=False)
    return hf.eager_attention_forward(module, q, k, v, mask, scaling=scale)


def causal_mask(B, S, T, dtype, left_pad=0):
    """HF's 4-D float mask: 0 where attended, finfo.min elsewhere; batch row 1 left-padded by `left_pad` keys."""
    mn = torch.finfo(dtype).min
    i = torch.arange(S, device="cpu")[:, None] + (T - S)
    j = torch.arange(T, device="cpu")[None, :]
    m = torch.zeros(B, 1, S, T, dtype=dtype, device="cpu")
    m.masked_fill_((j > i)[None, None], mn)
    if B > 1 and left_pad:
        m[1, :, :, :left_pad] = mn
    return m


def samples(dtype: torch.dtype) -> list[Sample]:
    out = [
        Sample("text prefill [1, 16, 282, 282], causal", OPS.attn_softmax.default,
               (rand((1, 16, 282, 282), dtype, 1, 30.0), TEXT_SCALING, causal_mask(1, 282, 282, dtype)), hf_softmax),
        Sample("text decode [2, 16, 1, 300], left-padded", OPS.attn_softmax.default,
               (rand((2, 16, 1, 300), dtype, 2, 30.0), TEXT_SCALING, causal_mask(2, 1, 300, dtype, left_pad=17)),
               hf_softmax),
        Sample("vision full attention [1, 16, 1024, 1024]", OPS.attn_softmax.default,
               (rand((1, 16, 1024, 1024), dtype, 3, 10.0), VISION_SCALING), hf_softmax),
        Sample("rows of one key, no mask", OPS.attn_softmax.default, (rand((3, 1), dtype, 4), 0.5), hf_softmax),
        Sample("empty rows", OPS.attn_softmax.default, (rand((0, 16), dtype, 5), 0.5), hf_softmax),
        Sample("in place", OPS.attn_softmax_.default,
               (rand((1, 4, 9, 40), dtype, 6, 10.0), TEXT_SCALING, causal_mask(1, 9, 40, dtype)), hf_softmax),
    ]
    cu = torch.tensor([0, 64, 128, 192, 237, 301], dtype=torch.int32, device="cpu")  # windows, the last ones uneven
    out.append(Sample("vision windows, packed", OPS.attn_softmax_segments.default,
                      (rand((16, 301, 64), dtype, 7, 10.0), VISION_SCALING, cu), segments))
    out.append(Sample("vision images, block diagonal", OPS.attn_softmax_segments.default,
                      (rand((16, 300, 300), dtype, 8, 10.0), VISION_SCALING,
                       torch.tensor([0, 200, 300], device="cpu"), True), segments))
    q = rand((1, 16, 37, 128), dtype, 9, 2.0)
    k, v = rand((1, 2, 37, 128), dtype, 10, 2.0), rand((1, 2, 37, 128), dtype, 11)
    out.append(Sample("eager_attention_forward, GQA 16 on 2 (repeat_kv)", OPS.attn_eager.default,
                      (q, k, v, TEXT_SCALING, causal_mask(1, 37, 37, dtype), 8, False), eager))
    return out


def drawn(draw, dtype: torch.dtype) -> Sample:
    """The attention core on [B, H, S, T] scores (B 1..2, H 1..4, S 0..20 queries, T 1..300 keys, scale of
    values 1..30) with no mask or HF's causal mask (a left-padded batch row), out of place or in place; the
    vision windows (1..100 patches cut at drawn points, packed or block diagonal); or the whole
    eager_attention_forward (1..4 kv heads, 1..4 groups, head dim 1..64, causal mask or none)."""
    form = draw.choice(("softmax", "segments", "eager"))
    scale = draw.choice((TEXT_SCALING, VISION_SCALING, 1.0))
    if form == "softmax":
        B, H, S = draw.integer(1, 2), draw.integer(1, 4), draw.integer(0, 20)
        T = draw.integer(max(S, 1), 300)
        scores = rand((B, H, S, T), dtype, draw.seed(), draw.choice((1.0, 30.0)))
        call = draw.choice(("attn_softmax", "attn_softmax_"))
        mask = causal_mask(B, S, T, dtype, left_pad=draw.integer(0, T - 1)) if draw.boolean() else None
        return Sample(f"{call} [{B}, {H}, {S}, {T}] mask {mask is not None}", getattr(OPS, call).default,
                      (scores, scale, mask), hf_softmax)
    if form == "segments":
        P, H = draw.integer(1, 100), draw.integer(1, 4)
        cuts = sorted({draw.integer(1, P - 1) for _ in range(draw.integer(0, 4))} if P > 1 else set())
        cu = torch.tensor([0, *cuts, P], dtype=torch.int32, device="cpu")
        block = draw.boolean()
        W = P if block else max(int(e - s) for s, e in zip(cu[:-1], cu[1:]))
        scores = rand((H, P, W), dtype, draw.seed(), 10.0)
        return Sample(f"segments {cu.tolist()} H={H} block {block}", OPS.attn_softmax_segments.default,
                      (scores, scale, cu, block), segments)
    B, KV, groups, S, D = draw.integer(1, 2), draw.integer(1, 4), draw.integer(1, 4), draw.integer(1, 20), draw.integer(1, 64)
    q = rand((B, KV * groups, S, D), dtype, draw.seed(), 2.0)
    k, v = rand((B, KV, S, D), dtype, draw.seed(), 2.0), rand((B, KV, S, D), dtype, draw.seed())
    mask = causal_mask(B, S, S, dtype) if draw.boolean() else None
    return Sample(f"eager B={B} KV={KV} groups={groups} S={S} D={D} mask {mask is not None}", OPS.attn_eager.default,
                  (q, k, v, scale, mask, groups, False), eager)


def huge() -> list[Huge]:
    """attn_softmax_ in place on scores [1, 1, S, 4096] bf16 past 2^31 elements (4.3 GB), text scaling."""
    T = 4096
    S = BIG // T + 1
    return [Huge(f"attn_softmax_ [1, 1, {S}, {T}] bf16", OPS.attn_softmax_.default,
                 lambda: (tiled((1, 1, S, T), torch.bfloat16, 10, 30.0), TEXT_SCALING), S, around_2_31(S, T),
                 hf_softmax)]


def misuses() -> list[Misuse]:
    s = rand((4, 16), torch.bfloat16, 0)
    return [
        Misuse("a mask of another dtype", lambda: OPS.attn_softmax(s, 0.1, torch.zeros(4, 16, device="cpu")),
               ValueError, "mask must have scores' dtype", (s,)),
        Misuse("a mask that does not broadcast", lambda: OPS.attn_softmax(s, 0.1, torch.zeros(3, 16, dtype=s.dtype,
                                                                                                  device="cpu")),
               ValueError, "mask must broadcast to scores", (s,)),
        Misuse("integer scores", lambda: OPS.attn_softmax(s.int(), 0.1), ValueError, "scores has dtype Int", (s,)),
        Misuse("a NaN scale", lambda: OPS.attn_softmax(s, float("nan")), ValueError, "scale must be a number", (s,)),
        Misuse("windows that do not cover the rows", lambda: OPS.attn_softmax_segments_(
            s, 0.1, torch.tensor([0, 2, 3], device="cpu")), ValueError, "cu_seqlens must run from 0 to P = 4", (s,)),
        Misuse("decreasing windows", lambda: OPS.attn_softmax_segments_(s, 0.1, torch.tensor([0, 3, 2, 4], device="cpu")),
               ValueError, "must not decrease", (s,)),
    ]
