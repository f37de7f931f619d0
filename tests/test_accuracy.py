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


def _state(model) -> dict:
    """name -> (bits, dtype, shape, strides, storage address) of every parameter and buffer."""
    out = {}
    for n, t in [*model.named_parameters(), *model.named_buffers()]:
        out[n] = (t.detach().clone(), t.dtype, tuple(t.shape), t.stride(), t.untyped_storage().data_ptr())
    return out


def _unchanged(model, inputs, ref, before: dict) -> str:
    """'' when the model's logits are still `ref`'s bits; else what differs, to tell a model opgym left
    changed (a parameter's value, dtype, shape or strides; its storage moved, with the address mod 4096)
    from a forward that does not repeat its own bits (two more forwards compared with each other)."""
    got = _logits(model, inputs)
    if torch.equal(got.view(torch.int16), ref.view(torch.int16)):
        return ""
    after = _state(model)
    changed = [n for n in before if n not in after or not torch.equal(before[n][0], after[n][0])
               or before[n][1:4] != after[n][1:4]]
    moved = [f"{n} ({before[n][4] % 4096} -> {after[n][4] % 4096})" for n in before
             if n in after and before[n][4] != after[n][4]]
    again = [_logits(model, inputs) for _ in range(2)]
    return (f"{int((got != ref).sum())} of {ref.numel()} logits differ from the reference; parameters or "
            f"buffers changed: {changed or 'none'}; storage moved: {moved or 'none'}; two more forwards "
            f"{'agree' if torch.equal(again[0], again[1]) else 'disagree'} with each other and "
            f"{'equal' if torch.equal(again[0], ref) else 'differ from'} the reference")


def test_evaluate_reference_row_is_exact_and_sides_clean_up(tiny):
    model, inputs, ref = tiny
    before = _state(model)
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
    assert torch.equal(sides[0].logits.view(torch.int16), ref.view(torch.int16))  # HF's side: the reference
    why = _unchanged(model, inputs, ref, before)
    assert not why, why
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


@pytest.mark.full  # 40 s of compilation
def test_compiled_patched_side_runs_on_its_own_copy_without_recompiling(tiny):
    """A patched side under torch.compile: patched and compiled once on a deepcopy, so that the shared
    model's patch / undo of the other sides never invalidates its graphs (each re-patch would recompile)."""
    from torch._dynamo.utils import counters

    model, inputs, ref = tiny
    side = A.compiled_copy(model, lambda m: A.patched_side(m, "opgym", None), "opgym@compile", backend="eager")
    other = A.patched_side(model, "opgym", None)
    assert side.model is not model and "forward" not in model.__dict__
    try:
        with torch.inference_mode():
            for r in range(3):
                side.on()
                got = side.model(**inputs, use_cache=False).logits
                side.off()
                if r == 0:
                    frames = counters["frames"]["ok"]
                    assert frames > 0 and torch.equal(got.view(torch.int16), ref.view(torch.int16))
                other.on()  # the shared model patched and undone between the compiled side's rounds
                model(**inputs, use_cache=False)
                other.off()
            assert counters["frames"]["ok"] == frames  # no new graph after the first round
            assert "forward" in side.model.__dict__ and side.model.__dict__.get("_opgym_patched") is None
            assert any("_opgym_patched" in m.__dict__ for m in side.model.modules())
    finally:
        side.close()
    assert not any("_opgym_patched" in m.__dict__ or "forward" in m.__dict__ for m in side.model.modules())
    assert not any("_opgym_patched" in m.__dict__ or "forward" in m.__dict__ for m in model.modules())


# ---- `opgym run --fast` / `--compile` end to end (the tiny model of test_run.py) -------------------
def _run_report(tmp_path, *extra):
    import json

    from test_run import ONE_THREAD, TINY, opgym_run

    out = tmp_path / "report.json"
    r = opgym_run(*TINY, *ONE_THREAD, "--accuracy-tokens", "6", "--report", str(out), *extra)
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(out.read_text()), r.stdout


def _check_rows(acc, names):
    rows = {r["side"]: r for r in acc["rows"]}
    assert list(rows) == names and acc["reference"] == names[0]
    for r in rows.values():
        lg = r["logits"]
        assert lg["n"] > 0 and sum(lg["ulp_buckets"].values()) == lg["n"]  # every logit in one bucket
        assert lg["differ"] == lg["n"] - lg["ulp_buckets"]["0"]
        assert 0 <= lg["argmax_agree"] <= lg["positions"] and lg["positions"] > 0
        assert r["tokens"]["n"] == 6 and 0 <= r["teacher_forced_agree"] <= 6
        assert r["prefill_wall_ms"] > 0 and r["wall_ratio"] > 0 and r["floor"]["gemm_ms"] > 0
    ref = rows[names[0]]
    assert ref["logits"]["differ"] == 0 and ref["wall_ratio"] == 1.0 and ref["tokens"]["equal"] == 6
    ex = rows["opgym exact"]["logits"]
    assert ex["differ"] == 0 and ex["argmax_agree"] == ex["positions"]  # the exact tier is HF eager's bits
    return rows


@pytest.mark.full  # about 4 min: opgym run --fast end to end
def test_run_fast_reports_accuracy_against_hf_eager(tmp_path):
    from opgym import fast_tier

    rep, stdout = _run_report(tmp_path, "--fast")
    assert rep["config"]["fast"] == list(fast_tier.default_names())
    rows = _check_rows(rep["accuracy"], ["HF eager (eager)", "opgym exact", "opgym fast", "HF + compile"])
    fast = rows["opgym fast"]
    assert fast["logits"]["differ"] > 0 and fast["logits"]["ulp_max"] > 0  # SDPA's rounding: the bits move
    assert fast["info"]["fast"]["sdpa"] == 3 and fast["info"]["fast"]["patch_embed_gemm"] == 1
    assert fast["floor"]["conv_ms"] == 0 < rows["HF eager (eager)"]["floor"]["conv_ms"]  # no conv left
    assert fast["floor"]["attention_kernel_ms"] > 0
    assert rep["calls"]["fast"]["patch_embed_gemm"]["fused"] > 0
    assert "outputs against HF eager (eager)" in stdout and "opgym fast" in stdout


@pytest.mark.full  # about 4 min: every compiled side of opgym run --compile
def test_run_compile_compares_each_compiled_side_with_hf_eager(tmp_path):
    rep, stdout = _run_report(tmp_path, "--compile")
    rows = _check_rows(rep["accuracy"], ["HF eager (eager)", "opgym exact", "HF + compile", "opgym + compile"])
    for name in ("HF + compile", "opgym + compile"):
        assert "compile" in rows[name]["info"]
    # the compiled copy is patched once: no recompilation in the timed rounds (it was ~190x the eager
    # prefill when each round re-patched the shared model); 5x is far above the noise of a loaded machine
    assert rows["opgym + compile"]["wall_ratio"] < 5
    assert "HF + compile" in stdout and "opgym + compile" in stdout


def test_run_fast_bad_options_are_one_line_errors(capsys):
    import argparse

    from opgym import run

    def call(*args):
        p = argparse.ArgumentParser(prog="opgym run")
        run.add_arguments(p)
        rc = run.main(p.parse_args(list(args)))
        return rc, capsys.readouterr().err.strip().splitlines()

    for args, needle in ((["--fast", "nope"], "unknown substitution"), (["--fast", "--ablation"], "--ablation"),
                         (["--accuracy-sides", "hf,opgym"], "--accuracy-sides")):
        rc, err = call("--testing-tiny", "--no-progress", *args)
        assert rc == 2 and len(err) == 1 and needle in err[0], (args, err)
