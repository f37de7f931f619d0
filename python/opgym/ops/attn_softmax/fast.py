"""Fast tier for attention: every attention of the model through torch's scaled_dot_product_attention.

HF's eager attention (what attn_softmax reproduces exactly) materializes the [q, k] scores, adds the
mask, runs the softmax in fp32 and casts back to the input dtype before the second matmul; torch's SDPA
on the CPU (its flash kernel) fuses the two matmuls and the softmax in blocks, with another summation
order and no rounding of the probabilities to bf16. Same function, other bits; on the embedded
Qwen2.5-VL-3B (4+4 layers, 1024 patches) it saves most of eager attention's cost, the vision tower's
full-attention block first (docs/PERF.md).

How: transformers picks the attention function per call from the config (`config._attn_implementation`
through ALL_ATTENTION_FUNCTIONS), so the substitution is the model's own `set_attn_implementation("sdpa")`,
which checks that every sub-model supports SDPA; the config values it changed are recorded and undo
writes them back (every PreTrainedModel config and sub-config of the model, as they were). Nothing
else is touched: opgym's exact rotary, RMSNorm, add + norm and SwiGLU keep serving the modules around
the attention. Served only when the model is a transformers PreTrainedModel that declares SDPA support
(`_supports_sdpa`) and can switch at run time, and its attention is "eager"; a model already on SDPA
or another kernel is left as it is (handle.notes says so).

Where attn_softmax's exact integration (HF eager's attention bits: opgym's eager_attention_forward and
the vision tower's one-pass windows) serves the same attention, SDPA wins in a fast patch: with the
config switched, transformers hands the attentions SDPA's function, so opgym's eager function is never
called, and the vision attention's one-pass copy sees a non-eager interface and runs HF's own
per-window loop with it (counted as attn_softmax fallbacks, "attention implementation is not eager").
"""
from __future__ import annotations

from torch import nn

NAME = "sdpa"
TITLE = "attention through torch SDPA (the model's attn_implementation switched from eager)"
DEFAULT = True


def _configs(model: nn.Module) -> list:
    """Every config object reachable from the model: each PreTrainedModel's config and their
    sub-configs (what set_attn_implementation may write)."""
    seen, out, todo = set(), [], []
    for m in model.modules():
        c = getattr(m, "config", None)
        if c is not None and hasattr(c, "_attn_implementation"):
            todo.append(c)
    while todo:
        c = todo.pop()
        if id(c) in seen:
            continue
        seen.add(id(c))
        out.append(c)
        for key in getattr(c, "sub_configs", {}) or {}:
            sub = getattr(c, key, None)
            if sub is not None and hasattr(sub, "_attn_implementation"):
                todo.append(sub)
    return out


def _why_not(model: nn.Module) -> str | None:
    try:
        from transformers import PreTrainedModel
    except ImportError:
        return "transformers is not installed"
    if not isinstance(model, PreTrainedModel):
        return f"{type(model).__name__} is not a transformers PreTrainedModel (no attn_implementation to switch)"
    if not getattr(model, "_supports_sdpa", False):
        return f"{type(model).__name__} does not declare SDPA support"
    if not type(model)._can_set_attn_implementation():
        return f"{type(model).__name__} cannot switch its attention implementation at run time"
    impl = model.config._attn_implementation
    if impl != "eager":
        return f"attention is already {impl!r}"
    return None


def apply_fast(model: nn.Module, handle, devices) -> None:
    why = _why_not(model)
    if why is not None:
        handle.notes[f"fast {NAME}"] = f"left alone: {why}"
        return
    configs = _configs(model)
    before = [(c, getattr(c, "_attn_implementation_internal", None)) for c in configs]

    def restore():
        for c, v in before:
            c._attn_implementation_internal = v

    handle.on_undo(restore)
    try:
        model.set_attn_implementation("sdpa")
    except Exception:
        restore()
        raise
    changed = [f"{type(c).__name__}: {v!r} -> {c._attn_implementation!r}" for c, v in before
               if c._attn_implementation != v]
    handle.fast[NAME].extend(changed)
    handle.notes[f"fast {NAME}"] = f"{len(changed)} config(s) switched to sdpa; undo writes back {len(before)}"
