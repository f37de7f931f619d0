"""`opgym bench --op attn_softmax`: one attention call as the model makes it - both matmuls and the core
between them - on its captured cases (cases/qwen2_5_vl_3b/attn_softmax.json: text scores [B, H, S, T]
with Qwen2.5-VL-3B's head_dim 128 and 2 KV heads; vision windows/full blocks with head_dim 80) plus a
text prefill sweep:

    copy        a copy of the scores' bytes (the [.., S, T] matrix the core reads and writes)
    opgym       opgym's eager_attention_forward (text: attn_softmax_ in place on the first matmul's
                output, grouped q without repeat_kv where the probe allows) / the one-pass vision windows
    hf_eager    transformers' eager_attention_forward (text) / HF's loop over the windows (vision)
    sdpa        torch's scaled_dot_product_attention (enable_gqa; the vision windows one call per
                window, as HF's sdpa path loops): not HF eager's bits, the speed reference
    compile     torch.compile of HF's function (text) / of HF's loop (vision)

"bytes" is the scores' bytes read and written once (the core's floor); GB/s are against it.
"""
from __future__ import annotations


from opgym.bench.cases import load_cases
from opgym.bench.timing import allow_recompiles, finish_row, time_interleaved

TITLE = "attention (matmuls + core)"
IMPLS = ("copy", "opgym", "hf_eager", "sdpa", "compile")
SWEEP = (64, 1024, 2048)  # text prefill lengths, q [1, 16, S, 128], k/v [1, 2, S, 128] bf16
TEXT_D, TEXT_KV, VISION_D = 128, 2, 80


def _inputs(args):
    """(label, kind, dims, dtype): text (B, H, S, T) or vision (H, cu_seqlens)."""
    out = []
    for cid, i in load_cases(args):
        s = i["scores"]["shape"]
        if "cu_seqlens" in i:
            out.append((cid, "vision", (s[0], tuple(i["cu_seqlens"])), i["scores"]["dtype"]))
        elif "mask" in i or "text" in cid:
            out.append((cid, "text", tuple(s), i["scores"]["dtype"]))
        else:  # one window: a full-attention block [1, H, P, P]
            out.append((cid, "vision", (s[1], (0, s[2])), i["scores"]["dtype"]))
    for S in ((1024,) if args.quick else SWEEP):
        out.append((f"sweep_text_S{S}", "text", (1, 16, S, S), "bfloat16"))
    return out


class _Module:
    """What the attention functions read of the module."""

    def __init__(self, groups):
        self.num_key_value_groups, self.training, self.scaling, self.attention_dropout = groups, False, None, 0.0


def _text(dims, dtype, torch, hf, F, fused, compiled):
    B, H, S, T = dims
    KV = TEXT_KV if H % TEXT_KV == 0 else 1
    g = torch.Generator().manual_seed(0)
    q = torch.randn(B, S, H, TEXT_D, generator=g).to(dtype).transpose(1, 2)
    k = torch.randn(B, KV, T, TEXT_D, generator=g).to(dtype)
    v = torch.randn(B, KV, T, TEXT_D, generator=g).to(dtype)
    mask = torch.zeros(B, 1, S, T, dtype=dtype)
    mask.masked_fill_(torch.arange(T)[None, :] > torch.arange(S)[:, None] + (T - S), torch.finfo(dtype).min)
    m, sc = _Module(H // KV), TEXT_D ** -0.5
    scores = torch.empty(B, H, S, T, dtype=dtype)
    dst = torch.empty_like(scores)
    return {
        "copy": lambda: dst.copy_(scores),
        "opgym": lambda: fused(m, q, k, v, mask, sc),
        "hf_eager": lambda: hf.eager_attention_forward(m, q, k, v, mask, sc),
        "sdpa": lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=sc, enable_gqa=True),
        "compile": lambda: compiled["text"](m, q, k, v, mask, sc),
    }, 2 * scores.numel() * scores.element_size()


def _vision(dims, dtype, torch, hf, F, vision, compiled):
    H, cu = dims
    P = cu[-1]
    lengths = [b - a for a, b in zip(cu, cu[1:])]
    g = torch.Generator().manual_seed(0)
    qkv = torch.randn(P, 3, H, VISION_D, generator=g).to(dtype).permute(1, 0, 2, 3)
    q, k, v = (t.transpose(0, 1).unsqueeze(0) for t in qkv.unbind(0))
    q, k = (t[0].transpose(0, 1).contiguous().transpose(0, 1).unsqueeze(0) for t in (q, k))
    cu_t = torch.tensor(cu, dtype=torch.int32)
    m = _Module(1)
    m.scaling = VISION_D ** -0.5

    def sdpa_loop():
        return torch.cat([F.scaled_dot_product_attention(a, b, c, scale=m.scaling).transpose(1, 2) for a, b, c in
                          zip(*(torch.split(t, lengths, dim=2) for t in (q, k, v)))], dim=1)

    Lmax = max(lengths)
    src = torch.empty(H, P, Lmax, dtype=dtype)
    dst = torch.empty_like(src)
    return {
        "copy": lambda: dst.copy_(src),
        "opgym": lambda: vision.one_pass(q, k, v, cu_t, m.scaling),
        "hf_eager": lambda: vision.hf_loop(m, q, k, v, cu_t, hf.eager_attention_forward, {}),
        "sdpa": sdpa_loop,
        "compile": lambda: compiled["vision"](m, q, k, v, cu_t, hf.eager_attention_forward, {}),
    }, 2 * src.numel() * src.element_size()


def run(args, impls, threads) -> list[dict]:
    import torch
    import torch.nn.functional as F
    from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl as hf

    from opgym.guard import Stats

    from . import text, vision

    allow_recompiles()
    fused = text.make_eager(hf.eager_attention_forward, hf.repeat_kv, True, False, (Stats(),), frozenset({"cpu"}),
                            "OPGYM_ATTN_SOFTMAX")
    compiled = {}
    if "compile" in impls:
        compiled = {"text": torch.compile(hf.eager_attention_forward, dynamic=True),
                    "vision": torch.compile(vision.hf_loop, dynamic=True)}
    rows = []
    for nt in threads:
        torch.set_num_threads(nt)
        for label, kind, dims, dt in _inputs(args):
            dtype = getattr(torch, dt)
            if kind == "text":
                fns, nbytes = _text(dims, dtype, torch, hf, F, fused, compiled)
                shape = list(dims)
            else:
                fns, nbytes = _vision(dims, dtype, torch, hf, F, vision, compiled)
                shape = [dims[0], dims[1][-1], len(dims[1]) - 1]
            loops = {n: fns[n] for n in impls if n in fns}
            with torch.no_grad():
                secs = time_interleaved(loops, {}, args.samples, args.sample_ms)
            row = {"shape": shape, "kind": kind, "dtype": dt, "label": label, "threads": nt, "bytes": nbytes}
            rows.append(finish_row(row, impls, secs))
    return rows
