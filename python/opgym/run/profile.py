"""The profiled prefill of a side (torch.profiler): where the time goes (the model's parts, the top
ops, each op's share, copies) and the top-level ops of one decode step.

Each op's share, for every op opgym.patch applies (opgym.SUPPORTED_OPS), on both sides:
    sites      a record_function range around each call of the op's sites' forwards (the modules its
               integration's sites(model) names: the modules whose HF forward the op serves or
               contains), self + children: HF's own ops on the baseline, the patched forward and
               opgym's operators on the opgym side
    operators  the self time of the profiler events of the op's torch operators (its SPEC.torch_ops,
               opgym::<name>): what opgym's kernels themselves cost (none on the baseline)
both in ms and as a fraction of the profiled prefill's range."""
from __future__ import annotations

import contextlib
import os
import sys

FWD_LABEL = "opgym_run::forward"
STEP_LABEL = "opgym_run::step::"
LAYER_LABEL = "opgym_run::text_layer0"
PARTS = (("vision encoder", ("model", "visual")), ("text decoder", ("model", "language_model")),
         ("lm_head", ("lm_head",)))


@contextlib.contextmanager
def quiet_stderr():
    """fd 2 to /dev/null (the profiler backend prints start/stop lines there)."""
    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:
        yield
        return
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


@contextlib.contextmanager
def profiling(activities=None):
    """torch.profiler.profile over the block (CPU activity unless `activities`), its start and stop lines
    kept off stderr; yields the profiler, whose events are read after the block."""
    from torch.profiler import ProfilerActivity, profile

    prof = profile(activities=activities or [ProfilerActivity.CPU])
    with quiet_stderr():
        prof.__enter__()
    try:
        yield prof
    finally:
        with quiet_stderr():
            prof.__exit__(None, None, None)


def part_label(name):
    return f"opgym_run::part::{name}"


def op_label(op: str) -> str:
    return f"opgym_run::op::{op}"


def op_sites(model) -> dict:
    """op -> the modules of its sites (its integration's sites(model)), for every op opgym.patch applies; taken
    from the model as built, so that both sides label the same modules."""
    from .. import SUPPORTED_OPS
    from ..ops import part

    out = {}
    for op in SUPPORTED_OPS:
        integ = part(op, "integration")
        out[op] = [m for _, m in integ.sites(model)] if integ is not None and hasattr(integ, "sites") else []
    return out


def _is_op(name: str) -> bool:
    return "::" in name and not name.startswith("opgym_run::") and not name.startswith("ProfilerStep")


def _top_level_op_counts(events, step: int) -> dict:
    """Top-level ops (an op with no op above it) inside forward step `step`, in all and inside the
    first text decoder layer's range."""
    total = layer = 0
    for e in events:
        if not _is_op(e.name):
            continue
        p, nested, in_step, in_layer = e.cpu_parent, False, False, False
        while p is not None:
            if _is_op(p.name):
                nested = True
                break
            in_step |= p.name == f"{STEP_LABEL}{step}"
            in_layer |= p.name == LAYER_LABEL
            p = p.cpu_parent
        if not nested and in_step:
            total += 1
            layer += in_layer
    return {"per_step": total, "per_text_layer": layer}


def decode_op_counts(model, inputs, sync) -> dict:
    """One generate of two tokens under torch.profiler; the second forward is a decode step."""
    from torch.autograd.profiler import record_function

    layers = getattr(getattr(getattr(model, "model", None), "language_model", None), "layers", None)
    stack, step, handles = [], [0], []

    def pre(label_fn):
        def hook(m, args, kwargs=None):
            rf = record_function(label_fn())
            rf.__enter__()
            stack.append(rf)
        return hook

    def post(m, args, out):
        stack.pop().__exit__(None, None, None)

    def step_label():
        step[0] += 1
        return f"{STEP_LABEL}{step[0] - 1}"

    handles.append(model.register_forward_pre_hook(pre(step_label)))
    handles.append(model.register_forward_hook(post, always_call=True))
    if layers is not None and len(layers):
        handles.append(layers[0].register_forward_pre_hook(pre(lambda: LAYER_LABEL)))
        handles.append(layers[0].register_forward_hook(post, always_call=True))
    try:
        with profiling() as prof:
            model.generate(**inputs, max_new_tokens=2, min_new_tokens=2, do_sample=False, num_beams=1)
            sync()
    finally:
        for h in handles:
            h.remove()
    out = _top_level_op_counts(prof.events(), 1)
    out["measured_as"] = ("torch.profiler, the second forward of a 2-token greedy generate (a decode step): ops "
                          "with no op above them; per_text_layer: those inside text decoder layer 0")
    return out


@contextlib.contextmanager
def _ranges(wraps, sync):
    """Every call of each (module, label) in `wraps` becomes a record_function range with that label
    (whatever runs inside the module's forward is inside it); yields the calls counted per label."""
    from torch.autograd.profiler import record_function

    calls, handles = {}, []
    for module, label in wraps:
        calls.setdefault(label, 0)
        stack = []

        def pre(m, args, label=label, stack=stack):
            sync()
            rf = record_function(label)
            rf.__enter__()
            stack.append(rf)

        def post(m, args, output, label=label, stack=stack):
            sync()
            stack.pop().__exit__(None, None, None)
            calls[label] += 1

        handles.append(module.register_forward_pre_hook(pre))
        handles.append(module.register_forward_hook(post))
    try:
        yield calls
    finally:
        for h in handles:
            h.remove()


def _parts(model):
    """(module, label) of the model's big parts: vision encoder, text decoder, LM head."""
    out = []
    for name, path in PARTS:
        m = model
        for attr in path:
            m = getattr(m, attr, None)
        if m is not None:
            out.append((m, part_label(name)))
    return out


def _op_shares(ka, calls, sites, fwd_us) -> dict:
    """Each op's sites' range time and its operators' self time, in ms and as shares of the prefill."""
    from ..ops import spec

    def share(us):
        return us / fwd_us if (fwd_us and us is not None) else None

    out = {}
    for op, modules in sites.items():
        sp = spec(op)
        n_site = calls.get(op_label(op), 0)
        site_us = ka[op_label(op)].cpu_time_total if n_site and op_label(op) in ka else None
        evs = [ka[f"opgym::{t}"] for t in sp.torch_ops if f"opgym::{t}" in ka]
        op_us = sum(e.self_cpu_time_total for e in evs)
        out[op] = {
            "title": sp.title,
            "sites": len(modules),
            "site_calls": n_site,
            "site_ms": site_us / 1e3 if site_us is not None else None,
            "site_share": share(site_us),
            "operators": [f"opgym::{t}" for t in sp.torch_ops],
            "operator_calls": sum(e.count for e in evs),
            "operator_ms": op_us / 1e3,
            "operator_share": share(op_us),
        }
    return out


OP_SHARES_MEASURED_AS = (
    "torch.profiler over one prefill; per op of the op table: site_* = record_function ranges around each "
    "call of the op's sites' forwards (its integration's sites(model), as built), self + children, null when "
    "none ran (the fused path of another op replaced the call, or a compiled graph inlined the module); "
    "operator_* = self time of the events of the op's torch operators (opgym::<name>); shares are fractions "
    "of the profiled prefill's range; ranges nest (a norm add_rms_norm fuses is also an RMSNorm site)")


def profile_side(model, inputs, prefill, device, sync, compiled: bool, sites: dict) -> dict:
    """One prefill under torch.profiler (the model in the side's state), then the decode op counts.
    `sites`: op_sites(model), taken once on the model as built."""
    from torch.profiler import ProfilerActivity, record_function

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    wraps = _parts(model) + [(m, op_label(op)) for op, modules in sites.items() for m in modules]
    with _ranges(wraps, sync) as calls, profiling(acts) as prof:
        with record_function(FWD_LABEL):
            prefill()
            sync()
    events = prof.key_averages()
    ka = {e.key: e for e in events}
    fwd_us = ka[FWD_LABEL].cpu_time_total if FWD_LABEL in ka else None
    out = {}
    out["profile_parts_ms"] = {
        name: ka[part_label(name)].cpu_time_total / 1e3 for name, _ in PARTS if part_label(name) in ka}
    top = sorted((e for e in events if not e.key.startswith("opgym_run::")),
                 key=lambda e: e.self_cpu_time_total, reverse=True)[:10]
    out["profile_top_ops"] = [
        {"op": e.key, "self_ms": e.self_cpu_time_total / 1e3, "calls": e.count,
         "self_share": (e.self_cpu_time_total / fwd_us) if fwd_us else None} for e in top]
    # RMSNorm's figures (the rms_norm op's sites are every RMSNorm module: find_rms_norms)
    rms = op_label("rms_norm")
    n_rms = calls.get(rms, 0)
    rms_us = ka[rms].cpu_time_total if rms in ka else 0.0
    op = ka.get("opgym::rms_norm")
    out["opgym_op_ms"] = op.cpu_time_total / 1e3 if op is not None else None
    out["opgym_op_calls"] = op.count if op is not None else 0
    out["profiled_forward_ms"] = fwd_us / 1e3 if fwd_us else None
    cp = ka.get("aten::copy_")  # casts and copies: the vision rotary's fp32 upcasts are most of them
    out["copy_calls_per_prefill"] = cp.count if cp is not None else 0
    out["copy_ms"] = cp.self_cpu_time_total / 1e3 if cp is not None else 0.0
    out["copy_share"] = (cp.self_cpu_time_total / fwd_us) if (cp is not None and fwd_us) else None
    if n_rms == 0 and compiled:
        # Compiled graphs inline the modules, so the module ranges never open. opgym's operator stays
        # a single op in the graph and is still timed; HF's RMSNorm is fused by inductor into its
        # neighbours and cannot be separated.
        rms_us = op.cpu_time_total if op is not None else None
        out["rms_norm_measured_as"] = ("opgym::rms_norm operator time (compiled graph)" if op is not None
                                       else "not separable under torch.compile (inductor fuses HF's RMSNorm)")
    else:
        out["rms_norm_measured_as"] = "record_function range around each RMSNorm module call (self + children)"
    out["rms_norm_ms"] = rms_us / 1e3 if rms_us is not None else None
    out["rms_norm_share"] = (rms_us / fwd_us) if (fwd_us and rms_us is not None) else None
    out["rms_norm_calls_per_prefill"] = n_rms if n_rms or not compiled else out["opgym_op_calls"]
    out["op_shares"] = _op_shares(ka, calls, sites, fwd_us)
    out["op_shares_measured_as"] = OP_SHARES_MEASURED_AS
    out["decode_top_level_ops"] = decode_op_counts(model, inputs, sync)
    return out
