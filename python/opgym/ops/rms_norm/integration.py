"""RMSNorm in HF models (opgym.patch's op "rms_norm"; switch OPGYM_RMS_NORM): every RMSNorm module
instance's forward is swapped for one that calls torch.ops.opgym.rms_norm.

Which modules: a module whose class carries HF's `kernel_layer_name == "RMSNorm"` label (set by
`use_kernel_forward_from_hub("RMSNorm")`, e.g. Qwen2_5_VLRMSNorm, Qwen2RMSNorm, Qwen3RMSNorm,
LlamaRMSNorm), or whose class name ends in "RMSNorm", that has a 1-D `weight` and a
`variance_epsilon` or `eps` attribute. Classes that scale by (1 + weight) (Gemma and the like) or
otherwise do not compute HF's Llama-style formula are skipped: each class is probed once on a small
random input against its own forward, and only classes that agree are patched (`handle.skipped`
lists the others with the reason).

At call time the fused path is taken when OPGYM_RMS_NORM is not "0", the input is one the kernel
serves (device with an opgym kernel, float32/float16/bfloat16, last dim contiguous, same device as
the weight) and no gradient is needed (the op has no backward); anything else, and any error from
opgym, runs the module's original forward. The model never raises because of opgym.
"""
from __future__ import annotations

import inspect
import types

import torch
from torch import nn

from ...guard import FUSED_DTYPES as _FUSED_DTYPES, count, guarded, layout_reason, tensor_reason
from . import SPEC

ENV_SWITCH = SPEC.switch


def _eps_of(module: nn.Module) -> float | None:
    for name in ("variance_epsilon", "eps"):
        v = getattr(module, name, None)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return float(v)
    return None


def is_rms_norm(module: nn.Module) -> bool:
    """HF-labelled or RMSNorm-named, with a 1-D weight and an eps attribute."""
    cls = type(module)
    labelled = getattr(cls, "kernel_layer_name", None) == "RMSNorm"
    named = cls.__name__.endswith("RMSNorm")
    if not (labelled or named):
        return False
    w = getattr(module, "weight", None)
    return isinstance(w, torch.Tensor) and w.dim() == 1 and _eps_of(module) is not None


def find_rms_norms(model: nn.Module) -> list[tuple[str, nn.Module]]:
    return [(name, m) for name, m in model.named_modules() if is_rms_norm(m)]


def _offset_style(cls: type) -> bool:
    """Gemma-style norms scale by (1 + weight); the plain formula would be wrong for them."""
    if "Gemma" in cls.__name__:
        return True
    try:
        src = inspect.getsource(cls.forward)
    except (OSError, TypeError):
        return False
    compact = src.replace(" ", "")
    return "1.0+self.weight" in compact or "1+self.weight" in compact or "self.weight+1" in compact


def _probe(module: nn.Module, forward) -> str | None:
    """Runs the module's own forward and opgym on one small random input; None when they agree.

    Only where the weight is on the CPU in a float dtype opgym reads (a meta or accelerator weight is
    judged by the class checks alone; the call-time checks still guard every call)."""
    w = module.weight
    if w.device.type != "cpu" or w.dtype not in _FUSED_DTYPES:
        return None
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, w.shape[0], generator=gen).to(w.dtype)
    try:
        with torch.no_grad():
            want = forward(x)
            got = torch.ops.opgym.rms_norm(x, w, _eps_of(module), "hf", False)
    except Exception as e:  # noqa: BLE001 - a probe failure means: do not patch
        return f"probe failed: {type(e).__name__}: {e}"
    if not isinstance(want, torch.Tensor) or want.shape != got.shape or want.dtype != got.dtype:
        return f"forward's output is not {tuple(got.shape)} {got.dtype} as opgym's"
    tol = {torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 2e-2}[w.dtype]
    if not torch.allclose(want.float(), got.float(), rtol=tol, atol=tol):
        return "forward does not compute HF's RMSNorm (x * rsqrt(mean(x^2) + eps) * weight)"
    return None


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
    op = torch.ops.opgym.rms_norm.default  # resolved once; mode "hf" and weight_offset False are its defaults
    w_of = lambda: module.weight  # noqa: E731 - read at each call: the parameter may be replaced (.to(), load)

    def fused(x):
        return op(x, w_of(), eps)

    call = guarded(ENV_SWITCH, counters, fused, original,
                   # Per token at decode: only the up-front checks; the op checks the rest itself.
                   lambda x: _fallback_reason(x, w_of(), devices, False),
                   lambda x: _fallback_reason(x, w_of(), devices))

    def forward(self, hidden_states, *args, **kwargs):
        if args or kwargs:
            if not torch.compiler.is_compiling():
                count(counters, False, "extra arguments")
            return original(hidden_states, *args, **kwargs)
        return call(hidden_states)

    return types.MethodType(forward, module)


def norm_verdict(module: nn.Module, cache: dict, forward=None) -> str | None:
    """None when opgym's RMSNorm computes this module's forward (checked once per class, by its
    source and a probe against `forward`, the class's own by default), else the reason."""
    cls = type(module)
    if cls not in cache:
        original = forward if forward is not None else cls.forward.__get__(module)
        cache[cls] = "scales by (1 + weight) (Gemma-style)" if _offset_style(cls) else _probe(module, original)
    return cache[cls]


def apply(model: nn.Module, handle, devices) -> None:
    """Patches every RMSNorm module of `model` that opgym serves; records them in `handle`."""
    found = find_rms_norms(model)
    verdict: dict[type, str | None] = {}
    for name, module in found:
        if handle.owned_elsewhere(module, "rms_norm"):
            handle.skipped[name] = "already patched by another handle"
            continue
        original = module.__dict__.get("forward", module.forward)
        why = norm_verdict(module, verdict, original)
        if why is not None:
            handle.skipped[name] = f"{type(module).__name__}: {why}"
            continue
        handle.replace_forward(module, "rms_norm", name,
                               _make_forward(module, original, _eps_of(module), handle.counters("rms_norm"), devices))



def sites(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The RMSNorm modules of `model` (what opgym.capture hooks and opgym run labels)."""
    return find_rms_norms(model)
