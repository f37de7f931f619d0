"""attn_softmax in models (opgym.patch's op "attn_softmax"): HF's eager_attention_forward served through the
instance's hooked forward (opgym/hooks.py, shared with rotary's hook), grouped-query attention without
repeat_kv where the patch-time probe allows it, Qwen2.5-VL's vision attention with all windows in one pass;
logits and greedy tokens bit-identical to HF eager; the shared forward under every undo order; fallbacks
(switch, gradients, sdpa, unverified functions); capture's cases; torch.compile fullgraph."""
from __future__ import annotations

import ast
import gc
import inspect
import sys
import textwrap

import pytest
import torch

import opgym
from opgym import hooks
from opgym.ops.attn_softmax import integration as integ, text, vision
from conftest import assert_only_refusals, graph_recorder, tiny_qwen25vl
from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl as hf

TEXT = "model.language_model.layers.0.self_attn"
VISION = "model.visual.blocks.0.attn"


_BEFORE: set = set()


@pytest.fixture(autouse=True)
def _hooked_before():
    """The hooked namespaces other test files' models left alive (collected first): a test here counts only its own."""
    gc.collect()
    _BEFORE.clear()
    _BEFORE.update(m for m in sys.modules if m.startswith(hooks.PREFIX))
    yield


def _hooked_modules():
    return sorted(m for m in sys.modules if m.startswith(hooks.PREFIX) and m not in _BEFORE)


def _run(model, inputs, tokens=4):
    with torch.no_grad():
        logits = model(**inputs).logits
        gen = model.generate(**inputs, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False)
    return logits, gen


@pytest.fixture(scope="module")
def uneven():
    """A tiny Qwen2.5-VL on a page whose windows are uneven (edge windows shorter than 64 patches)."""
    model, inputs = tiny_qwen25vl(page=(196, 140))
    return model, inputs, _run(model, inputs)


def test_logits_and_tokens_bit_identical_all_ops(uneven):
    model, inputs, (ref, gen_ref) = uneven
    with opgym.patch(model) as h:
        assert set(h.patched_by_op["attn_softmax"]) == {
            "model.visual.blocks.0.attn", "model.visual.blocks.1.attn",
            "model.language_model.layers.0.self_attn", "model.language_model.layers.1.self_attn"}
        got, gen = _run(model, inputs)
        st = h.stats()["ops"]["attn_softmax"]
    assert torch.equal(got, ref) and torch.equal(gen, gen_ref)
    assert st["fallback"] == 0 and st["fused"] > 0, st
    with opgym.patch(model) as h, torch.inference_mode():  # inference tensors: no version counter to cache on
        assert torch.equal(model(**inputs).logits, ref)
        assert_only_refusals(h.stats())
    for _, m in model.named_modules():
        assert "forward" not in m.__dict__ and "_opgym_patched" not in m.__dict__
    assert not _hooked_modules()


def test_vision_one_pass_uneven_and_full_blocks(uneven):
    model, inputs, _ = uneven
    grid = inputs["image_grid_thw"]
    visual = model.model.visual
    cu_w = hf.get_vision_window_index(grid, spatial_merge_size=visual.spatial_merge_size, window_size=visual.window_size,
                                      patch_size=visual.patch_size)[1] if hasattr(hf, "get_vision_window_index") else None
    if cu_w is not None:
        lengths = (cu_w[1:] - cu_w[:-1]).tolist()
        assert len(set(lengths)) > 1, lengths  # the page really has uneven windows
    seen = []
    orig = vision.one_pass

    def spy(q, k, v, cu, scaling):
        seen.append(tuple((cu[1:] - cu[:-1]).tolist()))
        return orig(q, k, v, cu, scaling)

    with opgym.patch(model, ops=("attn_softmax",)) as h:
        with torch.no_grad():
            model(**inputs)  # the probes of this page's signatures run (they call one_pass too)
        vision.one_pass = spy
        try:
            with torch.no_grad():
                model(**inputs)
        finally:
            vision.one_pass = orig
    assert len(seen) == 2  # block 0 windowed, block 1 full attention (the tiny model's last block)
    assert any(len(s) > 1 and len(set(s)) > 1 for s in seen) and any(len(s) == 1 for s in seen)


def test_vision_forward_is_hf_statement_for_statement():
    def tree(f):
        n = ast.parse(textwrap.dedent(inspect.getsource(f))).body[0]
        n.decorator_list, n.returns = [], None
        for a in n.args.args + n.args.kwonlyargs:
            a.annotation = None
        if isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant):
            n.body = n.body[1:]
        return n

    ours, theirs = tree(vision.forward), tree(hf.Qwen2_5_VLVisionAttention.forward)
    assert len(ours.body) == len(theirs.body)
    for a, b in zip(ours.body, theirs.body):
        if isinstance(b, ast.If) and b.orelse:
            assert ast.dump(a.test) == ast.dump(b.test) and ast.dump(ast.Module(a.body, [])) == ast.dump(
                ast.Module(b.body, []))
            loop = tree(vision.hf_loop).body
            assert [ast.dump(s) for s in loop[:-1]] == [ast.dump(s) for s in b.orelse[:-1]]
            assert ast.dump(loop[-1].value) == ast.dump(b.orelse[-1].value)  # return X / attn_output = X
            assert ast.dump(b.orelse[-1].targets[0]) == ast.dump(a.orelse[0].targets[0])
        else:
            assert ast.dump(a) == ast.dump(b)
    assert opgym.guard.fingerprint(hf.Qwen2_5_VLVisionAttention.forward) in vision.VERIFIED_FORWARD


@pytest.mark.parametrize("first", ["rotary", "attn_softmax"])
@pytest.mark.parametrize("undo_first", ["first", "second"])
def test_two_handles_share_one_forward_copy_in_any_undo_order(uneven, first, undo_first):
    model, inputs, (ref, _) = uneven
    second = "attn_softmax" if first == "rotary" else "rotary"
    m = model.get_submodule(TEXT)
    h1 = opgym.patch(model, ops=(first,))
    h2 = opgym.patch(model, ops=(second,))
    ns = hooks.namespace(m)
    assert ns is not None and [layer.owner for layer in hooks.layers(m)] == [first, second]
    assert ns.apply_rotary_pos_emb is not hf.apply_rotary_pos_emb
    assert ns.eager_attention_forward.opgym_original is hf.eager_attention_forward
    assert len(_hooked_modules()) == 2  # text attentions share one namespace, the vision ones another
    with torch.no_grad():
        assert torch.equal(model(**inputs).logits, ref)
    gone, kept = (h1, h2) if undo_first == "first" else (h2, h1)
    kept_op = second if undo_first == "first" else first
    gone.undo()
    ns = hooks.namespace(m)
    assert [layer.owner for layer in hooks.layers(m)] == [kept_op] and hooks.managed(m)
    assert (ns.apply_rotary_pos_emb is hf.apply_rotary_pos_emb) == (kept_op != "rotary")
    assert (ns.eager_attention_forward is hf.eager_attention_forward) == (kept_op != "attn_softmax")
    kept.reset_stats()
    with torch.no_grad():
        assert torch.equal(model(**inputs).logits, ref)
    assert kept.stats()["ops"][kept_op]["fused"] == 4
    kept.undo()
    for _, mod in model.named_modules():
        assert "forward" not in mod.__dict__
    assert not _hooked_modules()


def test_probe_decides_grouped_per_dtype_and_phase_and_bits_always_match():
    """Whatever the probe decides for a signature, the fused function gives HF's bits; decisions are per
    (dtype, phase, threads, ...)."""
    from opgym.guard import Stats

    st = Stats()
    fused = text.make_eager(hf.eager_attention_forward, hf.repeat_kv, True, False, (st,), frozenset({"cpu"}),
                            "OPGYM_ATTN_SOFTMAX")
    mod = type("M", (), {"num_key_value_groups": 8, "training": False})()
    g = torch.Generator().manual_seed(3)
    for dt in (torch.float32, torch.bfloat16, torch.float16):
        for S, T in ((1, 77), (1, 301), (13, 13), (40, 90)):
            q = torch.randn(1, S, 16, 64, generator=g).to(dt).transpose(1, 2)
            k, v = (torch.randn(1, 2, T, 64, generator=g).to(dt) for _ in range(2))
            mask = torch.zeros(1, 1, S, T, dtype=dt)
            mask.masked_fill_(torch.arange(T)[None] > torch.arange(S)[:, None] + T - S, torch.finfo(dt).min)
            for threads in (1, 2):
                old = torch.get_num_threads()
                torch.set_num_threads(threads)
                try:
                    out, w = fused(mod, q, k, v, mask, 64 ** -0.5)
                    ref, wref = hf.eager_attention_forward(mod, q, k, v, mask, 64 ** -0.5)
                finally:
                    torch.set_num_threads(old)
                assert torch.equal(out, ref) and torch.equal(w, wref), (dt, S, T, threads)
    assert st.fallback == 0
    decided = {(s[0], s[2], s[3]) for s in text.probed()}
    assert {(torch.bfloat16, "decode", 1), (torch.float32, "prefill", 2)} <= decided


def test_fp32_gqa_model_bit_identical_and_notes():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(vocab_size=256, hidden_size=256, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=8, num_key_value_heads=2, attn_implementation="eager")
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(cfg).eval()
    ids = torch.randint(0, 256, (2, 11), generator=torch.Generator().manual_seed(1))
    ref, gen_ref = _run(model, {"input_ids": ids}, tokens=6)
    with opgym.patch(model) as h:
        got, gen = _run(model, {"input_ids": ids}, tokens=6)
        notes = {k: v for k, v in h.notes.items() if k.startswith("attn_softmax GQA")}
        st = h.stats()["ops"]["attn_softmax"]
    assert torch.equal(got, ref) and torch.equal(gen, gen_ref)
    assert len(notes) == 2 and st["fallback"] == 0 and st["fused"] > 0


def test_sdpa_and_unverified_functions_are_left_alone(monkeypatch):
    model, _ = tiny_qwen25vl()
    model.set_attn_implementation("sdpa")
    with opgym.patch(model, ops=("attn_softmax", "rms_norm")) as h:
        assert not h.patched_by_op["attn_softmax"]
        assert "attention implementation 'sdpa'" in h.skipped[TEXT]
    model.set_attn_implementation("eager")
    monkeypatch.setitem(integ.VERIFIED_EAGER, "efbb6043024e14d5", None)
    monkeypatch.delitem(integ.VERIFIED_EAGER, "efbb6043024e14d5")
    with opgym.patch(model, ops=("attn_softmax", "rms_norm")) as h:
        assert "not one opgym has verified" in h.skipped[TEXT] and "not one opgym has verified" in h.skipped[VISION]


def test_switch_gradient_and_faults_fall_back(uneven, monkeypatch):
    model, inputs, (ref, _) = uneven
    with opgym.patch(model, ops=("attn_softmax",)) as h:
        monkeypatch.setenv("OPGYM_ATTN_SOFTMAX", "0")
        with torch.no_grad():
            assert torch.equal(model(**inputs).logits, ref)
        assert set(h.stats()["reasons"]) == {"OPGYM_ATTN_SOFTMAX=0"}
        monkeypatch.delenv("OPGYM_ATTN_SOFTMAX")
        vision._PROBED.clear()
        text._PROBED.clear()
        text._RACED.clear()
        h.reset_stats()
        with torch.library._scoped_library("opgym", "IMPL") as lib:
            boom = lambda *a, **k: (_ for _ in ()).throw(RuntimeError("simulated fault"))  # noqa: E731
            lib.impl("attn_softmax_", boom, "CPU")
            lib.impl("attn_softmax_segments_", boom, "CPU")
            lib.impl("attn_eager", boom, "CPU")
            lib.impl("attn_windows", boom, "CPU")
            with torch.no_grad():
                assert torch.equal(model(**inputs).logits, ref)
        # the vision probe raises too (nothing cached), then every fused call does
        assert set(h.stats()["reasons"]) == {"opgym error: RuntimeError", "the one-pass probe raised"}
        assert not vision.probed()  # (the text probe calls no opgym op)
        h.reset_stats()
        with torch.no_grad():
            assert torch.equal(model(**inputs).logits, ref)
        assert_only_refusals(h.stats()) and vision.probed()  # probed again, fused again
        h.reset_stats()
        out = model(**inputs).logits  # gradients enabled, weights require grad: HF's code
        assert torch.equal(out.detach(), ref)
        assert h.stats()["fused"] == 0 and all("gradient needed" in r for r in h.stats()["reasons"])


def test_capture_writes_text_and_vision_cases_and_rotary_still_records(uneven):
    from opgym.capture import Capture

    model, inputs, (ref, _) = uneven
    with torch.no_grad(), Capture(model) as cap:
        got = model(**inputs).logits
        model.generate(**inputs, max_new_tokens=2, min_new_tokens=2, do_sample=False)
    assert torch.equal(got, ref)
    assert not _hooked_modules() and all("forward" not in m.__dict__ for _, m in model.named_modules())
    cases = cap.cases(op="attn_softmax")
    ids = [c["id"] for c in cases]
    assert any("_text_" in i for i in ids) and any("_vision_windows_" in i for i in ids)
    assert any("_vision_full_" in i for i in ids)
    assert all(c["rtol"] == 0 and c["atol"] == 0 for c in cases)
    phases = {p for c in cases for p in c["phases"]}
    assert phases == {"prefill", "decode"}
    assert cap.recorder("rotary").records  # rotary's capture shares the hooked forward
    win = next(c for c in cases if "_vision_windows_" in c["id"])
    cu = win["input"]["cu_seqlens"]
    assert cu[0] == 0 and cu[-1] == win["input"]["scores"]["shape"][1]


def test_compile_fullgraph_text_model():
    import torch._dynamo
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=64, attn_implementation="eager")
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(cfg).eval().to(torch.bfloat16)
    ids = torch.randint(0, 512, (1, 9), generator=torch.Generator().manual_seed(1))
    backend, graphs = graph_recorder()
    torch._dynamo.reset()
    with torch.no_grad():
        ref = model(ids).logits
        with opgym.patch(model, ops=("rotary", "attn_softmax")):
            got = torch.compile(model, fullgraph=True, backend=backend)(ids).logits
    assert torch.equal(got, ref)
    assert len(graphs) == 1 and graphs[0].count("torch.ops.opgym.attn_eager") == 2
    assert graphs[0].count("torch.ops.opgym.rotary") == 2


# ---- text models of the coverage table and every float dtype ---------------------------------------

def _text_model(kind: str, dtype):
    """A tiny seeded GQA model (2 layers, 8 query heads on 2 KV heads) with weights of std 0.1, so that
    the attention weights are far from uniform."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    cls, cfg_cls = (LlamaForCausalLM, LlamaConfig) if kind == "llama" else (Qwen3ForCausalLM, Qwen3Config)
    cfg = cfg_cls(vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=8,
                  num_key_value_heads=2, head_dim=32, attn_implementation="eager")
    torch.manual_seed(0)
    model = cls(cfg).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.1 + (1.0 if p.dim() == 1 else 0.0))
    return model.to(dtype)


DTYPES = (torch.bfloat16, torch.float16, torch.float32)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).replace("torch.", ""))
@pytest.mark.parametrize("kind", ["llama", "qwen3"])
def test_text_models_bit_identical_with_padding_and_attention_weights(kind, dtype):
    """A left-padded batch of 2 (HF's [B, 1, S, T] mask with fully masked pad columns), the attention weights
    the model returns with output_attentions, greedy tokens through the KV cache: HF's bits, all fused."""
    model = _text_model(kind, dtype)
    ids = torch.randint(3, 256, (2, 13), generator=torch.Generator().manual_seed(2))
    am = torch.ones(2, 13, dtype=torch.long)
    am[1, :4] = 0
    inputs = {"input_ids": ids, "attention_mask": am}
    with torch.no_grad():
        ref = model(**inputs, output_attentions=True)
    ref_logits, ref_gen = _run(model, inputs, tokens=6)
    with opgym.patch(model) as h:
        assert len(h.patched_by_op["attn_softmax"]) == 2, h.skipped
        with torch.no_grad():
            got = model(**inputs, output_attentions=True)
        logits, gen = _run(model, inputs, tokens=6)
        st = h.stats()["ops"]["attn_softmax"]
    assert torch.equal(got.logits, ref.logits) and torch.equal(logits, ref_logits) and torch.equal(gen, ref_gen)
    assert len(got.attentions) == 2 and all(torch.equal(a, b) for a, b in zip(got.attentions, ref.attentions))
    assert st["fallback"] == 0 and st["fused"] > 0, st
    assert all("forward" not in m.__dict__ for _, m in model.named_modules()) and not _hooked_modules()


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).replace("torch.", ""))
def test_qwen25vl_with_an_image_every_dtype(dtype):
    from conftest import TINY_QWEN25VL
    from opgym import models

    cfg = models.qwen2_5_vl_3b_config(text_layers=2, vision_blocks=2, _widths=TINY_QWEN25VL)
    model = models.build_model(cfg, seed=0, dtype=dtype)
    inputs = models.make_inputs(cfg, models.synthetic_page(width=196, height=140))
    inputs = {k: v.to(dtype) if torch.is_tensor(v) and v.is_floating_point() else v for k, v in inputs.items()}
    ref, gen_ref = _run(model, inputs)
    with opgym.patch(model) as h:
        got, gen = _run(model, inputs)
        st = h.stats()["ops"]["attn_softmax"]
    assert torch.equal(got, ref) and torch.equal(gen, gen_ref)
    assert st["fused"] > 0, st
    assert_only_refusals(st, dtype)  # fp16 on an AVX2-only CPU: the vision windows' one-pass GEMMs refused


def test_training_falls_back_and_gradients_are_hf():
    """model.train() with gradients: HF's own function runs (no backward in opgym), so the loss and every
    gradient are HF's; the dropout of a training attention (p > 0) is never fused, even without gradients."""
    model = _text_model("llama", torch.float32)
    ids = torch.randint(3, 256, (1, 9), generator=torch.Generator().manual_seed(4))

    def grads():
        model.zero_grad()
        model(ids, labels=ids).loss.backward()
        return [p.grad.clone() for p in model.parameters()]

    model.train()
    ref = grads()
    with opgym.patch(model, ops=("attn_softmax",)) as h:
        got = grads()
        st = h.stats()["ops"]["attn_softmax"]
        assert st["fused"] == 0 and all("gradient needed" in r for r in h.stats()["reasons"]), st
        for _, m in model.named_modules():
            if hasattr(m, "attention_dropout"):
                m.attention_dropout = 0.5
        h.reset_stats()
        torch.manual_seed(5)
        with torch.no_grad():
            a = model(ids).logits
        assert h.stats()["reasons"] == {"dropout in training": 2}, h.stats()
    assert all(torch.equal(a_, b_) for a_, b_ in zip(got, ref))
    torch.manual_seed(5)
    with torch.no_grad():
        assert torch.equal(model(ids).logits, a)  # HF with the same dropout draws
    model.eval()


# ---- opgym::attn_eager, the operator the text path calls ------------------------------------------

@pytest.mark.parametrize("grouped", [False, True])
@pytest.mark.parametrize("S,T", [(1, 37), (9, 9), (5, 40)])
def test_attn_eager_is_hf_function_and_passes_opcheck(grouped, S, T):
    g = torch.Generator().manual_seed(S * 100 + T)
    mod = type("M", (), {"num_key_value_groups": 4, "training": False})()
    for dt in DTYPES:
        q = torch.randn(2, S, 8, 32, generator=g).to(dt).transpose(1, 2)  # HF's layout
        k, v = (torch.randn(2, 2, T, 32, generator=g).to(dt) for _ in range(2))
        mask = torch.zeros(2, 1, S, T, dtype=dt)
        mask[1, :, :, :3] = torch.finfo(dt).min  # a left-padded row
        out, w = torch.ops.opgym.attn_eager(q, k, v, 32 ** -0.5, mask, 4, grouped)
        ref, wref = hf.eager_attention_forward(mod, q, k, v, mask, 32 ** -0.5)
        if grouped and not text.grouped_exact(q, k, v, 4, hf.repeat_kv):
            continue  # the probe finds the grouped GEMM's bits not HF's here: the integration never asks for it
        assert torch.equal(w, wref) and torch.equal(out, ref) and out.is_contiguous(), (dt, S, T)
    torch.library.opcheck(torch.ops.opgym.attn_eager.default, (q, k, v, 32 ** -0.5, mask, 4, grouped))
    with pytest.raises(ValueError, match="groups"):
        torch.ops.opgym.attn_eager(q, k, v, 1.0, None, 3, grouped)
    with pytest.raises(RuntimeError, match="no backward"):
        torch.ops.opgym.attn_eager(q.detach().requires_grad_(), k, v, 1.0, None, 4, grouped)


@pytest.mark.parametrize("lengths", [[16] * 4, [64, 48, 16, 12, 64], [7], [5, 9, 9, 3]])
def test_attn_windows_is_hf_loop_and_passes_opcheck(lengths):
    """opgym::attn_windows against HF's loop (its eager function per window, torch.cat), bit for bit where the
    probe admits the signature; errors for windows that do not cover the patches."""
    g = torch.Generator().manual_seed(len(lengths))
    P, H, D = sum(lengths), 2, 32
    cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), dtype=torch.int32)

    class _M:
        num_key_value_groups, training = 1, False

    checked = []
    for dt in DTYPES:
        qkv = torch.randn(P, 3, H, D, generator=g).to(dt).permute(1, 0, 2, 3)
        q, k, v = (t.transpose(0, 1).unsqueeze(0) for t in qkv.unbind(0))
        if not vision.one_pass_ok(q, v, max(lengths)):
            continue
        checked.append(dt)
        ref = torch.cat([hf.eager_attention_forward(_M, a, b, c, None, D ** -0.5)[0] for a, b, c in
                         zip(*(torch.split(t, lengths, dim=2) for t in (q, k, v)))], dim=1)
        got = torch.ops.opgym.attn_windows(q, k, v, D ** -0.5, cu)
        assert torch.equal(got, ref) and got.is_contiguous(), (dt, lengths)
    assert torch.bfloat16 in checked, checked
    torch.library.opcheck(torch.ops.opgym.attn_windows.default, (q, k, v, D ** -0.5, cu))
    with pytest.raises(ValueError, match="cu_seqlens"):
        torch.ops.opgym.attn_windows(q, k, v, 1.0, cu[:-1])


@pytest.mark.parametrize("winner", ["grouped", "repeat_kv"])
def test_where_both_forms_are_exact_the_faster_one_runs(winner, monkeypatch):
    """Skipping repeat_kv is a form choice, not a preference: where the probe finds the grouped GEMMs exact,
    the race (faked here to fix its outcome) decides, and the note says which ran and the measured times."""
    monkeypatch.setattr(text, "fastest", lambda forms, device="cpu": (winner, {n: 0.001 * (n != winner) + 0.001
                                                                                for n in forms}))
    text._PROBED.clear()
    text._RACED.clear()
    q = torch.randn(1, 8, 1, 64).to(torch.bfloat16)
    k = v = torch.randn(1, 2, 300, 64).to(torch.bfloat16)
    if not text.grouped_exact(q, k, v, 4, hf.repeat_kv):
        pytest.skip("the grouped GEMM's bits differ from HF's on this machine: no choice to make")
    assert text.grouped_ok(q, k, v, 4, hf.repeat_kv) == (winner == "grouped")
    _, note = text.describe(text._signature(q, k, v, 4), winner == "grouped")
    assert note.startswith("grouped q" if winner == "grouped" else "repeat_kv as HF: both forms exact"), note
    assert f"measured repeat_kv {1 + (winner != 'repeat_kv'):.3f} ms" in note, note
    text._RACED.clear()
