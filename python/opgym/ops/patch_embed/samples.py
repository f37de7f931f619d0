"""patch_embed's contract (opgym/ops/contract.py): Qwen2.5-VL's vision patch embedding (3 -> 1280, kernel
(2, 14, 14)) on a 448x448 page's 1024 patches and on small and odd patch counts, against the module's own Conv3d
(transformers' Qwen2_5_VisionPatchEmbed). The op computes in one of several reduction orders (its forms); the one
torch's conv takes on this CPU is found by the op's own probe on a discriminating input (integration.py), never
on the sample itself; where no form gives the conv's bits (bf16/fp16 on a CPU where torch runs them outside oneDNN)
the op is left to HF in models and the samples say so."""
from __future__ import annotations

import functools

import torch

from ..contract import Misuse, Sample, qwen2_5_vl, rand

OPS = torch.ops.opgym
LIFE = qwen2_5_vl()  # a patched module's life (tests/test_module_life.py)
REFUSALS = ("no exact form at ",)  # its probe's reason where no form has the conv's bits here (tests/conftest.py)


@functools.lru_cache(maxsize=None)
def _module(dtype: torch.dtype):
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionPatchEmbed

    g = torch.Generator().manual_seed(0)
    m = Qwen2_5_VisionPatchEmbed(patch_size=14, temporal_patch_size=2, in_channels=3, embed_dim=1280)
    with torch.no_grad():
        m.proj.weight.copy_(torch.randn(m.proj.weight.shape, generator=g, device="cpu") * 0.02)
    return m.to(dtype).eval()


@functools.lru_cache(maxsize=None)
def form_here(dtype: torch.dtype, P: int) -> tuple:
    """(the form torch's conv takes here for P patches, or None; how the probe decided)."""
    from .integration import _State, forms_for

    x = rand((P, 3, 2, 14, 14), dtype, 99)
    with torch.no_grad():
        return _State(_module(dtype))._discriminate(x, forms_for(dtype))


def conv(x, packed, out_channels, bias=None, hardware=True, *, _dtype=None):
    """HF's forward: the pixels viewed as [P, 3, 2, 14, 14], the Conv3d, viewed back as [P, 1280]."""
    m = _module(x.dtype)
    return m(x.reshape(x.shape[0], -1))


def samples(dtype: torch.dtype) -> list[Sample]:
    w = _module(dtype).proj.weight.detach()
    out = []
    for P in (1024, 12, 7, 1):
        form, why = form_here(dtype, P)
        x = rand((P, 3, 2, 14, 14), dtype, P)
        packed = OPS.patch_embed_pack(w, form or "fma_chain")
        out.append(Sample(f"{P} patches ({form or 'no form'})", OPS.patch_embed.default, (x, packed, 1280), conv,
                          when=(lambda why=why, form=form: None if form else
                                f"no form gives torch's conv bits on this CPU ({why})")))
    return out


def drawn(draw, dtype: torch.dtype) -> Sample:
    """1..40 patches of Qwen2.5-VL's 3 x 2 x 14 x 14 pixels, against the module's own Conv3d, in the form this CPU's
    conv takes for that count (the op's probe); not exact here where no form is."""
    P = draw.integer(1, 40)
    form, why = form_here(dtype, P)
    packed = OPS.patch_embed_pack(_module(dtype).proj.weight.detach(), form or "fma_chain")
    return Sample(f"{P} patches ({form or 'no form'})", OPS.patch_embed.default,
                  (rand((P, 3, 2, 14, 14), dtype, draw.seed()), packed, 1280), conv,
                  when=lambda: None if form else f"no form gives torch's conv bits on this CPU ({why})")


def huge() -> list[Huge]:
    """None yet: past 2^31 output elements is 1.7 million patches (5 TFLOP a pass). The op's first call probes
    HF's conv over the whole call and the reference is that conv too, so in fp32 the pixels, the op's output and
    HF's outputs need ~34 GB (more than make test-huge's machines have), and bf16, half that, is exact only where
    torch runs its bf16 conv through oneDNN (not on the AVX2 CPU this was written on, so it could not be run
    here). The kernels index with int64_t (src/ops/patch_embed); no test takes them past 2^31."""
    return []


def misuses() -> list[Misuse]:
    w = _module(torch.float32).proj.weight.detach()
    packed = OPS.patch_embed_pack(w, "fma_chain")
    x = rand((4, 3, 2, 14, 14), torch.float32, 0)
    return [
        Misuse("a form opgym has not", lambda: OPS.patch_embed_pack(w, "winograd"), ValueError, "form", (w,)),
        Misuse("pixels of another kernel size", lambda: OPS.patch_embed(x[..., :13, :13], packed, 1280), ValueError,
               "x", (x,)),
        Misuse("out_channels that do not match the packed weight", lambda: OPS.patch_embed(x, packed, 640), ValueError,
               r"out must be \[4, 1280\]", (x,)),
    ]
