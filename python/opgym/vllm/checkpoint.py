"""A local Qwen2.5-VL checkpoint that vLLM loads offline: weights, tokenizer, image processor, chat template.

Nothing is downloaded. The weights are opgym's embedded Qwen2.5-VL-3B architecture (opgym.models:
real widths, reduced depth, seeded weights). The tokenizer is a byte-level BPE trained here, with the
`tokenizers` library, on a few sentences (so any text encodes, byte by byte where no merge applies),
plus Qwen2.5-VL's special tokens at the ids the model's config names (<|im_start|> 151644,
<|vision_start|> 151652, <|image_pad|> 151655, ...). The chat template writes Qwen's layout (system,
user, assistant turns; an image as <|vision_start|><|image_pad|><|vision_end|>), so text and image
prompts go through vLLM's own Qwen2.5-VL processor, which expands <|image_pad|> to the image's tokens.

    build_checkpoint(out_dir, text_layers=4, vision_blocks=4, seed=0, widths=None) -> out_dir
"""
from __future__ import annotations

import json
import os
from pathlib import Path

# The special tokens of Qwen2.5-VL's tokenizer and their ids (the config's bos/eos/vision/image ids).
SPECIAL_TOKENS = {
    "<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645,
    "<|object_ref_start|>": 151646, "<|object_ref_end|>": 151647, "<|box_start|>": 151648,
    "<|box_end|>": 151649, "<|quad_start|>": 151650, "<|quad_end|>": 151651,
    "<|vision_start|>": 151652, "<|vision_end|>": 151653, "<|vision_pad|>": 151654,
    "<|image_pad|>": 151655, "<|video_pad|>": 151656,
}

# A chat template producing Qwen's turn layout (written for opgym; Jinja as transformers renders it).
CHAT_TEMPLATE = (
    "{%- if messages[0]['role'] != 'system' -%}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "{%- endif -%}"
    "{%- for m in messages -%}"
    "<|im_start|>{{ m['role'] }}\n"
    "{%- if m['content'] is string -%}{{ m['content'] }}"
    "{%- else -%}{%- for part in m['content'] -%}"
    "{%- if part['type'] == 'image' or part['type'] == 'image_url' or 'image' in part -%}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{%- elif part['type'] == 'text' -%}{{ part['text'] }}"
    "{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "<|im_end|>\n"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|im_start|>assistant\n{%- endif -%}"
)

# The corpus the BPE merges are learned from (deterministic: same merges on every machine).
_CORPUS = [
    "You are a helpful assistant.",
    "Read all the text on this page.",
    "Describe this image in one sentence.",
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "The quick brown fox jumps over the lazy dog.",
    "Chapter one: the project gutenberg ebook of a page of text, with a copyright notice and a license.",
    "What is the capital of France? Paris is the capital of France.",
]

# The image processor's pixel bounds: a 448 x 448 page is 32 x 32 patches (256 image tokens); larger
# images are scaled down to at most ~1,000 image tokens, which keeps a CPU prefill to seconds.
MIN_PIXELS = 56 * 56
MAX_PIXELS = 896 * 896

MARKER = "opgym_checkpoint.json"


def build_tokenizer(vocab_size: int = 600):
    """A transformers fast tokenizer: byte-level BPE learned on _CORPUS, Qwen's special tokens at Qwen's ids."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tk.train_from_iterator(_CORPUS, trainer)
    spec = json.loads(tk.to_str())
    # Specials enter the model's vocabulary with their fixed ids (added tokens alone would be renumbered
    # after the learned vocabulary when the file is loaded) and are declared as added special tokens.
    for tok, i in SPECIAL_TOKENS.items():
        spec["model"]["vocab"][tok] = i
    spec["added_tokens"] = [{"id": i, "content": tok, "single_word": False, "lstrip": False, "rstrip": False,
                             "normalized": False, "special": True} for tok, i in SPECIAL_TOKENS.items()]
    tk = Tokenizer.from_str(json.dumps(spec))
    for tok, i in SPECIAL_TOKENS.items():
        if tk.token_to_id(tok) != i:
            raise RuntimeError(f"tokenizer: {tok} has id {tk.token_to_id(tok)}, expected {i}")
    out = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token=None, eos_token="<|im_end|>",
                                  pad_token="<|endoftext|>", unk_token=None,
                                  additional_special_tokens=[t for t in SPECIAL_TOKENS
                                                             if t not in ("<|im_end|>", "<|endoftext|>")])
    out.chat_template = CHAT_TEMPLATE
    out.model_max_length = 32768
    return out


def save_processor(out: Path, tokenizer) -> None:
    """Qwen2.5-VL's processor files: the PIL Qwen2-VL image processor's preprocessor_config.json (no
    torchvision), the tokenizer, the chat template. Written part by part: transformers' processor
    class cannot be instantiated here without torchvision (its video-processor slot checks a class
    that only exists with torchvision)."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    ip = Qwen2VLImageProcessorPil(min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS)
    ip.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    (out / "chat_template.jinja").write_text(CHAT_TEMPLATE)


def _params(text_layers, vision_blocks, seed, widths) -> dict:
    return {"text_layers": text_layers, "vision_blocks": vision_blocks, "seed": seed, "widths": widths or {},
            "format": 1}


def build_checkpoint(out_dir, text_layers: int = 4, vision_blocks: int = 4, seed: int = 0,
                     widths: dict | None = None, force: bool = False) -> Path:
    """Writes (or reuses, when its marker names the same parameters) the checkpoint in out_dir."""
    import torch

    from opgym import models

    out = Path(out_dir)
    params = _params(text_layers, vision_blocks, seed, widths)
    marker = out / MARKER
    if not force and marker.is_file():
        try:
            if json.loads(marker.read_text()) == params:
                return out
        except (OSError, json.JSONDecodeError):
            pass
    out.mkdir(parents=True, exist_ok=True)
    if marker.exists():
        marker.unlink()
    config = models.qwen2_5_vl_3b_config(text_layers, vision_blocks, _widths=widths)
    model = models.build_model(config, seed=seed, dtype=torch.bfloat16)
    model.config.dtype = torch.bfloat16
    model.save_pretrained(str(out))
    del model
    save_processor(out, build_tokenizer())
    gen = {"bos_token_id": SPECIAL_TOKENS["<|endoftext|>"], "eos_token_id": SPECIAL_TOKENS["<|im_end|>"],
           "pad_token_id": SPECIAL_TOKENS["<|endoftext|>"], "do_sample": False}
    (out / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
    marker.write_text(json.dumps(params, indent=2) + "\n")
    return out


def default_dir(text_layers: int, vision_blocks: int, seed: int) -> Path:
    """Where `opgym serve-bench` keeps its checkpoint (results/ is not tracked)."""
    root = Path(os.environ.get("OPGYM_VLLM_MODEL_DIR", "results/vllm-model"))
    return root / f"qwen2_5_vl_3b-L{text_layers}-V{vision_blocks}-seed{seed}"
