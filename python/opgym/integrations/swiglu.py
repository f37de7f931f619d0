"""SwiGLU MLPs in HF models: `down_proj(act_fn(gate_proj(x)) * up_proj(x))` becomes one GEMM for gate
and up (their weights merged), torch.ops.opgym.swiglu_merged, and down_proj (registered with
opgym.patch as the op "swiglu"; switch OPGYM_SWIGLU).

Which modules, and how the structure is proven: an MLP is served only when its class's forward is,
statement for statement, one opgym has verified (`FINGERPRINTS`: transformers 5.23's Qwen2MLP, which
Qwen2.5-VL's text model, Qwen3 and Llama share, and Qwen2_5_VLMLP, the vision tower's, with biases),
its act_fn is nn.SiLU or transformers' SiLUActivation (forward verified, no hooks), and gate_proj, up_proj and down_proj are plain nn.Linear (not a
subclass: quantized and LoRA-wrapped Linears fall outside) of one dtype and device, with no hooks on
any of the four modules. Anything else is left alone and listed in `handle.skipped` with the reason.

Merging (mode "merged", the default for bf16/fp16): at patch time gate_proj's and up_proj's weights
(and biases) are copied into one [2I, H] buffer ([2I]) and the two Linears' parameters become views of
its halves: memory does not grow, and the Linears still work on their own. undo() gives each Linear a
contiguous parameter of its own again, with the same values. Mode "act" (the default for fp32, and
OPGYM_SWIGLU_MODE=act): the two GEMMs stay HF's and only silu(gate) * up is fused.
Why the defaults: torch's CPU GEMM (oneDNN) gave the same bits for the merged [2I, H] GEMM as for the
two separate ones on every bf16/fp16 shape measured (T = 1, 7, 282, 1024 on both Qwen2.5-VL MLPs), but
not for fp32 at T = 1 on the vision MLP (0.1% of elements differ): docs/PERF.md, "swiglu".

At call time, when OPGYM_SWIGLU is not "0" and the op serves the input (a device with an opgym kernel,
the weights' dtype, no gradient needed), the fused path runs; otherwise, and on any error from opgym,
HF's own forward (counted as a fallback with the reason).
"""
from __future__ import annotations

import os

import torch
from torch import nn
import torch.nn.functional as F

from ..patch import FUSED_DTYPES, count, fingerprint, register, switch_on

ENV_SWITCH = "OPGYM_SWIGLU"
ENV_MODE = "OPGYM_SWIGLU_MODE"  # auto (default) | merged | act

FINGERPRINTS = {
    "b8c28f7223279a0b": "text",    # transformers 5.23: Qwen2MLP (Qwen2.5-VL's text MLP), Qwen3MLP, LlamaMLP
    "2c2e006200b009b0": "vision",  # transformers 5.23: Qwen2_5_VLMLP (the vision tower's, biases)
}


# act_fn classes whose forward is F.silu(input), verified: transformers 5.23's SiLUActivation.
SILU_FINGERPRINTS = {"b3b9c87d0aff49a2"}


def _is_silu(act) -> bool:
    if type(act) is nn.SiLU:
        return not getattr(act, "inplace", False)
    return isinstance(act, nn.Module) and fingerprint(type(act).forward) in SILU_FINGERPRINTS


def mlp_kind(cls: type, cache: dict) -> str | None:
    if cls not in cache:
        cache[cls] = FINGERPRINTS.get(fingerprint(cls.forward) or "")
    return cache[cls]


def _has_hooks(m: nn.Module) -> bool:
    return bool(m._forward_hooks or m._forward_pre_hooks or getattr(m, "_backward_hooks", None)
                or getattr(m, "_backward_pre_hooks", None)) or "forward" in m.__dict__


def _verdict(mlp: nn.Module) -> str | None:
    """Why opgym cannot serve this MLP, or None."""
    linears = [getattr(mlp, n, None) for n in ("gate_proj", "up_proj", "down_proj")]
    if any(type(l) is not nn.Linear for l in linears):
        return "gate/up/down_proj are not plain nn.Linear (quantized, LoRA-wrapped or replaced)"
    act = getattr(mlp, "act_fn", None)
    if not _is_silu(act) or _has_hooks(act):
        return f"act_fn is {type(act).__name__}, not a SiLU opgym has verified"
    if any(_has_hooks(m) for m in (mlp, *linears)):
        return "a hook or an instance forward on the MLP or its Linears"
    g, u, d = linears
    ws = [g.weight, u.weight, d.weight] + [b for b in (g.bias, u.bias, d.bias) if b is not None]
    if len({(w.dtype, w.device) for w in ws}) != 1:
        return "weights of more than one dtype or device"
    if ws[0].dtype not in FUSED_DTYPES:
        return f"dtype {ws[0].dtype} not supported"
    if (g.bias is None) != (u.bias is None):
        return "gate_proj and up_proj differ in having a bias"
    if g.weight.shape != u.weight.shape or d.weight.shape[1] != g.weight.shape[0]:
        return "gate/up/down_proj shapes do not chain"
    return None


def _mode_for(dtype: torch.dtype) -> str:
    mode = os.environ.get(ENV_MODE, "auto").strip().lower()
    if mode not in ("auto", "merged", "act"):
        raise ValueError(f"{ENV_MODE} must be auto, merged or act, got {mode!r}")
    if mode == "auto":
        return "act" if dtype == torch.float32 else "merged"
    return mode


def _merge(mlp: nn.Module, handle) -> tuple[torch.Tensor, torch.Tensor | None]:
    """gate_proj's and up_proj's parameters become views of one buffer; returns (weight, bias)."""
    g, u = mlp.gate_proj, mlp.up_proj
    n = g.weight.shape[0]
    with torch.no_grad():
        w = torch.cat([g.weight, u.weight])
        b = torch.cat([g.bias, u.bias]) if g.bias is not None else None
    saved = []
    for lin, sl in ((g, slice(0, n)), (u, slice(n, 2 * n))):
        saved.append((lin, lin.weight.requires_grad, lin.bias.requires_grad if lin.bias is not None else None))
        lin.weight = nn.Parameter(w[sl], requires_grad=lin.weight.requires_grad)
        if b is not None:
            lin.bias = nn.Parameter(b[sl], requires_grad=lin.bias.requires_grad)

    def unmerge():
        with torch.no_grad():
            for lin, wrg, brg in saved:
                lin.weight = nn.Parameter(lin.weight.detach().clone(), requires_grad=wrg)
                if brg is not None:
                    lin.bias = nn.Parameter(lin.bias.detach().clone(), requires_grad=brg)

    handle.on_undo(unmerge)
    return w, b


def _fallback_reason(x, w, devices) -> str | None:
    if not isinstance(x, torch.Tensor):
        return "input is not a tensor"
    if not (x.is_cpu or (x.is_cuda and "cuda" in devices)):
        return f"no opgym kernel for device {x.device.type}"
    if x.dtype != w.dtype:
        return f"input dtype {x.dtype} differs from the weights' {w.dtype}"
    if x.device != w.device:
        return "input on another device"
    if torch.is_grad_enabled() and (x.requires_grad or w.requires_grad):
        return "gradient needed (opgym::swiglu has no backward)"
    if x.dim() < 1 or x.shape[-1] != w.shape[1]:
        return "shape mismatch"
    return None


def _make_forward(mlp: nn.Module, mode: str, handle, counters, devices):
    hf_forward = type(mlp).forward.__get__(mlp)
    down = mlp.down_proj
    if mode == "merged":
        w, b = _merge(mlp, handle)
        merged = torch.ops.opgym.swiglu_merged.default

        def fused(x):
            return down(merged(F.linear(x, w, b)))
    else:
        gate, up = mlp.gate_proj, mlp.up_proj
        act = torch.ops.opgym.swiglu.default

        def fused(x):
            return down(act(gate(x), up(x)))

    def forward(x):
        weight = mlp.gate_proj.weight
        if torch.compiler.is_compiling():  # decided once per graph, not counted (see patch.Stats)
            if switch_on(ENV_SWITCH) and _fallback_reason(x, weight, devices) is None:
                return fused(x)
            return hf_forward(x)
        if not switch_on(ENV_SWITCH):
            reason = f"{ENV_SWITCH}=0"
        else:
            reason = _fallback_reason(x, weight, devices)
            if reason is None:
                try:
                    y = fused(x)
                except Exception as e:  # noqa: BLE001 - never raise because of opgym
                    reason = f"opgym error: {type(e).__name__}"
                else:
                    count(counters, True)
                    return y
        count(counters, False, reason)
        return hf_forward(x)

    return forward


def swiglu_mlps(model: nn.Module) -> list[tuple[str, nn.Module, str]]:
    """(name, module, kind) of every MLP opgym.patch would serve (for opgym.capture)."""
    kinds: dict[type, str | None] = {}
    return [(n, m, k) for n, m in model.named_modules()
            if (k := mlp_kind(type(m), kinds)) is not None and _verdict(m) is None]


def apply(model: nn.Module, handle, devices) -> None:
    kinds: dict[type, str | None] = {}
    for name, mlp in model.named_modules():
        cls = type(mlp)
        kind = mlp_kind(cls, kinds)
        if kind is None:
            if cls.__name__.endswith("MLP"):
                handle.skipped[name] = f"{cls.__name__}: forward not one opgym has verified (swiglu)"
            continue
        if handle.owned_elsewhere(mlp, "swiglu"):
            handle.skipped[name] = "already patched (swiglu)"
            continue
        why = _verdict(mlp)
        if why is not None:
            handle.skipped[name] = f"{cls.__name__}: {why} (swiglu)"
            continue
        mode = _mode_for(mlp.gate_proj.weight.dtype)
        handle.replace_forward(mlp, "swiglu", name, _make_forward(mlp, mode, handle, handle.counters("swiglu"), devices))


register("swiglu", ENV_SWITCH, apply)
