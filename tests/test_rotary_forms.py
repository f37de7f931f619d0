"""Every rotary function form opgym serves (ops/rotary/forms.py), held bit for bit to HF's own function:
fp32/fp16/bf16, prefill and decode shapes, tables in q's dtype and in fp32, HF's output dtype and
strides, through the very stand-in opgym.patch installs (integration.make_rope); the op's arguments
(partial rotary dims, pairings, per-pair tables, contiguous outputs) against HF's functions directly;
and the forms HF promotes or that opgym leaves alone falling back with their reason.

The tiny-model half (every type of a form: logits and generated tokens identical with the rotary
patch) is tests/test_rotary_models.py."""
from __future__ import annotations

import importlib

import pytest
import torch

import opgym
from opgym.guard import Stats, fingerprint
from opgym.ops.rotary import integration
from opgym.ops.rotary.forms import ROTATE, VERIFIED

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
CPU = frozenset({"cpu"})


def _hf(module: str, name: str):
    mod = importlib.import_module(f"transformers.models.{module}.modeling_{module}")
    return getattr(mod, name)


def _form(fn, name):
    form = VERIFIED[name][fingerprint(fn)]
    pairs = form.pairs if form.helper is None else ROTATE[fingerprint(fn.__globals__[form.helper])]
    return form, pairs


def _same_layout(a, b) -> bool:
    """Equal strides wherever a dim has more than one element (a size-1 dim's stride is arbitrary)."""
    return a.shape == b.shape and all(x == y for x, y, n in zip(a.stride(), b.stride(), a.shape) if n > 1)


def _bits_equal(a, b) -> bool:
    if a is None or b is None:
        return a is None and b is None
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    as_int = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return torch.equal(a.contiguous().view(as_int), b.contiguous().view(as_int))


def _heads(B, S, H, D, dt, g):
    """HF's q_proj(x).view(B, S, H, D).transpose(1, 2): strided heads, values where roundings differ."""
    return (torch.randn(B, S, H, D, generator=g) * 3).to(dt).transpose(1, 2)


# (module, function name, signature-specific case builder). Each case: (args, kwargs) as HF's
# attention passes them. D = 32; W = the table width HF passes.
def _qk_case(B, S, D, W, dt, cdt, g, Hk=2):
    q, k = _heads(B, S, 4, D, dt, g), _heads(B, S, Hk, D, dt, g)
    cos, sin = (torch.randn(B, S, W, generator=g).to(cdt) for _ in range(2))
    return (q, k, cos, sin), {}


FORMS = [
    # module, function, table width(s) relative to D, what else
    ("llama", "apply_rotary_pos_emb", ("D",), "qk"),
    ("gpt_neox", "apply_rotary_pos_emb", ("D", "D/2", "D/4"), "qk"),          # partial
    ("olmo2", "apply_rotary_pos_emb", ("D",), "qk"),                          # .to(q_type)
    ("cohere", "apply_rotary_pos_emb", ("D",), "qk"),                         # fp32, interleaved
    ("glm4v", "apply_rotary_pos_emb", ("D", "D/2"), "qk"),                    # partial, interleaved
    ("nemotron", "apply_rotary_pos_emb", ("D", "D/2"), "qk"),                 # partial
    ("ernie4_5", "apply_rotary_pos_emb", ("D",), "qk"),                       # fp32, interleaved, first half
    ("evolla", "apply_rotary_pos_emb", ("D",), "qk"),                         # fp32
    ("glm", "apply_rotary_pos_emb", ("D", "D/2"), "qk"),                      # partial, interleaved, first half
    ("phi3", "apply_rotary_pos_emb", ("D", "3D/4"), "qk"),                    # partial
    ("ernie4_5_vl_moe", "apply_rotary_pos_emb", ("D",), "qk"),                # fp32, interleaved
    ("gpt_oss", "apply_rotary_pos_emb", ("D/2",), "qk"),                      # halves, half-width table
    ("helium", "apply_rotary_pos_emb", ("D",), "qk"),                         # interleaved, first half
    ("hunyuan_vl", "apply_rotary_pos_emb", ("D",), "qk"),                     # everything .float()
    ("blt", "apply_rotary_pos_emb", ("D",), "qk"),                            # Llama's function, Cohere's rotate_half
    ("deepseek_v3", "apply_rotary_pos_emb_interleave", ("D",), "qk"),         # deinterleave
    ("mistral_large4", "apply_rotary_pos_emb_interleave", ("D",), "qk"),      # deinterleave, k optional
    ("gemma4", "apply_rotary_pos_emb", ("D",), "x"),                          # one tensor, [B, S, H, D]
    ("gptj", "apply_rotary_pos_emb", ("D/2",), "x_sin_cos"),                  # one tensor, (tensor, sin, cos)
    ("qwen2_5_vl", "apply_rotary_pos_emb_vision", ("D",), "vision"),
    ("inkling2", "apply_rotary_pos_emb_vision", ("D",), "vision"),            # interleaved (rotate_pairwise)
    ("minimax_m3_vl", "apply_rotary_pos_emb_vision", ("D", "D/2"), "vision"),  # partial, cos[:, None, :]
]
WIDTH = {"D": lambda d: d, "D/2": lambda d: d // 2, "D/4": lambda d: d // 4, "3D/4": lambda d: 3 * d // 4}


def _case(kind, D, W, S, dt, cdt, g):
    B = 2
    if kind == "qk":
        return _qk_case(B, S, D, W, dt, cdt, g)
    if kind == "x":  # Gemma 4: x [B, S, H, D] before the transpose, unsqueeze_dim=2
        x = (torch.randn(B, S, 4, D, generator=g) * 3).to(dt)
        cos, sin = (torch.randn(B, S, W, generator=g).to(cdt) for _ in range(2))
        return (x, cos, sin), {"unsqueeze_dim": 2}
    if kind == "x_sin_cos":  # GPT-J: q_rot = query[:, :, :, :rotary_dim] of [B, S, H, D], tables [B, S, R / 2]
        x = (torch.randn(B, S, 4, D, generator=g) * 3).to(dt)[..., : 2 * W]
        sin, cos = (torch.randn(B, S, W, generator=g).to(cdt) for _ in range(2))
        return (x, sin, cos), {}
    # vision: q, k [S, H, D] views of one qkv projection, tables [S, W]
    qkv = (torch.randn(S * 8, 3, 4, D, generator=g) * 3).to(dt)
    q, k, _ = qkv.permute(1, 0, 2, 3).unbind(0)
    cos, sin = (torch.randn(S * 8, W, generator=g).to(cdt) for _ in range(2))
    return (q, k, cos, sin), {}


def _cases():
    out = []
    for module, name, widths, kind in FORMS:
        for w in widths:
            out.append(pytest.param(module, name, w, kind, id=f"{module}.{name}[W={w}]"))
    return out


def _expect_fused(form, dt, cdt) -> bool:
    """Whether opgym takes the call: HF's "hf"-rounding forms promote their output to the tables'
    dtype when it is wider than q's (opgym leaves that to HF)."""
    return not (form.rounding == "hf" and cdt != dt and dt != torch.float32)


@pytest.mark.parametrize("module,name,width,kind", _cases())
def test_form_bit_exact_with_hf(module, name, width, kind):
    fn = _hf(module, name)
    form, pairs = _form(fn, name)
    g = torch.Generator().manual_seed(hash((module, width)) % 2**31)
    D = 32
    W = WIDTH[width](D)
    checked = 0
    for dt in DTYPES:
        for cdt in dict.fromkeys((dt, torch.float32)):
            for S in (9, 1):  # prefill, decode
                args, kwargs = _case(kind, D, W, S, dt, cdt, g)
                st = Stats()
                rope = integration.make_rope(fn, form, pairs, (st,), CPU)
                with torch.no_grad():
                    want = fn(*args, **kwargs)
                    got = rope(*args, **kwargs)
                want_t = want if isinstance(want, tuple) else (want,)
                got_t = got if isinstance(got, tuple) else (got,)
                assert len(got_t) == len(want_t)
                for a, b in zip(got_t, want_t):
                    assert _bits_equal(a, b), f"{module} {dt} cos {cdt} S={S}: bits differ"
                    assert a is None or _same_layout(a, b), f"{module} {dt} S={S}: strides {a.stride()} vs {b.stride()}"
                if _expect_fused(form, dt, cdt):
                    assert (st.fused, st.fallback) == (1, 0), (module, dt, cdt, st.reasons)
                else:
                    assert st.fallback == 1 and "promote" in next(iter(st.reasons)), st.reasons
                checked += 1
    assert checked >= 6


def test_deinterleave_and_single_tensor_edges():
    """Mistral Large 4's k=None; DeepSeek's decode with a single kv head; the deinterleaving form in
    place through the op (rotary_) matches its functional form."""
    fn = _hf("mistral_large4", "apply_rotary_pos_emb_interleave")
    form, pairs = _form(fn, "apply_rotary_pos_emb_interleave")
    g = torch.Generator().manual_seed(3)
    (q, k, cos, sin), _ = _qk_case(1, 5, 16, 16, torch.bfloat16, torch.bfloat16, g, Hk=1)
    st = Stats()
    rope = integration.make_rope(fn, form, pairs, (st,), CPU)
    gq, gk = rope(q, None, cos, sin)
    wq, wk = fn(q, None, cos, sin)
    assert gk is None and wk is None and _bits_equal(gq, wq) and st.fused == 1
    qo, ko = opgym.rotary(q, k, cos[..., :8], sin[..., :8], pairs="deinterleave", pair_table=True, contiguous=True)
    q2, k2 = q.clone(), k.clone()
    opgym.rotary_(q2, k2, cos[..., :8], sin[..., :8], pairs="deinterleave", pair_table=True)
    assert _bits_equal(qo, q2.contiguous()) and _bits_equal(ko, k2.contiguous()) and qo.is_contiguous()


def test_forms_fall_back_where_hf_would_differ():
    """Inputs a form's HF code would compute differently from the op (or refuse) go to HF, named."""
    fn = _hf("llama", "apply_rotary_pos_emb")
    form, pairs = _form(fn, "apply_rotary_pos_emb")
    g = torch.Generator().manual_seed(5)
    (q, k, cos, sin), _ = _qk_case(1, 3, 32, 32, torch.bfloat16, torch.bfloat16, g)
    st = Stats()
    rope = integration.make_rope(fn, form, pairs, (st,), CPU)
    with pytest.raises(RuntimeError):  # a partial table on the full-dim form: HF raises, so does the call
        rope(q, k, cos[..., :16].contiguous(), sin[..., :16].contiguous())
    assert st.reasons == {"rotary dim 16 of head dim 32 not served by this form": 1}
    # GPT-NeoX's partial form: a rotary dim above the head dim, an odd one
    fn = _hf("gpt_neox", "apply_rotary_pos_emb")
    form, pairs = _form(fn, "apply_rotary_pos_emb")
    st = Stats()
    rope = integration.make_rope(fn, form, pairs, (st,), CPU)
    out = rope(q, k, cos[..., :15], sin[..., :15])
    assert _bits_equal(out[0], fn(q, k, cos[..., :15], sin[..., :15])[0])
    assert st.reasons == {"rotary dim 15 of head dim 32 not served by this form": 1}
    # fp64 tables: HF computes in fp64
    st.reset()
    out = rope(q, k, cos.double(), sin.double())
    assert out[0].dtype == torch.float64 and st.fallback == 1


def test_unverified_helpers_and_forms_are_left_alone(monkeypatch):
    """A form whose rotation helper is not the verified one is not served; nor are the functions
    opgym knows it cannot serve (named)."""
    from transformers.models.nanochat import modeling_nanochat as nano
    from transformers.models.llama4 import modeling_llama4 as l4

    found = integration.resolve(nano.NanoChatAttention)
    assert found is not None and not found[1]
    assert "calls a rotate_half opgym has not verified" in found[2]["apply_rotary_pos_emb"]
    found = integration.resolve(l4.Llama4TextAttention)
    assert found is not None and not found[1] and "complex" in found[2]["apply_rotary_emb"]
    # DeepSeek-V3's attention calls both of its functions: both are served
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as ds
    found = integration.resolve(ds.DeepseekV3Attention)
    assert sorted(n for n, *_ in found[1]) == ["apply_rotary_pos_emb", "apply_rotary_pos_emb_interleave"]


@pytest.mark.skipif(not torch.cuda.is_available() or not torch._C._dispatch_has_kernel_for_dispatch_key(
    "opgym::rotary", "CUDA"), reason="no GPU (or opgym built without CUDA)")
@pytest.mark.parametrize("dt", DTYPES, ids=str)
def test_forms_on_cuda_match_the_cpu(dt):
    """Every pairing x table x rotary dim, functional and in place, on the GPU: the CPU op's bits."""
    g = torch.Generator().manual_seed(11)
    q = (torch.randn(2, 37, 8, 64, generator=g) * 3).to(dt).transpose(1, 2)
    k = (torch.randn(2, 37, 2, 64, generator=g) * 3).to(dt).transpose(1, 2)
    for pairs, pair_table, width in [("half", False, 64), ("half", False, 32), ("half", True, 32), ("half", True, 16),
                                     ("interleaved", False, 64), ("interleaved", False, 16), ("interleaved", True, 32),
                                     ("deinterleave", True, 32), ("deinterleave", True, 8)]:
        for mode, cdt in (("hf", dt), ("fp32", torch.float32)):
            cos, sin = (torch.randn(2, 37, width, generator=g).to(cdt) for _ in range(2))
            args = dict(mode=mode, pairs=pairs, pair_table=pair_table)
            want = opgym.rotary(q, k, cos, sin, contiguous=True, **args)
            got = opgym.rotary(q.cuda(), k.cuda(), cos.cuda(), sin.cuda(), contiguous=True, **args)
            assert all(_bits_equal(a.cpu(), b) and a.is_contiguous() for a, b in zip(got, want)), (pairs, width, mode)
            qc, kc = q.cuda().clone(), k.cuda().clone()
            opgym.rotary_(qc, kc, cos.cuda(), sin.cuda(), **args)
            assert _bits_equal(qc.cpu(), want[0]) and _bits_equal(kc.cpu(), want[1]), (pairs, width, mode, "in place")
