"""Accuracy of inexact sides against HF eager: the error table an opt-in fast tier (and HF under
torch.compile) reports, so that a user compares like with like. Prototype for issue 25.

A *side* is a way to run one model object: `on()` puts it in place, `off()` takes it back out (HF
eager itself is the side that does nothing). For each side, against the reference side:

    logits   one forward with every position's logits (use_cache=False): ulp distribution in the
             logits' own dtype (numerics.ulp_distance), how many differ, max |diff|, argmax agreement
             per position
    tokens   greedy generate of N tokens (do_sample=False, min = max = N): equal count, first
             divergence (index of the first differing new token, None when all equal) with the
             reference's own top-1 margin (ulps) at that step, and teacher-forced top-1 agreement: each
             side fed the reference's tokens in one forward, its argmax compared step by step (the
             per-step error without compounding; the reference's own row shows how far its full forward
             agrees with its incremental decode)
    prefill  one forward over the whole prompt with logits for the last position only (what
             generate's first step does), `repeats` times, the sides interleaved in one process
             (round r runs the sides in order, reversed on odd rounds); wall and process-CPU medians
             and the ratio to the reference's

Substitutions (`SUBSTITUTIONS`; each returns an undo), the inexact candidates of the fast tier:
    patch_embed_linear     the vision patch embedding's Conv3d as one F.linear over the flattened patch
    sdpa                   every attention through torch SDPA (model.set_attn_implementation)
    gate_up_merged         each MLP's gate and up projections as one GEMM (weights concatenated), split
    rms_norm_one_rounding  RMSNorm's weight applied in fp32 and rounded once (HF rounds the normalized
                           value to the input dtype first, then multiplies in that dtype)
and `compiled_side` (torch.compile of model.forward, dynamic=True, as `opgym run --compile`).

`python -m opgym.accuracy [--tokens 64] [--repeats 5] [--threads N] [--sides ...] [--json out.json]` runs the table
on the embedded Qwen2.5-VL-3B architecture (4+4 layers, a 448x448 synthetic page, bf16).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F

from .numerics import ulp_distance

ULP_BUCKETS = ((0, 0), (1, 1), (2, 2), (3, 4), (5, 16), (17, 256), (257, None))


# ---------------------------------------------------------------------------------- the measures
def error_table(ref: torch.Tensor, other: torch.Tensor) -> dict:
    """ulp distribution, counts and argmax agreement of `other` against `ref` (same dtype and shape,
    last dim = vocabulary)."""
    assert ref.shape == other.shape and ref.dtype == other.dtype, (ref.shape, other.shape, ref.dtype, other.dtype)
    d = ulp_distance(ref, other).reshape(-1)
    n = d.numel()
    out = {"n": n, "differ": int((d != 0).sum())}
    out["differ_share"] = out["differ"] / n if n else 0.0
    out["ulp_max"] = int(d.max()) if n else 0
    buckets = {}
    for lo, hi in ULP_BUCKETS:
        sel = (d >= lo) if hi is None else ((d >= lo) & (d <= hi))
        buckets[f"{lo}" if lo == hi else (f">={lo}" if hi is None else f"{lo}-{hi}")] = int(sel.sum())
    out["ulp_buckets"] = buckets
    nz = d[d != 0]
    if nz.numel():
        q = torch.quantile(nz[:1 << 24].double(), torch.tensor([0.5, 0.99], dtype=torch.double))
        out["ulp_median_of_differing"], out["ulp_p99_of_differing"] = float(q[0]), float(q[1])
    r32, o32 = ref.float(), other.float()
    out["max_abs_diff"] = float((r32 - o32).abs().max()) if n else 0.0
    out["ref_max_abs"] = float(r32.abs().max()) if n else 0.0
    a, b = ref.reshape(-1, ref.shape[-1]).argmax(-1), other.reshape(-1, other.shape[-1]).argmax(-1)
    out["positions"] = int(a.numel())
    out["argmax_agree"] = int((a == b).sum())
    return out


def token_agreement(ref: list, other: list) -> dict:
    first = next((i for i, (x, y) in enumerate(zip(ref, other)) if x != y), None)
    if first is None and len(ref) != len(other):
        first = min(len(ref), len(other))
    return {"n": len(ref), "equal": sum(int(x == y) for x, y in zip(ref, other)), "first_divergence": first}


# ---------------------------------------------------------------------------------- substitutions
def _swap_forward(module, fn, undo: list) -> None:
    had = "forward" in module.__dict__
    old = module.__dict__.get("forward")
    module.forward = fn

    def restore():
        if had:
            module.forward = old
        else:
            del module.forward
    undo.append(restore)


def _run_undo(undo: list) -> Callable[[], None]:
    def run():
        while undo:
            undo.pop()()
    return run


def sub_patch_embed_linear(model):
    """Qwen2.5-VL's patch embedding (Conv3d, kernel == stride, no bias) as one GEMM: [P, C*T*H*W] x W^T."""
    undo = []
    for m in model.modules():
        proj = getattr(m, "proj", None)
        if (type(m).__name__.endswith("PatchEmbed") and isinstance(proj, torch.nn.Conv3d) and proj.bias is None
                and tuple(proj.kernel_size) == tuple(proj.stride) and proj.padding == (0, 0, 0)):
            def fwd(hidden_states, _m=m):
                w = _m.proj.weight
                w2 = w.reshape(w.shape[0], -1)
                return F.linear(hidden_states.reshape(-1, w2.shape[1]).to(w.dtype), w2)
            _swap_forward(m, fwd, undo)
    return _run_undo(undo)


def sub_sdpa(model):
    """Every attention through torch's SDPA (text and vision), back to the model's own afterwards."""
    before = model.config._attn_implementation
    model.set_attn_implementation("sdpa")
    return lambda: model.set_attn_implementation(before)


def sub_gate_up_merged(model):
    """act(gate(x)) * up(x) with gate and up as one F.linear (concatenated weights, bias when there is
    one), no probe of the bits."""
    undo = []
    for m in model.modules():
        g, u, d = (getattr(m, k, None) for k in ("gate_proj", "up_proj", "down_proj"))
        if not all(isinstance(x, torch.nn.Linear) for x in (g, u, d)) or not hasattr(m, "act_fn"):
            continue
        w = torch.cat([g.weight, u.weight], 0)
        b = torch.cat([g.bias, u.bias], 0) if g.bias is not None and u.bias is not None else None
        if (g.bias is None) != (u.bias is None):
            continue
        n = g.out_features

        def fwd(x, _m=m, _w=w, _b=b, _n=n):
            gu = F.linear(x, _w, _b)
            return _m.down_proj(_m.act_fn(gu[..., :_n]) * gu[..., _n:])
        _swap_forward(m, fwd, undo)
    return _run_undo(undo)


def sub_rms_norm_one_rounding(model):
    """RMSNorm with the weight applied in fp32 and one rounding to the input dtype."""
    undo = []
    for m in model.modules():
        if not type(m).__name__.endswith("RMSNorm") or not hasattr(m, "weight"):
            continue
        eps = getattr(m, "variance_epsilon", getattr(m, "eps", None))
        if eps is None:
            continue

        def fwd(hidden_states, _m=m, _eps=eps):
            dt = hidden_states.dtype
            h = hidden_states.float()
            h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + _eps)
            return (_m.weight.float() * h).to(dt)
        _swap_forward(m, fwd, undo)
    return _run_undo(undo)


SUBSTITUTIONS = {
    "patch_embed_linear": sub_patch_embed_linear,
    "sdpa": sub_sdpa,
    "gate_up_merged": sub_gate_up_merged,
    "rms_norm_one_rounding": sub_rms_norm_one_rounding,
}


# ---------------------------------------------------------------------------------- sides
@dataclass
class Side:
    name: str
    on: Callable[[], None] = lambda: None
    off: Callable[[], None] = lambda: None
    logits: torch.Tensor | None = None
    tokens: list | None = None
    forced: list | None = None
    wall_ms: list = field(default_factory=list)
    cpu_ms: list = field(default_factory=list)


def substitution_side(model, name: str, subs: tuple, opgym_patch: bool = False) -> Side:
    """A side applying `subs` (names in SUBSTITUTIONS), after opgym.patch(model) when opgym_patch."""
    state = {}

    def on():
        undos = []
        if opgym_patch:
            import opgym
            h = opgym.patch(model)
            undos.append(h.undo)
        for s in subs:
            undos.append(SUBSTITUTIONS[s](model))
        state["undo"] = undos

    def off():
        for u in reversed(state.pop("undo", [])):
            u()
    return Side(name, on, off)


def compiled_side(model, name: str = "HF torch.compile", opgym_patch: bool = False, **compile_kwargs) -> Side:
    """model.forward compiled once (dynamic=True unless given) and reused: on() installs it, off() removes
    it; dynamo's guards keep the graphs across switches, so interleaving does not recompile."""
    compile_kwargs.setdefault("dynamic", True)
    state = {"fn": None}

    def on():
        if opgym_patch:
            import opgym
            state["h"] = opgym.patch(model)
        if state["fn"] is None:
            state["fn"] = torch.compile(model.forward, **compile_kwargs)
        model.forward = state["fn"]

    def off():
        if "forward" in model.__dict__:
            del model.forward
        h = state.pop("h", None)
        if h is not None:
            h.undo()
    return Side(name, on, off)


# ---------------------------------------------------------------------------------- the run
def margins_ulp(scores, dtype) -> list:
    """Per generated step, the reference's top-1 minus top-2 logit in ulps of the logits' own dtype
    (generate hands out fp32 copies of them; the cast back is exact): how close each greedy choice was
    to a tie (1 = adjacent values)."""
    out = []
    for sc in scores:
        top = sc[0].to(dtype).topk(2)
        a, b = top.values[0:1], top.values[1:2]
        out.append(int(ulp_distance(a, b)[0]))
    return out


def teacher_forced_argmax(model, inputs: dict, tokens: list) -> list:
    """Argmax of the next-token logits at each of the len(tokens) continuation steps, with `tokens` (a
    greedy continuation, normally the reference's) fed as the input instead of the side's own: the
    per-step error without compounding. One full forward over prompt + tokens[:-1] (use_cache=False)."""
    if not tokens:
        return []
    ids = torch.cat([inputs["input_ids"], torch.tensor([tokens[:-1]], dtype=inputs["input_ids"].dtype)], 1)
    kw = dict(inputs, input_ids=ids, attention_mask=torch.ones_like(ids))
    logits = model(**kw, use_cache=False, logits_to_keep=len(tokens)).logits
    assert logits.shape[1] == len(tokens), logits.shape
    return logits[0].argmax(-1).tolist()


def evaluate(model, inputs: dict, sides: list, n_tokens: int = 64, repeats: int = 5,
             log: Callable[[str], None] = lambda s: None) -> dict:
    """The table for every side against sides[0] (the reference, normally HF eager). repeats=0: no timing."""
    gen = dict(max_new_tokens=n_tokens, min_new_tokens=n_tokens, do_sample=False, num_beams=1)
    n_prompt = inputs["input_ids"].shape[1]
    ref_margins = None

    def prefill():
        return model(**inputs, use_cache=True, logits_to_keep=1)

    with torch.inference_mode():
        for i, s in enumerate(sides):
            log(f"{s.name}: full-logits forward, {n_tokens} greedy tokens, teacher-forced forward, warm-up prefill")
            s.on()
            try:
                s.logits = model(**inputs, use_cache=False).logits.detach().clone()
                if n_tokens:
                    g = model.generate(**inputs, **gen, output_scores=True, return_dict_in_generate=True)
                    s.tokens = g.sequences[0, n_prompt:].tolist()
                    if i == 0:
                        ref_margins = margins_ulp(g.scores, s.logits.dtype)
                    s.forced = teacher_forced_argmax(model, inputs, sides[0].tokens)
                else:
                    s.tokens, s.forced = [], []
                if repeats:
                    prefill()
            finally:
                s.off()
        for r in range(repeats):
            log(f"prefill round {r + 1}/{repeats}")
            for s in (sides if r % 2 == 0 else list(reversed(sides))):
                s.on()
                try:
                    c0, t0 = time.process_time(), time.perf_counter()
                    prefill()
                    s.wall_ms.append((time.perf_counter() - t0) * 1e3)
                    s.cpu_ms.append((time.process_time() - c0) * 1e3)
                finally:
                    s.off()
    ref = sides[0]
    rw = statistics.median(ref.wall_ms) if repeats else None
    rc = statistics.median(ref.cpu_ms) if repeats else None
    rows = []
    for s in sides:
        w = statistics.median(s.wall_ms) if repeats else None
        c = statistics.median(s.cpu_ms) if repeats else None
        tk = token_agreement(ref.tokens, s.tokens)
        if tk["first_divergence"] is not None and ref_margins and tk["first_divergence"] < len(ref_margins):
            tk["ref_margin_ulp_at_divergence"] = ref_margins[tk["first_divergence"]]
        tf = sum(int(x == y) for x, y in zip(s.forced, ref.tokens))
        rows.append({"side": s.name, "logits": error_table(ref.logits, s.logits), "tokens": tk,
                     "teacher_forced_agree": tf, "teacher_forced_n": len(ref.tokens),
                     "prefill_wall_ms": w, "prefill_cpu_ms": c,
                     "wall_ratio": w / rw if repeats else None, "cpu_ratio": c / rc if repeats else None,
                     "prefill_wall_ms_all": s.wall_ms, "prefill_cpu_ms_all": s.cpu_ms})
    return {"reference": ref.name, "prompt_tokens": n_prompt, "repeats": repeats, "rows": rows,
            "ref_margins_ulp": ref_margins}


def markdown(result: dict) -> str:
    """The table as markdown: one row per side."""
    names = [b for b in result["rows"][0]["logits"]["ulp_buckets"]]
    timed = result["repeats"] > 0
    head = ("| side | " + ("prefill wall ms (x ref) | prefill CPU ms (x ref) | " if timed else "")
            + "logits differing | " + " | ".join(f"{b} ulp" for b in names)
            + " | max abs diff | argmax agree | greedy equal | first divergence (ref margin, ulp) "
              "| teacher-forced top-1 agree |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in result["rows"]:
        lg, tk = r["logits"], r["tokens"]
        fd = tk["first_divergence"]
        fd_s = "-" if fd is None else (f"{fd} ({tk['ref_margin_ulp_at_divergence']})"
                                       if "ref_margin_ulp_at_divergence" in tk else f"{fd}")
        t = (f"{r['prefill_wall_ms']:.0f} ({r['wall_ratio']:.3f}) | {r['prefill_cpu_ms']:.0f} ({r['cpu_ratio']:.3f}) | "
             if timed else "")
        lines.append(
            f"| {r['side']} | {t}{lg['differ']:,} ({100 * lg['differ_share']:.1f}%) | "
            + " | ".join(f"{lg['ulp_buckets'][b]:,}" for b in names)
            + f" | {lg['max_abs_diff']:.3g} | {lg['argmax_agree']}/{lg['positions']} | {tk['equal']}/{tk['n']} | "
              f"{fd_s} | {r['teacher_forced_agree']}/{r['teacher_forced_n']} |")
    m = result.get("ref_margins_ulp")
    if m:
        lines.append(f"\nreference top-1 margins over the {len(m)} greedy steps (ulps): min {min(m)}, "
                     f"steps within 2 ulps: {sum(1 for x in m if x <= 2)}, within 8: {sum(1 for x in m if x <= 8)}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------- CLI (prototype)
SIDE_SPECS = {
    # name: (kind, substitutions, opgym.patch)
    "hf_eager": ("subs", (), False),
    "hf_compile": ("compile", (), False),
    "patch_embed_linear": ("subs", ("patch_embed_linear",), False),
    "sdpa": ("subs", ("sdpa",), False),
    "gate_up_merged": ("subs", ("gate_up_merged",), False),
    "rms_norm_one_rounding": ("subs", ("rms_norm_one_rounding",), False),
    "all_four": ("subs", tuple(SUBSTITUTIONS), False),
    "opgym": ("subs", (), True),
    "opgym+patch_embed_linear+sdpa": ("subs", ("patch_embed_linear", "sdpa"), True),
    "hf_compile+sdpa": ("compile_sdpa", (), False),
    "opgym_compile": ("compile", (), True),
}


def make_sides(model, names) -> list:
    sides = []
    for n in names:
        kind, subs, og = SIDE_SPECS[n]
        if kind == "compile":
            sides.append(compiled_side(model, n, opgym_patch=og))
        elif kind == "compile_sdpa":
            sides.append(_compile_with(model, n, "sdpa"))
        else:
            sides.append(substitution_side(model, n, subs, og))
    return sides


def _compile_with(model, name, sub):
    inner = compiled_side(model, name)
    state = {}

    def on():
        state["u"] = SUBSTITUTIONS[sub](model)
        inner.on()

    def off():
        inner.off()
        state.pop("u")()
    return Side(name, on, off)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m opgym.accuracy", description=__doc__.split("\n")[0])
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--text-layers", type=int, default=4)
    p.add_argument("--vision-blocks", type=int, default=4)
    p.add_argument("--page", type=int, default=448)
    p.add_argument("--attn", choices=("eager", "sdpa"), default="eager", help="the model's (reference's) attention")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--sides", default=",".join(SIDE_SPECS), help="comma-separated, first = reference")
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    from . import models as M

    if a.threads:
        torch.set_num_threads(a.threads)
    names = [s for s in a.sides.split(",") if s]
    unknown = [n for n in names if n not in SIDE_SPECS]
    if unknown:
        print(f"unknown sides {unknown}; known: {', '.join(SIDE_SPECS)}", file=sys.stderr)
        return 2
    cfg = M.qwen2_5_vl_3b_config(text_layers=a.text_layers, vision_blocks=a.vision_blocks)
    model = M.build_model(cfg, attn_implementation=a.attn)
    inputs = M.make_inputs(cfg, image=M.synthetic_page(a.page, a.page))
    t0 = time.perf_counter()
    res = evaluate(model, inputs, make_sides(model, names), a.tokens, a.repeats,
                   log=lambda s: print(f"[{time.perf_counter() - t0:7.1f}s] {s}", file=sys.stderr, flush=True))
    res.update({"attn": a.attn, "threads": torch.get_num_threads(), "text_layers": a.text_layers,
                "vision_blocks": a.vision_blocks, "page": a.page, "torch": torch.__version__})
    print(markdown(res))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
