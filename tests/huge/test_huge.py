"""Every op past 2^31 elements (int32 index overflow is the classic failure: vLLM #22419), results
checked against HF eager's code at sampled rows, the last one included. Needs ~10 GB of memory and a
minute; run by `make test-huge` (CI runs it once, on the CPU) and by scripts/gpu-check.sh with
OPGYM_DEVICE=cuda (there the norms are held to 2 ulp of HF on the GPU, RMSNorm's CUDA contract until
its rebuild; sums and rotary bit for bit). Not part of the default pytest run."""
from __future__ import annotations

import sys
from pathlib import Path

import os

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import opgym  # noqa: E402
from conftest import hf_rms_norm, ulp_diff  # noqa: E402
from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl as hf  # noqa: E402

BIG = (1 << 31) + (1 << 20)  # elements: past 2^31 by a margin
D = 2048
ROWS = BIG // D
DEVICE = os.environ.get("OPGYM_DEVICE", "cpu")
EXACT = DEVICE == "cpu"


def _same_norm(got, want):
    return torch.equal(got, want) if EXACT else int(ulp_diff(got, want).max()) <= 2


def _big(rows, d, seed):
    """[rows, d] bf16 without drawing 2^31 random numbers: a random block tiled, and its last row
    made distinct so the sampled rows (the last one included) are not all copies."""
    g = torch.Generator().manual_seed(seed)
    block = torch.randn(1024, d, generator=g).bfloat16()
    t = block.repeat((rows + 1023) // 1024, 1)[:rows]
    t[-1] = torch.randn(d, generator=g).bfloat16()
    return t.to(DEVICE)


SAMPLE = [0, 1, 1023, ROWS // 2, (1 << 31) // D, ROWS - 2, ROWS - 1]  # rows around the 2^31-element mark too


def test_rms_norm_in_place_past_2_31_elements():
    x = _big(ROWS, D, 0)
    assert x.numel() > 2**31
    w = (1 + 0.1 * torch.randn(D)).bfloat16().to(DEVICE)
    norm = hf_rms_norm(D, w, 1e-6)
    with torch.no_grad():
        want = {i: norm(x[i:i + 1].clone()) for i in SAMPLE}
    opgym.rms_norm_(x, w)
    for i in SAMPLE:
        assert _same_norm(x[i:i + 1], want[i]), i


def test_add_rms_norm_in_place_past_2_31_elements():
    x, r = _big(ROWS, D, 1), _big(ROWS, D, 2)
    w = (1 + 0.1 * torch.randn(D)).bfloat16().to(DEVICE)
    norm = hf_rms_norm(D, w, 1e-6)
    with torch.no_grad():
        want = {i: (norm(r[i:i + 1] + x[i:i + 1]), r[i:i + 1] + x[i:i + 1]) for i in SAMPLE}
    opgym.add_rms_norm_(x, r, w)
    for i in SAMPLE:
        assert _same_norm(x[i:i + 1], want[i][0]) and torch.equal(r[i:i + 1], want[i][1]), i


def test_rotary_in_place_past_2_31_elements():
    S = BIG // (16 * 128) + 1  # q [1, 16, S, 128] alone holds more than 2^31 elements
    q = _big(S * 16, 128, 3).view(1, S, 16, 128).transpose(1, 2)
    k = _big(S * 2, 128, 4).view(1, S, 2, 128).transpose(1, 2)
    cos, sin = _big(S, 128, 5).view(1, S, 128), _big(S, 128, 6).view(1, S, 128)
    assert q.numel() > 2**31
    pos = [0, 1, S // 2, S - 1]
    want = {p: hf.apply_rotary_pos_emb(q[:, :, p:p + 1].clone(), k[:, :, p:p + 1].clone(), cos[:, p:p + 1],
                                       sin[:, p:p + 1]) for p in pos}
    opgym.rotary_(q, k, cos, sin)
    for p in pos:
        assert torch.equal(q[:, :, p:p + 1], want[p][0]) and torch.equal(k[:, :, p:p + 1], want[p][1]), p
