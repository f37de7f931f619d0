"""Tiny configs for every model type: the type's own default config, shrunk consistently.

`tiny_config(model_type)` starts from the config class's defaults (the real architecture's shape) and
rewrites, in the top-level config and every sub-config (text, vision, audio, ...), the widths, depths,
head counts, expert counts and vocabulary so that the model is small and still self-consistent:

- widths: hidden 64, 4 heads of 16, 2 kv heads where the real model has fewer kv heads than heads,
  intermediate 128 (MoE experts 32), MLA ranks 32 with rope/nope head dims 8/8;
- depth: 2 layers, or one layer for each distinct combination of the per-layer lists (layer_types,
  mlp_layer_types, no_rope_layers, ...) and layer-index lists (cross_attention_layers, mlp_only_layers,
  deepstack_visual_indexes, ...), at most MAX_LAYERS; every such list is trimmed or renumbered to match;
- MoE: 4 experts, 2 per token, one expert group;
- rotary: an mrope section scaled to the new head_dim (its sum stays head_dim / 2);
- vocabulary: VOCAB ids; every special token id past it is moved to a distinct id at its top (the same
  old id gets the same new id in every sub-config), and `special_ids` reports them.

The few types whose configs need more than these rules have an entry in overrides.py.
"""
from __future__ import annotations

import copy
import math
import re

HIDDEN = 64
HEADS = 4
KV_HEADS = 2
HEAD_DIM = 16
INTERMEDIATE = 128
EXPERT_INTERMEDIATE = 32
LAYERS = 2
MAX_LAYERS = 4
EXPERTS = 4
EXPERTS_PER_TOKEN = 2
VOCAB = 256

_HIDDEN_KEYS = ("hidden_size", "d_model", "n_embd", "embed_dim", "dim", "attention_hidden_size", "lru_width",
                "embedding_size", "word_embed_proj_dim", "input_embedding_size", "output_embedding_size",
                "hidden_size_global", "encoder_hidden_size", "cross_attention_hidden_size", "vision_hidden_size")
_HEAD_KEYS = ("num_attention_heads", "num_heads", "n_head", "n_heads", "attention_heads", "encoder_attention_heads",
              "decoder_attention_heads", "num_encoder_attention_heads", "num_decoder_attention_heads")
_KV_KEYS = ("num_key_value_heads", "num_kv_heads", "kv_n_heads", "multi_query_group_num", "num_query_groups")
_HEAD_DIM_KEYS = ("head_dim", "attention_head_size", "kv_channels", "d_kv", "d_head", "dim_head")
_INTER_KEYS = ("intermediate_size", "ffn_dim", "encoder_ffn_dim", "decoder_ffn_dim", "d_ff", "n_inner", "mlp_dim",
               "ffn_hidden_size", "intermediate_size_mlp", "dense_intermediate_size", "feed_forward_size", "d_inner",
               "dim_ff", "dff")
_EXPERT_INTER_KEYS = ("moe_intermediate_size", "shared_expert_intermediate_size", "moe_hidden_size",
                      "expert_ffn_hidden_size", "shared_intermediate_size", "shared_experts_intermediate_size",
                      "moe_shared_expert_intermediate_size", "share_expert_dim")
_LAYER_KEYS = ("num_hidden_layers", "n_layer", "n_layers", "num_layers", "depth", "encoder_layers", "decoder_layers",
               "num_decoder_layers", "num_encoder_layers", "num_global_layers")
_EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")
_TOPK_KEYS = ("num_experts_per_tok", "moe_topk", "moe_k", "num_experts_per_token", "moe_top_k", "top_k")
# Lists of layer indices (renumbered with the layers kept).
_INDEX_LIST_KEYS = ("cross_attention_layers", "mlp_only_layers", "moe_layers", "full_attn_idxs", "attn_layer_indices",
                    "hybrid_layer_ids", "deepstack_visual_indexes", "fullatt_block_indexes", "intermediate_layers_indices",
                    "kv_source_layers", "ple_layer_ids", "global_attn_layers", "swa_layers", "rope_scaling_layers",
                    "spatial_target_layers")
_FEATURE_LAYER_KEYS = ("vision_feature_layer", "feature_layer", "vision_feature_layers", "select_layer")


def _is_config(v) -> bool:
    from transformers import PretrainedConfig

    return isinstance(v, PretrainedConfig)


def _int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


class _Shrinker:
    def __init__(self, mrope_default=None, source: str = ""):
        self.id_map: dict[int, int] = {}
        self.notes: list[str] = []
        self.mrope_default = mrope_default
        # transformers 4.x modeling code that indexes config.rope_scaling["rope_type"] without a default
        self.needs_rope_type = bool(re.search(r'rope_scaling\["rope_type"\]', source))

    # ---- depth -------------------------------------------------------------------------------
    def _layers_kept(self, cfg, n: int) -> list[int]:
        """Indices of the layers to keep: the first layer of each distinct combination of the per-layer
        lists and index lists, at least LAYERS of them, at most MAX_LAYERS."""
        per_layer = [k for k, v in vars(cfg).items() if isinstance(v, (list, tuple)) and len(v) == n and n > 1
                     and k not in _INDEX_LIST_KEYS and not k.startswith("_")]
        index_lists = [k for k in _INDEX_LIST_KEYS if isinstance(vars(cfg).get(k), (list, tuple))
                       and all(_int(i) for i in vars(cfg)[k])]
        seen, kept = set(), []
        for i in range(n):
            key = tuple(repr(getattr(cfg, k)[i]) for k in per_layer) + tuple(
                (i in getattr(cfg, k)) or (i - n in getattr(cfg, k)) for k in index_lists)
            if key not in seen:
                seen.add(key)
                kept.append(i)
        kept = kept[:MAX_LAYERS]
        for i in range(n):
            if len(kept) >= min(LAYERS, n):
                break
            if i not in kept:
                kept.append(i)
        return sorted(kept)

    def _shrink_depth(self, cfg) -> None:
        for key in _LAYER_KEYS:
            n = vars(cfg).get(key)
            if not _int(n) or n <= 0:
                continue
            kept = self._layers_kept(cfg, n)
            for k, v in list(vars(cfg).items()):
                if isinstance(v, (list, tuple)) and len(v) == n and n > 1 and k not in _INDEX_LIST_KEYS \
                        and not k.startswith("_"):
                    setattr(cfg, k, type(v)(v[i] for i in kept))
                elif k in _INDEX_LIST_KEYS and isinstance(v, (list, tuple)) and all(_int(i) for i in v):
                    new = [kept.index(i % n) for i in v if (i % n) in kept]
                    setattr(cfg, k, type(v)(new))
            setattr(cfg, key, len(kept))
            if key == "num_hidden_layers" and _int(vars(cfg).get("max_window_layers")):
                cfg.max_window_layers = min(cfg.max_window_layers, len(kept))
            if _int(vars(cfg).get("first_k_dense_replace")) and cfg.first_k_dense_replace > 0:
                cfg.first_k_dense_replace = 1
            for k in ("decoder_sparse_step", "interleave_moe_layer_step"):
                if _int(vars(cfg).get(k)) and vars(cfg)[k] > 1:
                    setattr(cfg, k, 1)

    # ---- widths ------------------------------------------------------------------------------
    def _fill_missing(self, cfg) -> None:
        """Fields some default configs leave None although their model needs them (a real checkpoint
        names them): head_dim, kv heads, and, in MoE configs, the experts per token and the groups."""
        d = vars(cfg)
        heads = next((d[k] for k in _HEAD_KEYS if _int(d.get(k))), None)
        if heads is None or not any(_int(d.get(k)) for k in _HIDDEN_KEYS):
            return
        if "head_dim" in d and d["head_dim"] is None and "qk_rope_head_dim" not in d:
            cfg.head_dim = HEAD_DIM
        for k in ("num_key_value_heads",):
            if k in d and d[k] is None:
                setattr(cfg, k, min(heads, KV_HEADS))
        if any(_int(d.get(k)) for k in _EXPERT_KEYS):
            for k in _TOPK_KEYS:
                if k in d and d[k] is None:
                    setattr(cfg, k, EXPERTS_PER_TOKEN)
            for k in ("n_group", "topk_group"):
                if k in d and d[k] is None:
                    setattr(cfg, k, 1)

    def _shrink_widths(self, cfg) -> None:
        d = vars(cfg)
        heads_before = next((d[k] for k in _HEAD_KEYS if _int(d.get(k))), None)
        for k in _HIDDEN_KEYS:
            if _int(d.get(k)) and d[k] > HIDDEN:
                setattr(cfg, k, HIDDEN)
        for k in _HEAD_KEYS:
            if _int(d.get(k)) and d[k] > HEADS:
                setattr(cfg, k, HEADS)
        for k in _KV_KEYS:
            if _int(d.get(k)):
                mha = heads_before is not None and d[k] >= heads_before
                setattr(cfg, k, HEADS if mha else min(d[k], KV_HEADS))
        for k in _HEAD_DIM_KEYS:
            if _int(d.get(k)) and d[k] > HEAD_DIM:
                setattr(cfg, k, HEAD_DIM)
        for k in _INTER_KEYS:
            if _int(d.get(k)) and d[k] > INTERMEDIATE:
                setattr(cfg, k, INTERMEDIATE)
        for k in _EXPERT_INTER_KEYS:
            if _int(d.get(k)) and d[k] > EXPERT_INTERMEDIATE:
                setattr(cfg, k, EXPERT_INTERMEDIATE)
        for k in _EXPERT_KEYS:
            if _int(d.get(k)) and d[k] > EXPERTS:
                setattr(cfg, k, EXPERTS)
        for k in _TOPK_KEYS:
            if _int(d.get(k)) and d[k] > EXPERTS_PER_TOKEN:
                setattr(cfg, k, EXPERTS_PER_TOKEN)
        for k in ("n_group", "topk_group", "num_expert_group", "topk_group_size"):
            if _int(d.get(k)) and d[k] > 1:
                setattr(cfg, k, 1)
        for k in ("n_shared_experts", "num_shared_experts", "moe_num_shared_experts"):
            if _int(d.get(k)) and d[k] > 1:
                setattr(cfg, k, 1)
        # MLA (DeepSeek-V2/V3 and their kin)
        if _int(d.get("qk_rope_head_dim")):
            old_rope = d["qk_rope_head_dim"]
            if _int(d.get("head_dim")) and d["head_dim"] in (old_rope, HEAD_DIM) and old_rope > 8:
                cfg.head_dim = 8
            cfg.qk_rope_head_dim = min(old_rope, 8)
            if _int(d.get("qk_nope_head_dim")):
                cfg.qk_nope_head_dim = min(d["qk_nope_head_dim"], 8)
            if _int(d.get("qk_head_dim")):
                cfg.qk_head_dim = cfg.qk_rope_head_dim + getattr(cfg, "qk_nope_head_dim", 0)
        if _int(d.get("rotary_dim")) and d["rotary_dim"] > HEAD_DIM // 2:
            cfg.rotary_dim = HEAD_DIM // 2  # CodeGen / GPT-J: a partial rotary dim, as in the real models
        for k in ("v_head_dim",):
            if _int(d.get(k)) and d[k] > HEAD_DIM:
                setattr(cfg, k, HEAD_DIM)
        for k in ("kv_lora_rank", "q_lora_rank", "o_lora_rank"):
            if _int(d.get(k)) and d[k] > 32:
                setattr(cfg, k, 32)
        for k in ("index_head_dim",):
            if _int(d.get(k)) and d[k] > HEAD_DIM:
                setattr(cfg, k, HEAD_DIM)
        for k in ("index_n_heads",):
            if _int(d.get(k)) and d[k] > HEADS:
                setattr(cfg, k, HEADS)
        # linear attention (Gated DeltaNet, KDA) and state-space layers
        for k, v in (("linear_key_head_dim", HEAD_DIM), ("linear_value_head_dim", HEAD_DIM), ("linear_head_dim", HEAD_DIM),
                     ("linear_num_key_heads", KV_HEADS), ("linear_num_value_heads", HEADS), ("linear_num_heads", HEADS),
                     ("mamba_d_state", 16), ("state_size", 16), ("ssm_state_size", 16), ("mamba_n_heads", 8),
                     ("mamba_num_heads", 8), ("mamba_d_head", 16), ("mamba_head_dim", 16), ("mamba_headdim", 16),
                     ("mamba_n_groups", 1), ("n_groups", 1), ("mamba_ngroups", 1), ("time_step_rank", 4),
                     ("mamba_dt_rank", 4), ("mamba_d_ssm", 128), ("n_mamba_heads", 2)):
            if _int(d.get(k)) and d[k] > v:
                setattr(cfg, k, v)
        # vision towers: images of at most 16 x 16 patches where the default is larger (Pixtral's 1024,
        # LightOnOCR's 1540 pixels: tens of thousands of patches for one synthetic image)
        ps = d.get("patch_size")
        if _int(d.get("image_size")) and _int(ps) and d["image_size"] > 16 * ps:
            cfg.image_size = 16 * ps
        # vision towers: the projection to the text width
        for k in ("out_hidden_size", "projector_hidden_size", "text_hidden_size", "projection_dim", "vision_output_dim",
                  "projector_input_dim", "projector_output_dim", "merged_hidden_size", "output_dim"):
            if _int(d.get(k)) and d[k] > HIDDEN:
                setattr(cfg, k, HIDDEN)
        for k in list(d):  # vocab_size, vocab_size_per_layer_input, encoder_hash_byte_group_vocab, ...
            if ("vocab" in k and not k.startswith("_") and "offset" not in k and _int(d[k])
                    and d[k] > VOCAB):
                setattr(cfg, k, VOCAB)
        self._fix_rope(cfg)

    def _fix_rope(self, cfg) -> None:
        rp = vars(cfg).get("rope_parameters")
        if self.mrope_default and isinstance(rp, dict) and "rope_type" in rp and "mrope_section" not in rp \
                and _is_text_config(cfg):
            rp = dict(rp, mrope_section=list(self.mrope_default))
            cfg.rope_parameters = rp
        if self.mrope_default and "rope_scaling" in vars(cfg) and cfg.rope_scaling is None \
                and "rope_parameters" not in vars(cfg) and _is_text_config(cfg):
            # transformers 4.x: the section lives in rope_scaling, which the default config leaves None
            cfg.rope_scaling = {"type": "default", "rope_type": "default", "mrope_section": list(self.mrope_default)}
        elif self.needs_rope_type and "rope_scaling" in vars(cfg) and cfg.rope_scaling is None \
                and "rope_parameters" not in vars(cfg) and _is_text_config(cfg):
            cfg.rope_scaling = {"rope_type": "default"}
        if _has_mrope(cfg) and (vars(cfg).get("partial_rotary_factor") or
                                (rp or {}).get("partial_rotary_factor") or 1.0) < 1.0 and _int(vars(cfg).get("head_dim")):
            cfg.head_dim = 64  # a quarter of 16 leaves no rotary frequency for each of the three mrope axes
        hd = vars(cfg).get("head_dim")
        if not _int(hd):
            h, n = vars(cfg).get("hidden_size"), next((vars(cfg)[k] for k in _HEAD_KEYS if _int(vars(cfg).get(k))), None)
            hd = h // n if _int(h) and n else None
        for attr in ("rope_parameters", "rope_scaling"):
            rp = vars(cfg).get(attr)
            if not isinstance(rp, dict):
                continue
            rp = copy.deepcopy(rp)
            subs = [v for v in rp.values() if isinstance(v, dict)] or [rp]
            for sub in subs:
                sec = sub.get("mrope_section")
                if isinstance(sec, (list, tuple)) and sec and hd:
                    sub["mrope_section"] = _scale_section(list(sec), self._rotary_half(cfg, sub, hd))
            setattr(cfg, attr, rp)

    @staticmethod
    def _rotary_half(cfg, rp: dict, hd: int) -> int:
        factor = rp.get("partial_rotary_factor", getattr(cfg, "partial_rotary_factor", 1.0)) or 1.0
        return int(hd * factor) // 2

    # ---- vocabulary --------------------------------------------------------------------------
    def _new_id(self, old: int) -> int:
        if old not in self.id_map:
            self.id_map[old] = VOCAB - 1 - len(self.id_map)
        return self.id_map[old]

    def _remap_ids(self, cfg) -> None:
        for k, v in list(vars(cfg).items()):
            if not (k.endswith("_id") or k.endswith("_index") or k.endswith("_token_id") or k.endswith("_ids")):
                continue
            if k in ("vision_feature_layer",) or k in _INDEX_LIST_KEYS or k.endswith("layer_ids"):
                continue
            if _int(v) and v >= VOCAB:
                setattr(cfg, k, self._new_id(v))
            elif isinstance(v, (list, tuple)) and v and all(_int(i) for i in v) and any(i >= VOCAB for i in v):
                setattr(cfg, k, type(v)(self._new_id(i) if i >= VOCAB else i for i in v))

    # ---- the walk ----------------------------------------------------------------------------
    def shrink(self, cfg) -> None:
        for k, v in list(vars(cfg).items()):
            if _is_config(v):
                self.shrink(v)
        self._shrink_depth(cfg)
        self._shrink_widths(cfg)
        self._fill_missing(cfg)
        self._feature_layers(cfg)

    def remap(self, cfg) -> None:
        for v in list(vars(cfg).values()):
            if _is_config(v):
                self.remap(v)
        self._remap_ids(cfg)

    def _feature_layers(self, cfg) -> None:
        """A composite's vision_feature_layer (-2, or a list of layers) made to exist in the shrunk tower."""
        vc = vars(cfg).get("vision_config")
        depth = None
        if _is_config(vc):
            depth = next((vars(vc)[k] for k in _LAYER_KEYS if _int(vars(vc).get(k))), None)
        for k in _FEATURE_LAYER_KEYS:
            v = vars(cfg).get(k)
            n = depth if depth is not None else next((vars(cfg)[key] for key in _LAYER_KEYS
                                                      if _int(vars(cfg).get(key))), None)
            if n is None:
                continue
            if _int(v):
                setattr(cfg, k, _clamp_layer(v, n))
            elif isinstance(v, (list, tuple)) and v and all(_int(i) for i in v):
                setattr(cfg, k, type(v)(_clamp_layer(i, n) for i in v))


def _clamp_layer(i: int, n: int) -> int:
    """A hidden-states index (n layers give n + 1 hidden states) kept inside the shrunk tower."""
    return max(i, -(n + 1)) if i < 0 else min(i, n)


def _scale_section(sec: list, half: int) -> list:
    """An mrope section (frequencies per temporal/height/width axis) scaled to sum to `half`, no part 0."""
    total = sum(sec)
    if total == half:
        return sec
    new = [max(1, math.floor(s * half / total)) for s in sec]
    i = 0
    while sum(new) < half:
        new[i % len(new)] += 1
        i += 1
    while sum(new) > half:
        j = max(range(len(new)), key=lambda t: new[t])
        new[j] -= 1
    return new


def _is_text_config(cfg) -> bool:
    return "vocab_size" in vars(cfg) and _int(vars(cfg).get("num_hidden_layers"))


def _has_mrope(cfg) -> bool:
    rp = vars(cfg).get("rope_parameters")
    return isinstance(rp, dict) and ("mrope_section" in rp or any(isinstance(v, dict) and "mrope_section" in v
                                                                    for v in rp.values()))


def modeling_source(model_type: str) -> str:
    """The source of transformers.models.<module>.modeling_<module> for a type ('' when unreadable)."""
    import importlib
    import inspect

    from transformers.models.auto.configuration_auto import model_type_to_module_name

    name = model_type_to_module_name(model_type)
    try:
        return inspect.getsource(importlib.import_module(f"transformers.models.{name}.modeling_{name}"))
    except Exception:  # noqa: BLE001
        return ""


def mrope_default(model_type: str):
    """The mrope section a type's modeling code falls back to when its config names none (Qwen2-VL's
    `config.rope_parameters.get("mrope_section", [16, 24, 24])`), or None."""
    src = modeling_source(model_type)
    m = re.search(r'"mrope_section",\s*\[([\d,\s]+)\]', src)
    if m:
        return [int(x) for x in m.group(1).split(",") if x.strip()]
    # transformers 4.x reads config.rope_scaling["mrope_section"] with no fallback: Qwen2-VL's published
    # section (of head_dim 128), which _fix_rope scales to the tiny head_dim
    return [16, 24, 24] if re.search(r'rope_scaling\["mrope_section"\]', src) else None


def default_config(model_type: str):
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    return CONFIG_MAPPING[model_type]()


def tiny_config(model_type: str):
    """(config, notes): the type's default config shrunk as the module docstring says, then the type's
    own overrides (overrides.py) applied."""
    from . import overrides

    cfg = default_config(model_type)
    vc_cls = (getattr(type(cfg), "sub_configs", None) or {}).get("vision_config")
    if "vision_config" in vars(cfg) and cfg.vision_config is None and vc_cls is not None \
            and vc_cls.__name__ != "AutoConfig":
        cfg.vision_config = vc_cls()  # e.g. Gemma-4's default has none: the vision tower should run too
    s = _Shrinker(mrope_default(model_type), modeling_source(model_type))
    overrides.before(model_type, cfg)
    s.shrink(cfg)
    s.remap(cfg)
    overrides.after(model_type, cfg)
    return cfg, s.notes


def special_ids(cfg) -> set[int]:
    """Every token id a config (or its sub-configs) names: what random text must not contain."""
    out: set[int] = set()

    def walk(c):
        for k, v in vars(c).items():
            if _is_config(v):
                walk(v)
            elif (k.endswith("_id") or k.endswith("_index") or k.endswith("_ids")) and "layer" not in k:
                if _int(v):
                    out.add(v)
                elif isinstance(v, (list, tuple)):
                    out.update(i for i in v if _int(i))
    walk(cfg)
    return out
