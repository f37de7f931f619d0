"""Fast tier for RMSNorm: Llama/Qwen2's norm with one rounding instead of two (opgym's mode "fp32").

HF's Llama/Qwen2 RMSNorm rounds the normalized row to the input dtype, then multiplies by the weight in
that dtype and rounds again (opgym's exact mode "hf"); mode "fp32" keeps the normalized row in fp32,
multiplies by the weight there and rounds once. The result is at least as accurate; the bits differ
on a share of the elements. opgym's kernel runs both in one pass, so the time gained is small (measured
in docs/PERF.md): the substitution is in the tier, but not applied by exact=False unless named
(fast=("rms_norm_fp32", ...)).

Served: every RMSNorm module whose admitted variant (the exact integration's admission probe) is HF's
two-rounding mode, with an RMSNorm forward of opgym's on top of the exact one (or of HF's, when the
rms_norm op is not applied): the fast forward wins on the module, the exact one is its fallback (an
input the op cannot serve, OPGYM_FAST_RMS_NORM=0). The norms add_rms_norm fuses with the residual add
before them run inside the layer's fused forward, not as modules: they keep the exact rounding (the
fused layer's forward calls add_rms_norm with the norm's admitted variant; switching it would need a
mode setting in add_rms_norm's integration, and there is nothing to gain: see below).

Measured (2-vCPU AVX-512 Xeon, bf16, 1 thread, thread CPU time per call, loaded machine): [1024, 1280]
242 us in mode hf against 218 in mode fp32, [282, 2048] 92 against 82, one decode row 3.1 against 3.1:
about 0.1 ms per prefill of the embedded model, under 0.01 % of it.
"""
from __future__ import annotations

import torch
from torch import nn

from ...guard import guarded, layout_reason, own_forward, tensor_reason
from .admission import admit, eps_of
from .integration import find_rms_norms

NAME = "rms_norm_fp32"
TITLE = "RMSNorm modules rounded once (mode fp32) instead of HF's two roundings"
DEFAULT = False
SWITCH = "OPGYM_FAST_RMS_NORM"


def _make_forward(module: nn.Module, original, eps: float, weight_offset: bool, counters, devices):
    op = torch.ops.opgym.rms_norm.default

    def check(x):
        w = module.weight
        reason = tensor_reason("rms_norm", (x, w), devices)
        if reason is None and (w.device != x.device or x.dim() < 1 or x.shape[-1] != w.shape[0]):
            reason = "shape or device mismatch"
        return reason or layout_reason((x,))

    def fused(x):
        return op(x, module.weight, eps, "fp32", weight_offset)

    call = guarded(SWITCH, counters, fused, original, check)

    def forward(hidden_states, *args, **kwargs):
        if args or kwargs:
            return original(hidden_states, *args, **kwargs)
        return call(hidden_states)

    return forward


def _fused_with_add(model: nn.Module, handle) -> set:
    """ids of the norms the exact add_rms_norm runs inside its layers' forwards (not as modules)."""
    if not handle.patched_by_op.get("add_rms_norm"):
        return set()
    from ..add_rms_norm.integration import fused_norms

    return {id(n) for n in fused_norms(model)}


def apply_fast(model: nn.Module, handle, devices) -> None:
    inside = _fused_with_add(model, handle)
    kept = 0
    for name, m in find_rms_norms(model):
        if id(m) in inside:
            kept += 1
            continue
        if (own_forward(m) and not m.__dict__.get("_opgym_patched")) or m._forward_hooks or m._forward_pre_hooks:
            handle.skipped[name] = f"{type(m).__name__}: forward replaced or hooked (fast {NAME})"
            continue
        variant, why = admit(m)  # HF's class forward, probed by bits (cached per class and signature)
        if variant is None:
            handle.skipped.setdefault(name, f"{type(m).__name__}: {why} (fast {NAME})")
            continue
        if variant.mode != "hf":
            continue  # already one rounding: the exact op computes it
        handle.replace_forward_fast(m, NAME, name, _make_forward(m, m.forward, eps_of(m), variant.weight_offset,
                                                                 handle.fast_counters(NAME), devices))
    handle.notes[f"fast {NAME}"] = (f"{len(handle.fast[NAME])} norm(s) rounded once; {kept} fused with the residual "
                                    f"add by add_rms_norm keep HF's two roundings (the layer's forward calls the op)")
