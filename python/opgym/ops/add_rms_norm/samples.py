"""add_rms_norm's contract (opgym/ops/contract.py): HF's decoder-layer seam `residual + hidden_states` then the
next RMSNorm, on Qwen2.5-VL-3B's captured shapes (text 2048 at decode and prefill, vision 1280 over 1024 patches)
and edge cases, against HF's own statements and RMSNorm modules (Qwen2's; OLMo-2's and Gemma's variants)."""
from __future__ import annotations

import torch

from ..contract import BIG, Huge, Misuse, Sample, around_2_31, causal_lm, rand, strided, tiled
from ..rms_norm.samples import gemma, olmo2, qwen2

OPS = torch.ops.opgym
LIFE = causal_lm("llama")  # a patched module's life (tests/test_module_life.py)
EPS = 1e-6


def _seam(norm):
    def reference(x, residual, w, eps, mode="hf", weight_offset=False, **_):
        s = residual + x  # HF: hidden_states = residual + hidden_states
        return norm(s, w, eps), s
    return reference


def samples(dtype: torch.dtype) -> list[Sample]:
    w = rand((2048,), dtype, 1, 0.5) + 1
    wv = rand((1280,), dtype, 2, 0.5) + 1
    out = []
    for name, shape, weight in (("decode [1, 1, 2048]", (1, 1, 2048), w), ("prefill [1, 282, 2048]", (1, 282, 2048), w),
                                ("vision [1024, 1280]", (1024, 1280), wv), ("empty [0, 2048]", (0, 2048), w)):
        x, r = rand(shape, dtype, 3), rand(shape, dtype, 4, 8.0)
        out.append(Sample(name, OPS.add_rms_norm.default, (x, r, weight, EPS, "hf", False), _seam(qwen2)))
    x, r = rand((3, 300), dtype, 5, 50.0), rand((3, 300), dtype, 6, 50.0)
    out += [
        Sample("strided x", OPS.add_rms_norm.default, (strided((6, 2048), dtype, 7), rand((6, 2048), dtype, 8), w, EPS,
                                                       "hf", False), _seam(qwen2)),
        Sample("fp32 mode (OLMo-2)", OPS.add_rms_norm.default, (x, r, rand((300,), dtype, 9), EPS, "fp32", False),
               _seam(olmo2)),
        Sample("1 + weight (Gemma)", OPS.add_rms_norm.default, (x, r, rand((300,), dtype, 10, 0.1), EPS, "fp32", True),
               _seam(gemma)),
        Sample("in place (x <- norm, residual <- sum)", OPS.add_rms_norm_.default,
               (rand((9, 2048), dtype, 11), rand((9, 2048), dtype, 12), w, EPS, "hf", False), _seam(qwen2)),
    ]
    return out


def drawn(draw, dtype: torch.dtype) -> Sample:
    """Any rank 1..4 (leading sizes 0..5, width 1..300), x's rows strided or not, the residual at scale 1 or 50;
    each variant (Qwen2's, OLMo-2's, Gemma's); out of place or in place (x <- norm, residual <- sum)."""
    from ..rms_norm.samples import _rows

    shape = _rows(draw)
    call = draw.choice(("add_rms_norm", "add_rms_norm_"))
    x = rand(shape, dtype, draw.seed()) if call == "add_rms_norm_" else draw.tensor(shape, dtype)
    r = rand(shape, dtype, draw.seed(), draw.choice((1.0, 50.0)))
    variant = draw.choice(("hf", "fp32", "gemma"))
    w = rand(shape[-1:], dtype, draw.seed(), 0.1) + (0 if variant == "gemma" else 1)
    ref = _seam({"hf": qwen2, "fp32": olmo2, "gemma": gemma}[variant])
    args = (x, r, w, EPS, "hf" if variant == "hf" else "fp32", variant == "gemma")
    return Sample(f"{call} {variant} {tuple(shape)}", getattr(OPS, call).default, args, ref)


def huge() -> list[Huge]:
    """add_rms_norm_ in place on x and residual [2^31 / 2048 + 512, 2048] bf16 (8.6 GB)."""
    D, R = 2048, BIG // 2048
    return [Huge(f"add_rms_norm_ [{R}, {D}] bf16", OPS.add_rms_norm_.default,
                 lambda: (tiled((R, D), torch.bfloat16, 2), tiled((R, D), torch.bfloat16, 3, 8.0),
                          rand((D,), torch.bfloat16, 4, 0.1) + 1, EPS, "hf", False),
                 R, around_2_31(R, D), _seam(qwen2))]


def misuses() -> list[Misuse]:
    x, r, w = rand((4, 16), torch.bfloat16, 0), rand((4, 16), torch.bfloat16, 1), rand((16,), torch.bfloat16, 2)
    return [
        Misuse("residual of another shape", lambda: OPS.add_rms_norm(x, r[:2], w, EPS), ValueError, "residual", (x, r)),
        Misuse("residual of another dtype", lambda: OPS.add_rms_norm(x, r.float(), w, EPS), ValueError, "residual",
               (x, r)),
        Misuse("in place with x and residual one tensor", lambda: OPS.add_rms_norm_(x, x, w, EPS), ValueError,
               "overlap", (x,)),
        Misuse("a mode opgym has not", lambda: OPS.add_rms_norm_(x, r, w, EPS, "fast"), ValueError, "mode", (x, r)),
    ]
