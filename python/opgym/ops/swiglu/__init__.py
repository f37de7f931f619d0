"""SwiGLU (src/ops/swiglu/): silu(gate) * up with torch's roundings, and the gated MLP around it.

The op's folder: this file (its spec and Python API), integration.py (opgym.patch), capture.py
(opgym.capture's cases), bench.py (`opgym bench --op swiglu`), swiglu.cpp / swiglu_cuda.cpp (the torch
operators). The numeric contract is src/ops/swiglu/README.md.
"""
from __future__ import annotations

import torch

from ..._library import require
from ..spec import OpSpec

SPEC = OpSpec(
    name="swiglu",
    title="SwiGLU",
    switch="OPGYM_SWIGLU",
    torch_ops=('swiglu', 'swiglu_merged', 'swiglu_mlp'),
    runners=('swiglu', 'swiglu_mlp'),
    exports=("swiglu", "swiglu_merged", "swiglu_mlp",),
    summary="silu(gate) * up with torch's own exp (HF's bits); the MLP with torch's GEMMs",
)


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up with torch's roundings (silu in fp32 rounded to the dtype, then the product)."""
    require()
    return torch.ops.opgym.swiglu(gate, up)


def swiglu_merged(gate_up: torch.Tensor) -> torch.Tensor:
    """swiglu on gate_up = [..., gate | up] (vLLM's silu_and_mul): [..., 2I] -> [..., I]."""
    require()
    return torch.ops.opgym.swiglu_merged(gate_up)


def swiglu_mlp(x: torch.Tensor, w_gate_up: torch.Tensor, b_gate_up: torch.Tensor | None, w_down: torch.Tensor,
               b_down: torch.Tensor | None = None) -> torch.Tensor:
    """down(swiglu_merged(x @ w_gate_up.T + b_gate_up)) with torch's own GEMMs (aten::linear);
    w_gate_up is [2I, H] (gate rows first), w_down [H_out, I]."""
    require()
    return torch.ops.opgym.swiglu_mlp(x, w_gate_up, b_gate_up, w_down, b_down)
