"""What `opgym run` runs: the model (the embedded Qwen2.5-VL-3B architecture with seeded weights, or a
local checkpoint), its inputs (an image and a prompt), and the report's `config` section."""
from __future__ import annotations

import time
from pathlib import Path

from .options import DEFAULT_TEXT_LAYERS, DEFAULT_VISION_BLOCKS, TINY_WIDTHS, UsageError


def build_workload(args, M, ops, page, image, dtype, progress):
    """(model, inputs, config): the model on args.device, its inputs, and the `config` section."""
    device = args.device
    config_out = {}
    # --- model (the modeling code is imported first, so that the build/load time is the model's own)
    import transformers.models.qwen2_5_vl.modeling_qwen2_5_vl  # noqa: F401

    t = time.perf_counter()
    processor = None
    if args.model:
        progress.step(f"loading {args.model}")
        try:
            model, processor = M.load_model(args.model, dtype=dtype, attn_implementation=args.attn)
        except M.ModelLoadError as e:
            raise UsageError(str(e)) from None
        config_out["model"] = str(Path(args.model).resolve())
        config = model.config
    else:
        if args.full_depth:
            tl, vb = M.FULL_TEXT_LAYERS, M.FULL_VISION_BLOCKS
        else:
            tl = args.text_layers if args.text_layers is not None else DEFAULT_TEXT_LAYERS
            vb = args.vision_blocks if args.vision_blocks is not None else DEFAULT_VISION_BLOCKS
        if tl < 1 or vb < 1:
            raise UsageError("--text-layers and --vision-blocks must be >= 1")
        progress.step(f"building the embedded Qwen2.5-VL-3B ({tl} text layers, {vb} vision blocks, seeded weights)")
        config = M.qwen2_5_vl_3b_config(tl, vb, _widths=TINY_WIDTHS if args.testing_tiny else None)
        model = M.build_model(config, seed=args.seed, dtype=dtype, attn_implementation=args.attn)
        config_out["model"] = "embedded Qwen2.5-VL-3B architecture, seeded random weights"
        if args.testing_tiny:
            config_out["model"] += " (testing: reduced widths)"
    if device == "cuda":
        model = model.to("cuda")
    build_s = time.perf_counter() - t
    progress.done()
    text_cfg = getattr(config, "text_config", config)
    vis_cfg = config.vision_config

    # --- inputs
    progress.step("preparing inputs (Qwen2-VL image processor)")
    if image is None:
        image = M.synthetic_page(page[0], page[1], seed=args.seed)
        image_desc = f"synthetic page {page[0]}x{page[1]} (seed {args.seed})"
    else:
        image_desc = str(Path(args.image).resolve())
    try:
        ip = M.checkpoint_image_processor(args.model) if args.model else None
        inputs = M.make_inputs(config, image=image, prompt=args.prompt, processor=processor, seed=args.seed,
                               image_proc=ip)
    except M.ModelLoadError as e:
        raise UsageError(str(e)) from None
    inputs = {k: v.to(device) for k, v in inputs.items()}
    if inputs["pixel_values"].is_floating_point():
        inputs["pixel_values"] = inputs["pixel_values"].to(dtype)
    progress.done()
    n_img = int((inputs["input_ids"] == config.image_token_id).sum())

    config_out.update({
        "text_layers": int(text_cfg.num_hidden_layers),
        "vision_blocks": int(vis_cfg.depth),
        "full_depth": int(text_cfg.num_hidden_layers) == M.FULL_TEXT_LAYERS and int(vis_cfg.depth) == M.FULL_VISION_BLOCKS,
        "text_hidden_size": int(text_cfg.hidden_size),
        "text_intermediate_size": int(text_cfg.intermediate_size),
        "text_heads": int(text_cfg.num_attention_heads),
        "text_kv_heads": int(text_cfg.num_key_value_heads),
        "vocab_size": int(text_cfg.vocab_size),
        "vision_hidden_size": int(vis_cfg.hidden_size),
        "vision_heads": int(vis_cfg.num_heads),
        "vision_fullatt_block_indexes": list(vis_cfg.fullatt_block_indexes),
        "rms_norm_eps": float(text_cfg.rms_norm_eps),
        "dtype": args.dtype,
        "attn_implementation": args.attn,
        "device": device,
        "compile": bool(args.compile),
        "fast": None,  # set by the run: the fast tier's substitutions on the opgym side (--fast)
        "ops": list(ops),
        "ablation": bool(args.ablation),
        "seed": args.seed,
        "image": image_desc,
        "image_grid_thw": inputs["image_grid_thw"][0].tolist(),
        "vision_patches": int(inputs["pixel_values"].shape[0]),
        "prompt_tokens": int(inputs["input_ids"].shape[1]),
        "image_tokens": n_img,
        "text_input": (f"checkpoint {'processor' if hasattr(processor, 'image_processor') else 'tokenizer'}, "
                       f"prompt: {args.prompt or M.DEFAULT_PROMPT!r}") if processor
        else f"seeded token ids around the image tokens (seed {args.seed}); no tokenizer",
        "max_new_tokens": args.max_new_tokens,
        "warmup": args.warmup,
        "repeats": args.repeats,
        "build_s": build_s,
    })
    return model, inputs, config_out
