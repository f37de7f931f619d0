"""The profiled prefill of a side (torch.profiler): where the time goes (the model's parts, the top
ops, RMSNorm's ranges, copies) and the top-level ops of one decode step."""
from __future__ import annotations

import contextlib

from .measure import quiet_stderr

RMS_LABEL = "opgym_run::rms_norm"
FWD_LABEL = "opgym_run::forward"
STEP_LABEL = "opgym_run::step::"
LAYER_LABEL = "opgym_run::text_layer0"
PARTS = (("vision encoder", ("model", "visual")), ("text decoder", ("model", "language_model")),
         ("lm_head", ("lm_head",)))


def part_label(name):
    return f"opgym_run::part::{name}"


def rms_modules(model):
    return [m for m in model.modules() if type(m).__name__.endswith("RMSNorm")]


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
    from torch.profiler import ProfilerActivity, profile

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
        with quiet_stderr():
            prof = profile(activities=[ProfilerActivity.CPU])
            prof.__enter__()
        try:
            model.generate(**inputs, max_new_tokens=2, min_new_tokens=2, do_sample=False, num_beams=1)
            sync()
        finally:
            with quiet_stderr():
                prof.__exit__(None, None, None)
    finally:
        for h in handles:
            h.remove()
    out = _top_level_op_counts(prof.events(), 1)
    out["measured_as"] = ("torch.profiler, the second forward of a 2-token greedy generate (a decode step): ops "
                          "with no op above them; per_text_layer: those inside text decoder layer 0")
    return out


@contextlib.contextmanager
def _rms_ranges(model, sync):
    """Wraps every RMSNorm module call in a record_function range (and counts the calls), and the
    model's big parts (vision encoder, text decoder, LM head) in ranges of their own.

    Whatever runs inside the module's forward is inside the range: HF's eight aten ops for the
    baseline; the patched forward and opgym's operator for the opgym side."""
    from torch.autograd.profiler import record_function

    counter, handles = [0], []

    def wrap(module, label, count):
        stack = []

        def pre(m, args):
            sync()
            rf = record_function(label)
            rf.__enter__()
            stack.append(rf)

        def post(m, args, output):
            sync()
            stack.pop().__exit__(None, None, None)
            if count:
                counter[0] += 1

        handles.append(module.register_forward_pre_hook(pre))
        handles.append(module.register_forward_hook(post))

    for m in rms_modules(model):
        wrap(m, RMS_LABEL, True)
    for name, path in PARTS:
        m = model
        for attr in path:
            m = getattr(m, attr, None)
        if m is not None:
            wrap(m, part_label(name), False)
    try:
        yield counter
    finally:
        for h in handles:
            h.remove()


def profile_side(model, inputs, prefill, device, sync, compiled: bool) -> dict:
    """One prefill under torch.profiler (the model in the side's state), then the decode op counts."""
    from torch.profiler import ProfilerActivity, profile, record_function

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    prof = profile(activities=acts)
    with _rms_ranges(model, sync) as calls:
        with quiet_stderr():  # the profiler backend prints start/stop lines on fd 2
            prof.__enter__()
        try:
            with record_function(FWD_LABEL):
                prefill()
                sync()
        finally:
            with quiet_stderr():
                prof.__exit__(None, None, None)
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
    rms_us = ka[RMS_LABEL].cpu_time_total if RMS_LABEL in ka else 0.0
    op = ka.get("opgym::rms_norm")
    out["opgym_op_ms"] = op.cpu_time_total / 1e3 if op is not None else None
    out["opgym_op_calls"] = op.count if op is not None else 0
    out["profiled_forward_ms"] = fwd_us / 1e3 if fwd_us else None
    cp = ka.get("aten::copy_")  # casts and copies: the vision rotary's fp32 upcasts are most of them
    out["copy_calls_per_prefill"] = cp.count if cp is not None else 0
    out["copy_ms"] = cp.self_cpu_time_total / 1e3 if cp is not None else 0.0
    out["copy_share"] = (cp.self_cpu_time_total / fwd_us) if (cp is not None and fwd_us) else None
    if calls[0] == 0 and compiled:
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
    out["rms_norm_calls_per_prefill"] = calls[0] if calls[0] or not compiled else out["opgym_op_calls"]
    out["decode_top_level_ops"] = decode_op_counts(model, inputs, sync)
    return out
