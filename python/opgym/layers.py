"""Kernels-hub layers: what HF's `kernels` package swaps in for modules labelled with
`use_kernel_forward_from_hub(NAME)` (Qwen2.5-VL, Qwen2, Qwen3, Llama RMSNorm carry "RMSNorm").

`kernels` replaces the labelled class's forward by `RMSNorm.forward`, run on the original module
instance: the layer has no __init__ and no state of its own, it reads the module's `weight` and
`variance_epsilon`. The opgym package directory `opgym/kernels_hub` is a local kernel repository
exposing these layers (see opgym.hub_repository()).
"""
from __future__ import annotations

import torch
from torch import nn

from . import _library  # noqa: F401 - registers torch.ops.opgym


class RMSNorm(nn.Module):
    """HF Llama/Qwen RMSNorm through torch.ops.opgym.rms_norm (mode "hf": HF eager's rounding).

    Inference only: the operator has no autograd formula, so `has_backward = False` and `kernels`
    keeps the original forward in training mode. Works under torch.compile (fake kernels registered).
    """

    weight: torch.Tensor
    variance_epsilon: float

    can_torch_compile: bool = True
    has_backward: bool = False

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return torch.ops.opgym.rms_norm(hidden_states, self.weight, self.variance_epsilon, "hf", False)


__all__ = ["RMSNorm"]


def hub_repository() -> str:
    """The local kernel repository (a directory with metadata.json) that serves these layers, for
    `kernels.LocalLayerRepository(repo_path=..., layer_name="RMSNorm")` or transformers'
    `KernelConfig({"RMSNorm": f"{hub_repository()}:RMSNorm"}, use_local_kernel=True)`."""
    import os

    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernels_hub")


__all__ = ["RMSNorm", "hub_repository"]
