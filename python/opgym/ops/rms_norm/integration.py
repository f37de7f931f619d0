"""RMSNorm in HF models (opgym.patch's op "rms_norm"; switch OPGYM_RMS_NORM): every RMSNorm module
instance's forward is swapped for one that calls torch.ops.opgym.rms_norm with the variant that
module computes.

Which modules: candidates are leaf modules with a 1-D weight, an eps attribute (variance_epsilon or
eps) and no bias (find_rms_norms); whether one is served, and with which of opgym's variants (HF's
Llama rounding, one fp32 rounding, Gemma's 1 + weight), is decided by bits: admission.py's probe runs
the module's own forward and every variant on inputs built to tell them apart, and admits exactly the
one variant that gives its bits. Anything else is skipped, with the reason in `handle.skipped`. A
class name or a source substring never decides.

At call time the fused path is taken when OPGYM_RMS_NORM is not "0", the input is one the kernel
serves (device with an opgym kernel, float32/float16/bfloat16, last dim contiguous, same device as
the weight), no gradient is needed (the op has no backward) and the signature (x dtype, weight
dtype) has been admitted (at patch time for the weight's dtype; any other is probed at its first
eager call, e.g. after model.to(dtype)); anything else, and any error from opgym, runs the module's
original forward. The model never raises because of opgym.
"""
from __future__ import annotations

import types

import torch
from torch import nn

from ...guard import FUSED_DTYPES as _FUSED_DTYPES, count, guarded, layout_reason, own_forward, tensor_reason
from . import SPEC
from .admission import Variant, Verdicts, admit, eps_of

ENV_SWITCH = SPEC.switch


def _eps_of(module: nn.Module) -> float | None:
    return eps_of(module)


def is_rms_norm(module: nn.Module) -> bool:
    """A candidate: a leaf module with a 1-D floating weight, an eps attribute and no bias. Whether it
    computes an RMSNorm opgym serves is the admission probe's to say (admission.admit)."""
    w = getattr(module, "weight", None)
    if not isinstance(w, torch.Tensor) or w.dim() != 1 or not w.is_floating_point():
        return False
    if getattr(module, "bias", None) is not None or next(module.children(), None) is not None:
        return False
    return eps_of(module) is not None


def find_rms_norms(model: nn.Module) -> list[tuple[str, nn.Module]]:
    return [(name, m) for name, m in model.named_modules() if is_rms_norm(m)]


# ---- the patched forward ------------------------------------------------------------------------

def _fallback_reason(x, w, devices, full: bool = True) -> str | None:
    """Why the fused op must not take this call, or None. Up front (full=False, the eager per-call
    path) only what the op would compute wrongly (a gradient needed) or refuse on every call (device,
    dtype), by the cheapest attributes; full=True adds what the op checks itself (the weight's
    device, shapes, strides), to name the reason after the op refused, and for torch.compile's trace,
    which must not reach an op that would refuse."""
    reason = tensor_reason("rms_norm", (x, w), devices)
    if reason is not None or not full:
        return reason
    if w.device != x.device:
        return "weight and input on different devices"
    if x.dim() < 1 or x.shape[-1] != w.shape[0]:
        return "shape mismatch"
    return layout_reason((x,))


def _make_forward(module: nn.Module, original, eps: float, counters, devices):
    op = torch.ops.opgym.rms_norm.default  # resolved once
    w_of = lambda: module.weight  # noqa: E731 - read at each call: the parameter may be replaced (.to(), load)
    verdicts = Verdicts(module, original)

    def check(x, full=False):
        w = w_of()
        reason = _fallback_reason(x, w, devices, full)
        if reason is not None:
            return reason
        v = verdicts.get(x.dtype, w.dtype)
        return None if isinstance(v, Variant) else v

    def fused(x):
        w = w_of()
        v = verdicts.by_sig[(x.dtype, w.dtype)]
        return op(x, w, eps, v.mode, v.weight_offset)

    # Per token at decode: only the up-front checks; the op checks the rest itself.
    call = guarded(ENV_SWITCH, counters, fused, original, check, lambda x: check(x, True))

    def forward(self, hidden_states, *args, **kwargs):
        if args or kwargs:
            if not torch.compiler.is_compiling():
                count(counters, False, "extra arguments")
            return original(hidden_states, *args, **kwargs)
        return call(hidden_states)

    return types.MethodType(forward, module)


def norm_verdict(module: nn.Module, forward=None) -> str | None:
    """None when opgym may patch this module: the probe admits a variant for its weight's dtype, or
    that dtype is one opgym does not compute (fp64: every call falls back until a move to a served
    dtype, whose signature is probed at its first call); else the reason (admission caches the verdicts)."""
    if module.weight.dtype not in _FUSED_DTYPES:
        return None
    return admit(module, forward)[1]


def apply(model: nn.Module, handle, devices) -> None:
    """Patches every RMSNorm module of `model` that opgym serves; records them in `handle`."""
    found = find_rms_norms(model)
    for name, module in found:
        if handle.owned_elsewhere(module, "rms_norm"):
            handle.skipped[name] = "already patched by another handle"
            continue
        if own_forward(module):
            handle.skipped[name] = f"{type(module).__name__}: forward replaced on the instance"
            continue
        original = module.forward
        why = norm_verdict(module, original)
        if why is not None:
            handle.skipped[name] = f"{type(module).__name__}: {why}"
            continue
        handle.replace_forward(module, "rms_norm", name,
                               _make_forward(module, original, _eps_of(module), handle.counters("rms_norm"), devices))



def sites(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The RMSNorm modules of `model` (what opgym.capture hooks and opgym run labels)."""
    return find_rms_norms(model)
