"""Building a tiny seeded model of one model type, and the inputs of its forward.

`head_of(model_type)` picks the model class: the image-text-to-text head where transformers has one
(so that the vision tower runs), else the causal-LM head, else the base model (a few types in the CI
list, e.g. pixtral or the *_text sub-configs, have no head: their last hidden state is compared).

`build(model_type, seed)` builds it in bf16 with eager attention from configs.tiny_config; every
parameter is then drawn, in name order, from one numpy PCG64 stream seeded by `seed`: uniform with mean
0 and std 0.02, except 1-D parameters that the model initializes to ones (norm scales), which get mean
1 and std 0.1 so that the scale really multiplies. Same seed, same model, on any machine.
"""
from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402

from . import configs  # noqa: E402

DTYPE = torch.bfloat16
SEQ = 16  # text tokens of the forward (image tokens come on top)


def head_of(model_type: str) -> tuple[str, str] | None:
    """(kind, class name): kind is 'image-text-to-text', 'causal-lm' or 'base'; None when transformers
    has no model class for the type."""
    from transformers.models.auto import modeling_auto as ma

    for kind, mapping in (("image-text-to-text", ma.MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES),
                          ("causal-lm", ma.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES),
                          ("base", ma.MODEL_MAPPING_NAMES)):
        name = mapping.get(model_type)
        if isinstance(name, (list, tuple)):
            name = name[0]
        if name:
            return kind, name
    return _class_of_config(model_type)


def _class_of_config(model_type: str) -> tuple[str, str] | None:
    """A type no auto mapping names (e.g. mllama_text_model): the model class of its own modeling
    module built on its config class, the causal-LM one first."""
    import importlib

    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING, model_type_to_module_name

    try:
        cfg_cls = CONFIG_MAPPING[model_type]
        name = model_type_to_module_name(model_type)
        mod = importlib.import_module(f"transformers.models.{name}.modeling_{name}")
    except Exception:  # noqa: BLE001
        return None
    found = [n for n in getattr(mod, "__all__", dir(mod))
             if getattr(getattr(mod, n, None), "config_class", None) is cfg_cls and hasattr(transformers, n)]
    for suffix, kind in (("ForCausalLM", "causal-lm"), ("Model", "base")):
        for n in found:
            if n.endswith(suffix):
                return kind, n
    return None


def known_types() -> list[str]:
    """Every model type with a causal-LM or image-text-to-text head in the installed transformers."""
    from transformers.models.auto import modeling_auto as ma

    return sorted(set(ma.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES) | set(ma.MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES))


def _model_class(name: str):
    import transformers

    cls = getattr(transformers, name, None)
    if cls is None:
        raise RuntimeError(f"transformers has no class {name}")
    return cls


def _fill_uniform(t: torch.Tensor, rng, mean: float, std: float) -> None:
    import numpy as np

    half = std * 3.0 ** 0.5
    x = torch.from_numpy(rng.random(t.numel(), dtype=np.float32))
    x.mul_(2.0 * half).add_(mean - half)
    t.copy_(x.view(t.shape).to(t.dtype))


@torch.no_grad()
def build(model_type: str, seed: int = 0, attn_implementation: str = "eager"):
    """(model, config, kind): the tiny seeded model in eval mode on the CPU."""
    import numpy as np

    head = head_of(model_type)
    if head is None:
        import transformers
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING

        if model_type not in CONFIG_MAPPING:
            raise RuntimeError(f"transformers {transformers.__version__} does not know this model type")
        raise RuntimeError("transformers has no model class for this type")
    kind, cls_name = head
    config, _ = configs.tiny_config(model_type)
    torch.manual_seed(seed)
    try:
        model = _model_class(cls_name)._from_config(config, dtype=DTYPE, attn_implementation=attn_implementation)
    except Exception:
        # transformers 4.57 maps `pixtral` to Llava's model, which wants a Llava config: the class of
        # the type's own modeling module that takes its config, if there is another one
        other = _class_of_config(model_type)
        if other is None or other[1] == cls_name:
            raise
        kind, cls_name = other
        torch.manual_seed(seed)
        model = _model_class(cls_name)._from_config(config, dtype=DTYPE, attn_implementation=attn_implementation)
    model.eval()
    rng = np.random.default_rng(seed)
    std = 0.02
    for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
        if p.dim() == 1 and p.numel() > 0 and p.is_floating_point() and bool((p == 1).all()):
            _fill_uniform(p.data, rng, 1.0, 0.1)
        elif p.is_floating_point():
            _fill_uniform(p.data, rng, 0.0, std)
    return model, config, kind


def text_config_of(config):
    get = getattr(config, "get_text_config", None)
    try:
        return get(decoder=True) if get is not None else config
    except TypeError:
        return get()


def _first_attr(configs_, names):
    for c in configs_:
        for n in names:
            v = getattr(c, n, None) if n in vars(c) else None
            if isinstance(v, int) and not isinstance(v, bool):
                return v
    return None


def token_ids(config) -> dict:
    """The image placeholder, image start/end and bos ids the config names (None where it has none)."""
    cs = [config, text_config_of(config)]
    return {
        "image": _first_attr(cs, ("image_token_id", "image_token_index", "image_patch_id")),
        "start": _first_attr(cs, ("vision_start_token_id", "boi_token_index", "boi_token_id", "image_start_token_id")),
        "end": _first_attr(cs, ("vision_end_token_id", "eoi_token_index", "eoi_token_id", "image_end_token_id")),
        "bos": _first_attr(cs, ("bos_token_id",)),
    }


def random_text(config, n: int, seed: int) -> list[int]:
    """n token ids drawn (seeded) from the vocabulary, none of them a special id of the config."""
    import numpy as np

    vocab = getattr(text_config_of(config), "vocab_size", None) or configs.VOCAB
    banned = configs.special_ids(config)
    allowed = [i for i in range(min(vocab, configs.VOCAB) - 40) if i not in banned] or list(range(vocab))
    rng = np.random.default_rng(seed + 1)
    return [allowed[int(i)] for i in rng.integers(0, len(allowed), n)]


def text_inputs(config, seed: int = 0) -> dict:
    ids = random_text(config, SEQ, seed)
    return {"input_ids": torch.tensor([ids]), "attention_mask": torch.ones(1, len(ids), dtype=torch.long)}
