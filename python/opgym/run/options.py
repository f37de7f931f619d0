"""`opgym run`'s options: the defaults, the command line, and the one-line usage error."""
from __future__ import annotations

import argparse

# Defaults for the embedded model, chosen so that the whole default `make run` (build, both sides,
# agreement) takes about three minutes on the 2-core CI machine; see docs/RUN.md for the measurement.
DEFAULT_TEXT_LAYERS = 4
DEFAULT_VISION_BLOCKS = 4
DEFAULT_MAX_NEW_TOKENS = 16
DEFAULT_PAGE = (448, 448)
DEFAULT_WARMUP = 1
DEFAULT_REPEATS = 3
DEFAULT_ACCURACY_TOKENS = 64  # greedy tokens of the accuracy section (--fast / --compile)
# Threads: torch's own default unless --threads says otherwise, so that a run measures what a user's
# run of the model gets (on the 2-core CI machine: 2).

# Reduced widths for tests only (--testing-tiny): same code path, runs in seconds. The vocabulary
# stays real (the special image token ids are in it).
# Head dims stay real (text 128, so mrope_section [16, 24, 24] still fits; vision 80).
TINY_WIDTHS = {
    "hidden_size": 256, "intermediate_size": 512, "num_attention_heads": 2, "num_key_value_heads": 1,
    "vision_config": {"hidden_size": 160, "intermediate_size": 320, "num_heads": 2, "out_hidden_size": 256},
}


class UsageError(Exception):
    """Bad input: reported as one line, exit code 2."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("model")
    g.add_argument("--model", metavar="PATH",
                   help="local Qwen2.5-VL checkpoint directory (config.json, safetensors, tokenizer/processor "
                        "files when present), loaded offline; default: the embedded Qwen2.5-VL-3B architecture "
                        "with seeded random weights")
    g.add_argument("--text-layers", type=int, default=None, metavar="N",
                   help=f"decoder layers of the embedded model (default {DEFAULT_TEXT_LAYERS}; the real 3B has 36)")
    g.add_argument("--vision-blocks", type=int, default=None, metavar="N",
                   help=f"vision blocks of the embedded model (default {DEFAULT_VISION_BLOCKS}; the real 3B has 32)")
    g.add_argument("--full-depth", action="store_true", help="all 36 text layers and 32 vision blocks")
    g.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), default="bfloat16")
    g.add_argument("--attn", choices=("eager", "sdpa"), default="eager",
                   help="HF attention implementation for both sides (default eager)")
    g.add_argument("--seed", type=int, default=0, help="weights, synthetic page and token ids (default 0)")
    g = parser.add_argument_group("input")
    g.add_argument("--image", metavar="FILE", help="an image file; default: a synthetic page of rendered text")
    g.add_argument("--page-size", default=f"{DEFAULT_PAGE[0]}x{DEFAULT_PAGE[1]}", metavar="WxH",
                   help="size of the synthetic page (default %(default)s)")
    g.add_argument("--prompt", default=None,
                   help="prompt text (used with the checkpoint's tokenizer; without one, seeded token ids)")
    g = parser.add_argument_group("measurement")
    g.add_argument("--max-new-tokens", type=int, default=DEFAULT_MAX_NEW_TOKENS, metavar="N",
                   help="greedy tokens per generate (default %(default)s)")
    g.add_argument("--warmup", type=int, default=DEFAULT_WARMUP, metavar="N", help="warm-up rounds, at least 1: the first one's forward gives the logits compared (default %(default)s)")
    g.add_argument("--repeats", type=int, default=DEFAULT_REPEATS, metavar="N",
                   help="timed runs of each phase; medians are reported (default %(default)s)")
    g.add_argument("--compile", action="store_true",
                   help="run both sides under torch.compile; adds the accuracy section (HF eager, HF and opgym "
                        "compiled: each against HF eager)")
    g.add_argument("--fast", nargs="?", const="default", default=None, metavar="SUBS",
                   help="the opgym side is opgym.patch(model, exact=False): the fast tier, whose bits differ from "
                        "HF's (default: its default substitutions; or a comma-separated list of them); adds the "
                        "accuracy section (HF eager, opgym exact, opgym fast, HF under torch.compile)")
    g.add_argument("--accuracy-tokens", type=int, default=DEFAULT_ACCURACY_TOKENS, metavar="N",
                   help="greedy tokens compared in the accuracy section (default %(default)s)")
    g.add_argument("--accuracy-sides", default=None, metavar="LIST",
                   help="the accuracy section's sides, comma-separated, the first the reference: hf, opgym, fast, "
                        "fast:SUB (opgym exact + that one substitution), each optionally @compile "
                        "(default: from --fast / --compile)")
    g.add_argument("--graph", action="store_true",
                   help="add the graph side (opgym.compile: the exact graph path, measured beside opgym.patch and HF "
                        "eager in the same interleaved rounds; not run under --ablation or --compile). Opt-in: Dynamo's "
                        "captures add minutes to a run of the default model")
    g.add_argument("--no-graph", action="store_true", help=argparse.SUPPRESS)  # the default; kept for old scripts
    g.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    g.add_argument("--ops", default="all",
                   help="fused ops to apply, comma-separated, or 'all' (default %(default)s: every op opgym.patch has)")
    g.add_argument("--threads", type=int, default=None, metavar="N",
                   help="torch intra-op threads (default: torch's own default, what a user's run gets, normally one "
                        "per core; 0 = the same). --threads 1 forces one thread, steadier on a shared machine where "
                        "multi-thread runs swing with the neighbours' load (see docs/RUN.md); both sides always use "
                        "the same count, and the report says which")
    g.add_argument("--ablation", action="store_true",
                   help="also measure each fused op alone and all of them together, each against the baseline in "
                        "the same alternating rounds; adds a table, the JSON key 'ablation' and a PNG (see --plot)")
    g.add_argument("--plot", metavar="FILE",
                   help="where --ablation writes its bar chart (PNG; default: the --report path with suffix .png)")
    g.add_argument("--report", metavar="FILE", help="write the full report as JSON")
    g.add_argument("--no-progress", action="store_true", help="no progress display")
    g.add_argument("--testing-tiny", action="store_true", help=argparse.SUPPRESS)


def parse_page(s: str):
    try:
        w, h = (int(v) for v in s.lower().split("x"))
        if w < 28 or h < 28:
            raise ValueError
        return w, h
    except ValueError:
        raise UsageError(f"--page-size {s!r} is not WxH with both sides >= 28") from None


def check_counts(args) -> None:
    """The checks that need nothing loaded: counts and option combinations."""
    for name, v in (("--max-new-tokens", args.max_new_tokens), ("--repeats", args.repeats)):
        if v < 1:
            raise UsageError(f"{name} must be >= 1")
    if args.max_new_tokens < 2:
        raise UsageError("--max-new-tokens must be >= 2 (decode speed needs a token after the first)")
    if args.warmup < 1:
        raise UsageError("--warmup must be >= 1 (the warm-up forward gives the logits that are compared)")
    if args.accuracy_tokens < 0:
        raise UsageError("--accuracy-tokens must be >= 0")
    if args.accuracy_sides is not None and not (args.fast or args.compile):
        raise UsageError("--accuracy-sides sets the sides of the accuracy section of --fast / --compile; add one")
    if args.fast and args.ablation:
        raise UsageError("--ablation measures the exact ops one by one; it does not combine with --fast")
    if args.model and (args.text_layers or args.vision_blocks or args.full_depth):
        raise UsageError("--text-layers/--vision-blocks/--full-depth apply to the embedded model, not --model")
