"""HF eager's formulas for the four vLLM layers, in vLLM's tensor layouts, op by op as transformers writes them.

These are the references the plugin's verify mode (OPGYM_VLLM_VERIFY=1) and the tests hold opgym's
kernels to, bit for bit, on the inputs vLLM really passes:
- rms_norm: Qwen2RMSNorm.forward (upcast, pow(2).mean, rsqrt, round to the input dtype, weight *);
- add_rms_norm: the decoder layer's `residual + hidden_states` (rounded to the dtype), then that norm;
- silu_and_mul: the MLP's act_fn(gate_proj(x)) * up_proj(x), on the gate and up halves of vLLM's merged
  gate_up (made contiguous, as HF's two Linear outputs are);
- rotary: apply_rotary_pos_emb's q * cos + rotate_half(q) * sin with cos = cat(freqs, freqs) (HF's emb),
  here gathered from vLLM's cos_sin_cache; MRoPE recomposes the t/h/w streams as Qwen2-VL does.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    input_dtype = x.dtype
    h = x.to(torch.float32)
    variance = h.pow(2).mean(-1, keepdim=True)
    h = h * torch.rsqrt(variance + eps)
    return weight * h.to(input_dtype)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float):
    """(rms_norm(residual + x), residual + x): vLLM's (out, new residual)."""
    s = residual + x
    return rms_norm(s, weight, eps), s


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    d = gate_up.shape[-1] // 2
    gate = gate_up[..., :d].contiguous()
    up = gate_up[..., d:].contiguous()
    return F.silu(gate) * up


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def hf_tables(cos_sin_cache: torch.Tensor, positions: torch.Tensor, rotary_dim: int):
    """HF's (cos, sin) for these positions from vLLM's cache ([max_pos, rotary_dim] = [cos | sin] halves):
    [T, rotary_dim] each, or [3, T, rotary_dim] for MRoPE's [3, T] positions."""
    half = rotary_dim // 2
    cs = cos_sin_cache[positions] if positions.ndim == 2 else cos_sin_cache.index_select(0, positions.flatten())
    c, s = cs[..., :half], cs[..., half:]
    return torch.cat((c, c), dim=-1), torch.cat((s, s), dim=-1)


def recompose_mrope(t: torch.Tensor, mrope_section) -> torch.Tensor:
    """Qwen2-VL's recomposition of a [3, T, D] table: element j takes stream (section of j mod D/2)."""
    parts = t.split(list(mrope_section) * 2, dim=-1)
    return torch.cat([m[i % 3] for i, m in enumerate(parts)], dim=-1)


def rotary(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor, cos_sin_cache: torch.Tensor,
           head_size: int, rotary_dim: int, mrope_section=None):
    """vLLM's (query, key) of RotaryEmbedding / MRotaryEmbedding (neox style) by HF's formula."""
    cos, sin = hf_tables(cos_sin_cache, positions, rotary_dim)
    if positions.ndim == 2:
        cos, sin = recompose_mrope(cos, mrope_section), recompose_mrope(sin, mrope_section)
    cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)
    n = positions.shape[-1]
    out = []
    for t in (query, key):
        t3 = t.view(n, -1, head_size)
        rot, rest = t3[..., :rotary_dim], t3[..., rotary_dim:]
        rot = (rot * cos) + (rotate_half(rot) * sin)
        out.append(torch.cat((rot, rest), dim=-1).reshape(t.shape))
    return out[0], out[1]
