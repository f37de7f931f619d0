"""opgym.run.accuracy: the error table's counting, the token agreement, and that every side (exact,
fast tier, compiled) leaves the model exactly as it found it."""
from __future__ import annotations

import pytest
import torch

from opgym.run import accuracy as A
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


def test_evaluate_reference_row_is_exact_and_sides_clean_up(tiny):
    model, inputs, ref = tiny
    sides = A.build_sides(model, "hf,opgym,fast:sdpa", None, ("sdpa",), ("sdpa",), "eager")
    assert [s.name for s in sides] == ["HF eager (eager)", "opgym exact", "opgym + sdpa"]
    res = A.evaluate(model, inputs, sides, n_tokens=3, repeats=1)
    rows = {r["side"]: r for r in res["rows"]}
    r0, ex, sd = rows["HF eager (eager)"], rows["opgym exact"], rows["opgym + sdpa"]
    assert r0["logits"]["differ"] == 0 and r0["tokens"]["equal"] == 3 and r0["wall_ratio"] == 1.0
    assert ex["logits"]["differ"] == 0 and ex["tokens"]["first_divergence"] is None  # the exact tier is exact
    assert sd["info"]["fast"] == {"sdpa": 3}  # three configs switched: the model's, the text's, the vision's
    assert len(res["ref_margins_ulp"]) == 3 and all(m >= 0 for m in res["ref_margins_ulp"])
    for r in rows.values():
        assert r["logits"]["n"] == ref.numel() and len(r["prefill_wall_ms_all"]) == 1
        assert r["floor"]["gemm_ms"] > 0 and r["floor_ratio"] > 0  # the profiled prefill ran GEMMs
        assert 0 <= r["teacher_forced_agree"] <= 3
    assert rows["opgym + sdpa"]["floor"]["attention_kernel_ms"] > 0  # SDPA's kernel ran ...
    assert rows["HF eager (eager)"]["floor"]["attention_kernel_ms"] == 0  # ... and not on the eager side
    assert model.config._attn_implementation == "eager"
    assert "forward" not in model.__dict__
    assert torch.equal(_logits(model, inputs).view(torch.int16), ref.view(torch.int16))
    md = A.markdown(res)
    assert "| HF eager (eager) |" in md and "| opgym + sdpa |" in md


def test_compiled_side_installs_and_removes_its_forward(tiny):
    model, inputs, ref = tiny
    side = A.compiled(model, A.Side("hf"), "hf@compile")
    assert "compile" in side.info
    side.on()
    try:
        assert "forward" in model.__dict__
    finally:
        side.off()
    assert "forward" not in model.__dict__


def test_build_sides_rejects_unknown_names(tiny):
    from opgym.run.options import UsageError

    model, _, _ = tiny
    for bad in ("hf,bogus", "hf,fast:nope", "hf,opgym@jit", "hf,hf", ""):
        with pytest.raises(UsageError):
            A.build_sides(model, bad, None, ("sdpa",), ("sdpa",), "eager")
