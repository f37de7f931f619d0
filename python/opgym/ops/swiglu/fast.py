"""Fast tier for SwiGLU MLPs: gate_proj and up_proj as one GEMM without the probe.

The exact swiglu integration merges an MLP's gate and up projections into one [2I, H] GEMM only where a
probe of torch's GEMM on this machine shows the merged product has the separate products' bits (on the
2-vCPU AVX512-BF16 Xeon: bf16 and fp16 at every Qwen2.5-VL shape, not fp32 at one row on the vision
MLP); elsewhere it fuses the activation alone. In a fast patch the integration runs with
OPGYM_SWIGLU_MODE=merged (its own setting: merge whatever the probe says; a value the user set wins),
so every MLP it serves gets the one GEMM. The MLPs whose merged GEMM really differs from HF's two are
recorded in handle.fast["gate_up_merged"] (the same probe: random rows at 1, 5 and 261 rows, bit for
bit); where the probe finds the same bits the merge is the exact tier's and nothing is recorded.

Which wins where both meet: this is the exact op run with another setting, so there is one forward per
MLP, the integration's; the fast tier only lifts its probe.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

NAME = "gate_up_merged"
TITLE = "SwiGLU MLP: gate and up as one GEMM even where the merged GEMM's bits differ (no probe)"
DEFAULT = True
EXACT_SETTINGS = {"OPGYM_SWIGLU_MODE": "merged"}
PROBE_ROWS = (1, 5, 261)

_SAME: dict[tuple, bool] = {}


def _merged_same_bits(g: nn.Linear, u: nn.Linear) -> bool:
    """Whether one GEMM over [gate; up] gives the two GEMMs' bits on random rows (cached per signature)."""
    w = g.weight
    key = (w.dtype, w.device, w.shape[1], w.shape[0], g.bias is not None)
    if key not in _SAME:
        gen = torch.Generator().manual_seed(0)
        same = True
        with torch.no_grad():
            wc = torch.cat([g.weight, u.weight])
            bc = torch.cat([g.bias, u.bias]) if g.bias is not None and u.bias is not None else None
            for rows in PROBE_ROWS:
                x = torch.randn(rows, w.shape[1], generator=gen).to(dtype=w.dtype, device=w.device)
                sep = torch.cat([F.linear(x, g.weight, g.bias), F.linear(x, u.weight, u.bias)], -1)
                same = same and torch.equal(F.linear(x, wc, bc), sep)
        _SAME[key] = same
    return _SAME[key]


def _shares_storage(g: nn.Linear, u: nn.Linear) -> bool:
    return g.weight.untyped_storage().data_ptr() == u.weight.untyped_storage().data_ptr()


def apply_fast(model: nn.Module, handle, devices) -> None:
    served = handle.patched_by_op.get("swiglu")
    if served is None:
        handle.notes[f"fast {NAME}"] = "left alone: the swiglu op is not applied (ops=...)"
        return
    modules = dict(model.named_modules())
    merged = exact = 0
    for path in served:
        mlp = modules.get(path)
        g, u = getattr(mlp, "gate_proj", None), getattr(mlp, "up_proj", None)
        if not isinstance(g, nn.Linear) or not isinstance(u, nn.Linear) or not _shares_storage(g, u):
            continue  # not merged by the integration (another form, or OPGYM_SWIGLU_MODE=act set by the user)
        if _merged_same_bits(g, u):
            exact += 1
        else:
            merged += 1
            handle.fast[NAME].append(path)
    handle.notes[f"fast {NAME}"] = (f"{merged} MLP(s) merged where the GEMM's bits differ; {exact} merged "
                                    f"exactly (the probe's same bits: the exact tier's merge)")
