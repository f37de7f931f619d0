"""The accuracy section of `opgym run --fast` / `--compile`: every side against HF eager, measured alike.

A *side* is a way to run the one model object: `on()` puts it in place, `off()` takes it back out.
HF eager (the model as built, reference) is the side that does nothing; the others are opgym.patch
(exact), opgym.patch(exact=False) (the fast tier), and any of these under torch.compile. For each side,
against the reference:

    logits   one forward with every position's logits (use_cache=False): ulp distribution in the
             logits' own dtype (numerics.ulp_distance), how many differ, max |diff|, argmax agreement
             per position
    tokens   greedy generate of N tokens (do_sample=False, min = max = N): how many equal, the first
             divergence with the reference's own top-1 margin (ulps) at that step, and teacher-forced
             top-1 agreement: the side fed the reference's tokens in one forward, its argmax compared
             step by step (the per-step error without compounding; the reference's own row shows how
             far its full forward agrees with its incremental decode)
    prefill  one forward over the prompt with the last position's logits (generate's first step),
             `repeats` rounds, the sides interleaved in one process (round r runs them in order,
             reversed on odd rounds): wall and process-CPU medians, each as a ratio to the reference's
    floor    one profiled prefill per side: the self time of its GEMMs (torch.profiler: aten::mm,
             addmm, bmm, baddbmm and oneDNN's linear ops), the time the side could not go below without
             faster GEMMs; the patch embedding's convolution and the fused attention kernel apart

Why greedy tokens are not the only verdict: on a model with seeded random weights the reference's own
top-1 margin is often 1 ulp or an exact tie, where any change of rounding (torch.compile's included)
may pick the other token; the margins at the divergence, and the teacher-forced agreement, say whether
a side is worse than a coin flip at a tie.
"""
from __future__ import annotations

import statistics
import time
from typing import Callable

import torch

from ..numerics import ulp_distance
from .compare import logits_table, token_agreement
from .sides import Side

ULP_BUCKETS = ((0, 0), (1, 1), (2, 2), (3, 4), (5, 16), (17, 256), (257, None))
GEMM_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::_addmm_activation",
            "mkldnn::_linear_pointwise", "aten::mkldnn_linear", "mkldnn::_linear_pointwise.binary")
CONV_OPS = ("aten::mkldnn_convolution", "aten::convolution_overrideable", "aten::slow_conv3d_forward",
            "aten::_slow_conv2d_forward")
ATTN_OPS = ("aten::_scaled_dot_product_flash_attention_for_cpu", "aten::_scaled_dot_product_flash_attention",
            "aten::_scaled_dot_product_efficient_attention", "aten::_scaled_dot_product_attention_math")


# ---------------------------------------------------------------------------------- the measures
def error_table(ref: torch.Tensor, other: torch.Tensor) -> dict:
    """compare.logits_table of `other` against `ref` (same dtype and shape, last dim = vocabulary) with the
    ulp distribution in their own dtype. `differ` counts bit patterns (admission's rule), the buckets
    ulps: a -0 / +0 pair is 0 ulps apart and differs."""
    t = logits_table(ref, other)
    d = ulp_distance(ref, other).reshape(-1)
    n = t["n"]
    out = {"n": n, "differ": t["differ"]}
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
    for k in ("max_abs_diff", "ref_max_abs", "positions", "argmax_agree"):
        out[k] = t[k]
    return out


def margins_ulp(scores, dtype) -> list:
    """Per generated step, the reference's top-1 minus top-2 logit in ulps of the logits' own dtype
    (generate hands out fp32 copies of them; the cast back is exact): how close each greedy choice was
    to a tie (0 = a tie that argmax breaks by index, 1 = adjacent values)."""
    out = []
    for sc in scores:
        top = sc[0].to(dtype).topk(2)
        out.append(int(ulp_distance(top.values[0:1], top.values[1:2])[0]))
    return out


def teacher_forced_argmax(model, inputs: dict, tokens: list) -> list:
    """Argmax of the next-token logits at each of the len(tokens) continuation steps, with `tokens` (the
    reference's greedy continuation) fed as the input instead of the side's own: the per-step error
    without compounding. One full forward over prompt + tokens[:-1] (use_cache=False)."""
    if not tokens:
        return []
    ids = torch.cat([inputs["input_ids"],
                     torch.tensor([tokens[:-1]], dtype=inputs["input_ids"].dtype, device=inputs["input_ids"].device)], 1)
    kw = dict(inputs, input_ids=ids, attention_mask=torch.ones_like(ids))
    logits = model(**kw, use_cache=False, logits_to_keep=len(tokens)).logits
    assert logits.shape[1] == len(tokens), logits.shape
    return logits[0].argmax(-1).tolist()


def gemm_floor(prefill: Callable[[], object]) -> dict:
    """One prefill under torch.profiler: self time (ms) of its GEMMs, of the convolutions and of the
    fused attention kernels (the names in GEMM_OPS, CONV_OPS, ATTN_OPS), with calls per op."""
    from .profile import profiling

    with profiling() as prof:
        t0 = time.perf_counter()
        prefill()
        wall = (time.perf_counter() - t0) * 1e3
    ka = {e.key: e for e in prof.key_averages()}

    def total(names):
        return sum(ka[n].self_cpu_time_total for n in names if n in ka) / 1e3

    return {"gemm_ms": total(GEMM_OPS), "conv_ms": total(CONV_OPS), "attention_kernel_ms": total(ATTN_OPS),
            "profiled_prefill_ms": wall,
            "ops": {n: {"self_ms": ka[n].self_cpu_time_total / 1e3, "calls": ka[n].count}
                    for n in (*GEMM_OPS, *CONV_OPS, *ATTN_OPS) if n in ka}}


# ---------------------------------------------------------------------------------- sides
def patched_side(model, name: str, ops=None, exact: bool = True, fast=None) -> Side:
    """opgym.patch(model, ops, exact=exact, fast=fast) while on; the first patch's record in side.info."""
    import opgym

    side = Side(name)
    side.info = {"patch": "opgym.patch" + ("" if exact else " (exact=False)"), "ops": list(ops or opgym.SUPPORTED_OPS)}
    state = {}

    def on():
        h = opgym.patch(model, ops=ops, exact=exact, fast=None if exact else fast)
        if "fast" not in side.info and not exact:
            side.info["fast"] = {k: len(v) for k, v in h.fast.items()}
            side.info["fast_notes"] = {k: v for k, v in h.notes.items() if k.startswith("fast ")}
        state["h"] = h

    def off():
        state.pop("h").undo()

    side.on, side.off = on, off
    return side


def compiled(model, inner: Side, name: str, **compile_kwargs) -> Side:
    """`inner` (a side that patches nothing: HF) with model.forward compiled (dynamic=True unless given):
    one torch.compile wrapper, made at the first on() and reused, installed by on() and removed by off().
    The unpatched model is the same object at every on(), so dynamo's guards hold and interleaving the
    sides does not recompile."""
    compile_kwargs.setdefault("dynamic", True)
    state = {"fn": None}

    def on():
        inner.on()
        if state["fn"] is None:
            state["fn"] = torch.compile(model.forward, **compile_kwargs)
        model.forward = state["fn"]

    def off():
        model.__dict__.pop("forward", None)
        inner.off()

    side = Side(name, on, off)
    side.info = dict(inner.info, compile=_compile_text(compile_kwargs))
    return side


def compiled_copy(model, make_inner: Callable, name: str, **compile_kwargs) -> Side:
    """A patched side under torch.compile, on a copy of the model of its own (copy.deepcopy, before any
    patch): the copy is patched once (make_inner(copy).on()) and its forward compiled once, at the first
    on(), and both stay until close(). A patch undone and redone on the shared model would install new
    forward objects each time, which dynamo's guards see as a new model: every interleaved round would
    recompile (measured: 7.3 s for a 40 ms prefill of the tiny model). The copy has the same weights
    (bit for bit) in other memory, as a second process would."""
    import copy

    compile_kwargs.setdefault("dynamic", True)
    own = copy.deepcopy(model)
    inner = make_inner(own)
    state = {"fn": None}

    def on():
        if state["fn"] is None:
            inner.on()
            state["fn"] = torch.compile(own.forward, **compile_kwargs)
            own.forward = state["fn"]

    def close():
        if state["fn"] is not None:
            own.__dict__.pop("forward", None)
            inner.off()
            state["fn"] = None

    side = Side(name, on, lambda: None, model=own, close=close)
    side.info = dict(inner.info, compile=_compile_text(compile_kwargs), model="a deepcopy, patched once")
    return side


def _compile_text(kw: dict) -> str:
    return f"torch.compile(model.forward, {', '.join(f'{k}={v}' for k, v in kw.items())})"


# ---------------------------------------------------------------------------------- the run
def evaluate(model, inputs: dict, sides: list, n_tokens: int = 64, repeats: int = 5, floor: bool = True,
             log: Callable[[str], None] = lambda s: None) -> dict:
    """The table for every side against sides[0] (the reference, normally HF eager). repeats=0: no timing.
    Each side runs `model`, or the model of its own (side.model); every side's close() runs at the end."""
    gen = dict(max_new_tokens=n_tokens, min_new_tokens=n_tokens, do_sample=False, num_beams=1)
    n_prompt = inputs["input_ids"].shape[1]
    ref_margins = None

    def prefill(m):
        return m(**inputs, use_cache=True, logits_to_keep=1)

    try:
        with torch.inference_mode():
            for i, s in enumerate(sides):
                m = s.model if s.model is not None else model
                log(f"{s.name}: full-logits forward, {n_tokens} greedy tokens, teacher-forced forward, warm-up prefill")
                s.on()
                try:
                    s.logits = m(**inputs, use_cache=False).logits.detach().clone()
                    if n_tokens:
                        g = m.generate(**inputs, **gen, output_scores=True, return_dict_in_generate=True)
                        s.tokens = g.sequences[0, n_prompt:].tolist()
                        if i == 0:
                            ref_margins = margins_ulp(g.scores, s.logits.dtype)
                        s.forced = teacher_forced_argmax(m, inputs, sides[0].tokens)
                    else:
                        s.tokens, s.forced = [], []
                    if repeats:
                        prefill(m)
                finally:
                    s.off()
            for r in range(repeats):
                log(f"prefill round {r + 1}/{repeats}, sides interleaved")
                for s in (sides if r % 2 == 0 else list(reversed(sides))):
                    m = s.model if s.model is not None else model
                    s.on()
                    try:
                        c0, t0 = time.process_time(), time.perf_counter()
                        prefill(m)
                        s.prefill_ms.append((time.perf_counter() - t0) * 1e3)
                        s.prefill_cpu_ms.append((time.process_time() - c0) * 1e3)
                    finally:
                        s.off()
            if floor:
                for s in sides:
                    m = s.model if s.model is not None else model
                    log(f"{s.name}: profiled prefill (GEMM floor)")
                    s.on()
                    try:
                        s.floor = gemm_floor(lambda: prefill(m))
                    finally:
                        s.off()
    finally:
        for s in sides:
            s.close()
    return result(sides, n_prompt, repeats, ref_margins)


def result(sides: list, n_prompt: int, repeats: int, ref_margins) -> dict:
    """The section's JSON: one row per side, ratios to sides[0]."""
    ref = sides[0]
    rw = statistics.median(ref.prefill_ms) if repeats else None
    rc = statistics.median(ref.prefill_cpu_ms) if repeats else None
    rows = []
    for s in sides:
        w = statistics.median(s.prefill_ms) if repeats else None
        c = statistics.median(s.prefill_cpu_ms) if repeats else None
        tk = token_agreement(ref.tokens, s.tokens)
        if tk["first_divergence"] is not None and ref_margins and tk["first_divergence"] < len(ref_margins):
            tk["ref_margin_ulp_at_divergence"] = ref_margins[tk["first_divergence"]]
        tf = sum(int(x == y) for x, y in zip(s.forced, ref.tokens))
        row = {"side": s.name, "info": s.info, "logits": error_table(ref.logits, s.logits), "tokens": tk,
               "tokens_list": s.tokens, "teacher_forced_list": s.forced, "teacher_forced_agree": tf, "teacher_forced_n": len(ref.tokens),
               "prefill_wall_ms": w, "prefill_cpu_ms": c,
               "wall_ratio": w / rw if repeats else None, "cpu_ratio": c / rc if repeats else None,
               "prefill_wall_ms_all": s.prefill_ms, "prefill_cpu_ms_all": s.prefill_cpu_ms, "floor": s.floor}
        if s.floor is not None and rw:
            row["floor_ratio"] = s.floor["gemm_ms"] / rw  # the side's GEMM time as a share of the reference's prefill
        rows.append(row)
    return {"reference": ref.name, "prompt_tokens": n_prompt, "repeats": repeats, "rows": rows,
            "ref_margins_ulp": ref_margins,
            "measured_as": ("one process, one model object, the sides switched in and out (patch / undo, compiled "
                            "forward installed / removed); logits: one use_cache=False forward, every position, "
                            "ulps in the logits' dtype; tokens: greedy generate; teacher-forced: the reference's "
                            "tokens fed in one forward; prefill: interleaved rounds (order reversed on odd ones), "
                            "medians of wall and process CPU time, ratios to the reference's medians; floor: the "
                            "profiler's self time of the GEMM ops in one more prefill (profiled, so slower), "
                            "floor_ratio = that / the reference's wall median")}


def markdown(result: dict) -> str:
    """The section as a markdown table: one row per side."""
    names = list(result["rows"][0]["logits"]["ulp_buckets"])
    timed = result["repeats"] > 0
    floor = any(r.get("floor") for r in result["rows"])
    head = ("| side | " + ("prefill wall ms (x ref) | prefill CPU ms (x ref) | " if timed else "")
            + ("GEMM floor ms (x ref prefill) | " if floor and timed else "")
            + "logits differing | " + " | ".join(f"{b} ulp" for b in names[1:])
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
        if floor and timed:
            t += (f"{r['floor']['gemm_ms']:.0f} ({r['floor_ratio']:.3f}) | " if r.get("floor") else "n/a | ")
        lines.append(
            f"| {r['side']} | {t}{lg['differ']:,} ({100 * lg['differ_share']:.1f}%) | "
            + " | ".join(f"{lg['ulp_buckets'][b]:,}" for b in names[1:])
            + f" | {lg['max_abs_diff']:.3g} | {lg['argmax_agree']}/{lg['positions']} | {tk['equal']}/{tk['n']} | "
              f"{fd_s} | {r['teacher_forced_agree']}/{r['teacher_forced_n']} |")
    m = result.get("ref_margins_ulp")
    if m:
        lines.append(f"\nreference top-1 margins over its {len(m)} greedy steps (ulps): min {min(m)}, "
                     f"steps within 2 ulps: {sum(1 for x in m if x <= 2)}, within 8: {sum(1 for x in m if x <= 8)}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------- in `opgym run`
def default_sides(fast: bool, compile_: bool) -> str:
    """The section's sides: HF eager (reference), opgym exact, the fast tier with --fast, HF compiled,
    and with --compile opgym (and its fast tier) compiled."""
    out = ["hf", "opgym"] + (["fast"] if fast else []) + ["hf@compile"]
    if compile_:
        out += ["opgym@compile"] + (["fast@compile"] if fast else [])
    return ",".join(out)


def side_label(token: str, attn: str) -> str:
    kind, _, comp = token.partition("@")
    base = {"hf": f"HF eager ({attn})", "opgym": "opgym exact", "fast": "opgym fast"}.get(kind)
    if base is None:
        base = f"opgym + {kind.split(':', 1)[1]}"
    if comp:
        base = base.replace(f"HF eager ({attn})", "HF").replace(" exact", "") + " + compile"
    return base


def build_sides(model, spec: str, ops: tuple, fast_sel: tuple, fast_names: tuple, attn: str) -> list:
    """Sides from a spec such as "hf,opgym,fast,fast:sdpa,hf@compile" (see --accuracy-sides)."""
    from .options import UsageError

    tokens = [t.strip() for t in spec.split(",") if t.strip()]
    if not tokens:
        raise UsageError("--accuracy-sides names no side")
    sides = []
    for t in tokens:
        kind, at, comp = t.partition("@")
        if at and comp != "compile":
            raise UsageError(f"--accuracy-sides: {t!r}: the only suffix is @compile")
        if kind == "opgym":
            make = lambda m, _t=t: patched_side(m, _t, ops)  # noqa: E731
        elif kind == "fast":
            make = lambda m, _t=t: patched_side(m, _t, ops, exact=False, fast=fast_sel)  # noqa: E731
        elif kind.startswith("fast:") and kind[5:] in fast_names:
            make = lambda m, _t=t, _n=kind[5:]: patched_side(m, _t, ops, exact=False, fast=(_n,))  # noqa: E731
        elif kind != "hf":
            raise UsageError(f"--accuracy-sides: unknown side {t!r}; sides: hf, opgym, fast, "
                             + ", ".join(f"fast:{n}" for n in fast_names) + " (each optionally @compile)")
        if kind == "hf":
            s = Side("hf", info={"patch": None})
            if comp:
                s = compiled(model, s, t)
        else:
            s = compiled_copy(model, make, t) if comp else make(model)
        s.name = side_label(t, attn)
        sides.append(s)
    if len({s.name for s in sides}) != len(sides):
        raise UsageError(f"--accuracy-sides {spec}: a side is named twice")
    return sides


def section(model, inputs, args, ops: tuple, fast_sel: tuple, progress) -> dict:
    """The report's `accuracy` section: the sides (--accuracy-sides, or default_sides) against the first,
    `args.accuracy_tokens` greedy tokens, `args.repeats` interleaved prefill rounds, one profiled prefill each."""
    from .. import fast_tier

    spec = args.accuracy_sides or default_sides(bool(args.fast), bool(args.compile))
    sides = build_sides(model, spec, ops, fast_sel, fast_tier.names(), args.attn)
    if any("compile" in s.info for s in sides):
        # each compiled side adds graphs for the prefill, the full-logits forward and decode: more than
        # dynamo's default recompile limit (8) allows with several compiled sides on one forward
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)

    def log(text):
        progress.step(f"accuracy: {text}")
        progress.done()

    out = evaluate(model, inputs, sides, n_tokens=args.accuracy_tokens, repeats=args.repeats, log=log)
    out["sides_spec"] = spec
    return out


def section_steps(args) -> int:
    """Progress steps the section takes."""
    spec = args.accuracy_sides or default_sides(bool(args.fast), bool(args.compile))
    n = len([t for t in spec.split(",") if t.strip()])
    return 2 * n + args.repeats
