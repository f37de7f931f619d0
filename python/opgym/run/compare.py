"""What the sides' outputs say about each other: the prefill logits and greedy tokens (opgym vs the
baseline), each RMSNorm output against HF's on the same input, the --ablation variants' bits, and the
graph side (opgym.compile) against HF eager and opgym.patch.

One comparison of logits and one of tokens serve every section of the report (the agreement, --ablation,
the graph side, the accuracy section): `logits_table` (bits by admission's one rule, max |diff|, argmax per
position) and `token_agreement` (equal tokens, first divergence)."""
from __future__ import annotations

from ..admission import count_differences
from ..numerics import ulp_distance
from .measure import median, pct, spread_entry
from ..ops.rms_norm.integration import find_rms_norms


def rms_exactness(model, inputs, sync) -> dict:
    """One prefill of the patched model in which every RMSNorm call's output is compared with HF's own
    forward (the module class's forward) on the very same input: the kernel's exactness on the
    model's real activations, before any propagation through later layers."""
    import torch

    acc = {"calls": 0, "elements": 0, "differing": 0, "max_abs_diff": 0.0, "max_ulps": 0.0}

    def hook(module, args, out):
        x = args[0]
        ref = type(module).forward(module, x)
        if not isinstance(out, torch.Tensor) or not isinstance(ref, torch.Tensor) or out.shape != ref.shape:
            return
        d = (out.float() - ref.float()).abs()
        acc["calls"] += 1
        acc["elements"] += d.numel()
        n = bits_differing(out, ref)
        if n is None:  # another dtype than HF's: compare the values
            n = int((d != 0).sum())
        if n:
            acc["differing"] += n
            acc["max_abs_diff"] = max(acc["max_abs_diff"], d.max().item())
            if out.dtype == ref.dtype:
                acc["max_ulps"] = max(acc["max_ulps"], float(ulp_distance(out, ref).max().item()))

    handles = [m.register_forward_hook(hook) for _, m in find_rms_norms(model)]
    try:
        with torch.inference_mode():
            model(**inputs, use_cache=True, logits_to_keep=1)
            sync()
    finally:
        for h in handles:
            h.remove()
    acc["compared_with"] = "HF's RMSNorm forward on the same input, every call of one prefill"
    return acc


def bits_differing(a, b) -> int | None:
    """Elements whose bits differ, by admission's one rule (count_differences: -0 and +0 differ, any NaN
    equals any NaN); None when the shapes or dtypes differ. On the A/B's fp32 copies of the logits this is
    the model's own bits too (widening is exact)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return None
    return count_differences(a, b)


def logits_table(ref, other) -> dict:
    """`other`'s logits against `ref`'s (same shape and dtype, last dim = the vocabulary): n elements, how
    many differ (bits_differing), max |diff| and max |ref| (in fp32), and the positions whose argmax agree."""
    assert ref.shape == other.shape and ref.dtype == other.dtype, (ref.shape, other.shape, ref.dtype, other.dtype)
    n = ref.numel()
    r32, o32 = ref.float(), other.float()
    a, b = ref.reshape(-1, ref.shape[-1]).argmax(-1), other.reshape(-1, other.shape[-1]).argmax(-1)
    return {"n": n, "differ": bits_differing(ref, other),
            "max_abs_diff": float((r32 - o32).abs().max()) if n else 0.0,
            "ref_max_abs": float(r32.abs().max()) if n else 0.0,
            "positions": int(a.numel()), "argmax_agree": int((a == b).sum())}


def token_agreement(ref: list, other: list) -> dict:
    """How many of `other`'s greedy tokens equal `ref`'s, and the first step where they differ (None: none;
    a shorter list diverges where it ends)."""
    first = next((i for i, (x, y) in enumerate(zip(ref, other)) if x != y), None)
    if first is None and len(ref) != len(other):
        first = min(len(ref), len(other))
    return {"n": len(ref), "equal": sum(int(x == y) for x, y in zip(ref, other)), "first_divergence": first}


def agreement(base_logits, opt_logits, base_tokens, opt_tokens) -> dict:
    t = logits_table(base_logits, opt_logits)
    b = base_logits
    nz = b != 0
    rel = ((opt_logits[nz] - b[nz]).abs() / b[nz].abs()).max().item() if bool(nz.any()) else 0.0
    return {
        "logits_max_abs_diff": t["max_abs_diff"],
        "logits_max_rel_diff": rel,
        "logits_rel_diff_definition": "max over elements with baseline != 0 of |opgym - baseline| / |baseline| "
                                      "(elementwise; large where a logit is near 0)",
        "logits_max_abs_diff_over_max_abs": t["max_abs_diff"] / max(t["ref_max_abs"], 1e-30),
        "logits_elements": t["n"],
        "logits_shape": list(b.shape),
        "logits_elements_differing": t["differ"],
        "logits_max_abs_baseline": t["ref_max_abs"],
        "logits_argmax_positions_differing": t["positions"] - t["argmax_agree"],
        "logits_compared": "prefill forward, every position, dtype of the model's logits converted to fp32; "
                           "differing: bit patterns (-0 and +0 differ, any NaN equals any NaN)",
        "tokens_identical": base_tokens == opt_tokens,
        "first_divergence": token_agreement(base_tokens, opt_tokens)["first_divergence"],
        "baseline_tokens": base_tokens,
        "opgym_tokens": opt_tokens,
    }


def ablation(base, singles, opt, base_logits, opt_logits) -> dict:
    """The --ablation section: the baseline and each variant (each op alone, then all) with medians,
    spreads, change vs the baseline's median, and whether its prefill logits and greedy tokens are
    the baseline's bit for bit. Each single side's stashed logits are loaded (and dropped) in turn."""
    b = spread_entry(base)
    variants = {}
    for side in (*singles, opt):
        key = side.ops[0] if side is not opt else "all"
        logits = side.logits.load() if side is not opt else opt_logits
        differing = bits_differing(base_logits, logits)
        del logits
        e = {"ops": list(side.ops), **spread_entry(side)}
        e["prefill_change_pct"] = pct(b["prefill_ms"], e["prefill_ms"])
        e["decode_change_pct"] = pct(b["decode_tokens_per_s"], e["decode_tokens_per_s"])
        e["logits_identical"] = differing == 0
        e["logits_elements_differing"] = differing
        e["tokens_identical"] = side.tokens == base.tokens
        c = side.counts
        e["calls"] = {"fused": c["fused"], "fallback": c["fallback"], "reasons": c["reasons"],
                      "per_op": {op: {"fused": v["fused"], "fallback": v["fallback"], "reasons": v["reasons"]}
                                 for op, v in c["ops"].items()}}
        variants[key] = e
    return {
        "baseline": b,
        "variants": variants,
        "measured_as": ("one run: each variant is opgym.patch(model, ops=its ops); in each timed round every "
                        "variant runs next to a baseline run (baseline first in even rounds, variant first in odd "
                        "ones), so the baseline has repeats x variants runs; change_pct = (variant median - "
                        "baseline median) / baseline median; logits: the warm-up's full-logits prefill, every "
                        "position, compared bit for bit; tokens: the timed greedy generates"),
    }


def _ratio(v, b):
    return v / b if v is not None and b not in (None, 0) else None


def graph_section(base, graph, opt, base_logits, graph_logits, patch_logits_differing: int) -> dict:
    """The report's `graph`: the exact graph path (opgym.compile) as a third side, timed in the same interleaved
    rounds as opgym.patch (each next to a baseline run): prefill and decode-time ratios to HF eager (the
    baseline's median over all its runs) beside opgym.patch's, its logits (the warm-up's full-logits forward,
    every position) and greedy tokens against HF's bit for bit, the graphs Dynamo compiled (after the warm-up,
    and in all: more in all is a recompilation during the timed rounds), the first calls' wall times (the
    graph side's capture, rewrite and probes happen there) beside HF eager's same calls, the regions replaced
    and left as captured per op, and the calls fused / fallen back as the patched side counts them."""
    h = graph.handle
    b, g, o = spread_entry(base), spread_entry(graph), spread_entry(opt)
    differing = bits_differing(base_logits, graph_logits)
    first = token_agreement(base.tokens or [], graph.tokens or [])["first_divergence"]
    fc, bfc = graph.first_calls, base.first_calls
    c = graph.counts
    return {
        **g,
        "generate_s": median(graph.totals),
        "time_to_first_token_ms": median(graph.ttfts),
        "peak_memory_mb": max(graph.peaks) if graph.peaks else None,
        "prefill_ratio_vs_hf": _ratio(g["prefill_ms"], b["prefill_ms"]),
        "decode_time_ratio_vs_hf": _ratio(b["decode_tokens_per_s"], g["decode_tokens_per_s"]),
        "patch_prefill_ratio_vs_hf": _ratio(o["prefill_ms"], b["prefill_ms"]),
        "patch_decode_time_ratio_vs_hf": _ratio(b["decode_tokens_per_s"], o["decode_tokens_per_s"]),
        "logits_identical": differing == 0,
        "logits_elements_differing": differing,
        "tokens_identical": graph.tokens == base.tokens,
        "first_divergence": first,
        "tokens": graph.tokens,
        "patch_logits_identical": patch_logits_differing == 0,
        "patch_tokens_identical": opt.tokens == base.tokens,
        "graphs": h.graphs,
        "graphs_after_warmup": graph.graphs_after_warmup,
        "recompiles_in_timed_rounds": (h.graphs - graph.graphs_after_warmup
                                       if graph.graphs_after_warmup is not None else None),
        "compile_setup_ms": graph.setup_ms,
        "first_calls_ms": dict(fc),
        "baseline_first_calls_ms": dict(bfc),
        "first_call_compile_ms": (fc["forward_ms"] - bfc["forward_ms"]
                                  if fc.get("forward_ms") is not None and bfc.get("forward_ms") is not None else None),
        "unchecked_compiles": h.unchecked,  # calls that compiled a program no check foresaw, left unchecked
        "refused": h.refused,  # why a checked call refused the graph path (None: served)
        "islands": dict(h.islands.why),  # module classes run as HF's own code inside the compiled model
        "replaced": dict(h.replaced),
        "gqa_form": h.forms(),  # every form's calls (grouped-query, windows), under its first one's name
        "skipped": {op: dict(why) for op, why in h.skipped.items()},
        "calls": {"fused": c["fused"], "fallback": c["fallback"], "reasons": c["reasons"],
                  "per_op": {op: {"fused": v["fused"], "fallback": v["fallback"], "reasons": v["reasons"]}
                             for op, v in c["ops"].items()}},
        "measured_as": ("one process, one model: opgym.compile(model) once, its compiled call dropped whenever "
                        "another side runs and put back after (Dynamo's graphs kept); each timed round runs it next "
                        "to a baseline run as the opgym side is (baseline first in even rounds), so the baseline's "
                        "medians are over both pairings; ratios: side median / HF eager median (prefill ms; decode "
                        "time per token = HF tokens/s / side tokens/s); first_call_compile_ms: the graph side's "
                        "first full-logits forward (Dynamo capture, opgym's rewrite and probes, the first-call "
                        "check's eager forward, the run) minus HF eager's first one; logits: the warm-up's "
                        "full-logits forward, every position, bit for bit; tokens: the timed greedy generates"),
    }
