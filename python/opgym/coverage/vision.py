"""Pixel inputs for image-text-to-text models: one seeded synthetic image, the model's own image
processor (its PIL class, instantiated offline with defaults and the vision config's patch/merge sizes),
or, where there is none, a plain (1, C, S, S) tensor at the vision config's image size. How many
placeholder tokens the text needs is asked from the model itself (`get_image_features` on the pixel
inputs: the rows of the features it returns); the text is then [bos] [start] image*N [end] + words.
"""
from __future__ import annotations

import inspect
import re
import traceback

import torch

from . import build

IMAGE_SIDE = 64  # the synthetic image's side where the vision config names no image size


def _vision_config(config):
    for k in ("vision_config", "vision_tower_config", "visual_config"):
        v = vars(config).get(k)
        if v is not None:
            return v
    return None


def _image_side(vc) -> int:
    size = getattr(vc, "image_size", None) if vc is not None else None
    if isinstance(size, (list, tuple)):
        size = size[0]
    return int(size) if isinstance(size, int) and size > 0 else IMAGE_SIDE


def synthetic_image(side: int, seed: int):
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed + 7)
    return Image.fromarray(rng.integers(0, 256, (side, side, 3), dtype=np.uint8))


def _processor(model_type: str, vc):
    """The type's PIL image processor with the vision config's patch/merge sizes, or None."""
    import transformers
    from transformers.models.auto.image_processing_auto import IMAGE_PROCESSOR_MAPPING_NAMES

    candidates = [model_type, model_type.removesuffix("_moe")]
    if vc is not None and getattr(vc, "model_type", None):
        candidates += [vc.model_type, vc.model_type.removesuffix("_vision").removesuffix("_vision_model")]
    names = next((IMAGE_PROCESSOR_MAPPING_NAMES[c] for c in candidates if c in IMAGE_PROCESSOR_MAPPING_NAMES), None)
    if isinstance(names, dict):
        name = names.get("pil")
    elif isinstance(names, (list, tuple)):
        name = next((n for n in names if n and not n.endswith("Fast")), None)
    else:
        name = names
    cls = getattr(transformers, name, None) if name else None
    if cls is None:
        return None
    kwargs = {}
    if vc is not None:
        for ours, theirs in (("patch_size", "patch_size"), ("temporal_patch_size", "temporal_patch_size"),
                             ("spatial_merge_size", "merge_size")):
            v = vars(vc).get(ours)
            if isinstance(v, int):
                kwargs[theirs] = v
    try:
        proc = cls(**kwargs)
    except TypeError:
        kwargs, proc = {}, cls()
    side = _image_side(vc) if vc is not None and vars(vc).get("image_size") else None
    if side is not None:  # the processor's class defaults may be another checkpoint's resolution
        sizes = {}
        for attr in ("size", "crop_size", "max_image_size"):
            d = _as_dict(getattr(proc, attr, None))
            if d and max((v for v in d.values() if isinstance(v, int)), default=0) > 16384:
                continue  # Qwen2-VL-style: shortest/longest_edge are pixel counts, not sides
            if d:
                sizes[attr] = {k: (side if k in ("shortest_edge", "height", "width", "longest_edge") else v)
                               for k, v in d.items()}
        if sizes:
            try:
                proc = cls(**kwargs, **sizes)
            except (TypeError, ValueError):
                pass
    if getattr(proc, "do_image_splitting", None):
        proc.do_image_splitting = False  # one image, not a grid of tiles plus the global view
    return proc


def _as_dict(d):
    import dataclasses

    if isinstance(d, dict):
        return dict(d)
    if dataclasses.is_dataclass(d):
        return {k: v for k, v in dataclasses.asdict(d).items() if v is not None}
    return None


def _get_image_features(model):
    fn = getattr(model, "get_image_features", None)
    if fn is None and isinstance(getattr(model, "model", None), torch.nn.Module):
        fn = getattr(model.model, "get_image_features", None)
    return fn


_MISMATCH = re.compile(r"tokens:\s*(\d+),\s*features:?\s*(\d+)")


def _features_count(model, pix: dict) -> int:
    fn = _get_image_features(model)
    if fn is None:
        raise RuntimeError("no get_image_features")
    params = inspect.signature(fn).parameters
    kwargs = {k: v for k, v in pix.items() if k in params}
    with torch.no_grad():
        out = fn(**kwargs)
    feats = getattr(out, "pooler_output", None)
    if feats is None:
        feats = out[0] if isinstance(out, tuple) and not isinstance(out[0], torch.Tensor) else out
        if hasattr(out, "last_hidden_state") and getattr(out, "pooler_output", None) is None:
            feats = out.last_hidden_state
    if isinstance(feats, torch.Tensor):
        feats = [feats]
    return sum(int(f.numel() // f.shape[-1]) for f in feats)


def _from_processor(model_type, vc, side, seed):
    proc = _processor(model_type, vc)
    if proc is None:
        raise RuntimeError(f"no PIL image processor for {model_type}")
    out = proc(images=[synthetic_image(side, seed)], return_tensors="pt")
    return {k: v for k, v in dict(out).items() if isinstance(v, torch.Tensor)}, \
        f"{type(proc).__name__} on a {side}x{side} image"


def _plain(vc, side, seed):
    channels = getattr(vc, "num_channels", None) or getattr(vc, "in_channels", None) or 3
    g = torch.Generator().manual_seed(seed + 7)
    return {"pixel_values": torch.randn(1, channels, side, side, generator=g)}, \
        f"a (1, {channels}, {side}, {side}) pixel tensor"


def _patches(model, vc, seed):
    """Flattened patches and their grid, for the Qwen2-VL-style towers (a grid_thw argument) whose
    image processor cannot run here (torchvision only): a (1, 2m, 2m) grid, m the merge size."""
    params = inspect.signature(_get_image_features(model)).parameters
    grid_arg = next((p for p in params if p.endswith("grid_thw")), None)
    if grid_arg is None:
        raise RuntimeError("the model takes no grid_thw")
    g = vars(vc)
    channels = g.get("in_channels") or g.get("num_channels") or 3
    temporal = g.get("temporal_patch_size") or g.get("patch_temporal") or 1
    merge = g.get("spatial_merge_size") or g.get("merge_size") or 1
    side = 2 * merge
    width = channels * temporal * g["patch_size"] ** 2
    gen = torch.Generator().manual_seed(seed + 7)
    return {"pixel_values": torch.randn(side * side, width, generator=gen),
            grid_arg: torch.tensor([[1, side, side]])}, f"{side * side} flattened patches of {width}"


def _prefix():
    """BLIP-style models without get_image_features: pixels and plain text, no placeholder tokens."""


def _cross_attention(config, pix: dict, seed: int) -> dict:
    """Mllama-style models (images reach the text through cross-attention layers): one image token,
    and a cross_attention_mask that lets every text token see every tile."""
    ids = token_ids_for_image(config, 1, seed)
    tiles = pix["pixel_values"].shape[2] if pix["pixel_values"].dim() == 6 else 1
    out = {"input_ids": torch.tensor([ids]), "attention_mask": torch.ones(1, len(ids), dtype=torch.long),
           "cross_attention_mask": torch.ones(1, len(ids), 1, tiles, dtype=torch.long)}
    return out


def pixel_inputs(model_type: str, model, config, seed: int = 0, forward=None) -> tuple[dict, str]:
    """(inputs for model(**inputs), how they were made): the image processor's output, else a plain
    pixel tensor; the first the model takes (`forward(inputs)` runs without raising). Raises when
    neither works, with both reasons."""
    vc = _vision_config(config)
    side = _image_side(vc)
    errors = []
    cross = "cross_attention_mask" in inspect.signature(model.forward).parameters
    ways = (_from_processor, _plain, _patches)
    if _get_image_features(model) is None and not cross:
        ways = (_from_processor, _plain, _prefix)
    for make in ways:
        try:
            if make is _from_processor:
                pix, how = make(model_type, vc, side, seed)
            elif make in (_plain, _prefix):
                pix, how = _plain(vc, side, seed)
            else:
                pix, how = make(model, vc, seed)
            if "pixel_values" in pix and pix["pixel_values"].is_floating_point():
                pix["pixel_values"] = pix["pixel_values"].to(build.DTYPE)
            inputs = dict(pix)
            if cross:
                n = 1
                inputs.update(_cross_attention(config, pix, seed))
            elif make is _prefix:
                n = 0
                inputs.update(build.text_inputs(config, seed))
                how += " (image features prepended by the model, no placeholders)"
            else:
                n = _features_count(model, pix) if _get_image_features(model) is not None else 1
                inputs.update(text_for_image(model, config, n, seed))
            if forward is not None:
                try:
                    forward(inputs)
                except ValueError as e:  # HF's placeholder check names the count it wants: once more
                    m = _MISMATCH.search(str(e))
                    if m is None or make is _prefix or cross:
                        raise
                    n = int(m.group(2))
                    inputs.update(text_for_image(model, config, n, seed))
                    forward(inputs)
            return inputs, f"{how}, {n} image tokens"
        except Exception as e:  # noqa: BLE001 - the next way, then the reasons
            tb = traceback.extract_tb(e.__traceback__)
            where = f" @{tb[-1].filename.rsplit('/', 1)[-1]}:{tb[-1].lineno}" if tb else ""
            errors.append(f"{make.__name__.strip('_')}: {type(e).__name__}: {' '.join(str(e).split())[:240]}{where}")
    raise RuntimeError("; ".join(errors))


def text_for_image(model, config, n_image: int, seed: int) -> dict:
    """input_ids with the image's placeholders, the attention mask, and mm_token_type_ids (1 on the
    image's tokens) where the forward takes them."""
    ids = token_ids_for_image(config, n_image, seed)
    out = {"input_ids": torch.tensor([ids]), "attention_mask": torch.ones(1, len(ids), dtype=torch.long)}
    if "mm_token_type_ids" in inspect.signature(model.forward).parameters:
        image = build.token_ids(config)["image"]
        out["mm_token_type_ids"] = (out["input_ids"] == image).long()
    return out


def token_ids_for_image(config, n_image: int, seed: int) -> list[int]:
    t = build.token_ids(config)
    if t["image"] is None:
        raise RuntimeError("the config names no image token id")
    ids = []
    if t["bos"] is not None:
        ids.append(t["bos"])
    if t["start"] is not None:
        ids.append(t["start"])
    ids += [t["image"]] * n_image
    if t["end"] is not None:
        ids.append(t["end"])
    return ids + build.random_text(config, build.SEQ, seed)


def pixel_inputs_only(model, config, seed: int = 0) -> tuple[dict, str]:
    """A vision-only model (e.g. Pixtral's encoder): one (1, C, S, S) image, plus image_sizes where the
    forward takes them."""
    dynamic = "image_sizes" in inspect.signature(model.forward).parameters
    side = IMAGE_SIDE if dynamic or not vars(config).get("image_size") else _image_side(config)
    channels = getattr(config, "num_channels", None) or 3
    g = torch.Generator().manual_seed(seed + 7)
    inputs = {"pixel_values": torch.randn(1, channels, side, side, generator=g).to(build.DTYPE)}
    if dynamic:  # Pixtral-style encoders take any size: a small one
        inputs["image_sizes"] = torch.tensor([[side, side]])
    return inputs, f"image only: (1, {channels}, {side}, {side}) pixels"
