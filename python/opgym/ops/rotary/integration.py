"""Rotary embeddings in HF attention (opgym.patch's op "rotary"; switch OPGYM_ROTARY): the q and k
rotation (slices, neg, cat, two muls and an add for each) becomes one torch.ops.opgym.rotary call.

The hook, and why it is this narrow: transformers calls its rotary functions by their module-level
name from inside the attention's forward (`apply_rotary_pos_emb(query_states, key_states, cos, sin)`
in the text attention, `apply_rotary_pos_emb_vision(...)` in Qwen2.5-VL's vision attention). Editing
that module global would change every model of that family in the process. Instead each attention
instance of the patched model gets its own copy of its class's forward: the very same code object,
whose globals are a copy of the modeling module's namespace in which that one name resolves to
opgym's function. The copy is registered as a module of its own (`opgym._hooked.<n>`, removed at
undo) because torch.compile re-imports a function's globals by their `__name__` to guard on them.
Other instances, other models, the class and the modeling module are untouched.

Which functions: the module's function under that name must be, statement for statement, one opgym
has verified (an AST hash of the function and of its module's `rotate_half`, as for the layer fusion):
transformers 5.23's `apply_rotary_pos_emb` (Qwen2.5-VL, Qwen2, Qwen3, Llama: the bf16 sequence, mode
"hf") and `apply_rotary_pos_emb_vision` (Qwen2.5-VL: the fp32 upcast, mode "fp32"). A forward that is
wrapped (has __wrapped__) is left alone.

At call time the fused op takes the call when OPGYM_ROTARY is not "0" and it serves the inputs: a
device with an opgym kernel, q/k (and cos/sin in the text mode) of one float dtype, cos/sin of q's
rank minus one with q's full head dim (a partial rotary dim falls back), an even head dim, last dims
contiguous, no gradient needed. Otherwise, and on any error from opgym, HF's own function runs
(counted as a fallback with the reason).
"""
from __future__ import annotations

import sys
import types

import torch
from torch import nn

from ... import hooks
from ...guard import FUSED_DTYPES, fingerprint, guarded, own_forward
from . import SPEC

ENV_SWITCH = SPEC.switch

# name in the modeling module -> (verified fingerprints of that function, the op's mode, HF's unsqueeze_dim)
VERIFIED = {
    "apply_rotary_pos_emb": ({"49be0a48c1397b56"}, "hf"),
    "apply_rotary_pos_emb_vision": ({"fe4e2eae55b153c0"}, "fp32"),
}
ROTATE_HALF = {"be8e312f2b6f2893"}  # transformers 5.23's rotate_half


def _fallback_reason(q, k, cos, sin, mode, unsqueeze_dim, devices) -> str | None:
    if not all(isinstance(t, torch.Tensor) for t in (q, k, cos, sin)):
        return "input is not a tensor"
    if not (q.is_cpu or (q.is_cuda and "cuda" in devices)):
        return f"no opgym kernel for device {q.device.type}"
    if q.dtype not in FUSED_DTYPES or k.dtype != q.dtype or cos.dtype not in FUSED_DTYPES or sin.dtype != cos.dtype:
        return f"dtypes {q.dtype}/{k.dtype}/{cos.dtype}/{sin.dtype} not served"
    if mode == "hf" and cos.dtype != q.dtype:
        return "cos/sin dtype differs from q's (HF would promote)"
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, cos, sin)):
        return "gradient needed (opgym::rotary has no backward)"
    if q.dim() != k.dim() or cos.dim() != q.dim() - 1 or cos.shape != sin.shape:
        return "position layout not verified"
    if q.shape[-1] % 2 or k.shape[-1] != q.shape[-1]:
        return "odd or mismatched head dim"
    if cos.shape[-1] != q.shape[-1]:
        return "partial rotary dim"
    if any(t.device != q.device for t in (k, cos, sin)):
        return "tensors on different devices"
    if any(t.stride(-1) != 1 for t in (q, k, cos, sin)):
        return "last dim not contiguous"
    if not isinstance(unsqueeze_dim, int):
        return "unsqueeze_dim not an int"
    return None


def _make_rope(original, mode: str, counters, devices, vision: bool):
    op = torch.ops.opgym.rotary.default

    def fused(q, k, cos, sin, unsqueeze_dim):
        return op(q, k, cos, sin, unsqueeze_dim, mode)

    def check(q, k, cos, sin, unsqueeze_dim):
        return _fallback_reason(q, k, cos, sin, mode, unsqueeze_dim, devices)

    if vision:
        call = guarded(ENV_SWITCH, counters, fused, lambda q, k, cos, sin, _u: original(q, k, cos, sin), check)

        def rope(q, k, cos, sin):
            return call(q, k, cos, sin, -2)
    else:
        call = guarded(ENV_SWITCH, counters, fused, original, check)

        def rope(q, k, cos, sin, unsqueeze_dim=1):
            return call(q, k, cos, sin, unsqueeze_dim)
    rope.__wrapped__ = original
    return rope


def _hooked_name(cls: type) -> tuple[str, object, dict] | None:
    """(name, HF's function, its module's globals) when cls.forward calls a verified rotary function."""
    fwd = cls.__dict__.get("forward") or getattr(cls, "forward", None)
    if not isinstance(fwd, types.FunctionType) or hasattr(fwd, "__wrapped__"):
        return None
    mod = sys.modules.get(fwd.__module__)
    if mod is None or fwd.__globals__ is not vars(mod):
        return None
    for name, (prints, _mode) in VERIFIED.items():
        fn = fwd.__globals__.get(name)
        if name in fwd.__code__.co_names and isinstance(fn, types.FunctionType):
            if fingerprint(fn) in prints and fingerprint(fwd.__globals__.get("rotate_half")) in ROTATE_HALF:
                return name, fn, fwd.__globals__
            return name, None, fwd.__globals__
    return None


def instrument(model: nn.Module, record) -> list:
    """For opgym.capture: every attention calling a verified rotary function gets a forward copy that
    calls record(module_path, mode, q, k, cos, sin, unsqueeze_dim) before HF's own function. Returns
    what `uninstrument` needs to restore them."""
    done, hooked = [], {}
    for path, m in model.named_modules():
        cls = type(m)
        if cls not in hooked:
            hooked[cls] = _hooked_name(cls)
        found = hooked[cls]
        if found is None or found[1] is None or (own_forward(m) and not hooks.managed(m)):
            continue
        fname, original, glb = found
        mode, vision = VERIFIED[fname][1], fname.endswith("_vision")

        def rec(q, k, cos, sin, unsqueeze_dim=-2 if vision else 1, _p=path, _m=mode, _o=original, _v=vision):
            record(_p, _m, q, k, cos, sin, unsqueeze_dim)
            return _o(q, k, cos, sin) if _v else _o(q, k, cos, sin, unsqueeze_dim)

        done.append(hooks.hook(m, {fname: rec}, owner="capture rotary"))
    return done


def uninstrument(done) -> None:
    for layer in done:
        hooks.release(layer)


def apply(model: nn.Module, handle, devices) -> None:
    """Gives every attention of `model` that calls a verified rotary function its own forward copy
    in which that function is opgym's."""
    hooked: dict[type, tuple | None] = {}
    ropes: dict[type, object] = {}  # one per class in this model (so one namespace per class)
    for name, m in model.named_modules():
        cls = type(m)
        if cls not in hooked:
            hooked[cls] = _hooked_name(cls)
        found = hooked[cls]
        if found is None:
            continue
        fname, original, glb = found
        if original is None:
            handle.skipped[name] = f"{cls.__name__}: its {fname} is not one opgym has verified (rotary)"
            continue
        if (own_forward(m) and not hooks.managed(m)) or handle.owned_elsewhere(m, "rotary"):
            handle.skipped[name] = "forward already replaced on the instance (rotary)"
            continue
        if cls not in ropes:
            ropes[cls] = _make_rope(original, VERIFIED[fname][1], handle.counters("rotary"), devices,
                                    vision=fname.endswith("_vision"))
        hooks.hook(m, {fname: ropes[cls]}, handle=handle, op="rotary", path=name)



def sites(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The attention modules whose forward calls a rotary function opgym has verified."""
    hooked: dict[type, tuple | None] = {}
    out = []
    for name, m in model.named_modules():
        cls = type(m)
        if cls not in hooked:
            hooked[cls] = _hooked_name(cls)
        if hooked[cls] is not None and hooked[cls][1] is not None:
            out.append((name, m))
    return out
