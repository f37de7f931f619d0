"""opgym.accuracy: the error table's counting, the token agreement, and that every substitution and
side leaves the model exactly as it found it."""
from __future__ import annotations

import pytest
import torch

from opgym import accuracy as A
from opgym import models


def _nudge(t: torch.Tensor, flat_index: int, ulps: int) -> None:
    v = t.view(-1).view(torch.int16)
    v[flat_index] += ulps  # positive values: +n in the int16 view = n ulps up


def test_error_table_counts_ulps_and_argmax():
    ref = torch.tensor([[1.0, 2.0, 3.0, 0.5], [4.0, 1.0, 0.25, 3.0]], dtype=torch.bfloat16)
    other = ref.clone()
    _nudge(other, 0, 1)   # 1 ulp
    _nudge(other, 5, 3)   # 3 ulps
    _nudge(other, 3, 200)  # 0.5 -> 1.5625 (200 ulps, across a binade); row 0 argmax unchanged
    other[1, 3] = 8.0     # 3.0 -> 8.0 (192 ulps): row 1 argmax moves from 0 to 3
    t = A.error_table(ref, other)
    assert t["n"] == 8 and t["differ"] == 4
    assert t["ulp_buckets"]["1"] == 1 and t["ulp_buckets"]["3-4"] == 1 and t["ulp_buckets"]["17-256"] == 2
    assert t["ulp_buckets"]["0"] == 4
    assert t["positions"] == 2 and t["argmax_agree"] == 1
    assert t["max_abs_diff"] == pytest.approx(5.0)


def test_error_table_identical_is_all_zero():
    ref = torch.randn(3, 7).to(torch.bfloat16)
    t = A.error_table(ref, ref.clone())
    assert t["differ"] == 0 and t["ulp_max"] == 0 and t["argmax_agree"] == 3
    assert sum(t["ulp_buckets"].values()) == 21


def test_token_agreement():
    assert A.token_agreement([1, 2, 3], [1, 2, 3]) == {"n": 3, "equal": 3, "first_divergence": None}
    assert A.token_agreement([1, 2, 3, 4], [1, 2, 9, 4]) == {"n": 4, "equal": 3, "first_divergence": 2}
    assert A.token_agreement([1, 2, 3], [1, 2])["first_divergence"] == 2


@pytest.fixture(scope="module")
def tiny():
    from opgym.run import TINY_WIDTHS

    cfg = models.qwen2_5_vl_3b_config(1, 1, _widths=TINY_WIDTHS)
    model = models.build_model(cfg, seed=3)
    inputs = models.make_inputs(cfg, image=models.synthetic_page(112, 112))
    with torch.inference_mode():
        ref = model(**inputs, use_cache=False).logits.clone()
    return model, inputs, ref


def _logits(model, inputs):
    with torch.inference_mode():
        return model(**inputs, use_cache=False).logits


@pytest.mark.parametrize("name", list(A.SUBSTITUTIONS))
def test_substitution_applies_and_undo_restores_bits(tiny, name):
    model, inputs, ref = tiny
    undo = A.SUBSTITUTIONS[name](model)
    try:
        sub = _logits(model, inputs)
        assert torch.isfinite(sub.float()).all()
        # an inexact substitution stays close: 0.25 is ~100x the differences seen on the embedded model
        assert (sub.float() - ref.float()).abs().max() < 0.25
    finally:
        undo()
    assert torch.equal(_logits(model, inputs).view(torch.int16), ref.view(torch.int16))


def test_patch_embed_linear_replaces_the_conv(tiny):
    model, inputs, _ = tiny
    pe = model.model.visual.patch_embed
    x = inputs["pixel_values"]
    with torch.inference_mode():
        conv = pe(x)
        undo = A.sub_patch_embed_linear(model)
        try:
            lin = pe(x)
        finally:
            undo()
        w = pe.proj.weight
        expect = torch.nn.functional.linear(x.to(w.dtype), w.reshape(w.shape[0], -1))
    assert torch.equal(lin.view(torch.int16), expect.view(torch.int16))
    assert lin.shape == conv.shape
    assert "forward" not in pe.__dict__


def test_evaluate_reference_row_is_exact_and_sides_clean_up(tiny):
    model, inputs, ref = tiny
    sides = A.make_sides(model, ["hf_eager", "sdpa", "rms_norm_one_rounding"])
    res = A.evaluate(model, inputs, sides, n_tokens=3, repeats=1)
    rows = {r["side"]: r for r in res["rows"]}
    assert set(rows) == {"hf_eager", "sdpa", "rms_norm_one_rounding"}
    r0 = rows["hf_eager"]
    assert r0["logits"]["differ"] == 0 and r0["tokens"]["equal"] == 3 and r0["wall_ratio"] == 1.0
    assert len(res["ref_margins_ulp"]) == 3
    for r in rows.values():
        assert r["logits"]["n"] == ref.numel() and len(r["prefill_wall_ms_all"]) == 1
    assert model.config._attn_implementation == "eager"
    assert torch.equal(_logits(model, inputs).view(torch.int16), ref.view(torch.int16))
    assert "| hf_eager |" in A.markdown(res)
