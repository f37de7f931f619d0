"""HF eager attention in models (opgym.patch's op "attn_softmax"; switch OPGYM_ATTN_SOFTMAX): HF's
eager_attention_forward becomes one torch.ops.opgym.attn_eager call (text.py: torch's matmuls around
the core - scale, mask add, fp32 softmax, cast back - in place on the scores), grouped-query
attention skips repeat_kv's copies where a probe shows the same GEMM bits, and Qwen2.5-VL's vision
attention runs all windows of a block in one pass (vision.py). CPU only: the CUDA kernel of the core
is torch's CUDA softmax within 1 ulp, not its bits, so CUDA tensors take HF's function.

The hook: transformers' attention forwards call `ALL_ATTENTION_FUNCTIONS.get_interface(
config._attn_implementation, eager_attention_forward)`, the module-level function being the default
that the "eager" implementation returns. Each attention instance's forward copy (opgym/hooks.py, the
one rotary's hook uses too) sees opgym's function under that name; other instances, other models and
the modeling module are untouched. Under any other implementation (sdpa, flash, a registered one) the
name is never called: such attentions are left alone with the reason.

Which functions: the modeling module's `eager_attention_forward` must be, statement for statement,
one opgym has verified (`VERIFIED_EAGER`, transformers 5.23: the grouped-query form with `repeat_kv`,
whose fingerprint is verified too, 169 modeling modules, Qwen2.5-VL's among them; and three
multi-head forms without repeat_kv, the same statements with `key`/`value` used directly). Those with
another softmax (in the input dtype, no fp32 upcast), soft-capping, sinks or a head mask have other
fingerprints and are not served. The Qwen2.5-VL vision attention's forward itself must be the verified
one (vision.VERIFIED_FORWARD) for its one-pass copy; otherwise only its per-window eager calls are
served.

At call time the fused path takes the call when OPGYM_ATTN_SOFTMAX is not "0" and: a device with an
opgym kernel, q/k/v (and the mask) of one float dtype, no gradient needed, no dropout in training, a
Python-number scaling, 4-D q/k/v whose head counts match num_key_value_groups, a mask whose last dim is
contiguous. Otherwise, and on any error from opgym, HF's own function runs (counted as a fallback with
the reason).
"""
from __future__ import annotations

import types

import torch
from torch import nn

from ... import hooks
from ...guard import fingerprint, own_forward, wrappers
from . import SPEC, text, vision

ENV_SWITCH = SPEC.switch
NAME = "eager_attention_forward"

# fingerprint of eager_attention_forward -> (calls repeat_kv with module.num_key_value_groups,
# scaling defaults to None, then query.size(-1) ** -0.5)
VERIFIED_EAGER = {
    "efbb6043024e14d5": (True, False),   # Qwen2.5-VL, Qwen2/3, Llama, Mistral ... (169 modules)
    "cff0f0831409c94e": (False, False),  # the same without repeat_kv (gpt_neox, persimmon, clip-like text ...)
    "323af087815a589d": (False, False),  # the same, key.transpose(-1, -2) (clip, siglip-like, opt, pixtral ...)
    "ec64ed955463d8de": (False, True),   # the same, scaling defaulting to head_dim ** -0.5 (vit, beit, swin ...)
}
VERIFIED_REPEAT_KV = {"b96503bdbfbb3a64"}  # transformers 5.23's repeat_kv


def _verified(cls: type, cache: dict):
    """(modeling globals, HF's eager function, its kind) when cls.forward calls a verified
    eager_attention_forward; (globals, None, reason) when it calls an unverified one; None when its
    forward does not call it by name."""
    if cls in cache:
        return cache[cls]
    out = None
    fwd = cls.__dict__.get("forward") or getattr(cls, "forward", None)
    if isinstance(fwd, types.FunctionType) and NAME in fwd.__code__.co_names:
        glb = fwd.__globals__
        fn = glb.get(NAME)
        why = hooks.hookable(cls)
        if why is not None:
            out = (glb, None, why)
        elif not isinstance(fn, types.FunctionType) or wrappers(fn):
            out = (glb, None, f"its {NAME} is not a plain function")
        elif fingerprint(fn) not in VERIFIED_EAGER:
            out = (glb, None, f"its {NAME} is not one opgym has verified")
        else:
            kind = VERIFIED_EAGER[fingerprint(fn)]
            rkv = fn.__globals__.get("repeat_kv")
            if kind[0] and (not isinstance(rkv, types.FunctionType) or fingerprint(rkv) not in VERIFIED_REPEAT_KV):
                out = (glb, None, "its repeat_kv is not one opgym has verified")
            else:
                out = (glb, fn, kind)
    cache[cls] = out
    return out


def _attn_impl(m: nn.Module):
    return getattr(getattr(m, "config", None), "_attn_implementation", None)


def _is_vision(cls: type) -> bool:
    return fingerprint(cls.forward) in vision.VERIFIED_FORWARD and not wrappers(cls.forward)


def _dtype(m: nn.Module):
    p = next(m.parameters(), None)
    return p.dtype if p is not None else None


def _probe_notes(m: nn.Module, handle, kind, repeat_kv, is_vision: bool) -> None:
    """Runs the patch-time probes for this attention's signature (model dtype, this thread count) and
    says what they decided in handle.notes."""
    dtype = _dtype(m)
    if dtype not in (torch.float32, torch.float16, torch.bfloat16) or next(m.parameters()).is_meta:
        return
    if is_vision:
        H, D = getattr(m, "num_heads", None), getattr(m, "head_dim", None)
        cfg = getattr(m, "config", None)
        try:
            side = cfg.window_size // cfg.spatial_merge_size // cfg.patch_size
            Lmax = side * side * cfg.spatial_merge_size ** 2
        except (AttributeError, TypeError, ZeroDivisionError):
            return
        if not (isinstance(H, int) and isinstance(D, int) and Lmax > 0):
            return
        q = torch.empty(1, H, 1, D, dtype=dtype, device="cpu")
        ok = vision.one_pass_ok(q, q, Lmax)
        handle.notes[f"attn_softmax vision {str(dtype).replace('torch.', '')} H{H} D{D} windows<={Lmax} "
                     f"{torch.get_num_threads()} thread(s)"] = (
            "all windows in one pass: the probe found HF's per-window bits" if ok else
            "HF's window loop: the one-pass GEMMs' bits differ from HF's per-window ones (probe)")
        return
    G, D = getattr(m, "num_key_value_groups", None), getattr(m, "head_dim", None)
    if not (kind[0] and isinstance(G, int) and G > 1 and isinstance(D, int)):
        return
    KV = getattr(getattr(m, "config", None), "num_key_value_heads", None)
    if not isinstance(KV, int):
        return
    for S in (1, 2):
        q = torch.empty(1, KV * G, S, D, dtype=dtype, device="cpu")
        k = torch.empty(1, KV, 1024, D, dtype=dtype, device="cpu")
        sig = text._signature(q, k, k, G)
        ok = text.grouped_ok(q, k, k, G, repeat_kv)
        key, note = text.describe(sig, ok)
        handle.notes[key] = note


def apply(model: nn.Module, handle, devices) -> None:
    """Gives every attention of `model` that calls a verified eager_attention_forward, under HF's eager
    implementation, a forward copy in which that function is opgym's (and Qwen2.5-VL's vision
    attention its one-pass forward)."""
    devices = frozenset(d for d in devices if d == "cpu")  # see the module docstring
    cache: dict = {}
    eagers: dict = {}   # HF's function -> opgym's (one per modeling module in this model)
    visions: dict = {}  # HF's function -> opgym_vision_attention
    probed: set = set()
    counters = handle.counters("attn_softmax")
    for name, m in model.named_modules():
        cls = type(m)
        found = _verified(cls, cache)
        if found is None:
            continue
        glb, original, kind = found
        if original is None:
            handle.skipped[name] = f"{cls.__name__}: {kind} (attn_softmax)"
            continue
        impl = _attn_impl(m)
        if impl != "eager":
            handle.skipped[name] = (f"{cls.__name__}: attention implementation {impl!r}; attn_softmax serves HF's "
                                    f"eager attention only (attn_softmax)")
            continue
        if (own_forward(m) and not hooks.managed(m)) or handle.owned_elsewhere(m, "attn_softmax"):
            handle.skipped[name] = "forward already replaced on the instance (attn_softmax)"
            continue
        repeat_kv = original.__globals__.get("repeat_kv")
        if original not in eagers:
            eagers[original] = text.make_eager(original, repeat_kv, kind[0], kind[1], counters, devices, ENV_SWITCH)
        names, body = {NAME: eagers[original]}, None
        is_vision = _is_vision(cls)
        if is_vision:
            if original not in visions:
                visions[original] = vision.make_vision_attention((original, eagers[original]), counters, devices,
                                                                 ENV_SWITCH)
            names["opgym_vision_attention"], body = visions[original], vision.forward
        if (cls, is_vision) not in probed:
            probed.add((cls, is_vision))
            _probe_notes(m, handle, kind, repeat_kv, is_vision)
        hooks.hook(m, names, body=body, handle=handle, op="attn_softmax", path=name)


def served(model: nn.Module) -> list:
    """(path, module, HF's eager function, is the Qwen2.5-VL vision attention) of every attention
    opgym.patch would serve (for capture and sites)."""
    cache: dict = {}
    out = []
    for name, m in model.named_modules():
        found = _verified(type(m), cache)
        if found is None or found[1] is None or _attn_impl(m) != "eager":
            continue
        out.append((name, m, found[1], _is_vision(type(m))))
    return out


def sites(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The attention modules whose eager attention opgym.patch serves."""
    return [(n, m) for n, m, _, _ in served(model)]
