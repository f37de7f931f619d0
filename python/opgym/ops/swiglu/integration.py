"""Gated MLPs in HF models (opgym.patch's op "swiglu"; switch OPGYM_SWIGLU): `act(gate) * up` becomes
one torch.ops.opgym call (act: SiLU, or GELU with the tanh approximation: Gemma's GeGLU), and where gate
and up are separate Linears, one GEMM for both (merged weights).

Which modules, and how the structure is proven: a module is served only when its class's forward is,
statement for statement, one opgym has verified (forms.FORMS, by fingerprint: transformers 5.23's
separate gate/up MLPs (Qwen2MLP, which Qwen2.5-VL's text model, Qwen3, Llama, Mistral and ~120 types
share; Qwen2_5_VLMLP with biases; Idefics, Llama-4, LFM2, Seed-OSS), gate and up in one chunked Linear
(Phi-3, GLM, GLM-4, Granite-MoE-Hybrid), and forms with statements of their own (Falcon-H1's multipliers,
Beam's fp32 product, DeepSeek-V4's and GLM-5-Next's clamped inputs, GLM-4V-MoE's patch merger, T5Gemma-2's
dropout)), or an experts module of the MoE forms experts.py verifies; its activation is one opgym verified
(forms.act_kind: nn.SiLU, transformers' SiLUActivation, F.silu; transformers' GELUTanh (its `act` a
partial of F.gelu with approximate="tanh") or nn.GELU("tanh"): the Gemma family, RecurrentGemma,
VaultGemma, PaliGemma's text model; no hooks), and its Linears are plain nn.Linear (not a
subclass: quantized and LoRA-wrapped Linears fall outside) of one dtype and device, with no hooks.
Anything else is left alone; `handle.skipped` gives the reason (forms.KNOWN_UNSERVED names the gated
forms opgym knows and does not fuse).

Separate gate and up are merged into one [2I, H] buffer when a probe of torch's GEMM on this machine
shows the same bits (merge.py; OPGYM_SWIGLU_MODE auto|merged|act); in auto, where both forms are exact,
each call runs the one measured faster here for its row count (merge.race); a long prefill runs in row
chunks where the probe allows. `handle.notes` says what was decided for each signature and why.

At call time, when OPGYM_SWIGLU is not "0" and the op serves the input (a device with an opgym kernel,
the weights' dtype, no gradient needed), the fused path runs; otherwise, and on any error from opgym,
HF's own forward (counted as a fallback with the reason).
"""
from __future__ import annotations

import torch
from torch import nn
import torch.nn.functional as F

from ...guard import fingerprint, guarded, tensor_reason, wrappers
from . import SPEC, experts
from .forms import FORMS, KNOWN_UNSERVED, Chunked, Separate, act_kind, form_of, merged_op, pair_op, positional
from .merge import (CHUNK_ROWS, DECODE_ROWS, ENV_MODE, merge, mode as _mode, probe, race,  # noqa: F401 (re-exported)
                    race_note, signature)

ENV_SWITCH = SPEC.switch


def _fallback_reason(x, w, devices) -> str | None:
    reason = tensor_reason("swiglu", (x, w), devices)
    if reason is not None:
        return reason
    if x.dtype != w.dtype:
        return f"input dtype {x.dtype} differs from the weights' {w.dtype}"
    if x.device != w.device:
        return "input on another device"
    if x.dim() < 1 or x.shape[-1] != w.shape[1]:
        return "shape mismatch"
    return None


def _separate_forward(mlp: nn.Module, form: Separate, kind: str, merge_it: bool, chunk: bool, handle, counters,
                      devices, merged_for=(True, True)):
    """merged_for: (decode calls, prefill calls) take the merged GEMM (else the activation-only form on the
    same Linears, whose weights are then views of the merged buffer): both exact, the race chose."""
    hf_forward = type(mlp).forward.__get__(mlp)
    gate, up, down = form.linears(mlp)
    act, merged = pair_op(kind), merged_op(kind)
    tail = form.tail

    def finish(y):
        return y if tail is None else tail(mlp, y)

    def act_only(x):
        return finish(down(act(gate(x), up(x))))

    if merge_it:
        state = merge(mlp, gate, up, down, handle, _mode(), chunk, kind)
        H, H_out = gate.weight.shape[1], down.weight.shape[0]

        def fused(x):
            if torch.compiler.is_compiling():  # no merging inside a trace (nor data pointers): the buffer as it is
                w, b, g = state.w, state.b, gate.weight
                if w is None or w.dtype != g.dtype or w.device != g.device:
                    return act_only(x)
            else:
                if not state.allowed():  # dtype/device changed and the probe says merging differs there
                    state.unmerge()
                    return act_only(x)
                w, b = state.current()
            rows = x.numel() // H if H else 0
            if not torch.compiler.is_compiling() and not merged_for[int(rows >= DECODE_ROWS)]:
                return act_only(x)  # both exact; the activation-only form measured faster at this row count
            if not state.chunk or rows <= CHUNK_ROWS or torch.compiler.is_compiling():
                return finish(down(merged(F.linear(x, w, b))))
            # Prefill: CHUNK_ROWS rows at a time (the probe showed the GEMMs give the same bits).
            xs = x.reshape(rows, H)
            out = torch.empty(rows, H_out, dtype=x.dtype, device=x.device)
            for i in range(0, rows, CHUNK_ROWS):
                out[i:i + CHUNK_ROWS] = down(merged(F.linear(xs[i:i + CHUNK_ROWS], w, b)))
            return finish(out.view(*x.shape[:-1], H_out))
    else:
        fused = act_only

    return positional(guarded(ENV_SWITCH, counters, fused, hf_forward,
                              lambda x: _fallback_reason(x, gate.weight, devices)), hf_forward)


def _serve_separate(name: str, mlp: nn.Module, form: Separate, handle, devices, mode: str) -> None:
    kind = act_kind(form.act_of(mlp))
    gate, up, down = form.linears(mlp)
    if mode == "act":
        merge_it, chunk, why = False, False, f"{ENV_MODE}=act"
    else:
        same, chunk = probe(gate, up, down, kind)
        merge_it = same or mode == "merged"
        why = ("merged GEMM gives the separate GEMMs' bits (probe)" if same else
               f"forced by {ENV_MODE}=merged (the probe found the merged GEMM's bits differ)" if merge_it else
               "merged GEMM's bits differ from the separate GEMMs' (probe): activation only")
        chunk = chunk and merge_it
    merged_for, raced = (True, True), ""
    if mode == "auto" and merge_it:
        r = race(gate, up, down, kind)
        if r is not None:  # decode's verdict, then the prefill slice's
            merged_for = tuple(r[T][0] == "merged" for T in sorted(r))
            raced = "; " + race_note(r)
            chunk = chunk and merged_for[1]  # row chunks are the merged prefill's; act-only prefill runs whole
            if not any(merged_for):
                merge_it, chunk = False, False
                why = "both forms exact (probe); the activation-only form measured faster at every row count"
        else:
            raced = "; the speed race raised: merged kept"
    sig = signature(gate, down, kind)
    note = (f"{'merged' if merge_it else 'act'}: {why}"
            + (f"; prefill in chunks of {CHUNK_ROWS} rows (same bits, probe)" if chunk else "") + raced)
    act = "" if kind == "silu" else f" {kind}"
    handle.notes[f"swiglu {str(sig[0]).replace('torch.', '')} H{sig[2]} I{sig[3]}{' bias' if sig[5] else ''}{act}"] = note
    handle.replace_forward(mlp, "swiglu", name, _separate_forward(mlp, form, kind, merge_it, chunk, handle,
                                                                  handle.counters("swiglu"), devices, merged_for))


def _serve_other(name: str, mlp: nn.Module, form, handle, devices) -> None:
    """Chunked and Statements forms: the activation fused, every GEMM HF's own."""
    op = pair_op(act_kind(form.act_of(mlp)))
    fused, weight = form.fused(mlp, op)
    hf_forward = type(mlp).forward.__get__(mlp)
    handle.replace_forward(mlp, "swiglu", name, positional(guarded(
        ENV_SWITCH, handle.counters("swiglu"), fused, hf_forward, lambda x: _fallback_reason(x, weight, devices)),
        hf_forward))
    handle.notes.setdefault(f"swiglu form {form.label}", "act: the fused activation on HF's own GEMM outputs")


def _unknown_reason(cls: type) -> str | None:
    """Why a module opgym does not serve is skipped, when it is one worth naming: a gated form opgym
    knows (forms.KNOWN_UNSERVED), or a class that looks like an MLP (its name: for the report only)."""
    fp = fingerprint(cls.forward) or ""
    if fp in KNOWN_UNSERVED:
        return f"{cls.__name__}: {KNOWN_UNSERVED[fp]} (swiglu)"
    if fp in FORMS and wrappers(cls.forward):
        return f"{cls.__name__}: a verified forward inside a wrapper opgym has not verified (swiglu)"
    if cls.__name__.endswith(("MLP", "Mlp")):
        return f"{cls.__name__}: forward not one opgym has verified (swiglu)"
    return None


def swiglu_mlps(model: nn.Module) -> list[tuple[str, nn.Module, str]]:
    """(name, module, label) of every separate gate/up MLP opgym.patch would serve (for opgym.capture)."""
    cache: dict = {}
    return [(n, m, f.label) for n, m in model.named_modules()
            if isinstance(f := form_of(type(m), cache), Separate) and f.reason(m) is None]


def separate_linears(mlp: nn.Module):
    """(gate, up, down) Linears of a module swiglu_mlps returned."""
    return FORMS[fingerprint(type(mlp).forward)].linears(mlp)


def activation_of(mlp: nn.Module) -> str:
    """"silu" or "gelu_tanh": the activation of a module swiglu_mlps returned."""
    return act_kind(FORMS[fingerprint(type(mlp).forward)].act_of(mlp))


def apply(model: nn.Module, handle, devices) -> None:
    mode = _mode()
    cache: dict = {}
    for name, mlp in model.named_modules():
        cls = type(mlp)
        form = form_of(cls, cache)
        if form is None:
            ex = experts.match(cls)
            if ex is not None:
                experts.serve(name, mlp, ex, handle, devices)
                continue
            why = _unknown_reason(cls) or experts.unknown_reason(cls)
            if why is not None:
                handle.skipped[name] = why
            continue
        if handle.owned_elsewhere(mlp, "swiglu"):
            handle.skipped[name] = "already patched (swiglu)"
            continue
        why = form.reason(mlp)
        if why is not None:
            handle.skipped[name] = f"{cls.__name__}: {why} (swiglu)"
            continue
        if isinstance(form, Separate):
            _serve_separate(name, mlp, form, handle, devices, mode)
        else:
            _serve_other(name, mlp, form, handle, devices)


def sites(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The modules opgym.patch would serve."""
    cache: dict = {}
    out = []
    for n, m in model.named_modules():
        f = form_of(type(m), cache)
        if f is not None and f.reason(m) is None:
            out.append((n, m))
        elif f is None and (ex := experts.match(type(m))) is not None and experts.reason(m, ex) is None:
            out.append((n, m))
    return out


__all__ = ["apply", "sites", "swiglu_mlps", "separate_linears", "CHUNK_ROWS", "ENV_MODE", "ENV_SWITCH", "Chunked"]
