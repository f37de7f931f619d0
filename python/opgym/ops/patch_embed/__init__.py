"""The vision patch embedding (src/ops/patch_embed/): a Conv3d whose kernel equals its stride, computed as
the GEMM it is with the reduction order of the convolution kernel torch runs on this CPU (oneDNN's), bit for
bit - one AMX TDPBF16PS per kernel position (amx_tile), the VDPBF16PS pair chain (dot_pairs) or a plain FMA
chain (fma_chain).

The op's folder: this file (its spec and Python API), integration.py (opgym.patch: HF's vision patch
embeddings, admitted by a bit probe per call shape), capture.py (opgym.capture's cases), bench.py
(`opgym bench --op patch_embed`), patch_embed.cpp (the torch operators). The numeric contract and the
evidence are src/ops/patch_embed/README.md.
"""
from __future__ import annotations

import torch

from ..._library import require
from ..spec import OpSpec

SPEC = OpSpec(
    name="patch_embed",
    title="patch embedding",
    switch="OPGYM_PATCH_EMBED",
    torch_ops=("patch_embed", "patch_embed_pack"),
    runners=("patch_embed",),
    exports=("patch_embed", "patch_embed_pack"),
    summary="the vision Conv3d patch embedding as a GEMM in the CPU conv's own reduction order (oneDNN's bits)",
)

FORMS = ("amx_tile", "dot_pairs", "fma_chain")


def patch_embed_pack(weight: torch.Tensor, form: str, in_channels: int = -1) -> torch.Tensor:
    """The Conv3d weight [OC, C, T, H, W] packed for `form` (a uint8 tensor): pack once per weight."""
    require()
    return torch.ops.opgym.patch_embed_pack(weight, form, int(in_channels))


def patch_embed(x: torch.Tensor, packed: torch.Tensor, out_channels: int, bias: torch.Tensor | None = None,
                hardware: bool = True) -> torch.Tensor:
    """x [P, C, T, H, W] (the weight's dtype) -> [P, out_channels] with the packed weight's form."""
    require()
    return torch.ops.opgym.patch_embed(x, packed, int(out_channels), bias, bool(hardware))


def paths() -> str:
    """What the calls run on this CPU, e.g. 'amx_tile: amx (tiles granted); dot_pairs: avx512_bf16; ...'."""
    require()
    return torch.ops.opgym_internal.patch_embed_paths()
