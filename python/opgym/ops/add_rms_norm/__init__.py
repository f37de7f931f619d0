"""Residual add + RMSNorm (src/ops/add_rms_norm/): the sum HF's decoder layer forms, then its norm.

The op's folder: this file (its spec and Python API), integration.py (opgym.patch), capture.py
(opgym.capture's cases), bench.py (`opgym bench --op add_rms_norm`), add_rms_norm.cpp / add_rms_norm_cuda.cpp (the torch
operators). The numeric contract is src/ops/add_rms_norm/README.md.
"""
from __future__ import annotations

import torch

from ..._library import require
from ..spec import OpSpec

SPEC = OpSpec(
    name="add_rms_norm",
    title="residual add + RMSNorm",
    switch="OPGYM_ADD_RMS_NORM",
    torch_ops=('add_rms_norm', 'add_rms_norm_'),
    runners=('add_rms_norm',),
    exports=("add_rms_norm", "add_rms_norm_",),
    summary="residual + x rounded as HF rounds it, then RMSNorm of the sum, in one call",
)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, mode: str = "hf",
                 weight_offset: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(residual + x), residual + x): HF's `residual + hidden_states` (rounded to x's dtype)
    followed by its RMSNorm, in one pass. residual must have x's shape and dtype."""
    require()
    return torch.ops.opgym.add_rms_norm(x, residual, weight, float(eps), mode, weight_offset)


def add_rms_norm_(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, mode: str = "hf",
                  weight_offset: bool = False) -> None:
    """In place, as vLLM and FlashInfer do: residual <- residual + x, x <- rms_norm(that sum). Needs the
    output dtype to be x's; x and residual must not overlap."""
    require()
    torch.ops.opgym.add_rms_norm_(x, residual, weight, float(eps), mode, weight_offset)
