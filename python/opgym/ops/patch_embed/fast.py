"""Fast tier: the vision patch embedding as one GEMM (the patch_embed op's fast part).

Qwen2-VL's patch embedding (and that of the vision towers that share its forward: Qwen2.5-VL, Qwen3-VL,
Qwen3.5, GLM-4V, ...) views its input as [P, C, T, ph, pw] patches and runs a Conv3d whose kernel and
stride are exactly one patch: each output is the dot product of one flattened patch with one flattened
filter, i.e. the GEMM [P, C*T*ph*pw] x [C*T*ph*pw, E] (+ bias). torch's CPU conv runs it through oneDNN's
convolution, which takes ~100x the GEMM's time at 1024 patches on a 2-vCPU AVX-512/AMX Xeon (issue 25:
111.7 ms against 1.15 ms), and sums K in another order: about 1 output in 5,500 differs by an ulp.
Here the module's forward becomes F.linear over the flattened patches and the flattened kernel (a view
of the Conv3d's weight: no copy).

Served: a module whose class's forward is one opgym verified (FINGERPRINTS), whose `proj` is a plain
nn.Conv3d (not a subclass) with kernel == stride, no padding, dilation 1, groups 1, zero padding mode,
no hooks on either module, and whose in_channels / temporal_patch_size / patch_size agree with the
conv's shape. Anything else is left alone (handle.skipped says why). At call time: an input the
GEMM cannot take (its element count not a whole number of patches) runs the module's own forward,
counted as a fallback; OPGYM_FAST_PATCH_EMBED=0 turns the substitution off without re-patching.

Where the exact patch_embed op (integration.py) serves the same module, this substitution wins in a fast
patch: its forward is installed on top of the exact one (undo restores both in turn); the exact op keeps
the conv's bits at a cost the GEMM does not have.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ...guard import fingerprint, guarded, has_hooks, own_forward, wrappers

NAME = "patch_embed_gemm"
TITLE = "vision patch embedding (Conv3d, kernel = stride) as one F.linear"
DEFAULT = True
SWITCH = "OPGYM_FAST_PATCH_EMBED"

# transformers 5.23: Qwen2-VL's PatchEmbed and the classes that copy it (Qwen2.5-VL, Qwen3-VL, Qwen3-VL-MoE,
# Qwen3.5, Qwen3.5-MoE, Qwen3-Omni-MoE, GLM-4V, GLM-4V-MoE, GLM-OCR, GLM-5-Next, Exaone-4.5, ...)
FINGERPRINTS = {"7242792135da3e14"}


def _verdict(m: nn.Module) -> str | None:
    """Why the GEMM cannot stand in for this module's forward, or None."""
    conv = getattr(m, "proj", None)
    if type(conv) is not nn.Conv3d:
        return "proj is not a plain nn.Conv3d"
    if tuple(conv.kernel_size) != tuple(conv.stride):
        return "the conv's stride is not its kernel (patches overlap or skip)"
    pad = conv.padding
    if pad != "valid" and (isinstance(pad, str) or tuple(pad) != (0, 0, 0)):
        return "the conv pads"
    if tuple(conv.dilation) != (1, 1, 1) or conv.groups != 1 or conv.padding_mode != "zeros":
        return "dilated, grouped or non-zero padding mode conv"
    t, p = getattr(m, "temporal_patch_size", None), getattr(m, "patch_size", None)
    if tuple(conv.kernel_size) != (t, p, p) or getattr(m, "in_channels", None) != conv.in_channels \
            or getattr(m, "embed_dim", None) != conv.out_channels:
        return "patch_size / temporal_patch_size / in_channels / embed_dim do not match the conv"
    if has_hooks(conv) or m._forward_hooks or m._forward_pre_hooks:
        return "a hook or an instance forward on the module or its conv"
    if conv.weight.is_meta:
        return "weights on the meta device"
    return None


def _make_forward(m: nn.Module, original, counters):
    conv = m.proj

    def gemm(hidden_states):
        w = conv.weight
        w2 = w.view(w.shape[0], -1)  # [E, C*T*ph*pw]: the filter flattened in the patch's own order
        x = hidden_states.view(-1, w2.shape[1]).to(dtype=w.dtype)
        return F.linear(x, w2, conv.bias)

    def check(hidden_states):
        if not isinstance(hidden_states, torch.Tensor):
            return "input is not a tensor"
        k = conv.weight[0].numel()
        if hidden_states.numel() % k:
            return "input is not a whole number of patches"
        return None

    return guarded(SWITCH, counters, gemm, original, check)


def targets(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The patch embeddings whose forward opgym verified (served or not)."""
    out = []
    for name, m in model.named_modules():
        if fingerprint(type(m).forward) in FINGERPRINTS and not wrappers(type(m).forward):
            out.append((name, m))
    return out


def apply_fast(model: nn.Module, handle, devices) -> None:
    for name, m in targets(model):
        why = _verdict(m)
        if why is None and own_forward(m) and not m.__dict__.get("_opgym_patched"):
            why = "forward replaced on the instance (not by opgym)"
        if why is not None:
            handle.skipped[name] = f"{type(m).__name__}: {why} (fast {NAME})"
            continue
        original = m.forward  # the exact op's forward where it serves the module, else HF's
        handle.replace_forward_fast(m, NAME, name, _make_forward(m, original, handle.fast_counters(NAME)))
