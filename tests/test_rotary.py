"""opgym::rotary: the torch operators against transformers' own rotary functions (the text path's
bf16 sequence and the vision tower's fp32 upcast, bit for bit, HF's output strides kept), MRoPE as
PyPTO-Gym defines it, errors (nothing written), opcheck, torch.compile; and opgym.patch's per-instance
hook on tiny HF models: identical logits and tokens, counters, switch, fallbacks, other instances
untouched, undo."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import opgym
from conftest import tiny_qwen25vl, graph_recorder
from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl as hf

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
REPO = Path(__file__).resolve().parent.parent


def _same_layout(a, b) -> bool:
    """Equal strides wherever a dim has more than one element (a size-1 dim's stride is arbitrary)."""
    return a.shape == b.shape and all(x == y for x, y, n in zip(a.stride(), b.stride(), a.shape) if n > 1)


def _text(B, S, H, Hkv, D, dt, seed=0):
    g = torch.Generator().manual_seed(seed)
    # HF's q_proj(x).view(B, S, H, D).transpose(1, 2): strided heads
    q = torch.randn(B, S, H, D, generator=g).to(dt).transpose(1, 2)
    k = torch.randn(B, S, Hkv, D, generator=g).to(dt).transpose(1, 2)
    cos, sin = (torch.randn(B, S, D, generator=g).to(dt) for _ in range(2))
    return q, k, cos, sin


@pytest.mark.parametrize("shape", [(1, 282, 16, 2, 128), (1, 1, 16, 2, 128), (2, 9, 4, 4, 64), (1, 3, 2, 1, 2)], ids=str)
@pytest.mark.parametrize("dt", DTYPES, ids=str)
def test_text_bit_exact_with_hf(shape, dt):
    q, k, cos, sin = _text(*shape, dt, seed=shape[1])
    want = hf.apply_rotary_pos_emb(q, k, cos, sin)
    got = opgym.rotary(q, k, cos, sin)
    for g, w in zip(got, want):
        assert torch.equal(g, w) and _same_layout(g, w) and g.dtype == w.dtype


@pytest.mark.parametrize("dt", DTYPES, ids=str)
@pytest.mark.parametrize("tokens", [1024, 7])
def test_vision_bit_exact_with_hf(dt, tokens):
    g = torch.Generator().manual_seed(tokens)
    qkv = torch.randn(tokens, 3, 16, 80, generator=g).to(dt)
    q, k, _ = qkv.permute(1, 0, 2, 3).unbind(0)  # HF's vision attention: strided views
    cos, sin = torch.randn(tokens, 80, generator=g), torch.randn(tokens, 80, generator=g)  # fp32 tables
    want = hf.apply_rotary_pos_emb_vision(q, k, cos, sin)
    got = opgym.rotary(q, k, cos, sin, -2, "fp32")
    for a, b in zip(got, want):
        assert torch.equal(a, b) and _same_layout(a, b) and a.dtype == b.dtype


def _mrope_reference(q, k, cos, sin, section, unsqueeze_dim=1):
    """Qwen2-VL's apply_multimodal_rotary_pos_emb (the gym's golden), written out."""
    sec = list(section) * 2
    cos = torch.cat([m[i % 3] for i, m in enumerate(cos.split(sec, dim=-1))], dim=-1).unsqueeze(unsqueeze_dim)
    sin = torch.cat([m[i % 3] for i, m in enumerate(sin.split(sec, dim=-1))], dim=-1).unsqueeze(unsqueeze_dim)
    return q * cos + hf.rotate_half(q) * sin, k * cos + hf.rotate_half(k) * sin


@pytest.mark.parametrize("dt", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("S", [31, 1, 128])
def test_mrope_as_the_gym_defines_it(dt, S):
    g = torch.Generator().manual_seed(S)
    q, k = torch.randn(1, 16, S, 128, generator=g).to(dt), torch.randn(1, 2, S, 128, generator=g).to(dt)
    cos, sin = torch.randn(3, 1, S, 128, generator=g).to(dt), torch.randn(3, 1, S, 128, generator=g).to(dt)
    want = _mrope_reference(q, k, cos, sin, (16, 24, 24))
    got = opgym.rotary(q, k, cos, sin, 1, "hf", (16, 24, 24))
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_in_place():
    q, k, cos, sin = _text(1, 5, 4, 2, 128, torch.bfloat16)
    want = hf.apply_rotary_pos_emb(q, k, cos, sin)
    q2, k2 = q.clone(), k.clone()
    v = (q2._version, k2._version)
    opgym.rotary_(q2, k2, cos, sin)
    assert torch.equal(q2, want[0]) and torch.equal(k2, want[1])
    assert q2._version > v[0] and k2._version > v[1]


@pytest.mark.parametrize("case,exc,match", [
    ("odd_dim", ValueError, "must be even"),
    ("mrope_sum", ValueError, "sum to half the rotary dim"),
    ("rotary_dim", ValueError, "must be even, from 2 to q's last dim"),
    ("pairs", ValueError, "pairs must be 'half', 'interleaved' or 'deinterleave'"),
    ("deinterleave_table", ValueError, "pair_table must be set"),
    ("cos_dtype", ValueError, "mode hf computes in q's dtype"),
    ("broadcast", ValueError, "does not broadcast"),
    ("k_dtype", ValueError, "k must have q's dtype"),
    ("mode", ValueError, "mode must be 'hf' or 'fp32'"),
    ("device", RuntimeError, "cos is on meta"),
    ("alias", ValueError, "overlaps"),
])
def test_errors_name_the_argument_and_write_nothing(case, exc, match):
    q, k, cos, sin = _text(1, 3, 4, 2, 8, torch.bfloat16)
    args, kwargs, in_place = [q, k, cos, sin], {}, False
    if case == "odd_dim":
        q, k, cos, sin = (t[..., :7].contiguous() for t in (q, k, cos, sin))
        args = [q, k, cos, sin]
    elif case == "mrope_sum":
        args[2] = args[3] = torch.randn(3, 1, 3, 8).bfloat16()
        kwargs = {"mrope_section": (1, 1, 1)}
    elif case == "cos_dtype":
        args[2], args[3] = cos.float(), sin.float()
    elif case == "broadcast":
        args[2], args[3] = cos[:, :2], sin[:, :2]
    elif case == "k_dtype":
        args[1] = k.float()
    elif case == "mode":
        kwargs = {"mode": "fast"}
    elif case == "rotary_dim":
        args[2] = args[3] = torch.randn(1, 3, 10).bfloat16()
    elif case == "pairs":
        kwargs = {"pairs": "zigzag"}
    elif case == "deinterleave_table":
        kwargs = {"pairs": "deinterleave"}
    elif case == "device":
        args[2] = cos.to("meta")
    elif case == "alias":
        args[1] = q  # q and k one tensor, in place: the outputs overlap
        in_place = True
    before = [t.clone() for t in args[:2]]
    with pytest.raises(exc, match=match):
        (opgym.rotary_ if in_place else opgym.rotary)(*args, **kwargs)
    assert all(torch.equal(a, b) for a, b in zip(args[:2], before))


def test_opcheck_and_compile():
    from torch.library import opcheck
    import torch._dynamo

    q, k, cos, sin = _text(1, 5, 4, 2, 64, torch.bfloat16)
    opcheck(torch.ops.opgym.rotary.default, (q, k, cos, sin, 1, "hf", None))
    opcheck(torch.ops.opgym.rotary.default, (q.float(), k.float(), cos, sin, 1, "fp32", None))
    opcheck(torch.ops.opgym.rotary_.default, (q.clone(), k.clone(), cos, sin, 1, "hf", None))
    # the other forms: partial and contiguous (GPT-NeoX), interleaved per-pair (GLM), deinterleave (DeepSeek)
    opcheck(torch.ops.opgym.rotary.default, (q, k, cos[..., :32], sin[..., :32], 1, "hf", None, "half", False, True))
    opcheck(torch.ops.opgym.rotary.default, (q, k, cos[..., :16], sin[..., :16], 1, "fp32", None, "interleaved", True))
    opcheck(torch.ops.opgym.rotary.default, (q, k, cos[..., :32], sin[..., :32], 1, "hf", None, "deinterleave", True,
                                             True))
    opcheck(torch.ops.opgym.rotary_.default, (q.clone(), k.clone(), cos[..., :32], sin[..., :32], 1, "hf", None,
                                              "deinterleave", True))

    def f(q, k, cos, sin):
        a, b = torch.ops.opgym.rotary(q, k, cos, sin, 1, "hf")
        c, d = torch.ops.opgym.rotary(q, k, cos[..., :32], sin[..., :32], 1, "hf", None, "interleaved", True, True)
        return a + 1, b, c * 2, d

    torch._dynamo.reset()
    for S in (5, 11):
        q, k, cos, sin = _text(1, S, 4, 2, 64, torch.bfloat16, seed=S)
        got = torch.compile(f, fullgraph=True, dynamic=True)(q, k, cos, sin)
        want = f(q, k, cos, sin)
        assert all(torch.equal(a, b) and a.stride() == b.stride() for a, b in zip(got, want))


def test_no_gradient():
    q, k, cos, sin = _text(1, 3, 2, 2, 8, torch.float32)
    q.requires_grad_(True)
    with pytest.raises(RuntimeError, match="has no backward"):
        opgym.rotary(q, k, cos, sin)


# Qwen2.5-VL's captured calls, checked here against Qwen2.5-VL's own functions. The other families' forms
# (cases/rotary_forms: partial dims, interleaved pairs, per-pair tables) are checked against their golden
# by the C++ runner (ctest check_cases_*) and against each family's HF module by test_rotary_forms.py.
CASE_FILES = sorted(REPO.glob("cases/qwen2_5_vl_3b/rotary*.json"))
TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def _cases():
    return [pytest.param(c, id=f"{p.parent.name}/{c['id']}") for p in CASE_FILES
            for c in json.loads(p.read_text())["test_cases"]]


def test_case_files_exist():
    assert CASE_FILES


@pytest.mark.parametrize("case", _cases())
def test_captured_shapes_bit_exact_with_hf(case):
    inp = case["input"]
    torch.manual_seed(case["seed"])
    t = {n: torch.randn(inp[n]["shape"]).to(TORCH_DTYPES[inp[n]["dtype"]]) for n in ("q", "k", "cos", "sin")}
    if inp["mode"] == "fp32":
        want = hf.apply_rotary_pos_emb_vision(t["q"], t["k"], t["cos"], t["sin"])
    else:
        want = hf.apply_rotary_pos_emb(t["q"], t["k"], t["cos"], t["sin"], inp["unsqueeze_dim"])
    got = opgym.rotary(t["q"], t["k"], t["cos"], t["sin"], inp["unsqueeze_dim"], inp["mode"])
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


# ---- the per-instance hook in opgym.patch --------------------------------------------------------



def _qwen25vl(seed=0):
    return tiny_qwen25vl(seed)


@pytest.fixture(scope="module")
def qwen25vl():
    return tiny_qwen25vl()


def test_qwen2_5_vl_rotary_fused_bit_identical(qwen25vl):
    model, inputs = qwen25vl
    with torch.no_grad():
        ref = model(**inputs).logits
        gen_ref = model.generate(**inputs, max_new_tokens=5, min_new_tokens=5, do_sample=False)
    with opgym.patch(model, ops=("rotary",)) as handle:
        assert set(handle.patched) == {"model.visual.blocks.0.attn", "model.visual.blocks.1.attn",
                                       "model.language_model.layers.0.self_attn",
                                       "model.language_model.layers.1.self_attn"}
        with torch.no_grad():
            got = model(**inputs).logits
            assert handle.stats()["ops"]["rotary"] == {"fused": 4, "fallback": 0, "reasons": {}}
            gen = model.generate(**inputs, max_new_tokens=5, min_new_tokens=5, do_sample=False)
        assert torch.equal(got, ref) and torch.equal(gen, gen_ref)
    for _, m in model.named_modules():
        assert "forward" not in m.__dict__
    assert hf.apply_rotary_pos_emb.__module__ == hf.__name__  # the module global was never touched


def test_other_instances_untouched_switch_and_faults(monkeypatch):
    a, inputs = _qwen25vl()
    b, _ = _qwen25vl()
    handle = opgym.patch(a, ops=("rotary",))
    with torch.no_grad():
        b(**inputs)  # the same classes, not patched: HF's functions, nothing counted
        assert handle.stats()["fused"] == 0
        monkeypatch.setenv("OPGYM_ROTARY", "0")
        ref = b(**inputs).logits
        assert torch.equal(a(**inputs).logits, ref)
        assert handle.stats()["reasons"] == {"OPGYM_ROTARY=0": 4}
        monkeypatch.delenv("OPGYM_ROTARY")
        handle.reset_stats()
        with torch.library._scoped_library("opgym", "IMPL") as lib:
            lib.impl("rotary", lambda *x, **kw: (_ for _ in ()).throw(RuntimeError("simulated fault")), "CPU")
            assert torch.equal(a(**inputs).logits, ref)
        assert handle.stats()["reasons"] == {"opgym error: RuntimeError": 4}
    handle.undo()


def test_partial_rotary_and_unverified_functions_fall_back(monkeypatch):
    import opgym.ops.rotary.integration as integ
    from opgym.patch import Stats

    calls = []

    def original(q, k, cos, sin, unsqueeze_dim=1):
        calls.append(1)
        return hf.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim)

    st = Stats()
    form = integ.VERIFIED["apply_rotary_pos_emb"]["49be0a48c1397b56"]
    rope = integ.make_rope(original, form, "half", (st,), frozenset({"cpu"}))
    q, k, cos, sin = _text(1, 3, 2, 1, 64, torch.bfloat16)
    out = rope(q, k, cos, sin)
    assert st.fused == 1 and not calls
    assert torch.equal(out[0], hf.apply_rotary_pos_emb(q, k, cos, sin)[0])
    # cos/sin covering part of the head (a partial rotary dim) on Qwen2.5-VL's full-dim function: HF's
    # own function takes the call (and raises for this input, as it would unpatched).
    with pytest.raises(RuntimeError):
        rope(q, k, cos[..., :32].contiguous(), sin[..., :32].contiguous())
    assert st.reasons == {"rotary dim 32 of head dim 64 not served by this form": 1} and calls == [1]
    # A modeling module whose apply_rotary_pos_emb differs from the verified one is skipped.
    monkeypatch.setitem(integ.VERIFIED, "apply_rotary_pos_emb", {})
    model, _ = _qwen25vl()
    with opgym.patch(model, ops=("rotary",)) as handle:
        assert "not one opgym has verified" in handle.skipped["model.language_model.layers.0.self_attn"]
        assert "model.visual.blocks.0.attn" in handle.patched


def test_compile_whole_patched_model_fullgraph_and_undo_cleans_up():
    import sys

    import torch._dynamo
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=64)
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(cfg).eval().to(torch.bfloat16)
    ids = torch.randint(0, 512, (1, 9), generator=torch.Generator().manual_seed(1))
    backend, graphs = graph_recorder()

    torch._dynamo.reset()
    before = set(sys.modules)
    with torch.no_grad():
        ref = model(ids).logits
        with opgym.patch(model, ops=("rotary",)) as handle:
            assert len(handle.patched) == 2
            # one per class (counted against `before`: a model an earlier test left patched keeps its own)
            assert len([m for m in set(sys.modules) - before if m.startswith("opgym._hooked.")]) == 1
            got = torch.compile(model, fullgraph=True, backend=backend)(ids).logits
    assert len(graphs) == 1 and graphs[0].count("torch.ops.opgym.rotary") == 2
    assert torch.equal(got, ref)
    assert not [m for m in set(sys.modules) - before if m.startswith("opgym._hooked.")]
