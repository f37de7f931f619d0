"""Rotary embeddings (src/ops/rotary/): HF's apply_rotary_pos_emb for q and k in one pass.

The op's folder: this file (its spec and Python API), integration.py (opgym.patch), capture.py
(opgym.capture's cases), bench.py (`opgym bench --op rotary`), rotary.cpp / rotary_cuda.cpp (the torch
operators). The numeric contract is src/ops/rotary/README.md.
"""
from __future__ import annotations

import torch

from ..._library import require
from ..spec import OpSpec

SPEC = OpSpec(
    name="rotary",
    title="rotary (q and k)",
    switch="OPGYM_ROTARY",
    torch_ops=('rotary', 'rotary_'),
    runners=('rotary', 'mrope'),
    exports=("rotary", "rotary_",),
    summary=("q and k rotated in one pass (HF's text rounding or the fp32 upcast; rotate_half, interleaved or "
             "DeepSeek's deinterleaving pairs; partial rotary dims; MRoPE sections)"),
)


def rotary(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, unsqueeze_dim: int = 1,
           mode: str = "hf", mrope_section=None, pairs: str = "half", pair_table: bool = False,
           contiguous: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(q * cos + rotate_half(q) * sin, the same for k) with cos/sin as HF passes them (before its
    unsqueeze), over the first R dims of each row; the rest is copied (R = cos.shape[-1], or twice it
    with pair_table). mode "hf": HF's text rounding (each op in q's dtype); "fp32": the upcast (one
    rounding at the end). pairs "half": rotate_half; "interleaved": adjacent pairs (HF's
    stack((-x2, x1), -1).flatten(-2)); "deinterleave": adjacent pairs in, halves out (DeepSeek-V3's
    apply_rotary_pos_emb_interleave). pair_table: cos/sin hold one value per pair (R / 2 wide).
    mrope_section (three lengths summing to R/2) takes cos/sin [3, ...] and recomposes them as Qwen2-VL
    does. contiguous: fresh contiguous outputs (what HF's torch.cat gives) instead of q's and k's
    layout."""
    require()
    return torch.ops.opgym.rotary(q, k, cos, sin, int(unsqueeze_dim), mode,
                                  None if mrope_section is None else [int(v) for v in mrope_section],
                                  pairs, bool(pair_table), bool(contiguous))


def rotary_(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, unsqueeze_dim: int = 1,
            mode: str = "hf", mrope_section=None, pairs: str = "half", pair_table: bool = False) -> None:
    """rotary in place in q and k (which must not overlap)."""
    require()
    torch.ops.opgym.rotary_(q, k, cos, sin, int(unsqueeze_dim), mode,
                            None if mrope_section is None else [int(v) for v in mrope_section],
                            pairs, bool(pair_table))
