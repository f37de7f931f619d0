"""Per-type config fixes the generic shrinking rules of configs.py cannot know, each with its reason.

`before(model_type, cfg)` runs on the default config before shrinking, `after(model_type, cfg)` on the
shrunk one. Keep every entry to what the type's own config validation or modeling code requires.
"""
from __future__ import annotations


def before(model_type: str, cfg) -> None:
    fix = _BEFORE.get(model_type)
    if fix is not None:
        fix(cfg)


def after(model_type: str, cfg) -> None:
    fix = _AFTER.get(model_type)
    if fix is not None:
        fix(cfg)


def _set(**values):
    def fix(cfg):
        for k, v in values.items():
            setattr(cfg, k, v)
    return fix


def _text(**values):
    def fix(cfg):
        for k, v in values.items():
            setattr(cfg.text_config, k, v)
    return fix


def _vision(**values):
    def fix(cfg):
        for k, v in values.items():
            setattr(cfg.vision_config, k, v)
    return fix


def _mllama_vision(cfg) -> None:
    vc = cfg.vision_config
    vc.image_size = 224
    vc.vision_output_dim = vc.hidden_size * (len(vc.intermediate_layers_indices) + 1)


def _mamba_ssm(cfg) -> None:
    """Falcon-H1: the SSM width is heads x head dim."""
    cfg.mamba_d_ssm = cfg.mamba_n_heads * cfg.mamba_d_head


_BEFORE: dict = {}

_AFTER: dict = {
    # Hybrids whose default puts no attention layer in the first two: one mamba and one attention layer.
    "bamba": _set(attn_layer_indices=[1]),
    "jamba": _set(attn_layer_period=2, attn_layer_offset=1, expert_layer_period=2, expert_layer_offset=1),
    "granitemoehybrid": _set(layer_types=["linear_attention", "full_attention"]),
    # block_types cycles recurrent, recurrent, attention: three layers reach the attention block.
    "recurrent_gemma": _set(num_hidden_layers=3),
    "falcon_h1": _mamba_ssm,
    # SigLIP at 224 / 16 gives 14 x 14 patches; the default 256 tokens (16 x 16) pool with a kernel of 0.
    "gemma3": _set(mm_tokens_per_image=49),
    "shieldgemma2": _set(mm_tokens_per_image=49),
    # Idefics3/SmolVLM: 224 / 32 gives 7 patches a side, which the pixel shuffle (factor 2) cannot halve.
    "smolvlm": _vision(patch_size=16),
    "idefics3": _vision(patch_size=16),
    # Llama-4's vision adapter takes the pixel-shuffled patches (ratio 0.5: 4 x hidden) as its input width.
    "llama4": _vision(intermediate_size=256),
    # Mllama: the vision output is the last hidden state and each intermediate layer's, concatenated;
    # 224-pixel tiles (257 patches each) keep its four tiles cheap.
    "mllama": _mllama_vision,
    # Muse-Glimmer: the adapter takes merge x merge vision patches concatenated.
    "muse_glimmer": lambda cfg: setattr(cfg, "out_hidden_size",
                                        cfg.vision_config.hidden_size * cfg.vision_config.merge_size ** 2),
    # Default configs that leave the MoE (dots1) or the layer pattern (LFM2-MoE) to the checkpoint.
    "dots1": _set(n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2, first_k_dense_replace=1),
    "lfm2_moe": _set(layer_types=["conv", "full_attention"], num_dense_layers=1),
    # Mamba-2: heads x head_dim is expand x hidden (2 x 64).
    "mamba2": _set(num_heads=8),
}
