"""rms_norm's contract (opgym/ops/contract.py): its operators on Qwen2.5-VL-3B's captured shapes (text hidden
2048 at decode and prefill, the vision tower's 1280 over 1024 patches, Qwen3-style per-head q/k norms) and
edge cases, each against HF's own RMSNorm modules: Qwen2's (mode "hf"), OLMo-2's one fp32 rounding (mode
"fp32"), Gemma's 1 + weight."""
from __future__ import annotations

import torch

from ..contract import BIG, Huge, Misuse, Sample, around_2_31, causal_lm, rand, strided, tiled

OPS = torch.ops.opgym
LIFE = causal_lm("qwen3")  # a patched module's life (tests/test_module_life.py): q/k norms too
EPS = 1e-6


def _hf(cls_path: str, weight: torch.Tensor, eps: float):
    import importlib

    mod, name = cls_path.rsplit(".", 1)
    cls = getattr(importlib.import_module(f"transformers.models.{mod}"), name)
    m = cls(weight.shape[0], eps=eps)
    m.weight = torch.nn.Parameter(weight.clone(), requires_grad=False)
    return m.eval()


def qwen2(x, w, eps, mode="hf", weight_offset=False, **_):
    return _hf("qwen2.modeling_qwen2.Qwen2RMSNorm", w, eps)(x)


def olmo2(x, w, eps, mode="fp32", weight_offset=False, **_):
    return _hf("olmo2.modeling_olmo2.Olmo2RMSNorm", w, eps)(x)


def gemma(x, w, eps, mode="fp32", weight_offset=True, **_):
    return _hf("gemma.modeling_gemma.GemmaRMSNorm", w, eps)(x)


def samples(dtype: torch.dtype) -> list[Sample]:
    w = rand((2048,), dtype, 1, 0.5) + 1
    wv = rand((1280,), dtype, 2, 0.5) + 1
    wh = rand((128,), dtype, 3, 0.5) + 1
    out = []
    for name, x, weight in (("decode [1, 1, 2048]", rand((1, 1, 2048), dtype, 4), w),
                            ("prefill [1, 282, 2048]", rand((1, 282, 2048), dtype, 5, 3.0), w),
                            ("vision [1024, 1280]", rand((1024, 1280), dtype, 6), wv),
                            ("q/k norm heads [1, 7, 16, 128] strided", strided((1, 7, 16, 128), dtype, 7), wh),
                            ("empty [0, 2048]", rand((0, 2048), dtype, 8), w),
                            ("one element rows [5, 1]", rand((5, 1), dtype, 9), rand((1,), dtype, 10))):
        out.append(Sample(f"{name} hf", OPS.rms_norm.default, (x, weight, EPS, "hf", False), qwen2))
    x = rand((3, 300), dtype, 11, 100.0)
    out += [
        Sample("fp32 mode (OLMo-2)", OPS.rms_norm.default, (x, rand((300,), dtype, 12), EPS, "fp32", False), olmo2),
        Sample("1 + weight (Gemma)", OPS.rms_norm.default, (x, rand((300,), dtype, 13, 0.1), EPS, "fp32", True), gemma),
        Sample("fp32 weight on this dtype (promotion)", OPS.rms_norm.default,
               (rand((4, 2048), dtype, 14), w.float(), EPS, "hf", False), qwen2),
        Sample("in place", OPS.rms_norm_.default, (rand((9, 2048), dtype, 15), w, EPS, "hf", False), qwen2),
        Sample("out=", OPS.rms_norm_out.default, (rand((9, 2048), dtype, 16), w, EPS, "hf", False), qwen2,
               kwargs={"out": torch.empty(9, 2048, dtype=dtype)}),
    ]
    return out


def _rows(draw, max_lead: int = 3, width: int = 300) -> tuple:
    """A shape [*lead, D]: 0 to `max_lead` leading dims of 0..5, D in 1..width."""
    return tuple(draw.integer(0, 5) for _ in range(draw.integer(0, max_lead))) + (draw.integer(1, width),)


def drawn(draw, dtype: torch.dtype) -> Sample:
    """Any rank 1..4 (leading sizes 0..5, width 1..300), rows strided or not, values at scale 1 or 100; each
    variant (Qwen2's, OLMo-2's fp32 rounding, Gemma's 1 + weight), a weight in x's dtype or any other float dtype
    (torch's promotion; fp32 is Qwen2's), four eps (0 among them); out of place, in place or out=."""
    shape = _rows(draw)
    x = draw.tensor(shape, dtype, draw.choice((1.0, 100.0)))
    variant = draw.choice(("hf", "fp32", "gemma"))
    # a weight of x's dtype, fp32 (Qwen2's promotion) or any other float dtype (torch's promotion either way)
    wdt = draw.choice((dtype, torch.float32, torch.bfloat16, torch.float16)) if variant == "hf" else dtype
    w = rand(shape[-1:], wdt, draw.seed(), 0.1) + (0 if variant == "gemma" else 1)
    eps = draw.choice((1e-6, 1e-5, 0.0, 0.5))
    ref = {"hf": qwen2, "fp32": olmo2, "gemma": gemma}[variant]
    args = (x, w, eps, "hf" if variant == "hf" else "fp32", variant == "gemma")
    call = draw.choice(("rms_norm", "rms_norm_", "rms_norm_out")) if wdt == dtype else "rms_norm"
    kwargs = {"out": torch.empty(shape, dtype=dtype)} if call == "rms_norm_out" else {}
    return Sample(f"{call} {variant} {tuple(shape)} w {wdt} eps {eps}", getattr(OPS, call).default, args, ref, kwargs)


def huge() -> list[Huge]:
    """rms_norm_ in place on [2^31 / 2048 + 512, 2048] bf16 rows (4.3 GB), Qwen2's variant."""
    D, R = 2048, BIG // 2048
    return [Huge(f"rms_norm_ [{R}, {D}] bf16", OPS.rms_norm_.default,
                 lambda: (tiled((R, D), torch.bfloat16, 0), rand((D,), torch.bfloat16, 1, 0.1) + 1, EPS, "hf", False),
                 R, around_2_31(R, D), qwen2)]


def misuses() -> list[Misuse]:
    x, w = rand((4, 16), torch.bfloat16, 0), rand((16,), torch.bfloat16, 1)
    out = torch.full((4, 16), 7.0, dtype=torch.bfloat16)
    return [
        Misuse("weight of another width", lambda: OPS.rms_norm(x, w[:8], EPS), ValueError, r"weight must have shape \[16\]", (x,)),
        Misuse("an integer x", lambda: OPS.rms_norm(x.int(), w, EPS), ValueError, "x", (x,)),
        Misuse("a mode opgym has not", lambda: OPS.rms_norm(x, w, EPS, "fast"), ValueError, "mode", (x,)),
        Misuse("out of another shape", lambda: OPS.rms_norm_out(x, w, EPS, out=out[:2]), ValueError, "out", (out, x)),
        Misuse("in place into a dtype that cannot hold the result", lambda: OPS.rms_norm_(x, w.float(), EPS),
               ValueError, "x", (x,)),
    ]
