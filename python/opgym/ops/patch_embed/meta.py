"""opgym::patch_embed's operators, Python half (their CPU kernels: patch_embed.cpp, on torch's stable
ABI): schemas, the fake kernel with the real kernel's checks, autograd rules (opgym/_meta.py)."""
from __future__ import annotations

import torch

from ... import _meta as m


def define() -> None:
    m.define("patch_embed_pack(Tensor weight, str form, int in_channels=-1) -> Tensor")
    m.define("patch_embed(Tensor x, Tensor packed, int out_channels, Tensor? bias=None, bool hardware=True) -> Tensor")
    m.define("patch_embed_paths() -> str", ns="opgym_internal")


def _fake(x, packed, out_channels, bias=None, hardware=True):
    op = "patch_embed"
    m.check_tensor(x, "x", op)
    if x.dim() < 2:
        raise ValueError(f"opgym::patch_embed: x must be [P, ...] with at least 2 dims, got {m.sizes(x)}")
    if packed.dim() != 1 or packed.dtype != torch.uint8:
        raise ValueError("opgym::patch_embed: packed must be the 1-D uint8 tensor patch_embed_pack returns")
    m.check_device(packed, "packed", x, "x", op)
    if out_channels < 1:
        raise ValueError(f"opgym::patch_embed: out_channels must be >= 1, got {out_channels}")
    if bias is not None:
        m.check_tensor(bias, "bias", op)
        m.check_device(bias, "bias", x, "x", op)
        if bias.dim() != 1 or bias.shape[0] != out_channels:
            raise ValueError(f"opgym::patch_embed: bias must be [{out_channels}], got {m.sizes(bias)}")
        if bias.dtype != x.dtype:
            raise ValueError(f"opgym::patch_embed: bias must have x's dtype {m.dtype_name(x.dtype)}, "
                             f"got {m.dtype_name(bias.dtype)}")
    return x.new_empty((x.shape[0], out_channels))


def register() -> None:
    lib = m.library("opgym")
    torch.library.register_fake("opgym::patch_embed", _fake, lib=lib)
    m.refuses_grad("patch_embed", "opgym::patch_embed has no backward (an inference kernel); call it under "
                   "torch.no_grad(), or use the module's own Conv3d where gradients are needed")
    # Packing reads the weight's values; its uint8 result has no gradient (a Parameter's weight packs as is).
    lib.impl("patch_embed_pack", torch.library.fallthrough_kernel, "Autograd")
