"""The attention core (src/ops/attn_softmax/): HF eager's statements between the two matmuls -
`scores * scaling`, `+ mask`, `softmax(dtype=float32)`, `.to(q.dtype)` - in one pass, with torch's
own CPU softmax bits; and the windowed form (segments of uneven length in one buffer) for vision
towers that attend within windows.

The op's folder: this file (its spec and Python API), attn_softmax.cpp (the torch operators, and
opgym::attn_eager: HF's whole eager_attention_forward as one operator around the core), integration.py
(opgym.patch: text.py, vision.py), capture.py, bench.py. The numeric contract is
src/ops/attn_softmax/README.md.
"""
from __future__ import annotations

import torch

from ..._library import require
from ..spec import OpSpec

SPEC = OpSpec(
    name="attn_softmax",
    title="attention softmax",
    switch="OPGYM_ATTN_SOFTMAX",
    torch_ops=("attn_softmax", "attn_softmax_", "attn_softmax_segments", "attn_softmax_segments_", "attn_eager",
               "attn_windows"),
    runners=("attn_softmax",),
    exports=("attn_softmax", "attn_softmax_", "attn_softmax_segments", "attn_softmax_segments_"),
    summary="scale, mask add, fp32 softmax and the cast back between HF eager attention's two matmuls",
)


def attn_softmax(scores: torch.Tensor, scale: float, mask: torch.Tensor | None = None) -> torch.Tensor:
    """softmax(round(round(scores * scale) + mask), fp32) rounded to scores' dtype: HF eager's bits. mask
    broadcasts over scores' leading dims as HF passes it (or None)."""
    require()
    return torch.ops.opgym.attn_softmax(scores, float(scale), mask)


def attn_softmax_(scores: torch.Tensor, scale: float, mask: torch.Tensor | None = None) -> None:
    """attn_softmax in place in scores."""
    require()
    torch.ops.opgym.attn_softmax_(scores, float(scale), mask)


def attn_softmax_segments(scores: torch.Tensor, scale: float, cu_seqlens: torch.Tensor,
                          block_diagonal: bool = False) -> torch.Tensor:
    """The softmax of each window's own rows and columns: windows [cu_seqlens[i], cu_seqlens[i + 1]) of
    uneven length in one buffer, packed at column 0 (or, with block_diagonal, at the window's own
    columns); every other column is written 0."""
    require()
    return torch.ops.opgym.attn_softmax_segments(scores, float(scale), cu_seqlens, bool(block_diagonal))


def attn_softmax_segments_(scores: torch.Tensor, scale: float, cu_seqlens: torch.Tensor,
                           block_diagonal: bool = False) -> None:
    """attn_softmax_segments in place in scores."""
    require()
    torch.ops.opgym.attn_softmax_segments_(scores, float(scale), cu_seqlens, bool(block_diagonal))
