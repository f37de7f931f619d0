"""The model opgym runs on: Qwen2.5-VL (the GutenOCR-3B architecture), built or loaded offline.

Nothing here touches the Hugging Face hub: the embedded default is built from a config with seeded
random weights, and `load_model` reads a local checkpoint directory with `local_files_only=True`.

Public interface (also used by the shape-capture feature):
    qwen2_5_vl_3b_config(text_layers=None, vision_blocks=None) -> Qwen2_5_VLConfig
    build_model(config, seed=0, dtype=torch.bfloat16, attn_implementation="eager") -> model
    load_model(path, dtype=torch.bfloat16, attn_implementation="eager") -> (model, processor_or_None)
    synthetic_page(width=448, height=448, seed=0) -> PIL.Image
    make_inputs(config, image=None, prompt=..., processor=None, seed=0, ...) -> dict for model(**inputs)
"""
from __future__ import annotations

import json
import os
import random
from pathlib import Path

# Everything that loads stays offline, whoever imports this module first.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402

DEFAULT_PROMPT = "Read all the text on this page."
# The attention used for both sides of the A/B: HF's eager (plain matmul + softmax) attention, the
# reference implementation the issue asks for. `sdpa` is available through the argument.
DEFAULT_ATTN = "eager"

# Qwen2.5-VL-3B-Instruct's config.json (text at the top level, vision in vision_config).
QWEN2_5_VL_3B = {
    "architectures": ["Qwen2_5_VLForConditionalGeneration"],
    "model_type": "qwen2_5_vl",
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "vision_start_token_id": 151652,
    "vision_end_token_id": 151653,
    "image_token_id": 151655,
    "video_token_id": 151656,
    "hidden_act": "silu",
    "hidden_size": 2048,
    "initializer_range": 0.02,
    "intermediate_size": 11008,
    "max_position_embeddings": 128000,
    "max_window_layers": 70,
    "num_attention_heads": 16,
    "num_hidden_layers": 36,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
    "sliding_window": 32768,
    "use_sliding_window": False,
    "tie_word_embeddings": True,
    "use_cache": True,
    "vocab_size": 151936,
    "vision_config": {
        "depth": 32,
        "hidden_act": "silu",
        "hidden_size": 1280,
        "intermediate_size": 3420,
        "num_heads": 16,
        "in_chans": 3,
        "out_hidden_size": 2048,
        "patch_size": 14,
        "spatial_merge_size": 2,
        "spatial_patch_size": 14,
        "window_size": 112,
        "fullatt_block_indexes": [7, 15, 23, 31],
        "tokens_per_second": 2,
        "temporal_patch_size": 2,
    },
}
FULL_TEXT_LAYERS = QWEN2_5_VL_3B["num_hidden_layers"]
FULL_VISION_BLOCKS = QWEN2_5_VL_3B["vision_config"]["depth"]


class ModelLoadError(ValueError):
    """A checkpoint directory that cannot be used: missing, malformed, or not Qwen2.5-VL."""


class ImageLoadError(ValueError):
    """An image file that cannot be read."""


def _fullatt_indexes(vision_blocks: int) -> list[int]:
    """The real full-attention block indexes that exist at this depth; when depth cuts them all off,
    the last block is made full-attention so that both attention kinds (window, full) still run."""
    real = QWEN2_5_VL_3B["vision_config"]["fullatt_block_indexes"]
    kept = [i for i in real if i < vision_blocks]
    return kept if kept else [vision_blocks - 1]


def qwen2_5_vl_3b_config(text_layers: int | None = None, vision_blocks: int | None = None, *,
                         _widths: dict | None = None):
    """The Qwen2.5-VL-3B architecture as a transformers Qwen2_5_VLConfig.

    text_layers / vision_blocks reduce the depth (None = the full 36 / 32); every width stays real.
    `_widths` is for tests only: overrides of the text (top-level keys) and vision ("vision_config")
    widths, so a test can run the same code path in seconds.
    """
    from transformers import Qwen2_5_VLConfig

    cfg = json.loads(json.dumps(QWEN2_5_VL_3B))  # deep copy
    if text_layers is not None:
        if text_layers < 1:
            raise ValueError("text_layers must be >= 1")
        cfg["num_hidden_layers"] = int(text_layers)
    if vision_blocks is not None:
        if vision_blocks < 1:
            raise ValueError("vision_blocks must be >= 1")
        cfg["vision_config"]["depth"] = int(vision_blocks)
    cfg["vision_config"]["fullatt_block_indexes"] = _fullatt_indexes(cfg["vision_config"]["depth"])
    if _widths:
        w = dict(_widths)
        cfg["vision_config"].update(w.pop("vision_config", {}))
        cfg.update(w)
    cfg.pop("architectures")
    cfg.pop("model_type")
    vision = cfg.pop("vision_config")
    config = Qwen2_5_VLConfig(vision_config=vision, **cfg)
    config.architectures = ["Qwen2_5_VLForConditionalGeneration"]
    return config


def _fill_uniform(t: torch.Tensor, rng, mean: float, std: float) -> None:
    """Fills t with uniform values of the given mean and standard deviation (half-width std*sqrt(3)),
    drawn in fp32 from numpy's PCG64: seeded, identical on every platform, and ~4x faster than
    normal draws (which matters: the full-depth model has 3.75 billion parameters)."""
    import numpy as np

    half = std * 3.0 ** 0.5
    flat = t.view(-1)
    chunk = 1 << 24
    for start in range(0, flat.numel(), chunk):
        n = min(chunk, flat.numel() - start)
        x = torch.from_numpy(rng.random(n, dtype=np.float32))
        x.mul_(2.0 * half).add_(mean - half)
        flat[start:start + n].copy_(x)


@torch.no_grad()
def build_model(config, seed: int = 0, dtype: torch.dtype = torch.bfloat16,
                attn_implementation: str = DEFAULT_ATTN):
    """Qwen2_5_VLForConditionalGeneration with seeded random weights, in eval mode, on the CPU.

    The modules are created without their own initialization (transformers' no_init_weights), then
    every parameter, in name order, is drawn from one numpy PCG64 stream seeded by `seed`
    (uniform distributions, see _fill_uniform): matrices, embeddings, conv kernels and biases with
    mean 0 and std initializer_range = 0.02; RMSNorm weights, which the model's own initializer would
    set to ones, with mean 1 and std 0.1 so that the scale really multiplies. Parameters are created
    directly in `dtype`; the rotary inv_freq buffers stay fp32 as the model computes them. Same seed, same weights, on any machine. The embedding and the LM head are one tied
    tensor (tie_word_embeddings), as in the real 3B.
    """
    import numpy as np
    from transformers import Qwen2_5_VLForConditionalGeneration
    from transformers.initialization import no_init_weights

    config._attn_implementation = attn_implementation
    prev = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with no_init_weights():
            model = Qwen2_5_VLForConditionalGeneration(config)
    finally:
        torch.set_default_dtype(prev)
    model.tie_weights()
    rng = np.random.default_rng(seed)
    std = float(getattr(getattr(config, "text_config", config), "initializer_range", 0.02))
    from .ops.rms_norm.integration import find_rms_norms

    norm_params = {id(m.weight) for _, m in find_rms_norms(model)}
    for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
        if id(p) in norm_params:
            _fill_uniform(p.data, rng, 1.0, 0.1)
        else:
            _fill_uniform(p.data, rng, 0.0, std)
    model.eval()
    _quiet_generation_config(model)
    return model


def _quiet_generation_config(model) -> None:
    gc = model.generation_config
    cfg = model.config
    text = getattr(cfg, "text_config", cfg)
    if gc.pad_token_id is None:
        gc.pad_token_id = getattr(text, "eos_token_id", None) or getattr(cfg, "eos_token_id", None)
        if isinstance(gc.pad_token_id, list):
            gc.pad_token_id = gc.pad_token_id[0]
    # A checkpoint's generation_config may ask for sampling; the runner always passes do_sample=False,
    # and these would only produce warnings.
    for k in ("temperature", "top_p", "top_k"):
        if hasattr(gc, k):
            setattr(gc, k, None)


def load_model(path, dtype: torch.dtype = torch.bfloat16, attn_implementation: str = DEFAULT_ATTN):
    """Loads a local Qwen2.5-VL checkpoint directory offline.

    Returns (model, processor) where processor is a Qwen2.5-VL processor (tokenizer + image
    processor) when the directory has one, a bare tokenizer when only that is there, else None.
    Raises ModelLoadError for a missing directory, a missing/malformed config.json, a model_type
    other than qwen2_5_vl, or weights that do not load.
    """
    p = Path(path)
    if not p.exists():
        raise ModelLoadError(f"model directory {path} does not exist")
    if not p.is_dir():
        raise ModelLoadError(f"model path {path} is not a directory")
    cfg_file = p / "config.json"
    if not cfg_file.is_file():
        raise ModelLoadError(f"model directory {path} has no config.json")
    try:
        raw = json.loads(cfg_file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelLoadError(f"{cfg_file} is not valid JSON ({e})") from None
    if not isinstance(raw, dict):
        raise ModelLoadError(f"{cfg_file} is not a JSON object")
    model_type = raw.get("model_type")
    if model_type != "qwen2_5_vl":
        raise ModelLoadError(f"{path} is a {model_type or 'unknown'} checkpoint (model_type in config.json), "
                             "not Qwen2.5-VL (qwen2_5_vl)")
    has_weights = any(p.glob("*.safetensors")) or any(p.glob("*.bin"))
    if not has_weights:
        raise ModelLoadError(f"model directory {path} has no weights (*.safetensors or *.bin)")

    from transformers import Qwen2_5_VLForConditionalGeneration

    try:
        model = Qwen2_5_VLForConditionalGeneration.from_pretrained(
            str(p), dtype=dtype, local_files_only=True, attn_implementation=attn_implementation)
    except Exception as e:  # noqa: BLE001 - any failure here is "this checkpoint does not load"
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ModelLoadError(f"cannot load the checkpoint in {path}: {msg}") from None
    model.eval()
    _quiet_generation_config(model)
    return model, _load_processor(p)


def _load_processor(p: Path):
    """The checkpoint's processor or tokenizer when present (offline), else None."""
    has_tok = any((p / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "vocab.json"))
    if not has_tok:
        return None
    import transformers

    if (p / "preprocessor_config.json").is_file():
        try:
            return transformers.AutoProcessor.from_pretrained(str(p), local_files_only=True)
        except Exception:  # noqa: BLE001 - fall back to the bare tokenizer
            pass
    try:
        return transformers.AutoTokenizer.from_pretrained(str(p), local_files_only=True)
    except Exception:  # noqa: BLE001
        return None


_WORDS = ("the of and to in is was for on that with as by at from his her which or an be this had not "
          "are but were have one all their they been has when who will more if no out so said what up "
          "its about into than them can only other new some could time these two may then do first any "
          "my now such like our over man me even most made after also did many before must through back "
          "years where much your way well down should because each just those people page chapter text "
          "gutenberg ebook project license copyright letter volume").split()


def synthetic_page(width: int = 448, height: int = 448, seed: int = 0):
    """A deterministic page: dark text lines of seeded random words on an off-white background."""
    from PIL import Image, ImageDraw, ImageFont

    rng = random.Random(seed)
    img = Image.new("RGB", (width, height), (250, 248, 240))
    draw = ImageDraw.Draw(img)
    font = ImageFont.load_default(size=13)
    margin = max(4, width // 16)
    line_h = 14
    y = margin
    draw.text((margin, y), f"Chapter {rng.randint(1, 40)}", fill=(10, 10, 10), font=font)
    y += 2 * line_h
    while y + line_h < height - margin:
        words, line = rng.randint(5, 12), []
        for _ in range(words):
            line.append(rng.choice(_WORDS))
        text = " ".join(line)
        # trim to the width so every line stays inside the page
        while text and draw.textlength(text, font=font) > width - 2 * margin:
            text = text.rsplit(" ", 1)[0] if " " in text else ""
        draw.text((margin, y), text, fill=(20, 20, 30), font=font)
        y += line_h
    return img


def load_image(path):
    """An RGB PIL image from a file, or ImageLoadError naming the problem."""
    from PIL import Image, UnidentifiedImageError

    p = Path(path)
    if not p.is_file():
        raise ImageLoadError(f"image {path} does not exist")
    try:
        with Image.open(p) as im:
            im.load()
            return im.convert("RGB")
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as e:
        raise ImageLoadError(f"cannot read image {path}: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None


def image_processor():
    """transformers' Qwen2-VL image processor (used by Qwen2.5-VL) with its default arguments.

    The PIL backend: it needs no torchvision (not a dependency here) and no download."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    return Qwen2VLImageProcessorPil()


def checkpoint_image_processor(path):
    """The checkpoint's own image-processor settings (preprocessor_config.json: min/max pixels etc.)
    in the PIL Qwen2-VL image processor, or None when the directory has none or it does not load."""
    p = Path(path)
    if not (p / "preprocessor_config.json").is_file():
        return None
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    try:
        return Qwen2VLImageProcessorPil.from_pretrained(str(p), local_files_only=True)
    except Exception:  # noqa: BLE001 - the defaults then
        return None


def _special_ids(config) -> dict:
    return {k: int(getattr(config, k)) for k in
            ("vision_start_token_id", "vision_end_token_id", "image_token_id")}


def make_inputs(config, image=None, prompt: str | None = DEFAULT_PROMPT, processor=None, seed: int = 0,
                prefix_tokens: int = 8, text_tokens: int = 16, image_proc=None) -> dict:
    """Inputs for model(**inputs) and model.generate(**inputs): input_ids, attention_mask,
    pixel_values, image_grid_thw (batch 1, one image).

    - processor is a full Qwen2.5-VL processor: its chat template and its own image processor.
    - processor is a bare tokenizer: the Qwen chat layout is written out by hand around the image
      tokens (vision_start, image_pad x n, vision_end) and tokenized.
    - no processor: seeded token ids (ordinary vocabulary, below the special tokens) around the image
      tokens: `prefix_tokens` ids, vision_start, image_pad x n, vision_end, `text_tokens` ids.
      The prompt text is not used in this case (there is no tokenizer to encode it).
    n = grid_t * grid_h * grid_w / merge_size^2 from the image processor's image_grid_thw.
    """
    if image is None:
        image = synthetic_page(seed=seed)
    prompt = DEFAULT_PROMPT if prompt is None else prompt

    if processor is not None and hasattr(processor, "image_processor") and hasattr(processor, "apply_chat_template"):
        try:
            messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": prompt}]}]
            text = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            out = processor(text=[text], images=[image], return_tensors="pt")
            return {k: out[k] for k in ("input_ids", "attention_mask", "pixel_values", "image_grid_thw")}
        except Exception:  # noqa: BLE001 - e.g. no chat template: fall through to the manual layout
            processor = getattr(processor, "tokenizer", None)

    ip = image_proc or image_processor()
    vis = ip(images=[image], return_tensors="pt")
    pixel_values, grid = vis["pixel_values"], vis["image_grid_thw"]
    n_img = int(grid[0].prod().item()) // (ip.merge_size ** 2)
    ids = _special_ids(config)

    if processor is not None:  # a tokenizer
        text = ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
                "<|vision_start|>" + "<|image_pad|>" * n_img + "<|vision_end|>" + prompt
                + "<|im_end|>\n<|im_start|>assistant\n")
        enc = processor(text, return_tensors="pt", add_special_tokens=False)
        input_ids = enc["input_ids"]
        if int((input_ids == ids["image_token_id"]).sum()) != n_img:
            raise ModelLoadError("the checkpoint's tokenizer does not encode <|image_pad|> as image_token_id")
    else:
        text_cfg = getattr(config, "text_config", config)
        hi = min(int(text_cfg.vocab_size), int(text_cfg.bos_token_id or 151643))
        gen = torch.Generator().manual_seed(seed)
        pre = torch.randint(0, hi, (prefix_tokens,), generator=gen)
        post = torch.randint(0, hi, (text_tokens,), generator=gen)
        image_ids = torch.tensor([ids["vision_start_token_id"]] + [ids["image_token_id"]] * n_img
                                 + [ids["vision_end_token_id"]])
        input_ids = torch.cat([pre, image_ids, post]).unsqueeze(0)
    return {
        "input_ids": input_ids,
        "attention_mask": torch.ones_like(input_ids),
        "pixel_values": pixel_values,
        "image_grid_thw": grid,
    }
