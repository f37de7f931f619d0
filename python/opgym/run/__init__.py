"""`opgym run`: the whole-network A/B of Qwen2.5-VL with and without opgym.

One model object, one set of inputs, two sides: the baseline (HF's own modules, eager PyTorch) and
the same model patched by `opgym.patch` (undone whenever the baseline runs). Each side is measured
the same way:

    warm-up      `--warmup` x (one full-logits forward, one prefill, one greedy generate); the first
                 warm-up forward's logits (every position) are kept for the agreement check
    prefill      `--repeats` x one forward over the whole prompt (vision encoder + text, KV cache on,
                 logits for the last position only: what generate's first step does); median
    decode       `--repeats` x generate(do_sample=False, max_new_tokens = min_new_tokens = N);
                 the time of each new token is taken from a streamer, so decode tokens/s is
                 (N - 1) / (time of token N - time of token 1): the prefill is not in it; median
    profile      one more prefill under torch.profiler; for every op opgym.patch applies (SUPPORTED_OPS),
                 each call of its sites (the modules its integration's sites(model) names) wrapped in a
                 record_function range: the op's share = those ranges (self + children) / the whole
                 forward's range, on both sides, and on the opgym side the self time of its torch
                 operators too (run/profile.py); RMSNorm's figures are the rms_norm op's
    memory       CPU: the process's peak resident set (VmHWM from /proc/self/status, weights included),
                 reset through /proc/self/clear_refs before each timed prefill+generate; the side's
                 peak is the largest; CUDA: torch.cuda.max_memory_allocated
    exactness    one prefill of the patched model in which each RMSNorm output is compared with HF's
                 forward on the same input
    op counts    one generate of two tokens under torch.profiler: the top-level torch ops (ops with no
                 op above them: each one dispatch, on a GPU in eager mode each a launch) of the decode
                 step, in all and inside the first text decoder layer

The timed rounds alternate the sides (baseline-opgym, opgym-baseline, ...) so that both see the same
machine; under --compile the sides run one after the other instead.

The graph side (with --graph; not under --ablation or --compile): the same model through the exact
graph path, opgym.compile(model), compiled once and switched like the patched side (its compiled call
dropped while another side runs, Dynamo's graphs kept). It is warmed up and timed as the opgym side is, in
the same rounds, each of its runs next to a baseline run; the report's `graph` section (compare.graph_section)
gives its prefill and decode-time ratios to HF eager beside opgym.patch's, its logits and greedy tokens
against HF's bit for bit, the number of graphs Dynamo compiled (and any recompilation in the timed rounds),
and its first calls' wall times against HF eager's (the capture, rewrite and probes happen there).

--fast makes the opgym side opgym.patch(model, exact=False): the fast tier, whose bits differ from HF's.
--fast and --compile add the accuracy section (run/accuracy.py): HF eager as the reference, and opgym
exact, opgym fast, HF and opgym under torch.compile, each measured against it alike (ulps of the logits,
argmax, greedy tokens, teacher-forced agreement, interleaved prefill ratios with the GEMM floor).

--ablation adds one patched side per op alone (opgym.patch(model, ops=(op,))); each round then runs
every variant next to a baseline run, alternating as above, and the report gets an "ablation" section
(medians, min..max, change vs the baseline, bit-identical logits and tokens) and a PNG bar chart.

Threads: torch's default (what a user's run gets) unless --threads N forces N; the report says which.

Bad input (a missing or malformed --model, an image that cannot be read, a checkpoint that is not
Qwen2.5-VL, cuda without CUDA) ends with one line naming the problem and exit code 2.

The jobs are this package's modules: options, workload (model, inputs), sides (A/B switching),
measure (timing, memory), profile, compare (logits, tokens, exactness), environment, report, progress.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from .options import TINY_WIDTHS, UsageError, add_arguments, check_counts, parse_page  # noqa: E402

__all__ = ["TINY_WIDTHS", "UsageError", "add_arguments", "main"]


def main(args) -> int:
    from ..models import ImageLoadError, ModelLoadError

    try:
        return _main(args)
    except (UsageError, ImageLoadError, ModelLoadError) as e:
        print(f"opgym run: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("opgym run: interrupted", file=sys.stderr)
        return 130


def _main(args) -> int:
    from .. import models as M
    from .environment import load_opgym
    from .progress import Progress

    ops = tuple(o.strip() for o in args.ops.split(",") if o.strip())
    if not ops:
        raise UsageError("--ops names no op")
    all_ops = ops == ("all",)
    check_counts(args)
    page = parse_page(args.page_size)
    # Input problems first, before anything slow.
    image = M.load_image(args.image) if args.image else None
    if args.model:
        p = Path(args.model)
        if not p.is_dir():
            raise UsageError(f"--model {args.model}: " + ("no such directory" if not p.exists() else "not a directory"))

    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda: this torch has no CUDA device available")
    if args.threads is not None and args.threads < 0:
        raise UsageError("--threads must be >= 0")
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.plot and not args.ablation:
        raise UsageError("--plot is the chart of --ablation; add --ablation")
    opgym = load_opgym()
    OPS = opgym.SUPPORTED_OPS  # the ops opgym.patch applies (those of the table with a model integration)

    if all_ops:
        ops = OPS
    unknown = [o for o in ops if o not in OPS]
    if unknown:
        raise UsageError(f"--ops: unknown op(s) {', '.join(unknown)}; this opgym supports {', '.join(OPS)}")
    if args.ablation and len(ops) < 2:
        raise UsageError(f"--ablation compares each op alone with all of them: --ops {args.ops} names one op")
    fast = _fast_selection(args.fast)
    dtype = getattr(torch, args.dtype)

    n_var = len(ops) + 1 if args.ablation else 1  # the all-ops side, plus each op alone under --ablation
    n_var += 1 if graph_side(args) else 0  # the graph side (opgym.compile)
    steps = 2 + (n_var + 1) * args.warmup + 4 * n_var * args.repeats + 2 + 2
    if args.fast or args.compile:
        from .accuracy import section_steps

        steps += section_steps(args)
    progress = Progress(steps, enabled=not args.no_progress)
    try:
        return _run(args, M, opgym, ops, page, image, dtype, progress, fast)
    finally:
        progress.close()


def graph_side(args) -> bool:
    """Whether the run has the graph side (opgym.compile): in the plain A/B and under --fast, unless
    --graph; not under --ablation (each op alone) nor --compile (every side under torch.compile)."""
    return bool(args.graph) and not (args.ablation or args.compile)


def _fast_selection(value) -> tuple | None:
    """--fast's substitutions: None without --fast, the tier's defaults for a bare --fast."""
    if value is None:
        return None
    from .. import fast_tier

    if value == "default":
        return fast_tier.default_names()
    names = tuple(n.strip() for n in value.split(",") if n.strip())
    unknown = [n for n in names if n not in fast_tier.names()]
    if unknown or not names:
        raise UsageError(f"--fast {value}: unknown substitution(s) {', '.join(unknown) or '(none named)'}; "
                         f"the fast tier has {', '.join(fast_tier.names())}")
    return tuple(n for n in fast_tier.names() if n in names)


def _run(args, M, opgym, ops, page, image, dtype, progress, fast=None) -> int:
    import torch

    from . import compare, report
    from .environment import environment
    from .measure import PeakMemory, measure, side_result, syncer
    from .profile import op_sites
    from .sides import Sides, calls_section
    from .workload import build_workload

    device = args.device
    model, inputs, config_out = build_workload(args, M, ops, page, image, dtype, progress)
    config_out["fast"] = list(fast) if fast is not None else None

    # --- the sides on one model: the baseline as built/loaded; opgym = patched (undone after), and
    # under --ablation one more patched side per op alone
    sides = Sides(model, opgym, args)
    base = sides.baseline()
    opt = sides.patched("opgym", ops, True, fast=fast)
    singles = [sides.patched(f"opgym {op} only", (op,), False) for op in ops] if args.ablation else []
    graph = [sides.graph("graph (opgym.compile)")] if graph_side(args) else []
    mem = PeakMemory(device)
    sites = op_sites(model)  # each op's sites, taken on the model as built (both sides label the same modules)
    measure(model, inputs, args, device, progress, base, [*singles, opt, *graph], mem, sites,
            profiled_sides=(base, opt))

    progress.step("opgym: each RMSNorm output against HF's on the same input (one prefill, uncompiled)")
    h = opgym.patch(model, ops=ops)
    try:
        exactness = compare.rms_exactness(model, inputs, syncer(device))
    finally:
        h.undo()
    progress.done()

    base_r, opt_r = side_result(base, mem), side_result(opt, mem)
    opt_r["patch_ms"] = sides.patch_ms
    calls = calls_section(opt, model, args.compile)

    progress.step("comparing outputs")
    base_logits, opt_logits = base.logits.load(), opt.logits.load()
    agreement = compare.agreement(base_logits, opt_logits, base.tokens, opt.tokens)
    agreement["rms_norm_outputs"] = exactness
    ablation = compare.ablation(base, singles, opt, base_logits, opt_logits) if args.ablation else None
    graph_out = None
    if graph:
        graph_out = compare.graph_section(base, graph[0], opt, base_logits, graph[0].logits.load(),
                                          agreement["logits_elements_differing"])
    del base_logits, opt_logits
    progress.done()
    accuracy = None
    if args.fast or args.compile:
        from .accuracy import section

        accuracy = section(model, inputs, args, ops, fast or (), progress)
    progress.close()

    env = environment(device)
    env["threads"] = torch.get_num_threads()
    env["threads_source"] = f"--threads {args.threads}" if args.threads else "torch's default"
    out = {
        "config": config_out,
        "environment": env,
        "baseline": base_r,
        "opgym": opt_r,
        "agreement": agreement,
        "calls": calls,
    }
    if graph_out is not None:
        out["graph"] = graph_out
    if accuracy is not None:
        out["accuracy"] = accuracy
    if ablation is not None:
        plot = args.plot or (str(Path(args.report).with_suffix(".png")) if args.report else None)
        ablation["plot"] = plot
        out["ablation"] = ablation
    report.emit(out, args)
    return 0
