"""The rotary functions opgym has verified, statement for statement, and how each maps onto the op.

A form is keyed by the AST fingerprint of HF's function (guard.fingerprint: docstring, annotations,
decorators and comments left out; the function's name is part of it) and, where the function calls a
rotation helper by its module-level name (`rotate_half`, `rotate_half_llm`, ...), by that helper's
fingerprint too: the helper decides the pairing (HF's rotate_half pairs the halves, the
`torch.stack((-x2, x1), -1).flatten(-2)` ones pair adjacent elements). Each form was checked bit for
bit against HF's own function (tests/test_rotary_forms.py: fp32/fp16/bf16, prefill and decode
shapes, HF's output strides) and on a tiny model of a type using it (logits identical).

What the function computes, in the op's terms (src/ops/rotary/README.md):
- rounding "hf": every op in q's dtype (op mode "hf"; when q is fp32 and the tables narrower, the
  promotion gives fp32 products: mode "fp32", the same bits). Tables of another dtype than q's
  otherwise make HF promote its output: not served.
- rounding "upcast": q.float() (and cos.float()) first, one rounding at the end (mode "fp32").
- rounding "to_q": HF's promotion, then `.to(q.dtype)` (OLMo): "hf" when the tables have q's dtype,
  "fp32" otherwise.
- table "element": cos/sin as passed, one value per element, R = cos.shape[-1];
  "first_half": HF reads cos[..., :W // 2] once per pair (repeat_interleave, or DeepSeek's even/odd
  slices), R = 2 * (W // 2); "pair": cos as passed, one value per pair (GPT-OSS), R = 2 * W.
- partial: HF slices q[..., :R] and concatenates q[..., R:] back (R may be below the head dim);
  otherwise R must be the head dim (HF would raise or broadcast oddly: not served).
- cat: HF's result comes out of torch.cat (a fresh contiguous tensor), else out of elementwise ops (q's
  strides).
- signature: how HF calls it (what the replacement must accept and return).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Form:
    rounding: str            # "hf" | "upcast" | "to_q"
    table: str               # "element" | "first_half" | "pair"
    partial: bool
    cat: bool
    signature: str           # "qk" | "qk_pos" | "qk_opt" | "vision" | "vision_index1" | "x" | "x_sin_cos"
    helper: str | None       # the rotation helper's global name (its fingerprint gives the pairing)
    pairs: str | None = None  # the pairing when there is no helper
    where: str = ""           # which HF code this is (transformers 5.23)


# Rotation helpers: fingerprint -> pairing.
ROTATE = {
    "be8e312f2b6f2893": "half",         # rotate_half: cat((-x2, x1)) over the halves (Llama, 160 types)
    "0e729b46b6e28c2a": "interleaved",  # rotate_half: stack([-x2, x1]).flatten(-2) on x[..., ::2] (Cohere)
    "774b6ae41003ce5a": "interleaved",  # rotate_half: the same on x[..., 0::2] (GLM, Ernie 4.5, Helium)
    "9d93680837931990": "interleaved",  # rotate_half_llm (GLM-4V text)
    "d8f6701428c868f4": "interleaved",  # rotate_half_text (Ernie 4.5 VL text)
    "b24160fc397cc684": "interleaved",  # rotate_pairwise: view(..., -1, 2), unbind, stack, flatten (Inkling2 vision)
    "39f038751e054ff6": "interleaved",  # rotate_every_two (GPT-J, CodeGen)
    "f659a22d0f57a8a7": "half",         # GPT-OSS's _apply_rotary_emb: chunk halves, first*c - second*s, ...
}

# HF's function name -> {fingerprint: Form}
VERIFIED: dict[str, dict[str, Form]] = {
    "apply_rotary_pos_emb": {
        "49be0a48c1397b56": Form("hf", "element", False, False, "qk", "rotate_half",
                                 where="Llama, Qwen2/3, Mistral, Gemma 1-3, ... (117 types)"),
        "cf85001a9ed08869": Form("hf", "element", True, True, "qk", "rotate_half",
                                 where="GPT-NeoX, GLM-4-MoE, Qwen3-Next, Qwen3.5, Bamba, ... (partial rotary)"),
        "ef0f97b0550e36cc": Form("to_q", "element", False, False, "qk", "rotate_half",
                                 where="OLMo, OLMo-2, OLMo-3, FlexOlmo, LFM3, Beam (.to(q_type))"),
        "0c0f7ac6fdf50af0": Form("upcast", "element", False, False, "qk", "rotate_half",
                                 where="Cohere, Cohere2 (q.float(), interleaved rotate_half)"),
        "451036cfc5b59aa2": Form("hf", "element", False, False, "x", "rotate_half",
                                 where="Gemma 4 text (one tensor)"),
        "620ef227afe89274": Form("hf", "element", True, True, "qk", "rotate_half_llm",
                                 where="GLM-4V, GLM-OCR text (partial, interleaved)"),
        "a232a417f7508c1f": Form("hf", "element", True, True, "qk", "rotate_half",
                                 where="Nemotron, dots3 audio (partial)"),
        "7312c2dde2765395": Form("upcast", "first_half", False, False, "qk", "rotate_half",
                                 where="Ernie 4.5 (fp32, interleaved, per-pair table)"),
        "369450ffa31a707b": Form("upcast", "element", False, False, "qk", "rotate_half",
                                 where="Evolla, ModernBERT decoder (q.float())"),
        "af0052b79e96f65d": Form("hf", "first_half", True, True, "qk", "rotate_half",
                                 where="GLM, GLM-4 (partial, interleaved, per-pair table)"),
        "01c3b5d19d29f3d1": Form("hf", "element", True, True, "qk", "rotate_half",
                                 where="Phi-3, Phi-4-multimodal (partial)"),
        "8f062d3a92ed89a0": Form("upcast", "element", False, False, "qk", "rotate_half_text",
                                 where="Ernie 4.5 VL text (fp32, interleaved)"),
        "595b532170159581": Form("hf", "pair", False, True, "qk", "_apply_rotary_emb",
                                 where="GPT-OSS (halves, half-width table)"),
        "19b44a9b9630f074": Form("hf", "first_half", False, False, "qk", "rotate_half",
                                 where="Helium (interleaved, per-pair table)"),
        "24df25c05912f1cd": Form("upcast", "element", False, False, "qk", "rotate_half",
                                 where="HunYuan-VL (everything .float())"),
        "59ff200ee34c0c37": Form("hf", "pair", False, False, "x_sin_cos", "rotate_every_two",
                                 where="GPT-J, CodeGen (one tensor, (tensor, sin, cos), repeat_interleave'd pair table)"),
    },
    "apply_rotary_pos_emb_vision": {
        "fe4e2eae55b153c0": Form("upcast", "element", False, False, "vision", "rotate_half",
                                 where="Qwen2-VL, Qwen2.5-VL, GLM-4V, ... vision towers (26 types)"),
        "3a42f53451a539c8": Form("upcast", "element", False, False, "vision", "rotate_pairwise",
                                 where="Inkling2 vision (interleaved pairs)"),
        "a6e68a80544ce31e": Form("hf", "element", True, True, "vision_index1", "rotate_half",
                                 where="MiniMax-M3-VL vision (partial, cos[:, None, :])"),
    },
    "apply_rotary_pos_emb_interleave": {
        "915fa5447d3ece1a": Form("hf", "first_half", False, True, "qk_pos", None, pairs="deinterleave",
                                 where="DeepSeek-V3, Kimi-K2.5, GLM-4-MoE-Lite, Mistral 4, ... (adjacent pairs in, halves out)"),
        "4eb2c7ecaeb97337": Form("hf", "first_half", False, True, "qk_opt", None, pairs="deinterleave",
                                 where="Mistral Large 4 (k may be None)"),
    },
}

# Rotary functions transformers 5.23 has that opgym does not serve, and why (shown in handle.skipped).
NOT_SERVED = {
    "7762070fb8614b10": "DeepSeek-V4's apply_rotary_pos_emb rotates the trailing rope slice of one tensor "
                        "(cat([nope, rotated])): not an opgym form",
    "b6b4adf5845b9854": "Llama 4's apply_rotary_emb multiplies complex numbers (torch.view_as_complex): "
                        "torch's complex product is not an opgym form",
    "714e22cd71de25e0": "DeepSeek-V2's apply_rotary_emb multiplies complex numbers (torch.view_as_complex)",
    "ce5208de29939cd9": "Llama 4 vision's vision_apply_rotary_emb multiplies complex numbers",
    "d87254b40ca75616": "Gemma 4 vision's apply_multidimensional_rope splits the head among position axes",
}

# Names under which transformers calls rotary functions from an attention's forward: the globals the
# hook looks at (a verified function is recognised by its fingerprint, which includes its name).
NAMES = tuple(VERIFIED) + ("apply_rotary_emb", "vision_apply_rotary_emb", "apply_multidimensional_rope")
