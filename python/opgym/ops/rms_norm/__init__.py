"""RMSNorm (src/ops/rms_norm/): y = x / sqrt(mean(x^2) + eps) * weight with HF eager's roundings.

The op's folder: this file (its spec and Python API), integration.py (opgym.patch), capture.py
(opgym.capture's cases), bench.py (`opgym bench --op rms_norm`), rms_norm.cpp / rms_norm_cuda.cpp (the torch
operators). The numeric contract is src/ops/rms_norm/README.md.
"""
from __future__ import annotations

import torch

from ..._library import require
from ..spec import OpSpec

SPEC = OpSpec(
    name="rms_norm",
    title="RMSNorm",
    switch="OPGYM_RMS_NORM",
    torch_ops=('rms_norm', 'rms_norm_out', 'rms_norm_'),
    runners=('rms_norm',),
    exports=("rms_norm", "rms_norm_out", "rms_norm_",),
    summary="RMSNorm of x over its last dim, scaled by weight (HF's Llama/Qwen2 rounding by default)",
)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, mode: str = "hf",
             weight_offset: bool = False) -> torch.Tensor:
    """RMSNorm of x over its last dim, scaled by weight (or 1 + weight with weight_offset).

    mode "hf" matches HF eager Llama/Qwen2 RMSNorm bit for bit; "fp32" rounds once at the end.
    The result has x's shape and torch's promotion of (weight, x) as dtype.
    """
    require()
    return torch.ops.opgym.rms_norm(x, weight, float(eps), mode, weight_offset)


def rms_norm_out(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, mode: str = "hf",
                 weight_offset: bool = False, *, out: torch.Tensor) -> torch.Tensor:
    """rms_norm into a preallocated `out` (x's shape, promoted dtype); returns out."""
    require()
    return torch.ops.opgym.rms_norm_out(x, weight, float(eps), mode, weight_offset, out=out)


def rms_norm_(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, mode: str = "hf",
              weight_offset: bool = False) -> torch.Tensor:
    """rms_norm in place in x; only when the output dtype equals x's (e.g. weight and x both bf16)."""
    require()
    return torch.ops.opgym.rms_norm_(x, weight, float(eps), mode, weight_offset)
