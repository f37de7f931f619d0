"""opgym's vLLM layers called directly (no engine): bit for bit against HF's formulas, vLLM's in-place
contract, fallbacks with their reasons, the switch. And the references tied to transformers' own code."""
from __future__ import annotations

import os

import pytest
import torch
from vllm.config import CompilationConfig, VllmConfig, set_current_vllm_config
from vllm.config.compilation import CompilationMode
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.layers.rotary_embedding.base import RotaryEmbedding

from opgym.vllm import _stats, layers, reference

DTYPES = [torch.bfloat16, torch.float16, torch.float32]


@pytest.fixture(autouse=True)
def eager_config():
    """The configuration vLLM runs with enforce_eager (custom ops on, no torch.compile)."""
    cfg = VllmConfig(compilation_config=CompilationConfig(mode=CompilationMode.NONE))
    with set_current_vllm_config(cfg), torch.inference_mode():
        _stats.reset()
        yield


def bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    d, nan = _stats.ulp_distance(a, b)
    return bool((d == 0).all()) and not bool(nan.any())


def last(op: str) -> dict:
    return _stats.snapshot()["ops"][op]


def rand(*shape, dtype, scale=1.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (scale * torch.randn(*shape, generator=g)).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 256), (37, 256), (3, 5, 256), (513, 1280)])
def test_rms_norm_plain_and_fused_equal_hf(dtype, shape):
    norm = layers.OpgymRMSNorm(shape[-1], eps=1e-6, dtype=dtype)
    norm.weight.data = (1 + 0.1 * rand(shape[-1], dtype=torch.float32, seed=1)).to(dtype)
    x, res = rand(*shape, dtype=dtype, scale=3.0, seed=2), rand(*shape, dtype=dtype, seed=3)
    y = norm(x)
    assert bits_equal(y, reference.rms_norm(x, norm.weight.data, 1e-6))
    want_out, want_sum = reference.add_rms_norm(x, res, norm.weight.data, 1e-6)
    xi, ri = x.clone(), res.clone()
    out, new_res = norm(xi, ri)
    # vLLM's contract: in place, residual <- residual + x, x <- norm of that sum, both returned
    assert out is xi and new_res is ri
    assert bits_equal(new_res, want_sum) and bits_equal(out, want_out)
    assert last("rms_norm")["fused"] == 1 and last("add_rms_norm")["fused"] == 1
    assert last("rms_norm")["fallback"] == 0 and last("add_rms_norm")["fallback"] == 0


def test_rms_norm_strided_rows():
    norm = layers.OpgymRMSNorm(128, eps=1e-5, dtype=torch.bfloat16)
    big = rand(9, 384, dtype=torch.bfloat16)
    x = big[:, 128:256]  # rows with a stride (e.g. a q or k slice of a fused qkv output)
    assert bits_equal(norm(x), reference.rms_norm(x, norm.weight.data, 1e-5))
    assert last("rms_norm")["fused"] == 1


def test_rms_norm_falls_back_where_vllm_semantics_differ():
    # an fp32 weight on bf16 activations: vLLM rounds the result to bf16, opgym would promote to fp32
    norm = layers.OpgymRMSNorm(64, eps=1e-6, dtype=torch.float32)
    x = rand(4, 64, dtype=torch.bfloat16)
    y = norm(x)
    assert y.dtype == torch.bfloat16
    assert bits_equal(y, RMSNorm.forward_native(norm, x))
    assert last("rms_norm")["fallback"] == 1 and "weight torch.float32" in next(iter(last("rms_norm")["reasons"]))
    # a variance over part of the row (var_hidden_size)
    part = layers.OpgymRMSNorm(64, eps=1e-6, var_hidden_size=32, dtype=torch.bfloat16)
    assert bits_equal(part(x), RMSNorm.forward_native(part, x))
    assert "var_hidden_size" in " ".join(last("rms_norm")["reasons"])
    # x and residual in one buffer: refused before anything is written, vLLM's own forward runs
    buf = rand(4, 128, dtype=torch.bfloat16)
    n2 = layers.OpgymRMSNorm(64, eps=1e-6, dtype=torch.bfloat16)
    want = RMSNorm.forward_native(n2, buf[:, :64].clone(), buf[:, 64:].clone())
    got = n2(buf[:, :64], buf[:, 64:])
    assert bits_equal(got[0], want[0]) and bits_equal(got[1], want[1])
    assert "share memory" in " ".join(last("add_rms_norm")["reasons"])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 2 * 11008), (17, 2 * 3420), (2, 3, 2 * 64)])
def test_silu_and_mul_equals_hf(dtype, shape):
    act = layers.OpgymSiluAndMul()
    x = rand(*shape, dtype=dtype, scale=4.0)
    assert bits_equal(act(x), reference.silu_and_mul(x))
    assert last("silu_and_mul")["fused"] == 1


def _rope(cls, head, rot, neox=True, dtype=torch.bfloat16, **kw):
    return cls(head, rot, 8192, 1e6, neox, dtype, **kw)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens", [1, 37])
@pytest.mark.parametrize("head,rot", [(128, 128), (64, 64), (128, 64), (80, 40)])
def test_rotary_equals_hf(dtype, tokens, head, rot):
    rope = _rope(layers.OpgymRotaryEmbedding, head, rot, dtype=dtype)
    pos = torch.randint(0, 8000, (tokens,), generator=torch.Generator().manual_seed(tokens))
    q, k = rand(tokens, 16 * head, dtype=dtype, seed=1), rand(tokens, 2 * head, dtype=dtype, seed=2)
    want = reference.rotary(pos, q, k, rope._match_cos_sin_cache_dtype(q), head, rot)
    qo, ko = rope(pos, q.clone(), k.clone())
    assert qo.shape == q.shape and ko.shape == k.shape
    assert bits_equal(qo, want[0]) and bits_equal(ko, want[1])
    assert last("rotary")["fused"] == 1


def test_rotary_on_views_of_fused_qkv():
    """vLLM splits q, k, v out of one qkv output: q and k are strided views of one buffer."""
    rope = _rope(layers.OpgymRotaryEmbedding, 128, 128)
    qkv = rand(11, (16 + 2 + 2) * 128, dtype=torch.bfloat16)
    q, k, v = qkv.split([16 * 128, 2 * 128, 2 * 128], dim=-1)
    pos = torch.arange(11)
    want = reference.rotary(pos, q, k, rope._match_cos_sin_cache_dtype(q), 128, 128)
    v0 = v.clone()
    qo, ko = rope(pos, q, k)
    assert bits_equal(qo, want[0]) and bits_equal(ko, want[1]) and bits_equal(v, v0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head,section", [(128, [16, 24, 24]), (64, [8, 12, 12])])
def test_mrope_sections_equal_hf(dtype, head, section):
    rope = _rope(layers.OpgymMRotaryEmbedding, head, head, dtype=dtype, mrope_section=section)
    g = torch.Generator().manual_seed(3)
    pos = torch.stack([torch.randint(0, 5000, (29,), generator=g) for _ in range(3)])
    q, k = rand(29, 16 * head, dtype=dtype, seed=4), rand(29, 2 * head, dtype=dtype, seed=5)
    want = reference.rotary(pos, q, k, rope._match_cos_sin_cache_dtype(q), head, head, section)
    qo, ko = rope(pos, q.clone(), k.clone())
    assert bits_equal(qo, want[0]) and bits_equal(ko, want[1])
    qo1, ko1 = rope(pos[0], q.clone(), k.clone())  # text-only positions: the plain rotary path
    want1 = reference.rotary(pos[0], q, k, rope.cos_sin_cache, head, head)
    assert bits_equal(qo1, want1[0]) and bits_equal(ko1, want1[1])
    assert last("mrope")["fused"] == 1 and last("rotary")["fused"] == 1


def test_rotary_fallbacks_keep_vllm_results():
    q, k = rand(5, 4 * 64, dtype=torch.bfloat16), rand(5, 2 * 64, dtype=torch.bfloat16)
    pos = torch.arange(5)
    gptj = _rope(layers.OpgymRotaryEmbedding, 64, 64, neox=False)
    got = gptj(pos, q.clone(), k.clone())
    want = RotaryEmbedding.forward_cpu(gptj, pos, q.clone(), k.clone())
    assert bits_equal(got[0], want[0]) and bits_equal(got[1], want[1])
    inter = _rope(layers.OpgymMRotaryEmbedding, 64, 64, mrope_section=[8, 12, 12], mrope_interleaved=True)
    inter(torch.stack([pos] * 3), q.clone(), k.clone())
    reasons = {**last("rotary")["reasons"], **last("mrope")["reasons"]}
    assert any("GPT-J" in r for r in reasons) and any("interleaved MRoPE" in r for r in reasons)
    assert last("rotary")["fused"] == 0 and last("mrope")["fused"] == 0


def test_switch_off_builds_vllm_layers_that_serve_nothing(monkeypatch):
    monkeypatch.setenv("OPGYM_VLLM", "0")
    norm = layers.OpgymRMSNorm(64, dtype=torch.bfloat16)
    x, r = rand(3, 64, dtype=torch.bfloat16), rand(3, 64, dtype=torch.bfloat16)
    norm(x)
    norm(x.clone(), r.clone())
    s = _stats.snapshot()
    assert s["ops"]["rms_norm"]["calls"] == 0 and s["ops"]["add_rms_norm"]["calls"] == 0
    assert s["layers"][-1]["served"] is False and s["layers"][-1]["why_not"] == "OPGYM_VLLM=0"


def test_verify_mode_counts_and_measures(monkeypatch):
    monkeypatch.setattr(layers, "_verify", [True])
    norm = layers.OpgymRMSNorm(256, eps=1e-6, dtype=torch.bfloat16)
    norm.weight.data = (1 + 0.1 * rand(256, dtype=torch.float32, seed=7)).to(torch.bfloat16)
    x, r = rand(64, 256, dtype=torch.bfloat16, scale=2.0), rand(64, 256, dtype=torch.bfloat16, seed=8)
    norm(x, r)
    v = _stats.snapshot()["verify"]["add_rms_norm"]
    assert v["calls"] == 1 and v["elements"] == 2 * 64 * 256 and v["opgym_differ"] == 0
    # vLLM's own fused add + RMSNorm normalizes the fp32 sum (HF rounds it to bf16 first): it differs
    assert v["vllm_differ"] > 0 and sum(v["vllm_ulp"].values()) == v["elements"]


# The references are HF's code, in vLLM's layouts: held to transformers' own modules and functions.

def test_references_are_transformers_code():
    from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl as hf

    hs = 256
    norm = hf.Qwen2_5_VLRMSNorm(hs, eps=1e-6).to(torch.bfloat16)
    norm.weight.data = (1 + 0.1 * rand(hs, dtype=torch.float32, seed=9)).to(torch.bfloat16)
    x = rand(2, 7, hs, dtype=torch.bfloat16, scale=3.0)
    assert bits_equal(reference.rms_norm(x, norm.weight.data, 1e-6), norm(x))
    head, section = 128, [16, 24, 24]
    rope = _rope(layers.OpgymMRotaryEmbedding, head, head, mrope_section=section)
    cache = rope._match_cos_sin_cache_dtype(rand(1, head, dtype=torch.bfloat16))
    pos = torch.stack([torch.arange(9) + d for d in (0, 3, 5)])
    cos, sin = reference.hf_tables(cache, pos, head)
    cos, sin = reference.recompose_mrope(cos, section), reference.recompose_mrope(sin, section)
    q, k = rand(9, 4 * head, dtype=torch.bfloat16, seed=10), rand(9, 2 * head, dtype=torch.bfloat16, seed=11)
    # HF's layout: q [B, H, S, D], cos [B, S, D], unsqueeze_dim 1
    hq, hk = hf.apply_rotary_pos_emb(q.view(1, 9, 4, head).transpose(1, 2), k.view(1, 9, 2, head).transpose(1, 2),
                                     cos[None], sin[None])
    rq, rk = reference.rotary(pos, q, k, cache, head, head, section)
    assert bits_equal(rq, hq.transpose(1, 2).reshape(9, -1)) and bits_equal(rk, hk.transpose(1, 2).reshape(9, -1))


def test_tables_vllm_cache_vs_hf_rotary_module(capsys):
    """vLLM's bf16 cos/sin cache against HF's Qwen2.5-VL rotary module at the same positions: reported
    (the tables are vLLM's input to the layer, the same on both sides of every comparison here)."""
    from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl as hf

    from opgym.models import qwen2_5_vl_3b_config

    cfg = qwen2_5_vl_3b_config(1, 1).text_config
    hf_rope = hf.Qwen2_5_VLRotaryEmbedding(cfg)
    rope = _rope(layers.OpgymMRotaryEmbedding, 128, 128, mrope_section=[16, 24, 24])
    pos = torch.stack([torch.arange(4096), torch.arange(4096) // 3, torch.arange(4096) % 97])
    hc, hs_ = hf_rope(torch.zeros(1, dtype=torch.bfloat16), pos[:, None, :])
    cache = rope._match_cos_sin_cache_dtype(torch.zeros(1, dtype=torch.bfloat16))
    c, s = reference.hf_tables(cache, pos, 128)
    c, s = reference.recompose_mrope(c, [16, 24, 24]), reference.recompose_mrope(s, [16, 24, 24])
    dc = int((_stats.ulp_distance(c, hc[0])[0] != 0).sum())
    ds = int((_stats.ulp_distance(s, hs_[0])[0] != 0).sum())
    with capsys.disabled():
        print(f"\n[vllm tables] bf16 cos/sin at 4096 MRoPE positions: vLLM's cache vs HF's Qwen2_5_VLRotaryEmbedding "
              f"differ in {dc} / {ds} of {c.numel()} elements")
    assert c.shape == hc[0].shape
