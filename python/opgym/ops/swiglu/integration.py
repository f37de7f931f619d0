"""SwiGLU MLPs in HF models (opgym.patch's op "swiglu"; switch OPGYM_SWIGLU): `down_proj(act_fn(
gate_proj(x)) * up_proj(x))` becomes one GEMM for gate and up (their weights merged),
torch.ops.opgym.swiglu_merged, and down_proj.

Which modules, and how the structure is proven: an MLP is served only when its class's forward is,
statement for statement, one opgym has verified (`FINGERPRINTS`: transformers 5.23's Qwen2MLP, which
Qwen2.5-VL's text model, Qwen3 and Llama share, and Qwen2_5_VLMLP, the vision tower's, with biases),
its act_fn is nn.SiLU or transformers' SiLUActivation (forward verified, no hooks), and gate_proj, up_proj and down_proj are plain nn.Linear (not a
subclass: quantized and LoRA-wrapped Linears fall outside) of one dtype and device, with no hooks on
any of the four modules. Anything else is left alone and listed in `handle.skipped` with the reason.

Merging (see _Merged): at patch time gate_proj's and up_proj's weights (and biases) are copied into one [2I, H]
buffer ([2I]) and the two Linears' parameters' data become views of its halves: memory does not grow,
the Linears still work on their own and keep their Parameter objects (an optimizer holding them is
unaffected). A state_dict (save_pretrained, tie checks) and undo() give each Linear storage of its own
again, with the same values; any move (.to(), load_state_dict(assign=True)) is noticed before the next
fused call, which merges again from the current values. Whether a model's MLPs are merged is measured, not assumed: at patch time, once per
(dtype, device, H, I, bias) in the process, a probe runs torch's GEMM on random rows of that shape
(T = 1, 5 and CHUNK_ROWS + 5) with the layer's own weights, and merges only if the merged GEMM gives the
separate GEMMs' bits exactly (OPGYM_SWIGLU_MODE: auto, the default; merged forces the merge; act never
merges). Measured here (oneDNN on AVX512-BF16): bf16 and fp16 identical on every Qwen2.5-VL shape, fp32
not at T = 1 on the vision MLP. Unmerged, only silu(gate) * up is fused and the GEMMs stay HF's.
Long inputs (prefill) run in chunks of CHUNK_ROWS rows when the same probe finds torch's GEMMs give
the same bits per row whatever the rows around them: HF's three [T, I] intermediates then exist for
CHUNK_ROWS rows at a time, which is where the MLP's peak memory goes. `handle.notes` says what was
decided for each signature and why.

At call time, when OPGYM_SWIGLU is not "0" and the op serves the input (a device with an opgym kernel,
the weights' dtype, no gradient needed), the fused path runs; otherwise, and on any error from opgym,
HF's own forward (counted as a fallback with the reason).
"""
from __future__ import annotations

import os

import torch
from torch import nn
import torch.nn.functional as F

from ...guard import FUSED_DTYPES, SettingError, fingerprint, guarded, wrappers, has_hooks as _has_hooks, tensor_reason
from . import SPEC

ENV_SWITCH = SPEC.switch
ENV_MODE = "OPGYM_SWIGLU_MODE"  # auto (default) | merged | act
CHUNK_ROWS = 256  # rows per chunk of a long input (merged mode, when the probe allows it)
_PROBED: dict[tuple, tuple[bool, bool]] = {}  # signature -> (merge gives HF's bits, chunks give the same bits)

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
    """The verified shape of cls.forward, or None (an unknown body, or a verified body inside a wrapper)."""
    if cls not in cache:
        kind = FINGERPRINTS.get(fingerprint(cls.forward) or "")
        cache[cls] = kind if kind and not wrappers(cls.forward) else None
    return cache[cls]


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
    if ws[0].is_meta:  # no data to probe or merge (a model built on the meta device, weights loaded later)
        return "weights on the meta device"
    if ws[0].dtype not in FUSED_DTYPES:
        return f"dtype {ws[0].dtype} not supported"
    if (g.bias is None) != (u.bias is None):
        return "gate_proj and up_proj differ in having a bias"
    if g.weight.shape != u.weight.shape or d.weight.shape[1] != g.weight.shape[0]:
        return "gate/up/down_proj shapes do not chain"
    return None


def _mode() -> str:
    mode = os.environ.get(ENV_MODE, "auto").strip().lower()
    if mode not in ("auto", "merged", "act"):
        raise SettingError(f"{ENV_MODE} must be auto, merged or act, got {mode!r}")
    return mode


def _signature(mlp) -> tuple:
    g, d = mlp.gate_proj, mlp.down_proj
    return (g.weight.dtype, g.weight.device, g.weight.shape[1], g.weight.shape[0], d.weight.shape[0], g.bias is not None)


def _probe(mlp) -> tuple[bool, bool]:
    """(merged GEMM == separate GEMMs, row chunks == whole) on random rows, bit for bit, with torch's own
    GEMMs on this machine; cached per signature."""
    key = _signature(mlp)
    if key in _PROBED:
        return _PROBED[key]
    g, u, d = mlp.gate_proj, mlp.up_proj, mlp.down_proj
    dtype, device, H, _, _, _ = key
    gen = torch.Generator().manual_seed(0)
    merged_ok = chunk_ok = True
    with torch.no_grad():
        w = torch.cat([g.weight, u.weight])
        b = torch.cat([g.bias, u.bias]) if g.bias is not None else None
        for T in (1, 5, CHUNK_ROWS + 5):
            x = torch.randn(T, H, generator=gen).to(dtype=dtype, device=device)
            whole = F.linear(x, w, b)
            sep = torch.cat([F.linear(x, g.weight, g.bias), F.linear(x, u.weight, u.bias)], -1)
            merged_ok = merged_ok and torch.equal(whole, sep)
            if T > CHUNK_ROWS:
                parts = torch.cat([F.linear(x[:CHUNK_ROWS], w, b), F.linear(x[CHUNK_ROWS:], w, b)])
                act = torch.ops.opgym.swiglu_merged(whole)
                down_whole = F.linear(act, d.weight, d.bias)
                down_parts = torch.cat([F.linear(act[:CHUNK_ROWS], d.weight, d.bias),
                                        F.linear(act[CHUNK_ROWS:], d.weight, d.bias)])
                chunk_ok = torch.equal(parts, whole) and torch.equal(down_parts, down_whole)
    _PROBED[key] = (merged_ok, chunk_ok)
    return _PROBED[key]


class _Merged:
    """gate_proj's and up_proj's weights (and biases) as the two halves of one [2I, H] buffer ([2I]).

    The Linears keep their Parameter objects (an optimizer built before patch() still holds them);
    only their `.data` becomes a view of the buffer, so memory does not grow. The merge is checked
    before every eager fused call and made again from the Linears' current values when anything
    replaced their data (`.to()`, `.half()`, load_state_dict(assign=True), a device move): the fused
    path never reads a stale buffer. When the dtype, device or shapes changed, the GEMM probe runs
    again for the new signature (a bf16 merge that was exact need not be in fp32). The merge is undone
    (each Linear gets contiguous storage of its own, the same values) whenever the MLP's state_dict is
    taken, so no state_dict, save_pretrained or tie check ever sees two weights sharing storage; the
    next fused call merges again (one copy of gate and up for that layer)."""

    def __init__(self, mlp: nn.Module, mode: str, chunk: bool):
        self.mlp, self.mode = mlp, mode
        self.w = self.b = None
        self.sig, self.ok, self.chunk = _signature(mlp), True, chunk

    def allowed(self) -> bool:
        """Whether the merged GEMM may serve the Linears as they are now (see the class docstring)."""
        sig = _signature(self.mlp)
        if sig != self.sig:
            same, chunk = _probe(self.mlp)
            self.sig, self.ok, self.chunk = sig, same or self.mode == "merged", chunk and (same or self.mode == "merged")
        return self.ok

    def _params(self):
        g, u = self.mlp.gate_proj, self.mlp.up_proj
        return [(g.weight, u.weight)] + ([(g.bias, u.bias)] if g.bias is not None else [])

    def intact(self) -> bool:
        if self.w is None:
            return False
        for (pg, pu), buf in zip(self._params(), (self.w, self.b)):
            n = pg.shape[0]
            if (buf is None or pg.dtype != buf.dtype or pg.device != buf.device
                    or pg.data_ptr() != buf.data_ptr() or pu.data_ptr() != buf[n:].data_ptr()):
                return False
        return True

    def current(self):
        """(w, b) of the merged GEMM, merging again first when the Linears' data moved."""
        if not self.intact():
            self.merge()
        return self.w, self.b

    def merge(self) -> None:
        bufs = []
        with torch.no_grad():
            for pg, pu in self._params():
                n = pg.shape[0]
                buf = torch.cat([pg.detach(), pu.detach()])
                pg.data, pu.data = buf[:n], buf[n:]
                bufs.append(buf)
        self.w, self.b = bufs[0], (bufs[1] if len(bufs) > 1 else None)

    def unmerge(self, *_args, **_kwargs) -> None:
        if self.w is None:
            return
        with torch.no_grad():
            for pg, pu in self._params():
                if pg.untyped_storage().data_ptr() == pu.untyped_storage().data_ptr():  # one storage: each its own
                    pg.data, pu.data = pg.data.clone(), pu.data.clone()
        self.w = self.b = None


def _merge(mlp: nn.Module, handle, mode: str, chunk: bool) -> _Merged:
    state = _Merged(mlp, mode, chunk)
    state.merge()
    hook = mlp.register_state_dict_pre_hook(state.unmerge)

    def undo():
        hook.remove()
        state.unmerge()

    handle.on_undo(undo)
    return state


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


def _make_forward(mlp: nn.Module, merge: bool, chunk: bool, handle, counters, devices):
    hf_forward = type(mlp).forward.__get__(mlp)
    down = mlp.down_proj
    gate, up, act = mlp.gate_proj, mlp.up_proj, torch.ops.opgym.swiglu.default

    def act_only(x):
        return down(act(gate(x), up(x)))

    if merge:
        state = _merge(mlp, handle, _mode(), chunk)
        merged = torch.ops.opgym.swiglu_merged.default
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
            if not state.chunk or rows <= CHUNK_ROWS or torch.compiler.is_compiling():
                return down(merged(F.linear(x, w, b)))
            # Prefill: CHUNK_ROWS rows at a time (the probe showed the GEMMs give the same bits).
            xs = x.reshape(rows, H)
            out = torch.empty(rows, H_out, dtype=x.dtype, device=x.device)
            for i in range(0, rows, CHUNK_ROWS):
                out[i:i + CHUNK_ROWS] = down(merged(F.linear(xs[i:i + CHUNK_ROWS], w, b)))
            return out.view(*x.shape[:-1], H_out)
    else:
        fused = act_only

    return guarded(ENV_SWITCH, counters, fused, hf_forward,
                   lambda x: _fallback_reason(x, mlp.gate_proj.weight, devices))


def swiglu_mlps(model: nn.Module) -> list[tuple[str, nn.Module, str]]:
    """(name, module, kind) of every MLP opgym.patch would serve (for opgym.capture)."""
    kinds: dict[type, str | None] = {}
    return [(n, m, k) for n, m in model.named_modules()
            if (k := mlp_kind(type(m), kinds)) is not None and _verdict(m) is None]


def apply(model: nn.Module, handle, devices) -> None:
    mode = _mode()
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
        if mode == "act":
            merge, chunk, why = False, False, f"{ENV_MODE}=act"
        else:
            same, chunk = _probe(mlp)
            merge = same or mode == "merged"
            why = ("merged GEMM gives the separate GEMMs' bits (probe)" if same else
                   f"forced by {ENV_MODE}=merged (the probe found the merged GEMM's bits differ)" if merge else
                   "merged GEMM's bits differ from the separate GEMMs' (probe): activation only")
            chunk = chunk and merge
        sig = _signature(mlp)
        note = (f"{'merged' if merge else 'act'}: {why}"
                + (f"; prefill in chunks of {CHUNK_ROWS} rows (same bits, probe)" if chunk else ""))
        handle.notes[f"swiglu {str(sig[0]).replace('torch.', '')} H{sig[2]} I{sig[3]}{' bias' if sig[5] else ''}"] = note
        handle.replace_forward(mlp, "swiglu", name,
                               _make_forward(mlp, merge, chunk, handle, handle.counters("swiglu"), devices))



def sites(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The MLPs opgym.patch would serve."""
    return [(n, m) for n, m, _ in swiglu_mlps(model)]
