"""The `opgym` command: `opgym capture`, `opgym run`, `opgym bench`.

Each subcommand's module is imported only when that subcommand runs, so a missing or broken one
never affects the others. Exit codes: 0 success, 1 a run that finished but failed its own checks
(as the subcommand reports), 2 bad input (one-line error on stderr).
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys

from . import ops as _ops_table

# The lazily imported subcommands: name -> (module, help). Each module exposes
# add_arguments(parser) and main(args) -> int.
LAZY = {
    "run": ("opgym.run", "A/B-run the model with and without opgym's fused operators"),
    "bench": ("opgym.bench", "benchmark opgym's operators against torch"),
    "coverage": ("opgym.coverage", "every HF model type, tiny and seeded: what opgym fuses and whether the logits stay bit-identical"),
    "serve-bench": ("opgym.vllm.serve_bench", "serve Qwen2.5-VL through vLLM with and without opgym's plugin"),
}


class UsageError(Exception):
    """Bad input from the user: reported as one line, exit code 2."""


def _capture_ops() -> tuple:
    """The ops with a capture part, in table order (rms_norm's file is --out)."""
    return tuple(op for op in _ops_table.OPS if _ops_table.part(op, "capture") is not None)


def _add_capture(sub) -> None:
    p = sub.add_parser("capture", help="record the shapes opgym's ops see in a real forward and write gym-format cases",
                       description="Builds (or loads) a Qwen2.5-VL model, runs generate on an image+text "
                                   "prompt with every call opgym serves hooked, and writes one gym-format case "
                                   "per distinct signature: RMSNorm's to --out, each other op's to its --<op>-out.")
    p.add_argument("--out", "-o", required=True, help="case file to write (e.g. cases/qwen2_5_vl_3b/rms_norm.json)")
    p.add_argument("--model", default=None,
                   help="local checkpoint directory (offline); default: the Qwen2.5-VL-3B architecture with "
                        "seeded random weights")
    p.add_argument("--text-layers", type=int, default=2, help="decoder layers of the built model (default 2)")
    p.add_argument("--vision-blocks", type=int, default=2, help="vision blocks of the built model (default 2)")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--image", action="append", default=None,
                   help="image file; repeat for several generate runs (default: opgym's synthetic page)")
    p.add_argument("--image-size", action="append", default=None, metavar="WxH",
                   help="size of the synthetic page; repeat for several generate runs (default 448x448)")
    p.add_argument("--prompt", default=None, help="text prompt")
    p.add_argument("--max-new-tokens", type=int, default=4, help="decode steps after the prefill (default 4)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--prefix", default="qwen2_5_vl_3b",
                   help="case id prefix: each op's ids start with PREFIX_<op> (default qwen2_5_vl_3b)")
    for op in _capture_ops():
        if op == "rms_norm":
            continue  # --out
        spec = _ops_table.spec(op)
        p.add_argument(f"--{op.replace('_', '-')}-out", default=None, metavar="FILE", dest=f"out_{op}",
                       help=f"also write {op}'s cases ({spec.title}: {spec.summary})")
    p.add_argument("--records", default=None, help="also write every recorded call as JSON here")
    p.set_defaults(func=_capture_main)


def _capture_main(args) -> int:
    import json

    import torch

    if args.max_new_tokens < 1:
        raise UsageError("--max-new-tokens must be >= 1")
    outs = {"rms_norm": args.out, **{op: getattr(args, f"out_{op}") for op in _capture_ops() if op != "rms_norm"}}
    for op, path in outs.items():
        flag = "--out" if op == "rms_norm" else f"--{op.replace('_', '-')}-out"
        out_dir = os.path.dirname(os.path.abspath(path)) if path else None
        if out_dir and not os.path.isdir(out_dir):
            raise UsageError(f"{flag}: directory {out_dir} does not exist")
    try:
        models = importlib.import_module("opgym.models")
    except ImportError as e:
        raise UsageError(f"opgym capture needs opgym.models, which is not available ({e})") from None
    from .capture import Capture

    images = []
    for path in args.image or []:
        try:
            images.append((path, models.load_image(path)))
        except ValueError as e:
            raise UsageError(f"--image: {e}") from None
    for size in args.image_size or ([] if images else ["448x448"]):
        try:
            w, h = (int(v) for v in size.lower().split("x"))
            if w < 28 or h < 28:
                raise ValueError
        except ValueError:
            raise UsageError(f"--image-size: expected WxH with both >= 28, got {size!r}") from None
        images.append((f"synthetic page {w}x{h}", models.synthetic_page(width=w, height=h, seed=args.seed)))
    dtype = getattr(torch, args.dtype)
    processor = None
    if args.model:
        try:
            model, processor = models.load_model(args.model, dtype)
        except (ValueError, OSError) as e:
            raise UsageError(f"--model: {e}") from None
        what = f"checkpoint {args.model}"
    else:
        if args.text_layers < 1 or args.vision_blocks < 1:
            raise UsageError("--text-layers and --vision-blocks must be >= 1")
        config = models.qwen2_5_vl_3b_config(text_layers=args.text_layers, vision_blocks=args.vision_blocks)
        model = models.build_model(config, seed=args.seed, dtype=dtype)
        what = (f"Qwen2.5-VL-3B architecture (real widths: vision 1280, text 2048, head_dim 128), "
                f"{args.text_layers} text layers, {args.vision_blocks} vision blocks, seeded random weights "
                f"(seed {args.seed})")
    runs = []
    with torch.no_grad(), Capture(model) as cap:
        for name, image in images:
            inputs = models.make_inputs(model.config, image, args.prompt, processor=processor)
            model.generate(**inputs, max_new_tokens=args.max_new_tokens, min_new_tokens=args.max_new_tokens,
                           do_sample=False)
            runs.append(f"{name}: {inputs['input_ids'].shape[1]} input ids, image grid "
                        f"{inputs['image_grid_thw'][0].tolist()}")
    source = (f"opgym capture: {what}; {args.dtype}; generate with {args.max_new_tokens} new tokens on "
              f"image+text prompts ({'; '.join(runs)})")
    description = (f"input signatures of {'Qwen2.5-VL-3B' if not args.model else args.model} (prefill and decode), "
                   "one case each" + ("; depth is reduced, every call site repeats per layer with the same shape"
                                      if not args.model else ""))
    data = None
    for op, path in outs.items():
        if not path:
            continue
        spec = _ops_table.spec(op)
        written = cap.write(path, source=source, op=op, prefix=f"{args.prefix}_{op}",
                            description=f"{spec.title}: {description}")
        if op == "rms_norm":
            data = written
        else:
            print(f"wrote {len(written['test_cases'])} {op} cases to {path}")
    if args.records:
        with open(args.records, "w") as f:
            json.dump({"steps": cap.steps, "records": cap.records,
                       "ops": {op: cap.recorder(op).records for op in outs}}, f, indent=1)
    print(cap.summary())
    print(f"wrote {len(data['test_cases'])} cases to {args.out}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="opgym", description="opgym: fused operators for HF models, with proof")
    parser.add_argument("--version", action="version", version="opgym 0.1.0")
    sub = parser.add_subparsers(dest="command", metavar="{capture,run,bench}")
    _add_capture(sub)
    for name, (module, help_text) in LAZY.items():
        p = sub.add_parser(name, help=help_text, add_help=False)
        p.add_argument("rest", nargs=argparse.REMAINDER)
        p.set_defaults(lazy=name)
    return parser


def _run_lazy(name: str, argv: list[str]) -> int:
    module_name, help_text = LAZY[name]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name == module_name:
            print(f"opgym {name}: not available in this installation ({module_name} is missing)", file=sys.stderr)
            return 2
        raise
    if not (hasattr(module, "add_arguments") and hasattr(module, "main")):
        print(f"opgym {name}: not available ({module_name} has no add_arguments/main)", file=sys.stderr)
        return 2
    p = argparse.ArgumentParser(prog=f"opgym {name}", description=help_text)
    module.add_arguments(p)
    args = p.parse_args(argv)
    return int(module.main(args) or 0)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    # `run`/`bench` own their whole argument list (including -h): hand it over untouched.
    if argv and argv[0] in LAZY:
        try:
            return _run_lazy(argv[0], argv[1:])
        except UsageError as e:
            print(f"opgym {argv[0]}: error: {e}", file=sys.stderr)
            return 2
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(args.func(args) or 0)
    except UsageError as e:
        print(f"opgym {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    # `python -m opgym.cli`: run the package's own module, whose UsageError is the one subcommands raise
    # (this file as __main__ is a second copy with a class of its own).
    from opgym.cli import main as _main

    sys.exit(_main())
