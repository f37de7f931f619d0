"""SwiGLU / GeGLU (src/ops/swiglu/): act(gate) * up with torch's roundings (act: silu, or gelu with the tanh
approximation), and the gated MLP around it.

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
    summary="silu(gate) * up or gelu_tanh(gate) * up with torch's own exp / tanh (HF's bits); the MLP with torch's GEMMs",
)


ACTIVATIONS = ("silu", "gelu_tanh")


def swiglu(gate: torch.Tensor, up: torch.Tensor, activation: str = "silu") -> torch.Tensor:
    """act(gate) * up with torch's roundings (the activation in fp32 rounded to the dtype, then the product),
    on these very views: torch's `F.silu(gate) * up` (activation="silu") or `F.gelu(gate, approximate="tanh")
    * up` (activation="gelu_tanh"), bit for bit on the CPU."""
    require()
    return torch.ops.opgym.swiglu(gate, up, activation)


def swiglu_merged(gate_up: torch.Tensor, activation: str = "silu") -> torch.Tensor:
    """swiglu on gate_up = [..., gate | up] (vLLM's silu_and_mul): [..., 2I] -> [..., I]; gate stands for a
    separate, contiguous gate_proj output (for HF's `.chunk(2, -1)` views use swiglu on the halves)."""
    require()
    return torch.ops.opgym.swiglu_merged(gate_up, activation)


def swiglu_mlp(x: torch.Tensor, w_gate_up: torch.Tensor, b_gate_up: torch.Tensor | None, w_down: torch.Tensor,
               b_down: torch.Tensor | None = None, activation: str = "silu") -> torch.Tensor:
    """down(swiglu_merged(x @ w_gate_up.T + b_gate_up)) with torch's own GEMMs (aten::linear);
    w_gate_up is [2I, H] (gate rows first), w_down [H_out, I]."""
    require()
    return torch.ops.opgym.swiglu_mlp(x, w_gate_up, b_gate_up, w_down, b_down, activation)
