"""Each rotary function form opgym serves, on a tiny seeded model of a type using it (opgym.coverage's
builder: 2 layers, hidden 64, bf16, eager attention): logits and greedily generated tokens (decode
steps through the KV cache) bit-identical with and without opgym.patch(ops=("rotary",)), every call
of the form fused (none falling back), and undo restoring HF's forwards.

The types are one per form (two where the form has a notable variant, e.g. a partial rotary dim of
0.25 and of 0.5, or DeepSeek's MLA with its two functions); `opgym coverage` runs all of them."""
from __future__ import annotations

import pytest
import torch

import opgym
from opgym.coverage import build

# type -> the form it exercises (forms.py's `where`), and whether its model's tables are fp32
TYPES = {
    "gpt_neox": "partial rotary 0.25 (R4)",
    "glm4_moe": "partial rotary 0.5 (R4), MoE",
    "qwen3_next": "partial rotary (R4), hybrid linear attention",
    "phi3": "partial rotary (Phi-3's own function)",
    "nemotron": "partial rotary (Nemotron's function)",
    "glm": "partial, interleaved, per-pair table",
    "glm4v": "partial, interleaved (GLM-4V text), MRoPE tables recomposed by HF",
    "helium": "interleaved, per-pair table",
    "cohere": "fp32 upcast, interleaved rotate_half",
    "ernie4_5": "fp32 upcast, interleaved, per-pair table",
    "ernie4_5_vl_moe": "fp32 upcast, interleaved (text)",
    "modernbert-decoder": "fp32 upcast (Evolla / ModernBERT decoder)",
    "olmo2": ".to(q_type) with fp32 tables",
    "gpt_oss": "halves with a half-width table",
    "deepseek_v3": "adjacent pairs in, halves out (MLA)",
    "glm4_moe_lite": "adjacent pairs in, halves out",
    "gemma4_text": "one tensor at a time",
    "gptj": "one tensor, (tensor, sin, cos), partial via the caller",
    "minimax_m3_vl": "vision partial (cos[:, None, :]) and text partial",
}


def _generate(model, inputs, n=4):
    return model.generate(**inputs, max_new_tokens=n, min_new_tokens=n, do_sample=False)


@pytest.mark.parametrize("model_type", list(TYPES))
def test_tiny_model_bit_identical_with_its_form_fused(model_type):
    torch.set_num_threads(1)
    model, config, _ = build.build(model_type, seed=0)
    inputs = build.text_inputs(config, seed=0)
    with torch.no_grad():
        ref = model(**inputs).logits
        try:
            gen_ref = _generate(model, inputs)
        except Exception:  # noqa: BLE001 - a tiny config some types cannot generate with: logits only
            gen_ref = None
    with opgym.patch(model, ops=("rotary",)) as handle:
        assert handle.patched, handle.skipped
        with torch.no_grad():
            got = model(**inputs).logits
            st = handle.stats()["ops"]["rotary"]
            assert st["fused"] > 0 and st["fallback"] == 0, st
            gen = _generate(model, inputs) if gen_ref is not None else None
            st = handle.stats()["ops"]["rotary"]
            assert st["fallback"] == 0, st  # decode steps too
    assert torch.equal(got, ref), f"{model_type}: {(got != ref).sum().item()} logits differ"
    if gen_ref is not None:
        assert torch.equal(gen, gen_ref)
    for _, m in model.named_modules():
        assert "forward" not in m.__dict__
