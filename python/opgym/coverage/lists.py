"""The fixed lists `opgym coverage --list NAME` runs (and tests/test_coverage.py checks).

LIGER_0_8_5: the 53 keys of Liger-Kernel 0.8.5's MODEL_TYPE_TO_APPLY_LIGER_FN
(liger_kernel/transformers/monkey_patch.py in the liger_kernel-0.8.5 wheel on PyPI), in its order: the
model types the most used peer patches. The `liger` list is those plus EXTRA: Qwen2.5-VL, the model of
opgym's own job (already among Liger's keys; named again so that the list keeps it whatever Liger does).
"""
from __future__ import annotations

LIGER_0_8_5 = (
    "deepseek_v2", "deepseek_v3", "deepseek_v4", "gemma", "gemma2", "gemma3_text", "gemma3", "gemma4_text", "gemma4",
    "glm4", "glm4v", "glm4v_moe", "gpt_oss", "internvl", "llama", "llama4_text", "llama4", "llava", "granite",
    "mllama", "mllama_text_model", "ministral", "mistral", "mixtral", "muse_glimmer", "nemotron", "olmo2", "pixtral",
    "olmo3", "qwen2", "qwen3", "qwen3_moe", "qwen2_vl", "qwen2_vl_text", "qwen2_5_vl", "qwen2_5_vl_text",
    "qwen3_next", "qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text", "qwen3_vl", "qwen3_vl_text",
    "qwen3_vl_moe", "qwen3_vl_moe_text", "smollm3", "phi3", "paligemma", "falcon_h1", "smolvlm", "hunyuan_v1_dense",
    "hunyuan_v1_moe", "exaone4",
)

EXTRA = ("qwen2_5_vl",)

LISTS = {
    "liger": tuple(dict.fromkeys(LIGER_0_8_5 + EXTRA)),
}

# Types of the lists that transformers (as pinned) cannot build or run tiny here, with the reason (a
# substring of the error `opgym coverage` reports): tests/test_coverage.py checks that exactly these
# fail, and for this reason.
KNOWN_UNBUILDABLE: dict[str, str] = {}
